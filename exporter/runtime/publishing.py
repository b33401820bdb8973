"""What a cycle publishes: the view (``families.MetricsView``) handed to every sink, made
of copies of the running sums, the sources' health, the Kubernetes watches' figures and
the sinks' own, so that a scrape landing while the next cycle runs sees this cycle only."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from exporter.metrics.families import MetricsView
from exporter.metrics.health import (
    CloudMonitoringStats,
    KubeHealth,
    RemoteWriteStats,
    ReportStats,
    SourceHealth,
    WatchStats,
)
from exporter.model.totals import Totals, WaitHistogram
from exporter.sinks import Sink

if TYPE_CHECKING:
    from exporter.sinks.prometheus import MetricsEndpoint


def _copied(value: Any) -> Any:
    """A table of the running figures copied, its histograms and inner tables (counts by
    reason) too; any other value as is."""
    if isinstance(value, dict):
        out = value.copy()
        for key, v in out.items():
            if isinstance(v, WaitHistogram):
                out[key] = WaitHistogram(list(v.buckets), v.count, v.total_seconds)
            elif isinstance(v, dict):
                out[key] = v.copy()
            else:
                break  # a table holds one kind of value
        return out
    if isinstance(value, set | deque):
        return value.copy()
    return value


def copy_of[T](stats: T) -> T:
    """A copy of a dataclass of figures (``Totals``, ``SourceHealth``, a sink's stats)
    that shares no table with it."""
    return replace(stats, **{  # type: ignore[type-var]
        f.name: _copied(getattr(stats, f.name)) for f in fields(stats)  # type: ignore[arg-type]
        if f.init})


@dataclass(frozen=True, slots=True)
class KubeFigures:
    """The Kubernetes watches' figures (``health.KubeHealth``) as they stood when taken,
    each kind's age included."""

    up: Mapping[str, bool]
    stats: Mapping[str, WatchStats]
    last_success: Mapping[str, float]
    rejected_objects: Mapping[str, int]
    discovery_up: Mapping[str, bool]
    discovery_errors: Mapping[tuple[str, str], int]
    discovery_error: Mapping[str, str]
    ages: Mapping[str, float | None]

    @classmethod
    def of(cls, kube: KubeHealth) -> KubeFigures:
        return cls(dict(kube.up), {k: copy_of(s) for k, s in kube.stats.items()},
                   dict(kube.last_success), dict(kube.rejected_objects),
                   dict(kube.discovery_up), dict(kube.discovery_errors),
                   dict(kube.discovery_error), {k: kube.age(k) for k in kube.last_success})

    def age(self, kind: str) -> float | None:
        return self.ages.get(kind)


def frozen_figures(totals: Totals, health: SourceHealth, kube: KubeHealth
                   ) -> tuple[Totals, SourceHealth, KubeFigures]:
    """Copies of the running figures a view shows, as they stand now."""
    return copy_of(totals), copy_of(health), KubeFigures.of(kube)


class Publisher:
    """``/metrics`` and the push sinks, the sinks' own figures the view shows, and the last
    view published."""

    def __init__(self, metrics: MetricsEndpoint, sinks: Sequence[Sink] = (), *,
                 remote_write: RemoteWriteStats | None = None,
                 cloud_monitoring: CloudMonitoringStats | None = None) -> None:
        self.metrics = metrics
        """``/metrics``: what the last cycle shows, rendered once for every scrape."""
        self.sinks: list[Sink] = [metrics, *sinks]
        """Each is handed every cycle's view."""
        self.remote_write = remote_write
        """The remote-write sink's own figures, when the service pushes by remote write."""
        self.cloud_monitoring = cloud_monitoring
        """The Cloud Monitoring sink's own figures, when the service writes there."""
        self.report: ReportStats | None = None
        """Set when the service also makes the weekly report on a schedule."""
        self.view: MetricsView | None = None
        """What the last cycle shows; None before the first."""

    def publish(self, view: MetricsView, now: float) -> None:
        self.view = view
        for sink in self.sinks:
            sink.add_cycle(view, now)
