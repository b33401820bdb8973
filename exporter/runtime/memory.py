"""What a cycle frees goes back to the system: glibc's allocator, tuned for the exporter.

A cycle at 8,000 GPUs allocates and frees some 100 MB: a thousand pages of 77 KB, the
devices' readings, states and rows, the exposition's gzip. At glibc's defaults most
of it stays with the process: the size above which a block is mapped on its own rises to
the largest block freed (up to 32 MB), so the next cycle's large blocks come from the heap
and fragment it, and the free pages inside the heap and the worker threads' arenas are
kept. ``tune`` fixes that size at ``MMAP_THRESHOLD_BYTES``; ``give_back`` (after each
cycle) returns every free page. Where the C library is not glibc both do nothing.
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter (malloc.h); setting it also stops glibc moving it."""
MMAP_THRESHOLD_BYTES = 256 * 1024
"""Blocks this large or larger are mapped on their own and unmapped when freed. A scrape's
page (77 KB) stays below it; the exposition's chunks as they are sent (about 1 MB each)
and its gzip are above."""


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)  # the symbols the process has loaded
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    return libc


_LIBC = _glibc()


def tune() -> None:
    """Fix glibc's mmap threshold (once per process is enough; again is harmless)."""
    if _LIBC is not None:
        _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def give_back() -> None:
    """Return the free memory of every arena to the system (``malloc_trim(0)``: about
    1 ms at 8,000 GPUs)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
