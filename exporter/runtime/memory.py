"""The process's memory tuned for the exporter while it runs (``MemoryTuning``): glibc's
allocator, so that what a cycle frees goes back to the system, and Python's garbage
collector, so that it does not run dozens of times a cycle.

A cycle at 8,000 GPUs allocates and frees some 100 MB: a thousand pages of 77 KB, the
devices' readings, states and rows, the exposition's gzip. At glibc's defaults most
of it stays with the process: the size above which a block is mapped on its own rises to
the largest block freed (up to 32 MB), so the next cycle's large blocks come from the heap
and fragment it, and the free pages inside the heap and the worker threads' arenas are
kept. ``tune_allocator`` fixes that size at ``mmap_threshold_bytes``; ``give_back`` (after
each cycle) returns every free page. Where the C library is not glibc both do nothing.
"""

from __future__ import annotations

import ctypes
import gc
from typing import Protocol

M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter (malloc.h); setting it also stops glibc moving it."""


class Allocator(Protocol):
    """The two calls of glibc's allocator the exporter makes."""

    def mallopt(self, param: int, value: int, /) -> int: ...

    def malloc_trim(self, pad: int, /) -> int: ...


def glibc() -> Allocator | None:
    """This process's glibc; None where the C library is another."""
    try:
        libc = ctypes.CDLL(None)  # the symbols the process has loaded
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    return libc


class MemoryTuning:
    """How the exporter's process keeps its memory while it runs; held by the service loop
    (``Exporter.memory``), tuned and put back by its wiring (``open_exporter``).

    ``allocator``: glibc (``glibc()``), or None for none to tune."""

    __slots__ = ("_allocator", "_frozen", "_saved_thresholds", "gc_thresholds",
                 "mmap_threshold_bytes")

    def __init__(self, allocator: Allocator | None, *,
                 gc_thresholds: tuple[int, int, int] = (100_000, 50, 50),
                 mmap_threshold_bytes: int = 256 * 1024) -> None:
        self._allocator = allocator
        self.gc_thresholds = gc_thresholds
        """The garbage collector's thresholds while the exporter runs (Python's are 2,000,
        10, 10). A cycle at 8,000 GPUs allocates about a million objects, nearly all freed
        by their reference counts: at Python's thresholds the collector ran about 50 times
        a cycle and cost 0.05-0.2 s CPU of each; at these, under 0.01 s on average."""
        self.mmap_threshold_bytes = mmap_threshold_bytes
        """Blocks this large or larger are mapped on their own and unmapped when freed. A
        scrape's page (77 KB) stays below it; the exposition's chunks as they are sent
        (about 1 MB each) and its gzip are above."""
        self._saved_thresholds: tuple[int, int, int] | None = None
        """The collector's thresholds before ``tune_collector``; None while not tuned."""
        self._frozen = False

    def tune_allocator(self) -> None:
        """Fix glibc's mmap threshold (once per process is enough; again is harmless; it
        stays fixed after ``close``)."""
        if self._allocator is not None:
            self._allocator.mallopt(M_MMAP_THRESHOLD, self.mmap_threshold_bytes)

    def tune_collector(self) -> None:
        """Set the collector's thresholds to ``gc_thresholds`` until ``close``."""
        if self._saved_thresholds is None:
            self._saved_thresholds = gc.get_threshold()
        gc.set_threshold(*self.gc_thresholds)

    def freeze(self) -> None:
        """Set what exists now aside from every later collection (what start-up built
        lives on: no collection need scan it again), until ``close``."""
        gc.freeze()
        self._frozen = True

    def give_back(self) -> None:
        """Return the free memory of every arena to the system (``malloc_trim(0)``: about
        1 ms at 8,000 GPUs)."""
        if self._allocator is not None:
            self._allocator.malloc_trim(0)

    def close(self) -> None:
        """Put the collector back as it was: its thresholds, and nothing frozen."""
        if self._saved_thresholds is not None:
            gc.set_threshold(*self._saved_thresholds)
            self._saved_thresholds = None
        if self._frozen:
            gc.unfreeze()
            self._frozen = False
