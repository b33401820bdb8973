"""The sources: each reads one outside system and hands on records (``exporter.records``),
never its wire format.

``kube.KubeSource`` keeps the cluster's nodes, pods and namespaces. The GPU readings come
from one ``ReadingSource``: ``dcgm.DcgmSource`` scrapes each node's dcgm-exporter,
``prometheus_api.PrometheusApiSource`` asks a Prometheus that scrapes them, and
``cloud_monitoring.CloudMonitoringSource`` reads what GKE keeps in Cloud Monitoring.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from exporter.errors import SourceDataError, SourceTimeout, SourceUnavailable
from exporter.records import PodInfo, TargetScrape

Failure = SourceUnavailable | SourceTimeout | SourceDataError
"""How a target fails: no answer, no answer in time, or an answer with nothing usable."""


class ReadingSource(Protocol):
    """Where the cycle's GPU readings come from."""

    @property
    def whole_cluster(self) -> bool:
        """Whether each target answers for every node (a query API) rather than its own."""

    def targets(self, pods: Iterable[PodInfo]) -> dict[str, str | None]:
        """This cycle's targets: URL -> the node it belongs to (None while unknown or when
        it answers for every node); ``pods``: the cluster's, for discovery."""

    async def fetch(self, targets: Sequence[str]) -> Sequence[TargetScrape | Failure]:
        """One answer per target, in order; a failed target is given as its error."""

    def close(self) -> None:
        """Let go of what the source holds (connections, a worker thread)."""
