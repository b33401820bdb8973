"""DCGM readings from Cloud Monitoring.

GKE's managed DCGM (on by default for new GPU clusters since 1.32) is scraped by Google
Managed Prometheus and kept in Cloud Monitoring as ``prometheus.googleapis.com/<field>/
gauge`` (a counter as ``.../counter``) on the ``prometheus_target`` resource (project_id,
location, cluster, namespace, job, instance). Each interval, one ListTimeSeries per DCGM
field asks for the cluster's series of the last ``lookback``; a series' newest point is its
reading. GMP takes ``namespace`` out
of the labels into the resource, and the scrape's own pod metadata renames dcgm-exporter's
``pod``/``namespace``/``container`` to ``exported_*`` when both are set. So the pod on a GPU
is ``exported_pod`` else ``pod``, and its namespace ``exported_namespace``, else a metric
``namespace``, else the resource's; labels naming a pod in the dcgm-exporters' own
namespace (a GPU no pod holds) are not a workload's and are dropped.

Where no DCGM series exist for the cluster, GKE's system metrics are the fallback:
``kubernetes.io/container/accelerator/{duty_cycle,memory_used,memory_total}`` on
``k8s_container``, labelled with the GPU (``accelerator_id``, ``model``). They exist per
container, so they see only GPUs a container holds: the scrape says so (``complete`` false),
idle GPUs then count as idle rather than missing, and the node comes from the pod.
Utilisation from them is the duty cycle (utilisation source ``duty_cycle``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from exporter.errors import SourceDataError, SourceTimeout, SourceUnavailable
from exporter.model.bottleneck import VIOLATIONS
from exporter.model.records import (
    ACCELERATOR_MEMORY_TOTAL,
    ACCELERATOR_MEMORY_USED,
    DUTY_CYCLE,
    ParseResult,
    PodInfo,
    TargetScrape,
)
from exporter.sources.dcgm_devices import collect

if TYPE_CHECKING:
    from google.cloud.monitoring_v3 import MetricServiceAsyncClient

_Failure = SourceUnavailable | SourceTimeout | SourceDataError
MAX_DEVICES = 1_000_000
DCGM_TYPE = "prometheus.googleapis.com/{field}/{kind}"
DCGM_COUNTERS = frozenset(VIOLATIONS)
"""The fields read that dcgm-exporter's counters file declares counters: GMP keeps them as
``.../counter`` (the others as ``.../gauge``)."""


def dcgm_type(field: str) -> str:
    """The Cloud Monitoring metric type GMP keeps a DCGM field's series under."""
    return DCGM_TYPE.format(field=field, kind="counter" if field in DCGM_COUNTERS else "gauge")

SYSTEM_TYPES = (DUTY_CYCLE, ACCELERATOR_MEMORY_USED, ACCELERATOR_MEMORY_TOTAL)
_POD_LABELS = ("pod", "namespace", "container")
_SYSTEM_LABELS = {"accelerator_id": "UUID", "model": "modelName"}
_CONTAINER_LABELS = {"pod_name": "pod", "namespace_name": "namespace",
                     "container_name": "container"}


def _newest(series: Any) -> float | None:
    """The value of a series' newest point (points come newest first); None if none."""
    if not series.points:
        return None
    value = series.points[0].value
    kind = value.WhichOneof("value")
    if kind == "double_value":
        return float(value.double_value)
    if kind == "int64_value":
        return float(value.int64_value)
    return None  # bool, string or distribution: not a DCGM reading


def dcgm_samples(field: str, series: Sequence[Any], exporter_namespace: str = ""
                 ) -> Iterator[tuple[str, dict[str, str], float | None]]:
    """(field, labels, value) of GMP's DCGM series (raw protobuf TimeSeries)."""
    for ts in series:
        labels = dict(ts.metric.labels)
        for key in _POD_LABELS:
            exported = labels.pop(f"exported_{key}", None)
            if exported is not None:
                labels[key] = exported
        if labels.get("pod") and not labels.get("namespace"):
            labels["namespace"] = ts.resource.labels.get("namespace", "")
        if exporter_namespace and labels.get("namespace") == exporter_namespace:
            labels = {k: v for k, v in labels.items() if k not in _POD_LABELS}
        yield field, labels, _newest(ts)


def system_samples(metric_type: str, series: Sequence[Any]
                   ) -> Iterator[tuple[str, dict[str, str], float | None]]:
    """(metric type, labels, value) of GKE's per-container accelerator series."""
    for ts in series:
        labels = {_SYSTEM_LABELS.get(k, k): v for k, v in ts.metric.labels.items()}
        for key, name in _CONTAINER_LABELS.items():
            labels[name] = ts.resource.labels.get(key, "")
        yield metric_type, labels, _newest(ts)


class CloudMonitoringSource:
    """``fetch`` as ``DcgmSource`` has it, over Cloud Monitoring's ListTimeSeries."""

    name = "dcgm"
    whole_cluster = True

    def __init__(self, client: MetricServiceAsyncClient, project: str, cluster: str,
                 fields: Collection[str], timeout_seconds: float, lookback_seconds: float,
                 location: str | None = None, fallback: bool = True,
                 exporter_namespace: str = "", max_devices: int = MAX_DEVICES,
                 clock: Callable[[], float] = time.time) -> None:
        for value in (cluster, location or ""):
            if '"' in value or "\\" in value:
                raise ValueError(f"{value!r} cannot be quoted into a Cloud Monitoring filter")
        self._exporter_namespace = exporter_namespace
        self._clock = clock
        """The query window ends now: the wall clock, or a test's."""
        self._client = client
        self.project = project
        self.target = f"monitoring.googleapis.com/projects/{project}"
        self._cluster = cluster
        self._location = location
        self._fields = sorted(fields)
        self._timeout = timeout_seconds
        self._lookback = lookback_seconds
        self._fallback = fallback
        self._max_devices = max_devices

    def filter(self, metric_type: str, resource_type: str, cluster_label: str) -> str:
        where = [f'metric.type = "{metric_type}"', f'resource.type = "{resource_type}"',
                 f'resource.labels.{cluster_label} = "{self._cluster}"']
        if self._location:
            where.append(f'resource.labels.location = "{self._location}"')
        return " AND ".join(where)

    def targets(self, pods: Iterable[PodInfo]) -> dict[str, str | None]:
        """The one target, for every node."""
        return {self.target: None}

    def close(self) -> None:
        """Nothing to let go of: the client is the caller's."""

    async def fetch(self, targets: Sequence[str]) -> list[TargetScrape | _Failure]:
        return [await self._one(t) for t in targets]

    async def _one(self, target: str) -> TargetScrape | _Failure:
        from google.api_core import exceptions

        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            async with asyncio.timeout(self._timeout):
                result, complete = await self._read(self._clock())
        except TimeoutError:
            return SourceTimeout("dcgm", target, f"no answer in {self._timeout:g} s")
        except exceptions.PermissionDenied as exc:
            return SourceUnavailable("dcgm", target, f"permission denied (reading time "
                                     f"series needs roles/monitoring.viewer): {exc.message}")
        except exceptions.GoogleAPICallError as exc:
            return SourceUnavailable("dcgm", target, f"{type(exc).__name__}: {exc.message}")
        if not result.devices:
            return SourceDataError("dcgm", target, f"no GPU series for cluster "
                                   f"{self._cluster!r} in project {self.project}")
        return TargetScrape(target, result, loop.time() - began, 0, complete=complete)

    async def _read(self, now: float) -> tuple[ParseResult, bool]:
        dcgm = await asyncio.gather(*(self._list(
            self.filter(dcgm_type(f), "prometheus_target", "cluster"), now)
            for f in self._fields))
        if any(dcgm) or not self._fallback:
            return collect((s for f, series in zip(self._fields, dcgm, strict=True)
                            for s in dcgm_samples(f, series, self._exporter_namespace)),
                           self._max_devices), True
        system = await asyncio.gather(*(self._list(
            self.filter(t, "k8s_container", "cluster_name"), now) for t in SYSTEM_TYPES))
        return collect((s for t, series in zip(SYSTEM_TYPES, system, strict=True)
                        for s in system_samples(t, series)), self._max_devices), False

    async def _list(self, filter_: str, now: float) -> list[Any]:
        """Every series matching the filter with a point in the lookback window, as raw
        protobuf (the proto-plus wrappers cost microseconds per field access)."""
        from google.cloud.monitoring_v3 import ListTimeSeriesRequest, ListTimeSeriesResponse
        from google.protobuf.timestamp_pb2 import Timestamp

        start, end = Timestamp(), Timestamp()
        start.FromNanoseconds(int((now - self._lookback) * 1e9))
        end.FromNanoseconds(int(now * 1e9))
        request = ListTimeSeriesRequest(
            name=f"projects/{self.project}", filter=filter_,
            interval={"start_time": start, "end_time": end},
            view=ListTimeSeriesRequest.TimeSeriesView.FULL)
        pager = await self._client.list_time_series(request=request, timeout=self._timeout)
        out: list[Any] = []
        async for page in pager.pages:
            out.extend(ListTimeSeriesResponse.pb(page).time_series)
        return out

