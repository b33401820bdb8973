"""An in-process Cloud Monitoring MetricService over real gRPC, for the two methods the
exporter calls. Google's API cannot be reached from the tests; this server answers with the
shapes Google documents (tests/fixtures/cloud_monitoring/README.md says where each comes
from) and enforces the documented rules a client can break:

ListTimeSeries: the filter names exactly one metric type (``metric.type = "..."``, joined by
``AND`` with ``resource.type`` and ``resource.labels.*`` equalities); only points inside the
interval are returned, newest first; ``page_size`` counts points (view FULL) and a page
token continues.

CreateTimeSeries: at most 200 series a request, one point each; a GAUGE point has no start
time (or start = end), a CUMULATIVE one starts before it ends and keeps its start; points of
one series come in time order, at least ``min_gap`` seconds apart. Series that break a rule
are refused and the rest written; the error is INVALID_ARGUMENT carrying a
CreateTimeSeriesSummary, as Google's is.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.cloud.monitoring_v3.types import (
    CreateTimeSeriesRequest,
    CreateTimeSeriesSummary,
    ListTimeSeriesRequest,
    ListTimeSeriesResponse,
    TimeSeries,
)
from google.protobuf import any_pb2, empty_pb2, json_format
from google.rpc import status_pb2

from tests.grpc_fake import serve, unary

SERVICE = "google.monitoring.v3.MetricService"
_TERM = re.compile(r'\s*(metric\.type|resource\.type|resource\.labels\.(\w+))\s*=\s*"([^"]*)"\s*')
MAX_SERIES_PER_CREATE = 200


def series_from_json(path: Path) -> list[Any]:
    """Raw TimeSeries from a file holding a ListTimeSeries response in its JSON form."""
    response = ListTimeSeriesResponse.pb()()
    json_format.Parse(path.read_text(), response)
    return list(response.time_series)


def _seconds(ts: Any) -> float:
    return float(ts.seconds) + ts.nanos / 1e9


def _key(series: Any) -> tuple[Any, ...]:
    return (series.metric.type, tuple(sorted(series.metric.labels.items())),
            series.resource.type, tuple(sorted(series.resource.labels.items())))


@dataclass
class FakeMetricService:
    series: list[Any] = field(default_factory=list)
    """What ListTimeSeries serves: raw TimeSeries with their points."""
    page_points: int = 100_000
    """The server's own cap on points per page (Google's is 100,000)."""
    min_gap: float = 10.0
    list_errors: list[grpc.StatusCode] = field(default_factory=list)
    """Codes the next ListTimeSeries calls fail with, in order."""
    create_errors: list[grpc.StatusCode] = field(default_factory=list)
    """Codes the next CreateTimeSeries calls fail with (nothing written), in order."""
    refuse: set[str] = field(default_factory=set)
    """Metric types whose series are refused (as a bad descriptor would be)."""
    written: dict[tuple[Any, ...], list[Any]] = field(default_factory=dict)
    """Series key -> points written, in order."""
    creates: list[tuple[float, int]] = field(default_factory=list)
    """(monotonic time, series count) of every CreateTimeSeries call."""
    lists: list[str] = field(default_factory=list)
    """Filters of every ListTimeSeries call."""

    def add(self, series: Iterable[Any]) -> None:
        self.series.extend(series)

    # ------------------------------------------------------------------ ListTimeSeries

    async def list_time_series(self, request: Any, context: grpc.aio.ServicerContext
                               ) -> Any:
        self.lists.append(request.filter)
        if self.list_errors:
            await context.abort(self.list_errors.pop(0), "injected failure")
        terms = request.filter.split(" AND ")
        wanted: dict[str, str] = {}
        for term in terms:
            m = _TERM.fullmatch(term)
            if m is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"Could not parse filter term: {term}")
            assert m is not None
            wanted[m.group(1)] = m.group(3)
        if "metric.type" not in wanted:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "A filter must specify a single metric type.")
        start, end = _seconds(request.interval.start_time), _seconds(request.interval.end_time)
        matched = []
        for s in self.series:
            labels = dict(s.resource.labels)
            if s.metric.type != wanted["metric.type"] or \
                    wanted.get("resource.type", s.resource.type) != s.resource.type or \
                    any(labels.get(k.removeprefix("resource.labels.")) != v
                        for k, v in wanted.items() if k.startswith("resource.labels.")):
                continue
            points = sorted((p for p in s.points
                             if start < _seconds(p.interval.end_time) <= end),
                            key=lambda p: -_seconds(p.interval.end_time))
            if points:
                out = type(s)()
                out.CopyFrom(s)
                del out.points[:]
                out.points.extend(points)
                matched.append(out)
        offset = int(request.page_token or 0)
        budget = min(request.page_size or self.page_points, self.page_points)
        response = ListTimeSeriesResponse.pb()()
        i = offset
        while i < len(matched) and (i == offset or budget >= len(matched[i].points)):
            response.time_series.append(matched[i])
            budget -= len(matched[i].points)
            i += 1
        if i < len(matched):
            response.next_page_token = str(i)
        return response

    # ------------------------------------------------------------------ CreateTimeSeries

    async def create_time_series(self, request: Any, context: grpc.aio.ServicerContext
                                 ) -> Any:
        self.creates.append((time.monotonic(), len(request.time_series)))
        if self.create_errors:
            await context.abort(self.create_errors.pop(0), "injected failure")
        if len(request.time_series) > MAX_SERIES_PER_CREATE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"Too many time series: at most {MAX_SERIES_PER_CREATE}")
        refused: list[str] = []
        for s in request.time_series:
            why = self._check(s)
            if why:
                refused.append(why)
                continue
            self.written.setdefault(_key(s), []).append(s.points[0])
        if refused:
            summary = CreateTimeSeriesSummary.pb()(
                total_point_count=len(request.time_series),
                success_point_count=len(request.time_series) - len(refused))
            detail = any_pb2.Any()
            detail.Pack(summary)
            status = status_pb2.Status(
                code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                message=f"One or more TimeSeries could not be written: {refused[0]}",
                details=[detail])
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, status.message,
                                trailing_metadata=(("grpc-status-details-bin",
                                                    status.SerializeToString()),))
        return empty_pb2.Empty()

    def _check(self, s: Any) -> str:
        if len(s.points) != 1:
            return "exactly one point per time series"
        if s.metric.type in self.refuse:
            return f"metric type {s.metric.type} refused"
        if not s.metric.type.startswith("custom.googleapis.com/"):
            return f"not a custom metric type: {s.metric.type}"
        kind = TimeSeries.pb().DESCRIPTOR.fields_by_name["metric_kind"].enum_type \
            .values_by_number[s.metric_kind].name
        p = s.points[0]
        start, end = _seconds(p.interval.start_time), _seconds(p.interval.end_time)
        if kind == "GAUGE" and p.interval.HasField("start_time") and start != end:
            return "a GAUGE point's start time must equal its end time"
        if kind == "CUMULATIVE" and not start < end:
            return "a CUMULATIVE point must start before it ends"
        if kind not in ("GAUGE", "CUMULATIVE"):
            return f"metric kind {kind} cannot be written"
        before = self.written.get(_key(s))
        if before:
            last = before[-1]
            if end - _seconds(last.interval.end_time) < self.min_gap:
                return ("One or more points were written more frequently than the maximum "
                        "sampling period configured for the metric")
            if kind == "CUMULATIVE" and start != _seconds(last.interval.start_time):
                return "a CUMULATIVE series keeps its start time"
        return ""

    # ------------------------------------------------------------------ serving

    async def start(self) -> tuple[grpc.aio.Server, str]:
        """Serve on a free loopback port; returns the server and its ``host:port``."""
        return await serve(SERVICE, {
            "ListTimeSeries": unary(self.list_time_series, ListTimeSeriesRequest),
            "CreateTimeSeries": unary(self.create_time_series, CreateTimeSeriesRequest)})
