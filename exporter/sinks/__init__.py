"""The sinks: where each cycle's figures go.

The warehouse (``warehouse``, and ``bigquery`` through its outbox) takes each interval's
rows. ``/metrics`` (``prometheus``) is written from the cycle's view when it is scraped.
The ``Push`` sinks take the view after every cycle and send it on in their own time:
remote write (``remote_write``) and Cloud Monitoring (``cloud_monitoring``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from exporter.families import MetricsView


class Push(Protocol):
    """A sink that is handed every cycle's view and sends it from a task of its own."""

    def add_cycle(self, view: MetricsView, now: float) -> None:
        """Take the cycle of ``now``; never waits on the network."""

    async def run(self) -> None:
        """Send what was taken, until cancelled."""
