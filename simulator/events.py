"""Kubernetes Events of the simulated cluster (``core/v1`` ``Event``), written to the API
store as the components that say them write them.

Two ways of recording, as in client-go:

- ``record.EventRecorder`` (kubelet, cluster-autoscaler): an event like one already
  recorded (same object, reason, message and source) updates it, ``count`` + 1 and
  ``lastTimestamp`` now, instead of making a new object.
- ``events.k8s.io/v1`` (kube-scheduler): the first occurrence has ``eventTime`` and no
  ``firstTimestamp``/``lastTimestamp``/``count``; the second adds ``series`` (count 2, last
  observed time); later ones are counted and written with the broadcaster's heartbeat
  (every 30 minutes). A series not observed for 6 minutes is finished: the next
  occurrence starts a new Event.

The API server deletes every Event ``ttl`` after it was last written (``--event-ttl``, 1 h),
so the events of a deleted pod are gone an hour after the last one. The message formats
of each component are here too, next to the recorder that writes them.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from exporter.model.selectors import SelectorError
from simulator.rng import key, uuid_str
from simulator.store import ApiStore

Obj = dict[str, Any]
SCHEDULER = "default-scheduler"
AUTOSCALER = "cluster-autoscaler"
KUBELET = "kubelet"
EVENT_TTL = 3600.0
SERIES_HEARTBEAT = 1800.0
SERIES_FINISH = 360.0


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def go_duration(seconds: float) -> str:
    """A duration as Go's ``time.Duration`` prints it: ``45s``, ``2m0s``, ``1h2m3.5s``."""
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s = f"{ms / 1000:.3f}".rstrip("0").rstrip(".")
    if h:
        return f"{h}h{m}m{s}s"
    return f"{m}m{s}s" if m else f"{s}s"


@dataclass(frozen=True, slots=True)
class Involved:
    """The object an event is about (``involvedObject``)."""

    kind: str
    namespace: str
    name: str
    uid: str
    field_path: str | None = None
    """``spec.containers{main}`` for what the kubelet says of a container."""


@dataclass(slots=True)
class _Recorded:
    """One Event object and what its recorder knows of it."""

    name: str
    involved: Involved
    reason: str
    message: str
    type: str
    component: str
    host: str | None
    first: float
    last: float
    count: int = 1
    written_count: int = 0
    written_at: float = 0.0


class EventLog:
    """The cluster's Events: recorded, deduplicated, refreshed and expired."""

    kept = True
    """Whether it keeps what it is told: a caller need not word an Event for a log that
    keeps none."""

    def __init__(self, store: ApiStore, seed: int, scheduler_instance: str,
                 ttl: float = EVENT_TTL) -> None:
        self.store = store
        self.seed = seed
        self.scheduler_instance = scheduler_instance
        """The scheduler's ``reportingInstance`` (``default-scheduler-<its host>``)."""
        self.ttl = ttl
        self._unwritten: dict[str, _Recorded] = {}
        """Scheduler series counted since their last write."""
        self._by_key: dict[tuple[str, str, str, str, str], _Recorded] = {}
        self._by_name: dict[str, _Recorded] = {}
        self._expiry: list[tuple[float, str]] = []
        self._serial = 0

    def record(self, involved: Involved, reason: str, message: str, *, component: str,
               now: float, warning: bool = False, host: str | None = None) -> None:
        """One occurrence of an event, said by ``component`` (on node ``host``)."""
        etype = "Warning" if warning else "Normal"
        k = (involved.uid, reason, message, component, etype)
        rec: _Recorded | None = self._by_key.get(k)
        series = component == SCHEDULER
        if rec is not None and series and now - rec.last > SERIES_FINISH:
            if rec.name in self._unwritten:  # the series is finished: its last count
                self._write(rec, now)
            rec = None  # and a new Event
        if rec is None:
            self._serial += 1
            name = f"{involved.name}.{int(now * 1e9) + self._serial:x}"
            rec = _Recorded(name, involved, reason, message, etype, component, host, now, now)
            self._by_key[k] = self._by_name[name] = rec
            self._write(rec, now)
            return
        rec.count += 1
        rec.last = now
        if not series or rec.written_count < 2:
            self._write(rec, now)
        else:
            self._unwritten[rec.name] = rec

    def tick(self, now: float) -> None:
        """The scheduler's heartbeat for its series, then the API server's TTL."""
        for due in [r for r in self._unwritten.values()
                    if now - r.written_at >= SERIES_HEARTBEAT - 1e-9
                    or now - r.last > SERIES_FINISH]:
            self._write(due, now)
        while self._expiry and self._expiry[0][0] <= now + 1e-9:
            at, name = heapq.heappop(self._expiry)
            rec = self._by_name.get(name)
            if rec is None or rec.written_at + self.ttl > at + 1e-9:
                continue  # written again since: a later expiry stands
            del self._by_name[name]
            self._unwritten.pop(name, None)
            k = (rec.involved.uid, rec.reason, rec.message, rec.component, rec.type)
            if self._by_key.get(k) is rec:
                del self._by_key[k]
            self.store.delete("Event", f"{rec.involved.namespace}/{name}")

    def objects(self) -> list[Obj]:
        """The Events the API serves now."""
        return self.store.list_objects("Event")

    def _write(self, rec: _Recorded, now: float) -> None:
        self._unwritten.pop(rec.name, None)
        rec.written_count = rec.count
        rec.written_at = now
        self.store.put("Event", self._object(rec))
        heapq.heappush(self._expiry, (now + self.ttl, rec.name))

    def _object(self, rec: _Recorded) -> Obj:
        inv = rec.involved
        involved: Obj = {"apiVersion": "v1", "kind": inv.kind, "namespace": inv.namespace,
                         "name": inv.name, "uid": inv.uid}
        if inv.field_path:
            involved["fieldPath"] = inv.field_path
        obj: Obj = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": rec.name, "namespace": inv.namespace,
                         "uid": uuid_str(self.seed, key("event/" + rec.name)),
                         "creationTimestamp": _time(rec.first)},
            "involvedObject": involved, "reason": rec.reason, "message": rec.message,
            "type": rec.type, "reportingComponent": rec.component,
            "reportingInstance": rec.host or "",
        }
        if rec.component == SCHEDULER:  # events.k8s.io/v1, as the core API shows it
            obj |= {"source": {}, "firstTimestamp": None, "lastTimestamp": None,
                    "eventTime": _micro_time(rec.first), "action": "Scheduling",
                    "reportingInstance": self.scheduler_instance}
            if rec.written_count > 1:
                obj["series"] = {"count": rec.written_count,
                                 "lastObservedTime": _micro_time(rec.last)}
            return obj
        source: Obj = {"component": rec.component}
        if rec.host:
            source["host"] = rec.host
        return obj | {"source": source, "firstTimestamp": _time(rec.first),
                      "lastTimestamp": _time(rec.last), "count": rec.count, "eventTime": None}


# ------------------------------------------------------------------ the API's selectors

FIELDS = {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
          "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.fieldPath",
          "reason", "reportingComponent", "source", "type", "metadata.name",
          "metadata.namespace"}
"""The fields the API server lets a selector of Events name."""
_TERM = re.compile(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(\S*)\s*$")


def _field(obj: Obj, path: str) -> str:
    if path == "source":
        return str((obj.get("source") or {}).get("component") or "")
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def field_selector(selector: str | None) -> Callable[[Obj], bool]:
    """A ``fieldSelector`` over Events (``involvedObject.kind=Pod,type=Warning``)."""
    tests: list[tuple[str, str, bool]] = []
    for term in (selector or "").split(","):
        if not term.strip():
            continue
        m = _TERM.match(term)
        if m is None:
            raise SelectorError(f"invalid field selector: {term.strip()!r}")
        if m.group(1) not in FIELDS:
            raise SelectorError(f'field label not supported: "{m.group(1)}"')
        tests.append((m.group(1), m.group(3), m.group(2) == "!="))
    return lambda obj: all((_field(obj, path) == value) != negate
                           for path, value, negate in tests)


# ------------------------------------------------------------------ what each one says


def pulling(image: str) -> str:
    """The kubelet's ``Pulling`` message."""
    return f'Pulling image "{image}"'


def pulled(image: str, seconds: float, size_bytes: int) -> str:
    """The kubelet's ``Pulled`` message for an image it pulled in ``seconds``."""
    took = go_duration(seconds)
    return (f'Successfully pulled image "{image}" in {took} ({took} including waiting). '
            f"Image size: {size_bytes} bytes.")


def scheduled(namespace: str, pod: str, node: str) -> str:
    """kube-scheduler's ``Scheduled`` message."""
    return f"Successfully assigned {namespace}/{pod} to {node}"


class SilentLog(EventLog):
    """The Events of a cluster no one watches (``Cluster(headless=True)``): none kept."""

    kept = False

    def record(self, involved: Involved, reason: str, message: str, *, component: str,
               now: float, warning: bool = False, host: str | None = None) -> None:
        return None

    def tick(self, now: float) -> None:
        return None
