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

import bisect
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


class _Pool:
    """One pool's nodes during a pass: those not Ready counted, the Ready ones by how many
    GPU units they have free, each count's nodes by name."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.unready = 0
        self.ready: list[Node] = []
        self._by_free: dict[int, list[str]] | None = None
        self._nodes: dict[str, Node] = {}
        self._free: dict[str, int] = {}

    def by_free(self) -> dict[int, list[str]]:
        if self._by_free is None:
            self._by_free = {}
            for node in self.ready:
                n = self._free[node.name] = node.free_count()
                self._nodes[node.name] = node
                self._by_free.setdefault(n, []).append(node.name)
        return self._by_free

    def short(self, gpus: int) -> int:
        """Ready nodes with fewer than ``gpus`` units free."""
        return sum(len(names) for n, names in self.by_free().items() if n < gpus)

    def best(self, gpus: int, sign: int) -> tuple[int, str] | None:
        """The score and name of the node with ``gpus`` units free that leaves the fewest
        free (``sign`` 1) or the most (-1), lowest name first."""
        fits = [n for n, names in self.by_free().items() if n >= gpus and names]
        if not fits:
            return None
        n = min(fits) if sign > 0 else max(fits)
        return sign * (n - gpus), self.by_free()[n][0]

    def take(self, name: str, gpus: int) -> Node:
        """Node ``name`` about to be given ``gpus`` of its free units."""
        by_free = self.by_free()
        n = self._free[name]
        by_free[n].remove(name)
        self._free[name] = n - gpus
        bisect.insort(by_free.setdefault(n - gpus, []), name)
        return self._nodes[name]


def _pools(c: Cluster) -> tuple[int, list[_Pool]]:
    """The live nodes, counted, and by pool."""
    count, pools = 0, []
    for nodes in c.nodes_by_pool().values():
        held = _Pool(nodes[0].pool)
        held.ready = [n for n in nodes if n.ready]
        held.unready = len(nodes) - len(held.ready)
        pools.append(held)
        count += len(nodes)
    return count, pools


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
    live: tuple[int, list[_Pool]] | None = None
    still: list[Pod] = []
    for pod in c.pending:
        shape = (pod.workload.name, pod.gpus)
        message = refused.get(shape)
        best: tuple[int, str, _Pool] | None = None
        if message is None:
            if live is None:
                live = _pools(c)
            reasons: dict[str, int] = {}
            whys = c.placement.reasons(pod.workload)
            for held in live[1]:
                if held.unready:
                    reasons[unreachable] = reasons.get(unreachable, 0) + held.unready
                why = whys[held.pool.name]
                if why is not None:
                    if held.ready:
                        reasons[why] = reasons.get(why, 0) + len(held.ready)
                    continue
                short = held.short(pod.gpus)
                if short:
                    reasons[INSUFFICIENT] = reasons.get(INSUFFICIENT, 0) + short
                cand = held.best(pod.gpus, sign)
                if cand is not None and (best is None or cand < best[:2]):
                    best = (*cand, held)
            if best is None:
                message = refused[shape] = failed_message(live[0], reasons)
        if best is None:
            assert message is not None
            c._unschedulable(pod, message)
            still.append(pod)
            continue
        node = best[2].take(best[1], pod.gpus)
        c._bind(pod, node, node.free_units()[: pod.gpus])
    c.pending = still
    c.refused, c.refused_since = refused, c.freed
