"""Running sums since start, the counters of ``/metrics``: GPU time, utilised time,
cost, energy and CO2e by owner group, per pod and per GPU (up and down), XID events, spot
interruptions, queue waits, the month's spend per team."""

from __future__ import annotations

import collections
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from exporter.model import compute
from exporter.model.records import Provisioning, State

KEEP_ENDED_PODS = 10_000
"""Pods gone from the cluster whose per-pod sums ``Totals`` keeps."""

QUEUE_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0,
                 28800.0, 43200.0, 86400.0, 172800.0, 345600.0, 604800.0)
"""Upper bounds of the queue-wait histogram: 5 s to 7 days (a notebook waits seconds, a
multi-node training job may wait days)."""


class GroupKey(NamedTuple):
    """Who GPU time and cost are summed by; the owner's parts are empty for time no pod
    holds (unallocated and unavailable GPUs: the pool's)."""

    state: State
    namespace: str
    team: str
    pool: str
    accelerator: str
    provisioning: Provisioning


@dataclass(slots=True)
class WaitHistogram:
    buckets: list[float] = field(default_factory=lambda: [0.0] * len(QUEUE_BUCKETS))
    count: float = 0.0
    total_seconds: float = 0.0

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(QUEUE_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1
        self.count += 1
        self.total_seconds += seconds


@dataclass(slots=True)
class Totals:
    """Running sums since start: the counters behind /metrics and the e2e checks."""

    gpu_seconds: dict[GroupKey, float] = field(default_factory=lambda: defaultdict(float))
    utilized_seconds: dict[GroupKey, float] = field(default_factory=lambda: defaultdict(float))
    cost_usd: dict[GroupKey, float] = field(default_factory=lambda: defaultdict(float))
    pod_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    pod_utilized: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    pod_cost: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    energy_joules: dict[GroupKey, float] = field(default_factory=lambda: defaultdict(float))
    """Energy by owner group, where known (``energy``)."""
    co2e_grams: dict[GroupKey, float] = field(default_factory=lambda: defaultdict(float))
    pod_joules: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    pod_co2e: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    gpu_joules: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    """(node, GPU UUID) -> the physical GPU's energy (its MIG instances' added up)."""
    energy_bases: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """GPU-intervals by where their energy came from (``energy.ENERGY_BASES``)."""
    up_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    down_seconds: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    interruptions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    xid_events: dict[tuple[str, str], int] = field(default_factory=dict)
    """(node, GPU UUID) -> times the GPU's last XID changed to a new code; 0 for every GPU
    seen, so a first event is an increase."""
    last_xid: dict[tuple[str, str], int] = field(default_factory=dict)
    month: str = ""
    """The UTC calendar month (``"2026-11"``) ``month_cost`` is of."""
    month_cost: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Team -> cost of its allocated GPUs this month: the warehouse's rows of the month
    from before this run, then this run's intervals (by the month each starts in)."""
    earlier_months: dict[tuple[str, str], float] = field(default_factory=dict)
    """(month, team) -> cost the warehouse held at start (``seed_months``), until the
    first cycle says which month it is."""
    allocation_cost: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Allocation value ("" for none) -> cost of the GPU time its pods held."""
    queue_hist: dict[tuple[str, str, str], WaitHistogram] = field(default_factory=dict)
    """Queue waits of scheduled pods by (namespace, team, GPU model), each pod once."""
    admission_hist: dict[tuple[str, str, str, str], WaitHistogram] = field(default_factory=dict)
    """Kueue admission waits by (ClusterQueue, LocalQueue, namespace, team), each
    admission once."""
    admitted: dict[str, float] = field(default_factory=dict)
    """Workload uid -> the admission last observed (a requeued one is admitted again)."""
    waited: set[str] = field(default_factory=set)
    ended: collections.deque[str] = field(default_factory=collections.deque)
    """Pods gone from the cluster, oldest first: the per-pod sums of the last
    ``KEEP_ENDED_PODS`` are kept, the older ones dropped."""

    def pod_ended(self, uid: str) -> None:
        self.ended.append(uid)
        while len(self.ended) > KEEP_ENDED_PODS:
            old = self.ended.popleft()
            for table in (self.pod_seconds, self.pod_utilized, self.pod_cost,
                          self.pod_joules, self.pod_co2e):
                table.pop(old, None)

    def observe_wait(self, uid: str, key: tuple[str, str, str], seconds: float) -> None:
        if uid in self.waited:
            return
        self.waited.add(uid)
        self.queue_hist.setdefault(key, WaitHistogram()).observe(seconds)

    def observe_admission(self, uid: str, admitted: float, key: tuple[str, str, str, str],
                          seconds: float) -> None:
        if self.admitted.get(uid) == admitted:
            return
        self.admitted[uid] = admitted
        self.admission_hist.setdefault(key, WaitHistogram()).observe(seconds)

    def add(self, rows: Sequence[compute.UsageRow]) -> None:
        if rows:
            self._month_of(rows[0].start)
        month = self.month_cost
        for r in rows:
            d, o = r.device, r.owner
            if d.state == "allocated" and r.cost_usd is not None and o is not None:
                month[o.team] += r.cost_usd
                self.allocation_cost[o.allocation] += r.cost_usd
            key = GroupKey(d.state, o.namespace if o else "", o.team if o else "", d.pool,
                           d.accelerator, d.provisioning)
            self.gpu_seconds[key] += r.seconds
            if r.utilized_seconds is not None:
                self.utilized_seconds[key] += r.utilized_seconds
            if r.cost_usd is not None:
                self.cost_usd[key] += r.cost_usd
            if r.joules is not None:
                self.energy_joules[key] += r.joules
                self.gpu_joules[(d.node, d.gpu_uuid)] += r.joules
                if r.co2e_grams is not None:
                    self.co2e_grams[key] += r.co2e_grams
            if o is not None and o.uid:
                self.pod_seconds[o.uid] += r.seconds
                if r.utilized_seconds is not None:
                    self.pod_utilized[o.uid] += r.utilized_seconds
                if r.cost_usd is not None:
                    self.pod_cost[o.uid] += r.cost_usd
                if r.joules is not None:
                    self.pod_joules[o.uid] += r.joules
                    if r.co2e_grams is not None:
                        self.pod_co2e[o.uid] += r.co2e_grams
            # availability per physical GPU: MIG instances add up to their GPU
            if d.state == "unavailable":
                self.down_seconds[(d.gpu_uuid, d.reason or "unknown")] += r.seconds
            else:
                self.up_seconds[d.gpu_uuid] += r.seconds

    def seed_months(self, earlier: Mapping[tuple[str, str], float]) -> None:
        """Go on from the cost of each (month, team) the warehouse held before this run:
        into this month's figure if the cycles have begun one, else kept for the first."""
        if not self.month:
            self.earlier_months = dict(earlier)
            return
        for (m, team), usd in earlier.items():
            if m == self.month:
                self.month_cost[team] += usd

    def _month_of(self, start: float) -> None:
        """Begin the month of an interval starting at ``start`` if it is a new one: from
        the warehouse's figures for it at the first cycle, from 0 on a change of month."""
        month = time.strftime("%Y-%m", time.gmtime(start))
        if month == self.month:
            return
        first = not self.month
        self.month = month
        self.month_cost = defaultdict(float)
        if first:
            for (m, team), usd in self.earlier_months.items():
                if m == month:
                    self.month_cost[team] += usd
        self.earlier_months = {}
