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
    from simulator.cluster import Cluster, Node, Pod
    from simulator.scenario import Pool

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


def _free(node: Node) -> int:
    """Units a pod could take now: none on a node not Ready."""
    return len(node.free_units()) if node.schedulable else 0


def pod_cause(c: Cluster, pod: Pod, free: dict[str, int],
              rooms: dict[tuple[str, int], tuple[int, int]] | None = None) -> Cause:
    """Why ``pod`` (Pending) waits now; ``free`` is each live node's free units; ``rooms``
    keeps, for one ``free``, each shape's free units in all and on one node."""
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
    shape = (w.name, pod.gpus)
    found = rooms.get(shape) if rooms is not None else None
    if found is None:
        room = [free[n.name] for n in c.live_nodes()
                if c.placement.eligible(n.pool, w) and n.allocatable >= pod.gpus]
        found = (sum(room), max(room, default=0))
        if rooms is not None:
            rooms[shape] = found
    if found[0] >= pod.gpus and found[1] < pod.gpus:
        return "fragmented"
    return "scaling_up" if ca.scaling_up else "no_capacity"


def waiting(c: Cluster, free: dict[str, int]) -> Iterator[Waiting]:
    """Everything that waits now: pods not running yet, Workloads Kueue has not admitted."""
    rooms: dict[tuple[str, int], tuple[int, int]] = {}
    for pod in c.pending_pods():
        yield Waiting(pod.uid, "pod", pod.namespace, pod.gpus, pod_cause(c, pod, free, rooms))
    if c.kueue is not None:
        for wl in c.kueue.workloads.values():
            if wl.pending:
                yield Waiting(wl.uid, "workload", wl.namespace, wl.gpus,
                              "preempted" if wl.evicted_at is not None else "quota")


def free_uses(c: Cluster, free: dict[str, int]) -> dict[tuple[str, str], float]:
    """Free physical GPUs now by node pool and use."""
    pods = c.pending
    held = [wl for wl in c.kueue.workloads.values() if wl.pending] if c.kueue else []
    out: dict[tuple[str, str], float] = {}
    by_pool: dict[str, list[Pod]] = {}
    for node in c.live_nodes():
        units = free[node.name]
        if not units:
            continue
        pool = node.pool
        eligible = by_pool.get(pool.name)
        if eligible is None:
            eligible = by_pool[pool.name] = [p for p in pods
                                             if c.placement.eligible(pool, p.workload)]
        allocatable = node.allocatable
        fitting = [p for p in eligible if allocatable >= p.gpus]
        use: Use
        if any(p.gpus <= units for p in fitting):
            use = "usable"
        elif fitting:
            use = "fragment"
        elif any(wl.accelerator == pool.accelerator and wl.gpus_per_pod <= units
                 for wl in held):
            use = "quota"
        else:
            use = "mismatch" if pods or held else "no_demand"
        k = (pool.name, use)
        out[k] = out.get(k, 0.0) + units * unit_gpus(pool)
    return out


def observe(c: Cluster) -> tuple[list[Waiting], dict[tuple[str, str], float]]:
    """What waits and why, and the free GPUs' uses, for the step starting now."""
    free = {n.name: _free(n) for n in c.live_nodes()}
    return list(waiting(c, free)), free_uses(c, free)
