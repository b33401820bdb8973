"""What went wrong with the GPUs: each GPU unavailable now (an open incident, from its
start until it is back), the XID events DCGM reports, spot preemptions by pool."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from exporter.model import compute
from exporter.model.records import NodeInfo, PodInfo
from exporter.model.totals import Totals


class Ended(NamedTuple):
    """An incident that ended: the warehouse's ``availability_events`` row."""

    node: str
    pool: str
    gpu_uuid: str
    reason: str
    start: float
    end: float


class Incidents:
    """Open incidents, XID events and spot preemptions since start."""

    def __init__(self, totals: Totals,
                 open_incidents: dict[tuple[str, str], tuple[float, str, str]] | None = None
                 ) -> None:
        self.totals = totals
        self.open: dict[tuple[str, str], tuple[float, str, str]] = open_incidents or {}
        """(GPU UUID, reason) -> (start, node, pool) of each GPU now unavailable."""
        self._preempted: set[str] = set()
        """Pods whose spot preemption is counted."""
        self._pool_of: dict[str, str] = {}
        """Node -> pool, kept after the node is gone (a preempted node's pods outlive it)."""

    def xids(self, states: Sequence[compute.DeviceState]) -> None:
        """DCGM reports a GPU's last XID: a change to a new code is one more event."""
        events, last = self.totals.xid_events, self.totals.last_xid
        for d in states:
            key = (d.node, d.gpu_uuid)
            events.setdefault(key, 0)
            xid = d.fields.get(compute.XID)
            if xid is None:
                continue
            code = int(xid)
            if code and last.get(key, 0) != code:
                events[key] += 1
            last[key] = code

    def update(self, states: Sequence[compute.DeviceState], nodes: Mapping[str, NodeInfo],
               unknown: frozenset[str], now: float) -> list[Ended]:
        """Open an incident when a GPU becomes unavailable; close it when it is back. The
        incidents that ended."""
        down = {(d.gpu_uuid, d.reason or ""): d for d in states if d.state == "unavailable"}
        for key, d in down.items():
            self.open.setdefault(key, (now, d.node, d.pool))
        reported = {d.node for d in states}
        ended: list[Ended] = []
        for gone in [k for k in self.open if k not in down]:
            start, node, pool = self.open[gone]
            if node in unknown or (node in nodes and node not in reported):
                continue  # cannot tell yet: no answer covered its node this cycle
            del self.open[gone]
            gpu_uuid, reason = gone
            ended.append(Ended(node, pool, gpu_uuid, reason, start, now))
        return ended

    def learn_pools(self, nodes: Iterable[NodeInfo]) -> None:
        self._pool_of.update((n.name, n.pool) for n in nodes)

    def preempted(self, pod: PodInfo) -> None:
        """Count a spot preemption once per pod: when it is seen terminated, or gone."""
        if pod.reason == "Terminated" and pod.phase == "Failed" and \
                pod.uid not in self._preempted:
            self._preempted.add(pod.uid)
            self.totals.interruptions[self._pool_of.get(pod.node or "", "")] += 1

    def pod_gone(self, pod: PodInfo) -> None:
        self.preempted(pod)
        self._preempted.discard(pod.uid)

    def forget_pools(self, nodes: Mapping[str, NodeInfo], pods: Iterable[PodInfo]) -> None:
        """The pool of a node neither live nor named by a pod is forgotten."""
        named = {p.node for p in pods}
        self._pool_of = {n: p for n, p in self._pool_of.items() if n in nodes or n in named}
