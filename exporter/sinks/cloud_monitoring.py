"""Write the exporter's figures to Cloud Monitoring as custom metrics.

Each written family of the catalogue (``exporter.metrics.families``) becomes
``custom.googleapis.com/gke_gpu/<family>`` on the cluster's ``k8s_cluster`` resource; the
samples' other labels become metric labels (empty ones omitted, as Prometheus omits them).
Gauges are GAUGE points; counters are CUMULATIVE from the exporter's start, when they were
zero. Histograms are not written.

At most one snapshot is written per ``interval`` (Cloud Monitoring takes one point per
series every 5 s), in CreateTimeSeries requests of at most 200 series, paced to stay under
the project's write quota. A request that fails for a reason that may pass (UNAVAILABLE,
DEADLINE_EXCEEDED, INTERNAL, RESOURCE_EXHAUSTED) is retried with backoff until a newer
snapshot is waiting: the rest of the old one is dropped and counted, since points of one
series must be written in time order and the newer point supersedes it. A refused request
(INVALID_ARGUMENT and the like) is never retried: its points are counted as refused (the
API's partial-success summary says how many, when it sends one) and logged once per cause.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.backoff import Backoff
from exporter.logs import ctx
from exporter.metrics.families import BY_NAME, AnyFamily, Kind, MetricsView, samples
from exporter.metrics.health import CloudMonitoringStats

if TYPE_CHECKING:
    from google.cloud.monitoring_v3 import MetricServiceAsyncClient

log = logging.getLogger(__name__)

METRIC_TYPE = "custom.googleapis.com/gke_gpu/{name}"
MAX_SERIES_PER_REQUEST = 200
RETRYABLE = ("ServiceUnavailable", "DeadlineExceeded", "InternalServerError",
             "TooManyRequests", "ResourceExhausted")
"""google.api_core exceptions of failures that may pass."""


@dataclass(frozen=True, slots=True)
class Point:
    """One sample of a written family, before it becomes a TimeSeries."""

    family: str
    kind: Kind
    labels: tuple[tuple[str, str], ...]
    value: float


def points(view: MetricsView, families: Sequence[AnyFamily]) -> Iterator[Point]:
    """The samples of the chosen families (gauges and counters) this cycle; the cluster
    label is the resource's, empty labels are left out."""
    for family in families:
        names = family.labels
        for values, value in samples(view, family):
            labels = tuple(sorted((k, v) for k, v in zip(names, values, strict=True)
                                  if v and k != "cluster"))
            yield Point(family.name, family.kind, labels, float(value))


class CloudMonitoringWriter:
    def __init__(self, client: MetricServiceAsyncClient, project: str, location: str,
                 cluster: str, families: Sequence[str], started: float,
                 interval: float = 60.0, batch_size: int = MAX_SERIES_PER_REQUEST,
                 requests_per_second: float = 5.0, timeout: float = 30.0,
                 backoff: Backoff | None = None) -> None:
        self._client = client
        self._name = f"projects/{project}"
        self._resource = {"type": "k8s_cluster", "labels": {
            "project_id": project, "location": location, "cluster_name": cluster}}
        self._written = [BY_NAME[name] for name in families]
        self._started = started
        self._interval = interval
        self._batch = min(batch_size, MAX_SERIES_PER_REQUEST)
        self._gap = 1.0 / requests_per_second
        self._timeout = timeout
        self._backoff = backoff or Backoff(base=1.0, cap=30.0)
        self._pending: tuple[float, list[Point]] | None = None
        self._last_taken: float | None = None
        self._next_request = 0.0
        self._wake = asyncio.Event()
        self.stats = CloudMonitoringStats(project=self._name)
        self._logged: set[str] = set()

    def add_cycle(self, view: MetricsView, now: float) -> None:
        """Offer one cycle's figures at ``now``; taken at most once per interval."""
        if self._last_taken is not None and now - self._last_taken < self._interval:
            return
        self._last_taken = now
        if self._pending is not None:
            self.stats.points_dropped += len(self._pending[1])
        self._pending = (now, list(points(view, self._written)))
        self._wake.set()

    async def run(self) -> None:
        """Write snapshots as they come until cancelled."""
        while True:
            if self._pending is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            now, todo = self._pending
            self._pending = None
            await self._write(now, todo)

    async def _write(self, now: float, todo: list[Point]) -> None:
        loop = asyncio.get_running_loop()
        for i in range(0, len(todo), self._batch):
            batch = todo[i:i + self._batch]
            while True:
                await asyncio.sleep(max(0.0, self._next_request - loop.time()))
                self._next_request = loop.time() + self._gap
                if await self._send(self.time_series(batch, now)):
                    self._backoff.reset()
                    break
                await asyncio.sleep(self._backoff.next())
                if self._pending is not None:  # a newer snapshot supersedes the rest
                    self.stats.points_dropped += len(todo) - i
                    return
                self.stats.retries += 1

    def time_series(self, batch: Sequence[Point], now: float) -> list[Any]:
        """CreateTimeSeries' series for a batch of points at ``now``."""
        from google.cloud.monitoring_v3 import TimeSeries
        from google.protobuf.timestamp_pb2 import Timestamp

        end = Timestamp()
        end.FromNanoseconds(int(now * 1e9))
        start = Timestamp()
        start.FromNanoseconds(int(min(self._started, now - 0.001) * 1e9))
        out = []
        for p in batch:
            counter = p.kind == "counter"
            interval: dict[str, Timestamp] = {"end_time": end}
            if counter:
                interval["start_time"] = start
            out.append(TimeSeries(
                metric={"type": METRIC_TYPE.format(name=p.family), "labels": dict(p.labels)},
                resource=self._resource,
                metric_kind="CUMULATIVE" if counter else "GAUGE",
                value_type="DOUBLE",
                points=[{"interval": interval, "value": {"double_value": p.value}}]))
        return out

    async def _send(self, series: list[Any]) -> bool:
        """True when the request was answered (written, or refused for good)."""
        from google.api_core import exceptions

        try:
            await self._client.create_time_series(name=self._name, time_series=series,
                                                  timeout=self._timeout, retry=None)
        except exceptions.GoogleAPICallError as exc:
            if type(exc).__name__ in RETRYABLE:
                self.stats.up = False
                self._log_once(type(exc).__name__, "cloud monitoring write failed; retrying",
                               error=exc.message)
                return False
            self.stats.up = True
            self.stats.last_success = time.time()
            refused = _refused_points(exc, len(series))
            self.stats.points_refused += refused
            self.stats.points_written += len(series) - refused
            self._log_once(f"{type(exc).__name__}:{exc.message}",
                           "cloud monitoring refused points", error=exc.message,
                           points=refused)
            return True
        except TimeoutError:
            self.stats.up = False
            return False
        self.stats.up = True
        self.stats.last_success = time.time()
        self.stats.points_written += len(series)
        return True

    def _log_once(self, cause: str, event: str, **fields: object) -> None:
        if cause in self._logged:
            return
        self._logged.add(cause)
        log.warning(event, extra=ctx(project=self._name, **fields))


def _refused_points(exc: Any, sent: int) -> int:
    """Points a refused request did not write: from the partial-success summary that
    CreateTimeSeries attaches to its error, else all of them."""
    from google.cloud.monitoring_v3.types import CreateTimeSeriesSummary

    for detail in getattr(exc, "details", None) or ():
        if isinstance(detail, CreateTimeSeriesSummary.pb()):
            return max(0, min(sent, int(detail.total_point_count - detail.success_point_count)))
        if type(detail).__name__ == "Any" and detail.Is(CreateTimeSeriesSummary.pb().DESCRIPTOR):
            summary = CreateTimeSeriesSummary.pb()()
            detail.Unpack(summary)
            return max(0, min(sent, int(summary.total_point_count
                                       - summary.success_point_count)))
    return sent
