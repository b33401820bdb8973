"""kube-scheduler's queue, reduced to GPUs.

Pending pods are tried in priority order, then by creation time; a pod binds to the
feasible node that leaves the fewest free GPUs (best fit, the scenario's ``placement:
compact``) or the most (``spread``), lowest name first; a pod that
fits nowhere stays Pending with ``PodScheduled=False`` / ``Unschedulable`` and does not
block the pods behind it. There is no preemption of running pods (the pods say
``preemptionPolicy: Never``). A GPU unit is never handed to two pods.

A node is feasible when it is Ready, passes the pod's taint and affinity filters
(``simulator.placement``) and has the GPUs free. Why each other node was not is counted as
kube-scheduler counts it in its ``FailedScheduling`` event and condition message::

    0/15 nodes are available: 1 node(s) had untolerated taint {cloud.google.com/gke-spot:
    true}, 12 node(s) didn't match Pod's node affinity/selector, 2 Insufficient
    nvidia.com/gpu. preemption: not eligible due to preemptionPolicy=Never.

(reasons sorted as strings, as ``FitError.Error`` sorts them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.placement import INSUFFICIENT, UNREACHABLE, untolerated_reason

if TYPE_CHECKING:
    from simulator.cluster import Cluster, Node, Pod
    from simulator.scenario import Pool

PREEMPTION = "preemption: not eligible due to preemptionPolicy=Never."


def failed_message(nodes: int, reasons: dict[str, int]) -> str:
    """kube-scheduler's summary for a pod no node of ``nodes`` can take."""
    counted = ", ".join(sorted(f"{n} {reason}" for reason, n in reasons.items()))
    return f"0/{nodes} nodes are available: {counted}. {PREEMPTION}"


def _pools(c: Cluster) -> tuple[int, list[tuple[Pool, list[Node], int]]]:
    """The live nodes, counted, and by pool: its Ready nodes by name and how many are not
    Ready."""
    nodes = c.live_nodes()
    pools: dict[str, tuple[Pool, list[Node], int]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        pool, ready, unready = pools.get(node.pool.name, (node.pool, [], 0))
        if node.ready:
            ready.append(node)
        else:
            unready += 1
        pools[node.pool.name] = (pool, ready, unready)
    return len(nodes), list(pools.values())


def schedule(c: Cluster) -> None:
    """One pass over the pending pods: bind those that fit, tell the others why not.

    A node not Ready is filtered as unreachable; the others of a pool the pod may not run
    on are filtered for the pool's reason, all at once (the filters' verdict is the
    pool's); on the rest, the GPUs free decide.

    A shape of pod (workload, GPUs) no node could take keeps its verdict, and its message,
    until GPUs are freed or the nodes change (``Cluster.freed``): binding only takes GPUs,
    so until then the same nodes turn it away for the same reasons. A pass with nothing
    new to try tells the pods waiting what it told them last."""
    if not c.pending:
        return
    c.pending.sort(key=lambda p: (-p.priority, p.created_at, p.name))
    refused = c.refused if c.refused_since == c.freed else {}
    unreachable = untolerated_reason(UNREACHABLE)
    sign = 1 if c.scenario.placement == "compact" else -1
    live: tuple[int, list[tuple[Pool, list[Node], int]]] | None = None
    free: dict[str, list[int]] = {}
    still: list[Pod] = []
    for pod in c.pending:
        shape = (pod.workload.name, pod.gpus)
        message = refused.get(shape)
        best: tuple[int, str, Node] | None = None
        if message is None:
            if live is None:
                live = _pools(c)
            reasons: dict[str, int] = {}
            for pool, ready, unready in live[1]:
                if unready:
                    reasons[unreachable] = reasons.get(unreachable, 0) + unready
                why = c.placement.reason(pool, pod.workload)
                if why is not None:
                    if ready:
                        reasons[why] = reasons.get(why, 0) + len(ready)
                    continue
                for node in ready:
                    units = free.get(node.name)
                    if units is None:
                        units = free[node.name] = node.free_units()
                    if len(units) < pod.gpus:
                        reasons[INSUFFICIENT] = reasons.get(INSUFFICIENT, 0) + 1
                        continue
                    cand = (sign * (len(units) - pod.gpus), node.name, node)
                    if best is None or cand[:2] < best[:2]:
                        best = cand
            if best is None:
                message = refused[shape] = failed_message(live[0], reasons)
        if best is None:
            assert message is not None
            c._unschedulable(pod, message)
            still.append(pod)
            continue
        node = best[2]
        units = free[node.name]
        c._bind(pod, node, units[: pod.gpus])
        free[node.name] = units[pod.gpus:]
    c.pending = still
    c.refused, c.refused_since = refused, c.freed
