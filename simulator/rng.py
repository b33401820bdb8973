"""Deterministic, stateless randomness for the simulator.

Every random figure the simulator shows is a pure function of the scenario seed and a few
integers (a GPU, a pod, a time step), so the same seed always yields byte-identical output
whatever order things are asked in. ``mix`` is SplitMix64's finaliser.
"""

from __future__ import annotations

import hashlib

_MASK = (1 << 64) - 1


def mix(*values: int) -> int:
    """A well-spread 64-bit hash of a sequence of integers."""
    return _mixed(0x9E3779B97F4A7C15, values)


def _mixed(h: int, values: tuple[int, ...]) -> int:
    """``h`` (a ``mix`` of some integers) carried on over ``values``: ``mix(*a, *b)`` is
    ``_mixed(mix(*a), b)``."""
    for v in values:
        h = (h ^ (v & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & _MASK
        h ^= h >> 29
    return h


def unit(*values: int) -> float:
    """A uniform number in [0, 1) derived from ``values``."""
    return (mix(*values) >> 11) * (1.0 / (1 << 53))


def key(text: str) -> int:
    """A stable 64-bit integer for a string (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def hex_id(*values: int, length: int = 32) -> str:
    """A stable lowercase hex string of ``length`` digits."""
    h = mix(*values)
    out = ""
    i = 0
    while len(out) < length:
        out += f"{_mixed(h, (i,)):016x}"
        i += 1
    return out[:length]


def uuid_str(*values: int) -> str:
    """A stable RFC 4122-shaped identifier (used for Kubernetes uids and GPU UUIDs)."""
    h = hex_id(*values)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
