"""The simulated API server's object store: current objects plus a bounded event history.

Resource versions are one cluster-wide, strictly increasing counter, as etcd's revision is.
A watch from a version older than the retained history is answered with 410 Gone, which
is what makes clients relist. No I/O here: the HTTP layer subscribes with ``listen``.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


class Expired(Exception):
    """The requested resource version is older than the retained history (HTTP 410)."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


@dataclass(frozen=True, slots=True)
class Event:
    rv: int
    kind: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj


def object_key(obj: Obj) -> str:
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else meta["name"]


class ApiStore:
    """Objects by kind and key, and the last ``history`` events, oldest first."""

    def __init__(self, history: int = 20000) -> None:
        self._objects: dict[str, dict[str, Obj]] = {}
        self._events: deque[Event] = deque(maxlen=history)
        self._rv = 0
        self._compacted_at = 0
        self._last: dict[str, int] = {}
        self._listeners: list[Callable[[Event], None]] = []

    @property
    def resource_version(self) -> int:
        return self._rv

    def listen(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``callback`` with every event from now on; returns the unsubscribe function."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    def put(self, kind: str, obj: Obj) -> None:
        """Create or replace an object; stamps its resourceVersion."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        objects = self._objects.setdefault(kind, {})
        key = object_key(obj)
        etype = "MODIFIED" if key in objects else "ADDED"
        objects[key] = obj
        self._record(Event(self._rv, kind, etype, obj))

    def delete(self, kind: str, key: str) -> None:
        obj = self._objects.get(kind, {}).pop(key, None)
        if obj is None:
            return
        self._rv += 1
        final = copy.copy(obj)
        final["metadata"] = {**obj["metadata"], "resourceVersion": str(self._rv)}
        self._record(Event(self._rv, kind, "DELETED", final))

    def _record(self, event: Event) -> None:
        self._events.append(event)
        self._last[event.kind] = event.rv
        for listener in list(self._listeners):
            listener(event)

    def last_version(self, kind: str) -> int:
        """The resourceVersion of the latest event of ``kind`` (0 if none retained)."""
        return self._last.get(kind, 0)

    def get(self, kind: str, key: str) -> Obj | None:
        return self._objects.get(kind, {}).get(key)

    def list_objects(self, kind: str) -> list[Obj]:
        """Current objects of ``kind``, ordered by key (namespace, then name)."""
        objects = self._objects.get(kind, {})
        return [objects[k] for k in sorted(objects)]

    @property
    def oldest_resource_version(self) -> int:
        """The oldest version a watch may start from."""
        return self._events[0].rv - 1 if self._events else max(self._compacted_at, self._rv)

    def events_since(self, kind: str, rv: int) -> list[Event]:
        """Events of ``kind`` after ``rv``; raises ``Expired`` if history no longer reaches it."""
        oldest = self.oldest_resource_version
        if rv < oldest:
            raise Expired(rv, oldest)
        return [e for e in self._events if e.rv > rv and e.kind == kind]

    def compact(self) -> None:
        """Forget all history (as etcd compaction does): older watches get 410."""
        self._events.clear()
        self._compacted_at = self._rv
