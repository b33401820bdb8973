"""One cycle's view (``families.MetricsView``) made from running totals alone, for the
sinks' tests: no device, node or pod; every Kubernetes kind unknown."""

from __future__ import annotations

from typing import Any

from exporter.metrics.families import MetricsView
from exporter.metrics.health import SourceHealth
from exporter.model.compute import Owner
from exporter.model.records import PodInfo
from exporter.model.totals import GroupKey, Totals
from exporter.sources.kube import KubeSource


def _owner(p: PodInfo) -> Owner:
    return Owner(p.uid, p.namespace, p.name, p.namespace, p.name)


def view_of(totals: Totals, cluster: str = "prod", now: float = 0.0, **kw: Any) -> MetricsView:
    return MetricsView(cluster=cluster, now=now, states=[], nodes={}, pods=[], totals=totals,
                       health=SourceHealth(), kube=KubeSource(None),  # type: ignore[arg-type]
                       diagnoses={}, available_gpus=None, cycle_seconds=0.0, owner=_owner,
                       rows_written={}, **kw)


def gpus_up(n: int, cost: float = 1.0, start: int = 0) -> Totals:
    """Totals with ``n`` GPUs' up time (GPU ``gpu-<i>`` up ``i`` seconds, from ``start``)
    and one owner group's cost."""
    t = Totals()
    for i in range(start, start + n):
        t.up_seconds[f"gpu-{i}"] = float(i)
    key = GroupKey("allocated", "ml", "ml", "a100", "nvidia-tesla-a100", "on-demand")
    t.gpu_seconds[key] = 60.0
    t.cost_usd[key] = cost
    return t
