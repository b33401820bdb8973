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

PREEMPTION = "preemption: not eligible due to preemptionPolicy=Never."


def failed_message(nodes: int, reasons: dict[str, int]) -> str:
    """kube-scheduler's summary for a pod no node of ``nodes`` can take."""
    counted = ", ".join(sorted(f"{n} {reason}" for reason, n in reasons.items()))
    return f"0/{nodes} nodes are available: {counted}. {PREEMPTION}"


def _filtered(c: Cluster, node: Node, pod: Pod, free: dict[str, list[int]]) -> str | None:
    """Why ``node`` cannot take ``pod`` now (None: it can)."""
    if not node.ready:
        return untolerated_reason(UNREACHABLE)
    why = c.placement.reason(node.pool, pod.workload)
    if why is not None:
        return why
    units = free.get(node.name)
    if units is None:
        units = free[node.name] = node.free_units()
    return INSUFFICIENT if len(units) < pod.gpus else None


def schedule(c: Cluster) -> None:
    """One pass over the pending pods: bind those that fit, tell the others why not."""
    if not c.pending:
        return
    c.pending.sort(key=lambda p: (-p.priority, p.created_at, p.name))
    nodes = sorted(c.live_nodes(), key=lambda n: n.name)
    sign = 1 if c.scenario.placement == "compact" else -1
    free: dict[str, list[int]] = {}
    refused: dict[tuple[str, int], str] = {}  # nothing frees up during a pass
    still: list[Pod] = []
    for pod in c.pending:
        shape = (pod.workload.name, pod.gpus)
        message = refused.get(shape)
        best: tuple[int, str, Node] | None = None
        if message is None:
            reasons: dict[str, int] = {}
            for node in nodes:
                why = _filtered(c, node, pod, free)
                if why is not None:
                    reasons[why] = reasons.get(why, 0) + 1
                    continue
                cand = (sign * (len(free[node.name]) - pod.gpus), node.name, node)
                if best is None or cand[:2] < best[:2]:
                    best = cand
            if best is None:
                message = refused[shape] = failed_message(len(nodes), reasons)
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
