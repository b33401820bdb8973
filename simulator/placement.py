"""Where a pod may run: its nodes' labels and taints, its node selector, required node
affinity and tolerations, matched as kube-scheduler's filters match them.

One place decides both what the API objects say (``objects.node`` and ``objects.pod`` take
their labels, taints, selectors, affinity and tolerations from here) and what the
simulator's scheduler, autoscaler and truth do with them, so a real scheduler reading the
served objects would place every pod where the simulator places it. A pod of a workload
that asks for neither MIG nor time-sharing carries a required affinity that its node have
neither label (``cloud.google.com/gke-gpu-partition-size`` and
``cloud.google.com/gke-gpu-sharing-strategy`` ``DoesNotExist``): without it the scheduler
would also put it on MIG or shared nodes of the same accelerator.

The filters run in kube-scheduler's order (``TaintToleration``, then ``NodeAffinity``,
then ``NodeResourcesFit``), and each returns the reason kube-scheduler counts in its
``FailedScheduling`` summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.scenario import Pool, Scenario, Workload

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
PARTITION = "cloud.google.com/gke-gpu-partition-size"
SHARING = "cloud.google.com/gke-gpu-sharing-strategy"
ACCELERATOR = "cloud.google.com/gke-accelerator"
SPOT = "cloud.google.com/gke-spot"
UNREACHABLE = "node.kubernetes.io/unreachable"
MISMATCH = "node(s) didn't match Pod's node affinity/selector"
INSUFFICIENT = f"Insufficient {GPU}"
_FILTERED = frozenset({"NoSchedule", "NoExecute"})


def untolerated_reason(key: str, value: str = "") -> str:
    """kube-scheduler's ``TaintToleration`` reason for a taint the pod does not tolerate."""
    return f"node(s) had untolerated taint {{{key}: {value}}}"


def node_labels(pool: Pool, scenario: Scenario) -> dict[str, str]:
    """The labels GKE puts on every node of ``pool`` (``kubernetes.io/hostname`` aside)."""
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": pool.machine_type,
        "topology.kubernetes.io/region": scenario.region,
        "topology.kubernetes.io/zone": pool.zone,
        "cloud.google.com/gke-nodepool": pool.name,
        ACCELERATOR: pool.accelerator,
        "cloud.google.com/gke-accelerator-count": str(pool.gpus_per_node),
        "cloud.google.com/gke-gpu": "true",
        "cloud.google.com/gke-gpu-driver-version": "latest",
        "cloud.google.com/gke-provisioning": "spot" if pool.spot else "standard",
        "cloud.google.com/gke-os-distribution": "cos",
        "cloud.google.com/machine-family": pool.machine_type.split("-")[0],
    }
    if pool.spot:
        labels[SPOT] = "true"
    if pool.sharing is not None:
        labels[SHARING] = pool.sharing.strategy
        labels["cloud.google.com/gke-max-shared-clients-per-gpu"] = str(
            pool.sharing.max_shared_clients_per_gpu)
    if pool.mig_partition_size is not None:
        labels[PARTITION] = pool.mig_partition_size
    return labels


def node_taints(pool: Pool) -> list[Obj]:
    """The taints every node of ``pool`` has: GKE's GPU and spot taints, then the pool's."""
    taints: list[Obj] = [{"key": GPU, "value": "present", "effect": "NoSchedule"}]
    if pool.spot:
        taints.append({"key": SPOT, "value": "true", "effect": "NoSchedule"})
    taints += [{"key": t.key, "value": t.value, "effect": t.effect} for t in pool.taints]
    return taints


@dataclass(frozen=True, slots=True)
class Constraints:
    """What a workload's pods ask of a node, as their spec says it."""

    node_selector: dict[str, str]
    affinity: list[list[Obj]]
    """Required node-affinity terms (any one must hold), each a list of requirements
    (``key``, ``operator``, ``values``); empty: no required affinity."""
    tolerations: list[Obj] = field(default_factory=list)

    def affinity_object(self) -> Obj | None:
        """``spec.affinity`` as the API shows it, or None without required affinity."""
        if not self.affinity:
            return None
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": term} for term in self.affinity]}}}


def pod_constraints(w: Workload, scenario: Scenario) -> Constraints:
    """The node selector, required node affinity and tolerations of ``w``'s pods."""
    selector: dict[str, str] = {ACCELERATOR: w.accelerator} if w.accelerator_selector else {}
    requirements: list[Obj] = []
    if not w.accelerator_selector:  # the accelerator by affinity instead
        requirements.append({"key": ACCELERATOR, "operator": "In",
                             "values": list(dict.fromkeys([w.accelerator, *w.accelerators]))})
    tolerations: list[Obj] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    if w.spot:
        selector[SPOT] = "true"
        tolerations.append({"key": SPOT, "operator": "Equal", "value": "true",
                            "effect": "NoSchedule"})
    if w.sharing:
        selector[SHARING] = w.sharing
        selector["cloud.google.com/gke-max-shared-clients-per-gpu"] = str(
            next(pl.sharing.max_shared_clients_per_gpu for pl in scenario.pools
                 if pl.sharing is not None and pl.accelerator == w.accelerator))
    if w.mig_partition_size:
        selector[PARTITION] = w.mig_partition_size
    if not w.sharing and not w.mig_partition_size:  # whole GPUs only
        requirements += [{"key": PARTITION, "operator": "DoesNotExist"},
                         {"key": SHARING, "operator": "DoesNotExist"}]
    selector |= w.node_selector
    tolerations += [{k: v for k, v in (("key", t.key), ("operator", t.operator),
                                       ("value", t.value), ("effect", t.effect))
                     if v not in (None, "")} for t in w.tolerations]
    return Constraints(selector, [requirements] if requirements else [], tolerations)


def _requirement_holds(req: Obj, labels: dict[str, str]) -> bool:
    key, op, values = req["key"], req["operator"], req.get("values", [])
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if key not in labels:
        return False
    try:
        have, want = int(labels[key]), int(values[0])
    except (ValueError, IndexError):
        return False
    return have > want if op == "Gt" else have < want


def labels_match(c: Constraints, labels: dict[str, str]) -> bool:
    """``NodeAffinity``: the node selector, and any one required affinity term."""
    if any(labels.get(k) != v for k, v in c.node_selector.items()):
        return False
    return not c.affinity or any(all(_requirement_holds(r, labels) for r in term)
                                 for term in c.affinity)


def _tolerates(tol: Obj, taint: Obj) -> bool:
    if tol.get("effect") not in (None, taint["effect"]):
        return False
    if tol.get("key") is None:
        return tol.get("operator") == "Exists"
    if tol["key"] != taint["key"]:
        return False
    return tol.get("operator") == "Exists" or tol.get("value", "") == taint.get("value", "")


def untolerated(c: Constraints, taints: list[Obj]) -> Obj | None:
    """``TaintToleration``: the first NoSchedule or NoExecute taint no toleration covers."""
    for taint in taints:
        if taint["effect"] in _FILTERED and not any(_tolerates(t, taint)
                                                    for t in c.tolerations):
            return taint
    return None


def filter_reason(c: Constraints, labels: dict[str, str], taints: list[Obj]) -> str | None:
    """Why a node with ``labels`` and ``taints`` is filtered out for the pod, in
    kube-scheduler's words; None when it passes the taint and affinity filters."""
    taint = untolerated(c, taints)
    if taint is not None:
        return untolerated_reason(taint["key"], taint.get("value", ""))
    return None if labels_match(c, labels) else MISMATCH


class Placement:
    """Which pools each workload's pods may run on: the filters' verdict on a pool's
    (static) labels and taints, computed once per pair."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._labels = {p.name: node_labels(p, scenario) for p in scenario.pools}
        self._taints = {p.name: node_taints(p) for p in scenario.pools}
        self._constraints: dict[str, Constraints] = {}
        self._reasons: dict[tuple[str, str], str | None] = {}
        self._fits_any: dict[tuple[str, int], bool] = {}
        self._by_workload: dict[str, dict[str, str | None]] = {}

    def constraints(self, w: Workload) -> Constraints:
        c = self._constraints.get(w.name)
        if c is None:
            c = self._constraints[w.name] = pod_constraints(w, self.scenario)
        return c

    def reason(self, pool: Pool, w: Workload) -> str | None:
        """Why ``w``'s pods may not run on ``pool``'s nodes; None when they may."""
        k = (pool.name, w.name)
        if k not in self._reasons:
            self._reasons[k] = filter_reason(self.constraints(w), self._labels[pool.name],
                                             self._taints[pool.name])
        return self._reasons[k]

    def eligible(self, pool: Pool, w: Workload) -> bool:
        return self.reason(pool, w) is None

    def reasons(self, w: Workload) -> dict[str, str | None]:
        """``reason`` for each pool, by name."""
        found = self._by_workload.get(w.name)
        if found is None:
            found = self._by_workload[w.name] = {p.name: self.reason(p, w)
                                                 for p in self.scenario.pools}
        return found

    def fits_any(self, w: Workload, gpus: int) -> bool:
        """Whether a node of any pool, empty, could take a pod of ``w`` asking ``gpus``."""
        k = (w.name, gpus)
        found = self._fits_any.get(k)
        if found is None:
            found = self._fits_any[k] = any(self.fits(p, w, gpus) for p in self.scenario.pools)
        return found

    def fits(self, pool: Pool, w: Workload, gpus: int) -> bool:
        """Whether a node of ``pool``, empty, could take a pod of ``w`` asking ``gpus``."""
        return self.eligible(pool, w) and gpus <= pool.gpus_per_node * pool.units_per_gpu
