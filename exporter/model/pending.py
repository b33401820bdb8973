"""Why GPU demand waits, and which free GPUs no waiting pod could use: pure functions of
one snapshot's evidence (no I/O, no clock).

===============  ==========================================================================
figure           definition
===============  ==========================================================================
pending cause    the one reason a waiting pod (or a Kueue Workload with no pod yet) could
                 not run in an interval, decided from that interval's evidence, the first
                 of these that holds (``CAUSES``' order):

                 ``starting``      scheduled, no container running yet (image pull, init);
                 ``preempted``     waiting again after its pod was evicted or reclaimed
                                   (a spot VM taken back, a lost node; a Workload Kueue
                                   evicted), not scheduled since;
                 ``quota``         Kueue holds it back (not admitted; its pods gated);
                 ``unschedulable`` no node pool could ever run it: no node, and no pool
                                   seen, meets its selector, affinity and tolerations with
                                   GPUs enough on one node, and the cluster autoscaler
                                   found no group for it either;
                 ``stockout``      the autoscaler's scale-up for it failed (the zone out
                                   of resources, the project's quota), or a
                                   ProvisioningRequest could not be provisioned;
                 ``fragmented``    the nodes it fits have the GPUs it asks for free
                                   between them, but no one node has them;
                 ``scaling_up``    a scale-up for it is under way (triggered within
                                   ``SCALE_UP_PATIENCE_SECONDS``; a ProvisioningRequest
                                   pending);
                 ``no_capacity``   otherwise: the pools it fits are full, at their maximum
                                   or not autoscaled.
fits             a node fits a pod when its labels meet the pod's node selector and one of
                 its required node-affinity terms, it tolerates the node's ``NoSchedule``
                 and ``NoExecute`` taints (but the node-condition taints, which say *not
                 now*, not *never*) and the node has at least the GPUs it asks for.
free GPUs        a Ready, uncordoned node's allocatable ``nvidia.com/gpu`` less what the
                 pods bound to it and not ended ask for (Kubernetes' units: a MIG instance,
                 a time-sharing client).
free GPU use     each free GPU of a node is ``usable`` (a waiting pod fits the node and
                 asks no more than it has free), else ``fragment`` (one fits, but asks
                 more), else ``quota`` (only a Workload Kueue holds back would fit), else
                 ``mismatch`` (something waits, nothing fits), else ``no_demand``. All
                 but ``usable`` are *stranded*. Counted in physical GPUs: a MIG instance
                 as its fraction, a time-sharing client as 1 / clients per GPU.
fragmentation    of a pool, against the pods waiting for it: the share of its free GPUs
                 on nodes where a waiting pod that fits the pool asks more than the node
                 has free (``fragment`` / free GPUs, physical). No figure (None) while no
                 pod that fits the pool waits: free GPUs nobody asks for are not
                 fragmented, they are idle (``no_demand``) or of the wrong kind
                 (``mismatch``).
===============  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from exporter.model.compute import mig_fraction
from exporter.model.records import (
    NodeInfo,
    PodConstraints,
    PodInfo,
    Requirement,
    Taint,
    Toleration,
)

Cause = Literal["starting", "preempted", "quota", "unschedulable", "stockout", "fragmented",
                "scaling_up", "no_capacity"]
CAUSES: tuple[Cause, ...] = ("starting", "preempted", "quota", "unschedulable", "stockout",
                             "fragmented", "scaling_up", "no_capacity")
"""Every cause, in the order the first that holds is the one."""

Use = Literal["usable", "fragment", "quota", "mismatch", "no_demand"]
USES: tuple[Use, ...] = ("usable", "fragment", "quota", "mismatch", "no_demand")
STRANDED: tuple[Use, ...] = ("fragment", "quota", "mismatch", "no_demand")
"""The uses of a free GPU no waiting pod could take."""

ScaleUp = Literal["triggered", "failed", "max_size", "no_group"]
"""What the cluster autoscaler last said of a pod: it triggered a scale-up for it; the
scale-up failed; the groups it fits are at their maximum size; no group fits it."""

SCALE_UP_PATIENCE_SECONDS = 900.0
"""How long a triggered scale-up counts as under way: the cluster autoscaler's own
``--max-node-provision-time`` default (15 minutes), after which it gives the nodes up."""

CONDITION_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
                              "node.kubernetes.io/unschedulable",
                              "node.kubernetes.io/network-unavailable",
                              "node.kubernetes.io/memory-pressure",
                              "node.kubernetes.io/disk-pressure",
                              "node.kubernetes.io/pid-pressure"})
"""Taints the node lifecycle controller sets for a node's condition: they say a node cannot
take pods now, not that a pod could never run there."""

KUEUE_GATE = "kueue.x-k8s.io/admission"
"""The scheduling gate Kueue keeps on a pod until its Workload is admitted."""


# ---------------------------------------------------------------------------- fitting


def meets(req: Requirement, labels: Mapping[str, str]) -> bool:
    """Whether node labels meet one node-selector requirement (Kubernetes' operators; an
    unknown operator meets nothing)."""
    value = labels.get(req.key)
    match req.operator:
        case "In":
            return value is not None and value in req.values
        case "NotIn":
            return value is None or value not in req.values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
        case "Gt" | "Lt" if value is not None and len(req.values) == 1:
            try:
                have, bound = int(value), int(req.values[0])
            except ValueError:
                return False
            return have > bound if req.operator == "Gt" else have < bound
    return False


def selects(constraints: PodConstraints, labels: Mapping[str, str]) -> bool:
    """Whether node labels meet a pod's node selector and one of its required node-affinity
    terms (a term with no requirement meets nothing, as in Kubernetes)."""
    if any(labels.get(k) != v for k, v in constraints.node_selector.items()):
        return False
    if not constraints.affinity:
        return True
    return any(term and all(meets(r, labels) for r in term) for term in constraints.affinity)


def tolerated(taint: Taint, tolerations: Iterable[Toleration]) -> bool:
    for t in tolerations:
        if t.effect is not None and t.effect != taint.effect:
            continue
        if t.key is None:
            if t.operator == "Exists":
                return True
            continue
        if t.key != taint.key:
            continue
        if t.operator == "Exists" or t.value == taint.value:
            return True
    return False


def fits(constraints: PodConstraints, gpus_per_pod: int, node: NodeInfo) -> bool:
    """Whether the node could ever run such a pod (``fits`` in the module's table)."""
    if node.allocatable_gpus < gpus_per_pod or not selects(constraints, node.labels):
        return False
    return all(tolerated(t, constraints.tolerations) for t in node.taints
               if t.effect in ("NoSchedule", "NoExecute") and t.key not in CONDITION_TAINTS)


def free_units(nodes: Mapping[str, NodeInfo], pods: Iterable[PodInfo]) -> dict[str, int]:
    """Free GPUs (Kubernetes' units) per GPU node (``free GPUs`` in the module's table)."""
    used: dict[str, int] = {}
    for p in pods:
        if p.node and p.gpus > 0 and p.phase in ("Pending", "Running"):
            used[p.node] = used.get(p.node, 0) + p.gpus
    return {name: 0 if not n.ready or n.unschedulable
            else max(0, n.allocatable_gpus - used.get(name, 0))
            for name, n in nodes.items() if n.allocatable_gpus > 0}


def unit_gpus(node: NodeInfo) -> float:
    """Physical GPUs one of the node's ``nvidia.com/gpu`` units is."""
    return mig_fraction(node.mig_profile) / max(1, node.clients_per_gpu)


# ---------------------------------------------------------------------------- causes


@dataclass(frozen=True, slots=True)
class Said:
    """A component's words about a waiting pod, and when it said them."""

    words: str
    source: str
    """``default-scheduler``, ``cluster-autoscaler``, ``kueue``, ``kubelet``, or
    ``exporter`` for what the exporter worked out itself."""
    unix: float = 0.0


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one interval says of one waiting pod or Workload, for ``decide``."""

    gpus_per_pod: int
    constraints: PodConstraints
    scheduled: bool = False
    """``PodScheduled=True`` (and not running yet)."""
    preempted: Said | None = None
    """Its slot's last pod was evicted or reclaimed (or, a Workload, Kueue evicted it)."""
    held: Said | None = None
    """Kueue holds it back: no quota reserved for it (its pods gated)."""
    scale_up: ScaleUp | None = None
    scale_up_said: Said | None = None
    provisioning: Literal["pending", "failed"] | None = None
    """A ProvisioningRequest admission check's state, when quota is reserved and the
    Workload waits for its nodes."""
    provisioning_said: Said | None = None
    scheduler: Said | None = None
    """The scheduler's last words (``FailedScheduling``, the condition's message)."""
    starting: Said | None = None
    """The kubelet's, while its containers start."""


@dataclass(frozen=True, slots=True)
class Room:
    """Where a pod could go: the nodes it fits with their free GPUs, and the pools seen
    (now or before) it fits."""

    free: Mapping[str, int]
    """Fitting node -> its free GPUs."""
    pool_free: Mapping[str, int]
    """Fitting pool -> free GPUs of its fitting nodes."""
    pools_seen: frozenset[str] = frozenset()
    """Pools seen (now or earlier) whose nodes it fits."""

    @property
    def pool(self) -> str:
        """The pool it would go to: of those it fits, the one with the most free GPUs (then
        by name); else one seen before; "" for none."""
        if self.pool_free:
            return min(self.pool_free, key=lambda p: (-self.pool_free[p], p))
        return min(self.pools_seen, default="")


def room(constraints: PodConstraints, gpus_per_pod: int, nodes: Mapping[str, NodeInfo],
         free: Mapping[str, int], pool_shapes: Mapping[str, NodeInfo]) -> Room:
    """The ``Room`` of such a pod among ``nodes`` (their ``free`` GPUs) and the pools whose
    last node seen is ``pool_shapes``."""
    fitting: dict[str, int] = {}
    pool_free: dict[str, int] = {}
    for name, node in nodes.items():
        if name in free and fits(constraints, gpus_per_pod, node):
            fitting[name] = free[name]
            pool_free[node.pool] = pool_free.get(node.pool, 0) + free[name]
    seen = frozenset(p for p, shape in pool_shapes.items()
                     if p in pool_free or fits(constraints, gpus_per_pod, shape))
    return Room(fitting, pool_free, seen)


@dataclass(frozen=True, slots=True)
class Verdict:
    cause: Cause
    pool: str
    said: Said | None
    """The words it was decided on."""


def decide(ev: Evidence, where: Room, now: float) -> Verdict:
    """The cause of one waiting pod or Workload (the module's table, in ``CAUSES``'
    order)."""
    pool = where.pool
    if ev.scheduled:
        return Verdict("starting", pool, ev.starting)
    if ev.preempted is not None:
        return Verdict("preempted", pool, ev.preempted)
    if ev.held is not None:
        return Verdict("quota", pool, ev.held)
    said = ev.scale_up_said
    could = bool(where.free or where.pools_seen) or ev.scale_up in ("triggered", "failed",
                                                                      "max_size")
    if not could and ev.provisioning is None:
        return Verdict("unschedulable", pool, ev.scheduler or said)
    if ev.provisioning == "failed":
        return Verdict("stockout", pool, ev.provisioning_said)
    if ev.scale_up == "failed":
        return Verdict("stockout", pool, said)
    need = ev.gpus_per_pod
    if sum(where.free.values()) >= need > max(where.free.values(), default=0):
        return Verdict("fragmented", pool, ev.scheduler)
    recent = said is not None and now - said.unix <= SCALE_UP_PATIENCE_SECONDS
    if ev.provisioning == "pending":
        return Verdict("scaling_up", pool, ev.provisioning_said)
    if ev.scale_up == "triggered" and recent:
        return Verdict("scaling_up", pool, said)
    if ev.scale_up == "max_size" and said is not None:
        return Verdict("no_capacity", pool, said)
    return Verdict("no_capacity", pool, ev.scheduler or said)


# ---------------------------------------------------------------------------- free GPUs


@dataclass(frozen=True, slots=True)
class Demand:
    """A waiting pod's shape, as the free GPUs are judged against it."""

    constraints: PodConstraints
    gpus_per_pod: int
    held: bool = False
    """Kueue holds it back: a pod gated for quota, or a Workload with no pod yet (it waits
    for admission, whatever its cause)."""


@dataclass(slots=True)
class PoolFree:
    """A pool's free GPUs at one snapshot."""

    pool: str
    model: str
    provisioning: str
    zone: str
    gpus: dict[Use, float] = field(default_factory=dict)
    """Physical GPUs by use."""
    cost_usd_per_hour: dict[Use, float] = field(default_factory=dict)
    units: int = 0
    """Free GPUs, Kubernetes' units."""
    largest: int = 0
    """Most free units on one node."""

    @property
    def fragmentation(self) -> float | None:
        """``fragmentation``: None while no pod that fits the pool waits."""
        fragment = self.gpus.get("fragment", 0.0)
        asked = fragment + self.gpus.get("usable", 0.0)
        return fragment / asked if asked > 0 else None


def use_of(node: NodeInfo, units: int, demands: Sequence[Demand]) -> Use:
    """What could use ``units`` free GPUs of ``node`` (``free GPU use``)."""
    if not demands:
        return "no_demand"
    eligible = [d for d in demands if not d.held and fits(d.constraints, d.gpus_per_pod, node)]
    if any(d.gpus_per_pod <= units for d in eligible):
        return "usable"
    if eligible:
        return "fragment"
    if any(d.held and d.gpus_per_pod <= units and fits(d.constraints, d.gpus_per_pod, node)
           for d in demands):
        return "quota"
    return "mismatch"


def pools_free(nodes: Mapping[str, NodeInfo], free: Mapping[str, int],
               demands: Sequence[Demand], price_per_gpu_hour: Mapping[str, float]
               ) -> dict[str, PoolFree]:
    """Each GPU pool's free GPUs by use, their cost (``price_per_gpu_hour``: node -> the
    price of one of its physical GPUs, after discount) and its largest free block."""
    out: dict[str, PoolFree] = {}
    for name in sorted(free):
        node = nodes[name]
        pf = out.get(node.pool)
        if pf is None:
            pf = out[node.pool] = PoolFree(node.pool, node.accelerator or "",
                                           node.provisioning, node.zone)
        units = free[name]
        if units <= 0:
            continue
        use = use_of(node, units, demands)
        gpus = units * unit_gpus(node)
        pf.gpus[use] = pf.gpus.get(use, 0.0) + gpus
        pf.cost_usd_per_hour[use] = pf.cost_usd_per_hour.get(use, 0.0) + \
            gpus * price_per_gpu_hour.get(name, 0.0)
        pf.units += units
        pf.largest = max(pf.largest, units)
    return out


# ---------------------------------------------------------------------------- one cycle


WaitKey = tuple[str, str, str, str, Cause]
"""(namespace, team, pool, model, cause): how waits are summed."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """One pod, or Kueue Workload with no pod yet, waiting at a snapshot, and why."""

    kind: Literal["pod", "workload"]
    uid: str
    namespace: str
    name: str
    workload: str
    team: str
    model: str
    gpus: int
    gpus_per_pod: int
    wait_seconds: float
    """Its wait so far."""
    verdict: Verdict
    cluster_queue: str = ""

    @property
    def key(self) -> WaitKey:
        return (self.namespace, self.team, self.verdict.pool, self.model, self.verdict.cause)


@dataclass(frozen=True, slots=True)
class WaitFigures:
    """What one cycle shows of the waits: what waits now and why, each pool's free GPUs by
    use, and the counters since start. The cycle's own copies: never changed."""

    waiting: tuple[Waiting, ...] = ()
    pools: Mapping[str, PoolFree] = field(default_factory=dict)
    gpu_seconds: Mapping[WaitKey, float] = field(default_factory=dict)
    """GPU-seconds waited since start, by ``WaitKey``."""
    scale_up_failures: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(pool, reason) -> scale-ups that failed since start."""


@dataclass(frozen=True, slots=True)
class PendingRow:
    """One waiting pod or Workload over one stretch of time, for the warehouse."""

    start: float
    seconds: float
    waiting: Waiting
    expected_start: float | None = None
    """When the queue forecast at the stretch's start expected it to start (Unix
    seconds; ``exporter.model.forecast``), if it did."""


@dataclass(frozen=True, slots=True)
class FreeRow:
    """One pool's free GPUs of one use over one stretch of time, for the warehouse."""

    start: float
    seconds: float
    pool: PoolFree
    use: Use
