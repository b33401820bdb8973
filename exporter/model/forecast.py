"""When each waiting pod or Kueue Workload is expected to start: the live queue played
forward from now, event by event, with no I/O and no clock (``expected_starts``).

What the forward play holds, from ``now`` on:

- **Running pods** end at their expected end (``Busy.ends``: the run-time history of pods
  like them, ``exporter.runtime.forecasts``), freeing their GPUs and their Workload's quota.
- **The queue** is tried in the scheduler's order (priority, highest first, then the
  oldest) at every event that frees or adds room. A Kueue Workload first needs its
  ClusterQueue's quota (what is unused of its nominal quota, then of its cohort's, up to its
  borrowing limit) and holds it from then on; then every one of its pods needs a node at
  once. A pod goes to the fitting node with the fewest free GPUs that still take it (best
  fit). A pod already bound to a node (its containers starting) starts now.
- **The autoscaler**: a unit no node can take, and no node on its way either, grows a pool
  it fits (the one whose node it fills best, then by name) by the nodes it needs, up to the
  pool's maximum, ready ``PoolBounds.scale_up_seconds`` later. A pool stocking out, or
  whose maximum is unknown, grows no further than it is.
- **What starts** runs for its expected run time (``Queued.runs_seconds``), then frees its
  room for the units behind it.

It leaves out what it cannot know: jobs not submitted yet, preemption (a higher priority
arriving later), faults, and when a stockout ends. A unit that does not start within
``horizon_seconds`` has no expected start.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from exporter.model.pending import fits
from exporter.model.records import NodeInfo, PodConstraints

Basis = Literal["starting", "forecast", "beyond_horizon", "no_room"]
"""How an expected start was found: the pod is bound to a node and its containers start
(now); the forward play started it; it had not started when the play reached its horizon;
no node nor pool it fits exists, or its ClusterQueue's quota could never hold it."""
BASES: tuple[Basis, ...] = ("starting", "forecast", "beyond_horizon", "no_room")
HORIZON_SECONDS = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class Busy:
    """A running pod: where, how many GPUs, until when it is expected to run."""

    node: str
    gpus: int
    ends: float
    """Unix seconds."""
    quota: str | None = None
    """The ClusterQueue its Workload holds quota in (Kueue), if any."""


@dataclass(frozen=True, slots=True)
class Queued:
    """A waiting pod, or a Kueue Workload with no pod yet."""

    uid: str
    pods: int
    gpus_per_pod: int
    constraints: PodConstraints
    priority: int
    since: float
    """When it joined the queue (Unix seconds): the tie-break among equal priorities."""
    runs_seconds: float | None
    """How long it is expected to run once started; None: for longer than the horizon."""
    bound: bool = False
    """Already on a node (``PodScheduled``): it starts now."""
    quota: str | None = None
    """The ClusterQueue whose quota it needs before its pods may be placed; None: none (a
    pod of an admitted Workload, or no Kueue)."""
    expected: bool = False
    """Not submitted yet: work expected to arrive at ``since`` (it competes, it is not
    answered for)."""
    holds: str | None = None
    """The ClusterQueue whose quota its Workload already holds (a pod of an admitted
    Workload): freed when it ends."""

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


@dataclass(frozen=True, slots=True)
class PoolBounds:
    """What a pool may grow to."""

    shape: NodeInfo
    """A node of it: what a scale-up adds."""
    max_nodes: int | None
    """None: unknown (it grows no further than it is)."""
    scale_up_seconds: float
    stocking_out: bool = False


@dataclass(frozen=True, slots=True)
class Quota:
    """A ClusterQueue's GPU quota (all its flavors together)."""

    nominal_gpus: float
    used_gpus: float
    borrowing_limit_gpus: float | None = None
    """None: as much as its cohort leaves unused."""
    cohort: str = ""


@dataclass(frozen=True, slots=True)
class Expected:
    start: float | None
    """Unix seconds; None when it was not found to start (``basis``)."""
    basis: Basis


@dataclass(frozen=True, slots=True)
class Forecast:
    """The last forecast: each waiting unit's expected start, when it was made, its CPU."""

    starts: Mapping[str, Expected] = field(default_factory=dict)
    made_unix: float | None = None
    cpu_seconds: float = 0.0
    assumed_runs: int = 0
    """Running pods whose remaining time had no history (taken as long again)."""

    def counts(self) -> dict[Basis, int]:
        out: dict[Basis, int] = dict.fromkeys(BASES, 0)
        for e in self.starts.values():
            out[e.basis] += 1
        return out


@dataclass(slots=True)
class _Node:
    info: NodeInfo
    free: int
    ready: float


@dataclass(slots=True)
class _Play:
    """The forward play's state."""

    nodes: dict[str, _Node]
    pools: Mapping[str, PoolBounds]
    quotas: Mapping[str, Quota]
    used: dict[str, float]
    """ClusterQueue -> GPUs of quota held."""
    counts: Mapping[str, int]
    """Pool -> its nodes now."""
    added: dict[str, int] = field(default_factory=dict)
    """Pool -> nodes the play added."""
    events: list[tuple[float, int, str, int, str | None]] = field(default_factory=list)
    """(time, order, node, GPUs freed, quota freed): ends and new nodes."""
    fitting: dict[tuple[object, int], tuple[PodConstraints, int, list[str]]] = field(
        default_factory=dict)
    """A pod shape -> the nodes it fits."""

    def push(self, t: float, node: str, gpus: int, quota: str | None) -> None:
        heapq.heappush(self.events, (t, len(self.events), node, gpus, quota))

    def candidates(self, constraints: PodConstraints, per_pod: int) -> list[str]:
        """The nodes (now and to come) such a pod fits."""
        key = (_key(constraints), per_pod)
        found = self.fitting.get(key)
        if found is None:
            found = self.fitting[key] = (constraints, per_pod, [
                n for n, s in self.nodes.items() if fits(constraints, per_pod, s.info)])
        return found[2]

    def quota_room(self, cq: str) -> float:
        """GPUs of quota ``cq`` may still take: up to its nominal quota and borrowing limit,
        within what its cohort leaves unused."""
        q = self.quotas.get(cq)
        if q is None:
            return math.inf
        cap = q.nominal_gpus + (math.inf if q.borrowing_limit_gpus is None
                                else q.borrowing_limit_gpus)
        own = cap - self.used.get(cq, 0.0)
        if not q.cohort:
            return min(own, q.nominal_gpus - self.used.get(cq, 0.0))
        cohort = [name for name, o in self.quotas.items() if o.cohort == q.cohort]
        spare = sum(self.quotas[n].nominal_gpus - self.used.get(n, 0.0) for n in cohort)
        return min(own, spare)

    def place(self, item: Queued, t: float) -> list[str] | None:
        """Nodes for each of its pods, ready by ``t`` (best fit); None if not all fit."""
        names = self.candidates(item.constraints, item.gpus_per_pod)
        taken: dict[str, int] = {}
        out = []
        for _ in range(item.pods):
            best, best_free = None, 0
            for n in names:
                s = self.nodes[n]
                free = s.free - taken.get(n, 0)
                if s.ready <= t and free >= item.gpus_per_pod and (
                        best is None or free < best_free):
                    best, best_free = n, free
            if best is None:
                return None
            taken[best] = taken.get(best, 0) + item.gpus_per_pod
            out.append(best)
        return out

    def on_the_way(self, item: Queued, t: float, claimed: dict[str, int]) -> bool:
        """Whether nodes not ready yet would take it (claiming their room)."""
        need = item.pods
        took: dict[str, int] = {}
        for n in self.candidates(item.constraints, item.gpus_per_pod):
            s = self.nodes[n]
            if s.ready <= t:
                continue
            free = s.free - claimed.get(n, 0)
            while need and free >= item.gpus_per_pod:
                free -= item.gpus_per_pod
                took[n] = took.get(n, 0) + item.gpus_per_pod
                need -= 1
        if need:
            return False
        for n, g in took.items():
            claimed[n] = claimed.get(n, 0) + g
        return True

    def grow(self, item: Queued, t: float, claimed: dict[str, int]) -> bool:
        """Add nodes of the pool it fits best for it, if one may grow: ready later."""
        best: tuple[int, str] | None = None
        for name, b in self.pools.items():
            if b.stocking_out or b.max_nodes is None or b.shape.allocatable_gpus <= 0:
                continue
            if not fits(item.constraints, item.gpus_per_pod, b.shape):
                continue
            per_node = b.shape.allocatable_gpus // item.gpus_per_pod
            need = math.ceil(item.pods / per_node)
            count = self.counts.get(name, 0) + self.added.get(name, 0)
            if count + need > b.max_nodes:
                continue
            waste = per_node * need * item.gpus_per_pod - item.gpus
            waste += b.shape.allocatable_gpus * need - per_node * need * item.gpus_per_pod
            if best is None or (waste, name) < best:
                best = (waste, name)
        if best is None:
            return False
        pool = self.pools[best[1]]
        per_node = pool.shape.allocatable_gpus // item.gpus_per_pod
        left = item.pods
        ready = t + pool.scale_up_seconds
        while left > 0:
            n = self.added.get(best[1], 0)
            self.added[best[1]] = n + 1
            name = f"{best[1]}+{n}"
            self.nodes[name] = _Node(pool.shape, pool.shape.allocatable_gpus, ready)
            for constraints, per_pod, names in self.fitting.values():
                if fits(constraints, per_pod, pool.shape):
                    names.append(name)
            take = min(left, per_node)
            claimed[name] = take * item.gpus_per_pod
            left -= take
        self.push(ready, "", 0, None)
        return True


def expected_starts(now: float, nodes: Mapping[str, NodeInfo], free: Mapping[str, int],
                    busy: Sequence[Busy], queue: Sequence[Queued],
                    pools: Mapping[str, PoolBounds], quotas: Mapping[str, Quota],
                    horizon_seconds: float = HORIZON_SECONDS) -> dict[str, Expected]:
    """Each queued unit's expected start (by ``uid``); ``free``: each Ready, schedulable GPU
    node's free GPUs now (``pending.free_units``)."""
    out: dict[str, Expected] = {}
    counts: dict[str, int] = {}
    for node in nodes.values():
        if node.allocatable_gpus > 0:
            counts[node.pool] = counts.get(node.pool, 0) + 1
    held: dict[str, int] = {}
    for b in busy:
        held[b.node] = held.get(b.node, 0) + b.gpus
    play_nodes: dict[str, _Node] = {}
    for n, f in sorted(free.items()):
        info = nodes.get(n)
        if info is None or info.unschedulable:
            continue
        if info.ready:
            play_nodes[n] = _Node(info, f, now)
        elif (bound := pools.get(info.pool)) is not None:  # coming up, as a new node would
            play_nodes[n] = _Node(info, max(0, info.allocatable_gpus - held.get(n, 0)),
                                  now + bound.scale_up_seconds)
    play = _Play(play_nodes, pools, quotas, {cq: q.used_gpus for cq, q in quotas.items()},
                 counts)
    for name in {s.ready for s in play_nodes.values() if s.ready > now}:
        play.push(name, "", 0, None)
    for b in busy:
        play.push(max(b.ends, now), b.node, b.gpus, b.quota)
    waiting: list[Queued] = []
    for item in sorted(queue, key=lambda q: (-q.priority, q.since, q.uid)):
        if item.expected:
            if item.since > now:
                play.push(item.since, "", 0, None)
            waiting.append(item)
        elif item.bound:
            out[item.uid] = Expected(now, "starting")
        elif not _could_ever(item, play):
            out[item.uid] = Expected(None, "no_room")
        else:
            waiting.append(item)
    admitted: set[str] = set()
    end = now + horizon_seconds
    t = now
    while any(not q.expected for q in waiting) and t <= end:
        while play.events and play.events[0][0] <= t:
            _, _, freed, gpus, quota = heapq.heappop(play.events)
            if freed in play.nodes:
                play.nodes[freed].free += gpus
            if quota is not None:
                play.used[quota] = max(0.0, play.used.get(quota, 0.0) - gpus)
        left: list[Queued] = []
        failed: set[tuple[object, ...]] = set()  # a quota's (queue, GPUs), a pod shape
        claimed: dict[str, int] = {}
        for item in waiting:
            if item.since > t:
                left.append(item)
                continue
            if item.quota is not None and item.uid not in admitted:
                if (item.quota, item.gpus) in failed or \
                        play.quota_room(item.quota) < item.gpus:
                    failed.add((item.quota, item.gpus))
                    left.append(item)
                    continue
                admitted.add(item.uid)
                play.used[item.quota] = play.used.get(item.quota, 0.0) + item.gpus
            shape = (_key(item.constraints), item.gpus_per_pod, item.pods)
            if shape in failed:
                left.append(item)
                continue
            placed = play.place(item, t)
            if placed is None:
                if not play.on_the_way(item, t, claimed) and not play.grow(item, t, claimed):
                    failed.add(shape)
                left.append(item)
                continue
            if not item.expected:
                out[item.uid] = Expected(t, "forecast")
            for n in placed:
                play.nodes[n].free -= item.gpus_per_pod
                if item.runs_seconds is not None:
                    play.push(t + item.runs_seconds, n, item.gpus_per_pod,
                              item.quota or item.holds)
        waiting = left
        if not play.events:
            break
        t = play.events[0][0]
    for item in waiting:
        if not item.expected:
            out[item.uid] = Expected(None, "beyond_horizon")
    return out


def _key(constraints: PodConstraints) -> object:
    return (tuple(sorted(constraints.node_selector.items())), constraints.affinity,
            constraints.tolerations)


def _could_ever(item: Queued, play: _Play) -> bool:
    """Whether the nodes it fits, with those their pools may still add, could ever take
    all its pods at once (and its ClusterQueue's quota all its GPUs)."""
    if item.quota is not None and (q := play.quotas.get(item.quota)) is not None:
        cohort = sum(o.nominal_gpus for o in play.quotas.values()
                     if q.cohort and o.cohort == q.cohort) if q.cohort else q.nominal_gpus
        limit = cohort if q.borrowing_limit_gpus is None else min(
            cohort, q.nominal_gpus + q.borrowing_limit_gpus)
        if item.gpus > limit:
            return False
    slots = sum(play.nodes[n].info.allocatable_gpus // item.gpus_per_pod
                for n in play.candidates(item.constraints, item.gpus_per_pod))
    for name, b in play.pools.items():
        if not fits(item.constraints, item.gpus_per_pod, b.shape):
            continue
        if b.max_nodes is None:
            return True  # its maximum unknown: it may be large enough
        more = b.max_nodes - play.counts.get(name, 0)
        slots += max(0, more) * (b.shape.allocatable_gpus // item.gpus_per_pod)
    return slots >= item.pods
