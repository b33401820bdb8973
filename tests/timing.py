"""Time limits that follow the machine.

A test that waits on an event (a server up, a process gone, a file written) gives up
after a limit, so that a broken build fails rather than hangs. The limits are what the
step needs on an idle 2-core machine; a machine doing other work beside the suite runs the
same step slower, so each limit is scaled by how much slower this machine runs now: the
wall-clock time of a fixed pure-Python loop, against its time on that idle machine
(``QUIET_SECONDS``). The scale is measured again when it is half a minute old, never goes
below 1 and is capped at ``MOST``. ``GKE_GPU_TEST_TIME_SCALE`` sets it outright.
"""

from __future__ import annotations

import os
import statistics
import time

QUIET_SECONDS = 0.07
"""The loop's wall-clock seconds on an idle 2-core development machine (two million
additions)."""
MOST = 8.0
"""The largest scale: past it a limit no longer guards against a hang in useful time."""
FRESH_SECONDS = 30.0

_measured: tuple[float, float] | None = None
"""(when, scale) of the last measurement."""


def _loop_seconds() -> float:
    began, total = time.perf_counter(), 0
    for i in range(2_000_000):
        total += i
    return time.perf_counter() - began


def scale() -> float:
    """How much longer than on an idle machine a step takes here now (at least 1)."""
    global _measured
    given = os.environ.get("GKE_GPU_TEST_TIME_SCALE")
    if given:
        return max(1.0, float(given))
    now = time.monotonic()
    if _measured is None or now - _measured[0] > FRESH_SECONDS:
        seconds = statistics.median(_loop_seconds() for _ in range(3))
        _measured = now, min(MOST, max(1.0, seconds / QUIET_SECONDS))
    return _measured[1]


def limit(seconds: float) -> float:
    """``seconds`` (what a step needs on an idle machine) as this machine needs it now."""
    return seconds * scale()
