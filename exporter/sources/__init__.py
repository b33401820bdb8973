"""The sources: each reads one outside system and hands on records (``exporter.model.records``),
never its wire format.

The cluster's nodes, pods and namespaces, the events about its pods (and Kueue's
Workloads and queues, where Kueue runs: ``kueue``) come from a ``ClusterSource``
(``kube.KubeSource``: list and watch). The GPU readings come from one ``ReadingSource``:
``dcgm.DcgmSource`` scrapes each node's dcgm-exporter, ``prometheus_api.PrometheusApiSource``
asks a Prometheus that scrapes them, and ``cloud_monitoring.CloudMonitoringSource`` reads
what GKE keeps in Cloud Monitoring.

A dcgm-exporter's page is read in three modules, each owning one thing: ``dcgm_devices``
makes DCGM's label sets devices (for the query APIs too, through ``collect``),
``dcgm_parser`` parses a page's text in full, and ``dcgm_plan`` reads a page by the plan
learnt from the last page of its shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from exporter.errors import SourceDataError, SourceTimeout, SourceUnavailable
from exporter.metrics.health import KubeHealth, WatchStats
from exporter.model.records import (
    ClusterQueueInfo,
    LocalQueueInfo,
    NodeInfo,
    PodEvent,
    PodInfo,
    TargetScrape,
    WorkloadInfo,
)

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


class ClusterSource(KubeHealth, Protocol):
    """The cluster's objects, kept current between cycles, and the health of keeping
    them."""

    @property
    def nodes(self) -> Mapping[str, NodeInfo]:
        """Node name -> node."""

    @property
    def pods(self) -> Mapping[str, PodInfo]:
        """Pod UID -> pod."""

    @property
    def namespace_labels(self) -> Mapping[str, Mapping[str, str]]:
        """Namespace -> its labels."""

    @property
    def workloads(self) -> Mapping[str, WorkloadInfo]:
        """Kueue Workload UID -> workload (empty without Kueue)."""

    @property
    def cluster_queues(self) -> Mapping[str, ClusterQueueInfo]:
        """Kueue ClusterQueue name -> queue."""

    @property
    def pod_events(self) -> Mapping[str, Mapping[str, PodEvent]]:
        """Pod UID -> reason -> the newest event of that reason about the pod (the
        scheduler's ``FailedScheduling``, the cluster autoscaler's ``TriggeredScaleUp``,
        ``NotTriggerScaleUp`` and ``FailedScaleUp``, the kubelet's image pulls...), for
        the pods that ask for GPUs and wait (``Pending``); empty where events cannot be
        read. A pod's mapping is
        replaced, never changed: a shallow copy is a snapshot."""

    @property
    def local_queues(self) -> Mapping[tuple[str, str], LocalQueueInfo]:
        """(namespace, name) -> Kueue LocalQueue."""

    @property
    def kueue(self) -> bool | None:
        """Whether the cluster serves Kueue's API; None until asked."""

    @property
    def denied(self) -> Mapping[str, str]:
        """Kind -> the RBAC grant it lacks, while the API answers it 403 Forbidden."""

    @property
    def synced(self) -> Mapping[str, asyncio.Event]:
        """Kind -> set once the kind is listed."""

    @property
    def resource_versions(self) -> Mapping[str, int]:
        """Kind -> the resource version it has caught up with."""

    @property
    def stats(self) -> Mapping[str, WatchStats]:
        """Kind -> what keeping it current took."""

    def start(self) -> None:
        """Begin keeping the objects current (in tasks of its own)."""

    async def stop(self) -> None:
        """Stop keeping them."""

    async def wait_synced(self) -> None:
        """Return once every kind is listed."""

    def take_deleted_pods(self) -> list[PodInfo]:
        """The pods deleted since the last call, as they last were."""
