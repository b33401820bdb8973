"""Push the exporter's series to a Prometheus remote-write 1.0 receiver.

Each cycle's series (``families.series``: those ``/metrics`` shows) become one
WriteRequest (protobuf, snappy block format) with the cycle's timestamp; a series that
disappears gets a staleness marker, so a receiver stops showing it at once. Requests wait
in a bounded queue (the oldest dropped and counted when it is full); 5xx and 429 answers
are retried with capped backoff, other 4xx never (the request is dropped and counted: the
receiver will not take it however often it is sent). Timestamps are strictly increasing
per series.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from typing import Any

import aiohttp
import cramjam
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from exporter.backoff import Backoff
from exporter.logs import ctx
from exporter.metrics.families import MetricsView, series
from exporter.metrics.health import RemoteWriteStats

log = logging.getLogger(__name__)

STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
"""Prometheus' staleness marker: a NaN with this exact bit pattern."""


def _messages() -> tuple[Any, ...]:
    """remote.proto's WriteRequest, TimeSeries, Label, Sample (remote-write 1.0)."""
    f = descriptor_pb2.FileDescriptorProto(name="gke_gpu_remote.proto", package="prometheus",
                                           syntax="proto3")
    scalar = descriptor_pb2.FieldDescriptorProto
    for name, fields in (("Label", [("name", 1, scalar.TYPE_STRING, None),
                                    ("value", 2, scalar.TYPE_STRING, None)]),
                         ("Sample", [("value", 1, scalar.TYPE_DOUBLE, None),
                                     ("timestamp", 2, scalar.TYPE_INT64, None)]),
                         ("TimeSeries", [("labels", 1, scalar.TYPE_MESSAGE, ".prometheus.Label"),
                                         ("samples", 2, scalar.TYPE_MESSAGE,
                                          ".prometheus.Sample")]),
                         ("WriteRequest", [("timeseries", 1, scalar.TYPE_MESSAGE,
                                            ".prometheus.TimeSeries")])):
        m = f.message_type.add(name=name)
        for fname, number, ftype, type_name in fields:
            field = m.field.add(name=fname, number=number, type=ftype,
                                label=scalar.LABEL_REPEATED if type_name else
                                scalar.LABEL_OPTIONAL)
            if type_name:
                field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prometheus.{n}"))
                 for n in ("WriteRequest", "TimeSeries", "Label", "Sample"))


WriteRequest, TimeSeries, Label, Sample = _messages()


SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
"""A series' name and labels (name-value pairs, empty labels left out)."""


def _series(key: SeriesKey, value: float, ts_ms: int) -> Any:
    name, labels = key
    ts = TimeSeries()
    ts.labels.add(name="__name__", value=name)
    for k, v in sorted(labels):
        ts.labels.add(name=k, value=v)
    ts.samples.add(value=value, timestamp=ts_ms)
    return ts


class RemoteWriter:
    def __init__(self, session: aiohttp.ClientSession, url: str, queue_size: int = 60,
                 timeout: float = 30.0, backoff: Backoff | None = None) -> None:
        self._session = session
        self.url = url
        self._timeout = timeout
        self._queue: collections.deque[bytes] = collections.deque()
        self._queue_size = queue_size
        self._backoff = backoff or Backoff(base=0.5, cap=30.0)
        self._last: dict[SeriesKey, float] = {}
        self._last_ts = 0
        self._wake = asyncio.Event()
        self.stats = RemoteWriteStats()

    def add_cycle(self, view: MetricsView, now: float) -> None:
        """Queue one cycle's series at ``now`` (seconds), with staleness markers for the
        series the previous cycle had and this one has not."""
        ts = max(int(now * 1000), self._last_ts + 1)  # strictly increasing
        current = {(s.name, s.labels): s.value for s in series(view)}
        req = WriteRequest()
        for key, value in current.items():
            req.timeseries.append(_series(key, value, ts))
        for key in self._last.keys() - current.keys():
            req.timeseries.append(_series(key, STALE_NAN, ts))
        self._last, self._last_ts = current, ts
        if len(self._queue) >= self._queue_size:
            self._queue.popleft()
            self.stats.requests_dropped += 1
            log.warning("remote write queue full: oldest request dropped",
                        extra=ctx(url=self.url, queue_size=self._queue_size))
        self._queue.append(bytes(cramjam.snappy.compress_raw(req.SerializeToString())))
        self.stats.queued = len(self._queue)
        self._wake.set()

    async def run(self) -> None:
        """Send queued requests in order until cancelled."""
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            outcome = await self._send(self._queue[0])
            if outcome == "retry":
                self.stats.retries += 1
                await asyncio.sleep(self._backoff.next())
                continue
            self._backoff.reset()
            self._queue.popleft()
            self.stats.queued = len(self._queue)
            if outcome == "sent":
                self.stats.requests_sent += 1
            else:
                self.stats.requests_dropped += 1

    async def _send(self, body: bytes) -> str:
        headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
                   "X-Prometheus-Remote-Write-Version": "0.1.0"}
        try:
            async with asyncio.timeout(self._timeout), self._session.post(
                    self.url, data=body, headers=headers) as resp:
                if resp.status < 300:
                    return "sent"
                if resp.status == 429 or resp.status >= 500:
                    return "retry"
                log.warning("remote write refused: request dropped", extra=ctx(
                    url=self.url, status=resp.status, answer=(await resp.text())[:200]))
                return "dropped"
        except (TimeoutError, aiohttp.ClientError):
            return "retry"
