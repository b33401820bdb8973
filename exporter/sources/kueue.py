"""Kueue's objects as the exporter keeps them: Workloads, ClusterQueues and LocalQueues of
``kueue.x-k8s.io/v1beta2`` (served since Kueue 0.15, the storage version since 0.16), read
with the v1beta1 names where they differ (``cohort``, ``flavorUsage``,
``priorityClassName``), so that a cluster on an older Kueue reads the same.

A Workload's wait, as Kueue measures it (``QueuedWaitTime``), runs from its creation, or
from its ``Requeued`` condition's transition (an eviction), to its ``Admitted`` condition's
(quota reserved and every admission check ready).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from exporter.errors import SourceDataError
from exporter.model.quantities import quantity_value
from exporter.model.records import (
    AdmissionCheck,
    ClusterQueueInfo,
    FlavorQuota,
    LocalQueueInfo,
    WorkloadInfo,
)

Obj = dict[str, Any]
GROUP = "kueue.x-k8s.io"
GROUP_VERSION = f"{GROUP}/v1beta2"
GROUP_VERSIONS = (GROUP_VERSION, "kueue.x-k8s.io/v1beta1")
"""The versions asked for, in order: v1beta2 (Kueue 0.15 and later), v1beta1 (before)."""
GPU = "nvidia.com/gpu"
ACCELERATOR = "cloud.google.com/gke-accelerator"


def _ts(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def quantity(value: object, what: str) -> float:
    """A Kubernetes quantity (``8``, ``"8"``, ``"500m"``, ``"2Ki"``) as a number;
    ``SourceDataError`` naming ``what`` if it is none."""
    try:
        return quantity_value(value)
    except ValueError as exc:
        raise SourceDataError("kubernetes", what, str(exc)) from exc


def _conditions(status: Obj) -> dict[str, Obj]:
    return {str(c.get("type")): c for c in status.get("conditions") or [] if isinstance(c, dict)}


def _true_since(conditions: dict[str, Obj], kind: str) -> float | None:
    c = conditions.get(kind)
    return _ts(c.get("lastTransitionTime")) if c and c.get("status") == "True" else None


def workload_info(obj: Obj) -> WorkloadInfo:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    name = f"{meta.get('namespace', '')}/{meta['name']}"
    conditions = _conditions(status)
    created = _ts(meta.get("creationTimestamp")) or 0.0
    requeued = conditions.get("Requeued")
    queued = (_ts(requeued.get("lastTransitionTime")) if requeued else None) or created
    gpus = most_per_pod = 0.0
    accelerator = None
    labels: dict[str, str] = {}
    for i, ps in enumerate(spec.get("podSets") or []):
        pod_spec = (ps.get("template") or {}).get("spec") or {}
        per_pod = 0.0
        for c in pod_spec.get("containers") or []:
            res = c.get("resources") or {}
            want = (res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU)
            per_pod += quantity(want, f"workload {name}") if want is not None else 0.0
        gpus += per_pod * int(ps.get("count", 1))
        most_per_pod = max(most_per_pod, per_pod)
        accelerator = accelerator or (pod_spec.get("nodeSelector") or {}).get(ACCELERATOR)
        if i == 0:
            labels = dict(((ps.get("template") or {}).get("metadata") or {}).get("labels") or {})
    owners = meta.get("ownerReferences") or []
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else {})
    ref = spec.get("priorityClassRef") or {}
    admitted = _true_since(conditions, "Admitted")
    finished = _true_since(conditions, "Finished")
    checks = admission_checks(status)
    waiting = admitted is None and finished is None
    evicted = conditions.get("Evicted") or {}
    return WorkloadInfo(
        uid=meta.get("uid", ""), namespace=meta.get("namespace", ""), name=meta["name"],
        local_queue=str(spec.get("queueName") or ""),
        cluster_queue=(status.get("admission") or {}).get("clusterQueue") or None,
        created_unix=created, queued_unix=queued, admitted_unix=admitted,
        finished_unix=finished,
        gpus=round(gpus), accelerator=accelerator, priority=int(spec.get("priority") or 0),
        priority_class=str(ref.get("name") or spec.get("priorityClassName") or ""),
        owner_kind=str(owner.get("kind") or ""), owner_name=str(owner.get("name") or ""),
        labels=labels, gpus_per_pod=round(most_per_pod),
        quota_reserved=(conditions.get("QuotaReserved") or {}).get("status") == "True",
        pending_message=pending_message(conditions, checks) if waiting else "",
        evicted_reason=str(evicted.get("reason") or "") or None
        if waiting and evicted.get("status") == "True" else None,
        admission_checks=checks)


def admission_checks(status: Obj) -> tuple[AdmissionCheck, ...]:
    """A Workload's ``status.admissionChecks`` (a ProvisioningRequest's among them)."""
    return tuple(AdmissionCheck(str(c.get("name") or ""), str(c.get("state") or ""),
                                str(c.get("message") or ""))
                 for c in status.get("admissionChecks") or [] if isinstance(c, dict))


def pending_message(conditions: dict[str, Obj], checks: tuple[AdmissionCheck, ...]) -> str:
    """Why a Workload waits, in Kueue's words: ``QuotaReserved=False``'s message (no
    flavor with quota for it), else the message of an admission check not yet ``Ready``
    (quota is held, its nodes are not there), else ``Admitted=False``'s; "" when none
    says."""
    reserved = conditions.get("QuotaReserved") or {}
    if reserved.get("status") == "False" and reserved.get("message"):
        return str(reserved["message"])
    for check in checks:
        if check.state != "Ready" and check.message:
            return check.message
    admitted = conditions.get("Admitted") or {}
    return str(admitted.get("message") or "") if admitted.get("status") == "False" else ""


def cluster_queue_info(obj: Obj) -> ClusterQueueInfo:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    what = f"clusterqueue {meta['name']}"
    used: dict[str, tuple[float, float]] = {}
    for f in status.get("flavorsUsage") or []:
        for r in f.get("resources") or []:
            if r.get("name") == GPU:
                used[f["name"]] = (quantity(r.get("total", 0), what),
                                   quantity(r.get("borrowed", 0), what))
    flavors = {}
    for group in spec.get("resourceGroups") or []:
        for f in group.get("flavors") or []:
            for r in f.get("resources") or []:
                if r.get("name") != GPU:
                    continue
                limit = r.get("borrowingLimit")
                total, borrowed = used.get(f["name"], (0.0, 0.0))
                flavors[f["name"]] = FlavorQuota(
                    quantity(r.get("nominalQuota", 0), what),
                    None if limit is None else quantity(limit, what), total, borrowed)
    return ClusterQueueInfo(
        name=meta["name"], cohort=str(spec.get("cohortName") or spec.get("cohort") or ""),
        flavors=flavors, pending_workloads=int(status.get("pendingWorkloads") or 0),
        admitted_workloads=int(status.get("admittedWorkloads") or 0))


def local_queue_info(obj: Obj) -> LocalQueueInfo:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    return LocalQueueInfo(
        namespace=meta.get("namespace", ""), name=meta["name"],
        cluster_queue=str(spec.get("clusterQueue") or ""),
        pending_workloads=int(status.get("pendingWorkloads") or 0),
        admitted_workloads=int(status.get("admittedWorkloads") or 0))
