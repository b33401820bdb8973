"""Process lifecycle helpers shared by the long-running commands (Unix signals).

``run`` handles SIGINT and SIGTERM from its first instruction: ``stop_on_signals`` makes
them raise ``Stopped`` while start-up runs synchronously (reading the config, the checks),
and ``stop_signal`` hands them to the event loop once it runs (the first Kubernetes sync,
the warehouse's opening), so that a stop at any moment ends the process with one log line
and exit 0, never the signal's default death.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """SIGINT or SIGTERM received while start-up ran outside the event loop (a
    ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception`` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal = signal.Signals(signum).name


def _raise_stopped(signum: int, _: FrameType | None) -> None:
    raise Stopped(signum)


def stop_on_signals() -> None:
    """From now until an event loop takes them over, SIGINT and SIGTERM raise ``Stopped``
    in the main thread."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_stopped)


@contextlib.contextmanager
def stop_signal() -> Iterator[asyncio.Future[str]]:
    """A future set to the name of the first SIGINT or SIGTERM received inside the block
    (the running loop's handlers, installed on entry and removed on exit)."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[str] = loop.create_future()

    def received(sig: signal.Signals) -> None:
        if not got.done():
            got.set_result(sig.name)

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, received, sig)
    try:
        yield got
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        got.cancel()


async def wait_for_shutdown() -> None:
    """Return on SIGINT or SIGTERM."""
    with stop_signal() as stop:
        await stop
