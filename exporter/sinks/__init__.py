"""The sinks: where each cycle's figures go.

Every ``Sink`` is handed each cycle's view (``exporter.metrics.families.MetricsView``):
``/metrics`` (``prometheus.MetricsEndpoint``) renders it once for the scrapes until the
next cycle; the ``Push`` sinks send it on from tasks of their own: remote write
(``remote_write``) and Cloud Monitoring (``cloud_monitoring``).
``exporter.runtime.app.open_exporter`` builds them all, from the configuration, and hands
them to the service.

The warehouse (``warehouse``) is the record of the cycles rather than a view of one: it
takes each cycle's usage rows, pods and incidents, writes them in its own thread (a
failure costs that cycle's work only and is shown by ``warehouse_ok``), and keeps the
service's state across restarts (the GPU inventory, the open incidents, the month's
spend). BigQuery (``bigquery``) is fed from the warehouse's outbox, never by the cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from exporter.metrics.families import MetricsView


class Sink(Protocol):
    """Where every cycle's view goes."""

    def add_cycle(self, view: MetricsView, now: float) -> None:
        """Take the cycle of ``now``; never waits on the network."""


class Push(Sink, Protocol):
    """A sink that sends what it was handed from a task of its own."""

    async def run(self) -> None:
        """Send what was taken, until cancelled."""
