"""GKE's cluster autoscaler for the pools with ``autoscaling``, and the managed instance
groups that bring their nodes.

Every step, after the scheduler's pass, the autoscaler looks at the pods still waiting for
a node, in the scheduler's order:

- a pod that fits on a node already being added (an upcoming node) is left alone;
- for the others, each node group (autoscaled pool) that may run them and is below its
  maximum and not backing off is sized by packing them on new nodes (first fit); the
  group that helps the most pods (then the first by name) scales up, one group a loop, and
  its pods are told ``TriggeredScaleUp`` (``pod triggered scale-up: [{<group> 1->2 (max:
  2)}]``). The nodes come ``provisioning_delay`` later;
- when no group can help, each waiting pod is told ``NotTriggerScaleUp`` with every
  group's reason counted (``pod didn't trigger scale-up: 1 max node group size reached``),
  and again every 5 minutes while that stays its answer. As the real one, the autoscaler
  says nothing to the other pods in a loop that scaled up.

During a scenario's stockout of a pool its scale-ups fail: a minute after the attempt the
pods it was for are told GKE's ``FailedScaleUp`` (``Node scale up in zones us-central1-a
associated with this pod failed: GCE out of resources. Pod is at risk of not being
scheduled.``), and the group backs off (5 minutes, doubling to 30, reset after 3 hours
without a failure) before it is tried again. A group with no pod to run and nodes idle for
``scale_down_delay`` shrinks to its minimum.

What the autoscaler last told each pod is kept on the pod (``CaWords``): the truth of why
it waits is decided from that, never from the Events the API serves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simulator.events import AUTOSCALER, Involved
from simulator.rng import key, mix
from simulator.scenario import Pool, Scenario, Stockout

if TYPE_CHECKING:
    from simulator.cluster import Cluster, Node, Pod

MAX_REACHED = "max node group size reached"
IN_BACKOFF = "in backoff after failed scale-up"
REPEAT_SECONDS = 300.0
"""How often an unchanged ``NotTriggerScaleUp`` is said again to a pod still waiting."""
FAILURE_SECONDS = 60.0
"""How long after a scale-up GKE reports it failed."""
BACKOFF_SECONDS, MAX_BACKOFF_SECONDS, BACKOFF_RESET_SECONDS = 300.0, 1800.0, 10800.0
GCE_ERRORS = {"out_of_resources": "GCE out of resources", "quota_exceeded": "GCE quota exceeded"}


def instance_group(scenario: Scenario, pool: Pool) -> str:
    """The managed instance group of ``pool``'s nodes: ``gke-<cluster>-<pool>-<hash>``."""
    group = mix(scenario.seed, key(pool.name)) & 0xFFFFFFFF
    return f"gke-{scenario.cluster}-{pool.name}-{group:08x}"


def group_url(scenario: Scenario, pool: Pool) -> str:
    """The node group's id as the cluster autoscaler prints it on GKE (the MIG's URL)."""
    return (f"https://www.googleapis.com/compute/v1/projects/{scenario.project}/zones/"
            f"{pool.zone}/instanceGroups/{instance_group(scenario, pool)}-grp")


def triggered_message(url: str, current: int, new: int, most: int) -> str:
    return f"pod triggered scale-up: [{{{url} {current}->{new} (max: {most})}}]"


def not_triggered_message(reasons: dict[str, int]) -> str:
    parts = sorted(f"{n} {reason}" for reason, n in reasons.items())
    return "pod didn't trigger scale-up: " + ", ".join(parts)


def failed_message(zone: str, reason: str) -> str:
    return (f"Node scale up in zones {zone} associated with this pod failed: "
            f"{GCE_ERRORS[reason]}. Pod is at risk of not being scheduled.")


@dataclass(slots=True)
class CaWords:
    """What the cluster autoscaler last said to one waiting pod, and when."""

    triggered_at: float | None = None
    failed_at: float | None = None
    failed_reason: str | None = None
    refused_at: float | None = None
    refused: str | None = None
    """The last ``NotTriggerScaleUp`` message."""

    @property
    def scaling_up(self) -> bool:
        """Its latest word is a scale-up for it."""
        t = self.triggered_at
        return t is not None and t > max(self.failed_at or -math.inf,
                                         self.refused_at or -math.inf)

    @property
    def stocked_out(self) -> bool:
        """The scale-up for it failed since it was last triggered."""
        return self.failed_at is not None and self.failed_at > (self.triggered_at or -math.inf)

    @property
    def at_max(self) -> bool:
        return self.refused is not None and MAX_REACHED in self.refused


@dataclass(slots=True, eq=False)
class _Attempt:
    """Nodes asked of a pool's instance group, due at ``due``."""

    pool: Pool
    nodes: int
    due: float
    pods: list[Pod] = field(default_factory=list)
    failure: str | None = None
    """The stockout's reason when it will fail."""


@dataclass(slots=True)
class _Backoff:
    until: float = -math.inf
    failures: int = 0
    last_failure: float = -math.inf


class Autoscaler:
    """The autoscaler's loop and the instance groups' resizes in flight."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.scenario = cluster.scenario
        self.pools = sorted((p for p in self.scenario.pools if p.autoscaling is not None),
                            key=lambda p: p.name)
        self.attempts: list[_Attempt] = []
        self.backoff: dict[str, _Backoff] = {p.name: _Backoff() for p in self.pools}
        self.stockouts = sorted(self.scenario.stockouts, key=lambda s: s.at)

    # ----------------------------------------------------------------- instance groups

    def recreate(self, pool: Pool, at: float) -> None:
        """A node of a pool without autoscaling lost: its instance group makes it again."""
        self.attempts.append(_Attempt(pool, 1, at))

    def coming(self, pool: Pool) -> int:
        return sum(a.nodes for a in self.attempts if a.pool is pool)

    def stockout(self, pool: Pool, t: float) -> Stockout | None:
        start = self.cluster.start
        return next((s for s in self.stockouts if s.pool == pool.name
                     and start + s.at <= t + 1e-9 < start + s.at + s.duration), None)

    def due(self, t: float) -> None:
        """Resizes done by ``t``: their nodes join, or their failure is told and backed off."""
        done = [a for a in self.attempts if a.due <= t + 1e-9]
        self.attempts = [a for a in self.attempts if a.due > t + 1e-9]
        for attempt in done:
            if attempt.failure is None:
                for _ in range(attempt.nodes):
                    self.cluster._add_node(attempt.pool)
                continue
            message = failed_message(attempt.pool.zone, attempt.failure)
            for pod in attempt.pods:
                if pod.node is None and not pod.deleted:
                    pod.ca.failed_at, pod.ca.failed_reason = t, attempt.failure
                    self._say(pod, "FailedScaleUp", message, t, warning=True)
            b = self.backoff[attempt.pool.name]
            b.failures = b.failures + 1 if t - b.last_failure < BACKOFF_RESET_SECONDS else 1
            b.last_failure = t
            b.until = t + min(MAX_BACKOFF_SECONDS, BACKOFF_SECONDS * 2 ** (b.failures - 1))

    # ----------------------------------------------------------------- the loop

    def run(self, t: float) -> None:
        if not self.pools:
            return  # no node pool autoscales: GKE runs no cluster autoscaler
        by_pool = self.cluster.nodes_by_pool()
        alive = {p.name: by_pool.get(p.name, []) for p in self.pools}
        waiting = self._not_covered(self.cluster.pending)
        if waiting:
            options = {p.name: self._option(p, waiting, t, len(alive[p.name]))
                       for p in self.pools}
            best = self.pools[0]
            for pool in self.pools[1:]:  # the group that helps the most pods, the first by name
                if len(options[pool.name][0]) > len(options[best.name][0]):
                    best = pool
            helped, nodes = options[best.name]
            if helped:
                self._scale_up(best, helped, nodes, t, len(alive[best.name]))
            else:
                said: dict[tuple[str, int], str] = {}
                for pod in waiting:
                    self._refuse(pod, t, said)
        self._scale_down(t, alive)

    def _not_covered(self, pods: list[Pod]) -> list[Pod]:
        """The pods no upcoming node will take (the others wait for those, unspoken to)."""
        free: dict[str, list[int]] = {
            p.name: [p.gpus_per_node * p.units_per_gpu] * self.coming(p) for p in self.pools}
        out = []
        for pod in pods:
            slots = next((free[p.name] for p in self.pools
                          if self.cluster.placement.eligible(p, pod.workload)
                          and any(f >= pod.gpus for f in free[p.name])), None)
            if slots is None:
                out.append(pod)
                continue
            i = next(i for i, f in enumerate(slots) if f >= pod.gpus)
            slots[i] -= pod.gpus
        return out

    def _option(self, pool: Pool, pods: list[Pod], t: float, alive: int
                ) -> tuple[list[Pod], int]:
        """The pods new nodes of ``pool`` (``alive`` nodes now) would take now, and how many
        nodes (first fit)."""
        assert pool.autoscaling is not None
        if self.backoff[pool.name].until > t + 1e-9:
            return [], 0
        room = pool.autoscaling.max_nodes - alive - self.coming(pool)
        per_node = pool.gpus_per_node * pool.units_per_gpu
        packs: list[int] = []
        helped = []
        for pod in pods:
            if not self.cluster.placement.fits(pool, pod.workload, pod.gpus):
                continue
            i = next((i for i, f in enumerate(packs) if f >= pod.gpus), None)
            if i is None:
                if len(packs) >= room:
                    continue
                packs.append(per_node)
                i = len(packs) - 1
            packs[i] -= pod.gpus
            helped.append(pod)
        return helped, len(packs)

    def _scale_up(self, pool: Pool, pods: list[Pod], nodes: int, t: float, alive: int
                  ) -> None:
        assert pool.autoscaling is not None
        current = alive + self.coming(pool)
        short = self.stockout(pool, t)
        delay = FAILURE_SECONDS if short is not None else pool.autoscaling.provisioning_delay
        step = self.cluster.step
        self.attempts.append(_Attempt(pool, nodes, t + math.ceil(delay / step) * step,
                                      list(pods), short.reason if short else None))
        message = triggered_message(group_url(self.scenario, pool), current, current + nodes,
                                    pool.autoscaling.max_nodes)
        for pod in pods:
            pod.ca.triggered_at = t
            self._say(pod, "TriggeredScaleUp", message, t)

    def _refuse(self, pod: Pod, t: float, said: dict[tuple[str, int], str]) -> None:
        """Tell ``pod`` no group helps it; ``said`` keeps this loop's message to each shape
        of pod (workload, GPUs)."""
        shape = (pod.workload.name, pod.gpus)
        message = said.get(shape)
        if message is None:
            reasons: dict[str, int] = {}
            for pool in self.pools:
                reason = self._reason(pool, pod, t)
                reasons[reason] = reasons.get(reason, 0) + 1
            message = said[shape] = not_triggered_message(reasons)
        ca = pod.ca
        if ca.refused == message and ca.refused_at is not None and \
                t - ca.refused_at < REPEAT_SECONDS - 1e-9 and ca.refused_at >= max(
                    ca.triggered_at or -math.inf, ca.failed_at or -math.inf):
            return
        ca.refused, ca.refused_at = message, t
        self._say(pod, "NotTriggerScaleUp", message, t)

    def _reason(self, pool: Pool, pod: Pod, t: float) -> str:
        """Why ``pool`` cannot help ``pod`` now, in the autoscaler's words."""
        assert pool.autoscaling is not None
        mismatch = self.cluster.placement.reason(pool, pod.workload)
        if mismatch is not None:
            return mismatch
        if pod.gpus > pool.gpus_per_node * pool.units_per_gpu:
            return "Insufficient nvidia.com/gpu"
        if self.backoff[pool.name].until > t + 1e-9:
            return IN_BACKOFF
        return MAX_REACHED

    def _say(self, pod: Pod, reason: str, message: str, t: float, warning: bool = False) -> None:
        if self.cluster.events.kept:
            self.cluster.events.record(Involved("Pod", pod.namespace, pod.name, pod.uid), reason,
                                       message, component=AUTOSCALER, now=t,
                                       warning=warning)

    def _scale_down(self, t: float, nodes: dict[str, list[Node]]) -> None:
        """Pools no waiting pod needs lose the nodes idle for ``scale_down_delay``;
        ``nodes``: each pool's live nodes."""
        c = self.cluster
        for pool in self.pools:
            scaling = pool.autoscaling
            assert scaling is not None
            alive = nodes[pool.name]
            if len(alive) <= scaling.min_nodes or any(
                    c.placement.fits(pool, p.workload, p.gpus) for p in c.pending):
                continue
            idle = sorted((n for n in alive if n.empty_since is not None
                           and t - n.empty_since >= scaling.scale_down_delay),
                          key=lambda n: n.name)
            for node in idle[: len(alive) - scaling.min_nodes]:
                c._delete_node(node, "ScaleDown")
