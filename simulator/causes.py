"""Why each pod (or Kueue Workload) waits, and what could use each free GPU: the
simulator's truth, decided from its own state every step.

A waiting pod or Workload gets the first cause that holds, in this order:

==============  ==============================================================================
starting        bound to a node, its container still being created (image pull, init)
preempted       it replaces a pod of its slot whose node was reclaimed or lost, and has not
                been scheduled since; or a Kueue Workload evicted and waiting to be re-admitted
quota           a Kueue Workload not admitted
unschedulable   no node pool's nodes could ever run it (selector, affinity, taints, GPUs per
                node), and the autoscaler neither scaled up for it nor found its group full
stockout        the autoscaler's scale-up for it failed since it last triggered one
fragmented      its eligible nodes together have the GPUs it asks free, no single one does
scaling_up      the autoscaler's latest word to it is a scale-up for it
no_capacity     otherwise: the nodes it may use are full
==============  ==============================================================================

Every free GPU of a Ready node gets one use: ``usable`` (a waiting pod fits it and asks no
more than the node has free), ``fragment`` (a waiting pod fits the node but asks more),
``quota`` (only a Workload Kueue holds back selects its model, asking no more per pod),
``mismatch`` (things wait, none fits it) or ``no_demand`` (nothing waits). Free GPUs are
counted physical: a MIG instance as its fraction of a GPU, a time-shared GPU once.
Pods being started hold their GPUs and are not waiting for any.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from exporter.model.catalog import GPU_MODELS

if TYPE_CHECKING:
    from simulator.cluster import Cluster, Pod
    from simulator.kueue import QueuedWorkload
    from simulator.scenario import Pool, Workload

Cause = Literal["starting", "preempted", "quota", "unschedulable", "stockout", "fragmented",
                "scaling_up", "no_capacity"]
CAUSES: tuple[Cause, ...] = ("starting", "preempted", "quota", "unschedulable", "stockout",
                             "fragmented", "scaling_up", "no_capacity")
Use = Literal["usable", "fragment", "quota", "mismatch", "no_demand"]
USES: tuple[Use, ...] = ("usable", "fragment", "quota", "mismatch", "no_demand")
Kind = Literal["pod", "workload"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """One thing waiting during a step, and why."""

    uid: str
    kind: Kind
    namespace: str
    gpus: int
    """``nvidia.com/gpu`` it asks for (a Workload: all its pods')."""
    cause: Cause


def unit_gpus(pool: Pool) -> float:
    """Physical GPUs one ``nvidia.com/gpu`` unit of ``pool`` is."""
    if pool.mig_partition_size is not None:
        return GPU_MODELS[pool.accelerator].mig_profiles[pool.mig_partition_size].fraction
    return 1.0 / pool.units_per_gpu


class Rooms:
    """The live nodes' free units during one step (none on a node not Ready), and what
    each shape of pod (workload, GPUs) finds of them."""

    def __init__(self, c: Cluster) -> None:
        self.cluster = c
        self.nodes = c.live_nodes()
        self.free = [n.free_count() if n.ready else 0 for n in self.nodes]
        self._shapes: dict[tuple[str, int], tuple[int, int]] = {}

    def of(self, w: Workload, gpus: int) -> tuple[int, int]:
        """Free units, in all and on one node, of the nodes a pod of ``w`` asking ``gpus``
        may use and fits on."""
        shape = (w.name, gpus)
        found = self._shapes.get(shape)
        if found is None:
            whys = self.cluster.placement.reasons(w)
            room = [n.free_count() if n.ready else 0
                    for name, nodes in self.cluster.nodes_by_pool().items()
                    if whys[name] is None for n in nodes if n.allocatable >= gpus]
            found = self._shapes[shape] = (sum(room), max(room, default=0))
        return found


def pod_cause(c: Cluster, pod: Pod, rooms: Rooms) -> Cause:
    """Why ``pod`` (Pending) waits now."""
    if pod.node is not None:
        return "starting"
    if pod.replaces_disrupted:
        return "preempted"
    w = pod.workload
    ca = pod.ca
    if not c.placement.fits_any(w, pod.gpus) and ca.triggered_at is None and not ca.at_max:
        return "unschedulable"
    if ca.stocked_out:
        return "stockout"
    total, most = rooms.of(w, pod.gpus)
    if total >= pod.gpus and most < pod.gpus:
        return "fragmented"
    return "scaling_up" if ca.scaling_up else "no_capacity"


def waiting(c: Cluster, rooms: Rooms, held: list[QueuedWorkload]) -> Iterator[Waiting]:
    """Everything that waits now: pods not running yet, and ``held``, the Workloads Kueue
    has not admitted."""
    for pod in c.pending_pods():
        yield Waiting(pod.uid, "pod", pod.namespace, pod.gpus, pod_cause(c, pod, rooms))
    for wl in held:
        yield Waiting(wl.uid, "workload", wl.namespace, wl.gpus,
                      "preempted" if wl.evicted_at is not None else "quota")


def free_uses(c: Cluster, rooms: Rooms, held: list[QueuedWorkload]
              ) -> dict[tuple[str, str], float]:
    """Free physical GPUs now by node pool and use.

    A node's free units are ``usable`` when the smallest waiting pod that may run on its
    pool asks no more than them, a ``fragment`` when it asks no more than the node has
    (its units on healthy GPUs, never fewer than those free); ``quota`` when the smallest
    held Workload of its model asks no more per pod."""
    pods = c.pending
    asks: dict[str, tuple[Workload, int]] = {}
    """Workload -> the fewest GPUs a pod of it waiting asks."""
    for p in pods:
        had = asks.get(p.workload.name)
        if had is None or p.gpus < had[1]:
            asks[p.workload.name] = (p.workload, p.gpus)
    reasons = c.placement.reasons
    smallest: dict[str, int | None] = {}
    """Pool -> the fewest GPUs a waiting pod that may run on it asks."""
    quota: dict[str, int | None] = {}
    """Accelerator -> the fewest GPUs a pod of a held Workload of it asks."""
    out: dict[tuple[str, str], float] = {}
    for node, units in zip(rooms.nodes, rooms.free, strict=True):
        if not units:
            continue
        pool = node.pool
        if pool.name in smallest:
            least = smallest[pool.name]
        else:
            least = smallest[pool.name] = min(
                (gpus for w, gpus in asks.values() if reasons(w)[pool.name] is None),
                default=None)
        use: Use
        if least is not None and least <= units:
            use = "usable"
        elif least is not None and least <= node.allocatable:
            use = "fragment"
        else:
            if pool.accelerator in quota:
                asked = quota[pool.accelerator]
            else:
                asked = quota[pool.accelerator] = min(
                    (wl.gpus_per_pod for wl in held if wl.accelerator == pool.accelerator),
                    default=None)
            if asked is not None and asked <= units:
                use = "quota"
            else:
                use = "mismatch" if pods or held else "no_demand"
        k = (pool.name, use)
        out[k] = out.get(k, 0.0) + units * unit_gpus(pool)
    return out


def observe(c: Cluster) -> tuple[list[Waiting], dict[tuple[str, str], float]]:
    """What waits and why, and the free GPUs' uses, for the step starting now."""
    rooms = Rooms(c)
    held = [wl for wl in c.kueue.workloads.values() if wl.pending] if c.kueue else []
    return list(waiting(c, rooms, held)), free_uses(c, rooms, held)
