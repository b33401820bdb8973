"""Kueue in the simulated cluster: ClusterQueues with GPU quotas (nominal, borrowing within
a cohort, preemption of lower priorities), LocalQueues, and a Workload for each Job that a
LocalQueue queues. The Job is created suspended: no pod exists until its Workload is
admitted (quota reserved and admitted at once, as without admission checks).

Admission follows Kueue's ``BestEffortFIFO``: each ClusterQueue's pending Workloads in order
of priority, then of the time they were queued; one that does not fit is passed over and
the next is tried. A Workload fits when its ClusterQueue's usage of its flavor stays within
the nominal quota plus what it may borrow (``borrowing_limit_gpus``, and the unused quota
of its cohort). With ``preemption: LowerPriority``, one that does not fit evicts admitted
Workloads of lower priority in its ClusterQueue (lowest priority, then the most recently
admitted, first) when that makes room; an evicted Workload is requeued, its Job suspended
(its pods deleted) and run again from the start once admitted again.

The objects are served as ``kueue.x-k8s.io/v1beta2`` (the storage version since Kueue
0.16), as the API server returns them; ``exposition`` is what Kueue's controller exports
for the same events (``kueue_admission_wait_time_seconds``, ``kueue_pending_workloads``,
...), measured as Kueue measures them: from the Workload's creation, or from its first
requeue (``QueuedWaitTime``), to admission.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from simulator.rng import key, uuid_str
from simulator.scenario import ClusterQueue, Kueue, LocalQueue
from simulator.store import ApiStore

Obj = dict[str, Any]
GROUP_VERSION = "kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"
BUCKETS = (1.0, *(2.5 * 2 ** i for i in range(15)))
"""``kueue_admission_wait_time_seconds``' buckets: 1, 2.5, 5, ... 40960 s
(``generateExponentialBuckets(16)``)."""


def _ts(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def workload_name(job_name: str, job_uid: str) -> str:
    """The name Kueue gives the Workload of a batch/v1 Job: ``job-<name>-<5 hex>``
    (``GetWorkloadNameForOwnerWithGVK``)."""
    digest = hashlib.sha1(f"Job\nbatch\n{job_name}\n{job_uid}".encode()).hexdigest()[:5]
    return f"job-{job_name}"[:247] + "-" + digest


@dataclass(slots=True, eq=False)
class QueuedWorkload:
    """One Job's Workload and what Kueue did with it."""

    name: str
    uid: str
    namespace: str
    job_name: str
    job_uid: str
    local_queue: str
    cluster_queue: str
    accelerator: str
    pods: int
    gpus_per_pod: int
    priority: int
    priority_class: str
    created_at: float
    job: Any = None
    """The simulator's Job (``simulator.cluster.Job``)."""
    queued_at: float = 0.0
    """Where Kueue's wait starts: creation, else the first requeue."""
    admitted_at: float | None = None
    requeued_at: float | None = None
    evicted_at: float | None = None
    finished_at: float | None = None
    finished_reason: str | None = None
    inadmissible: bool = False
    """A failed admission attempt since the queue last changed (Kueue's ``inadmissible``)."""
    pending_message: str = ""
    """``QuotaReserved=False``'s message: why its last admission attempt failed, in
    Kueue's words, or why it lost its quota."""
    evicted_message: str = ""
    """Its last eviction's message (``Evicted``, ``Preempted`` and ``Requeued``)."""
    admissions: list[tuple[float, float]] = field(default_factory=list)
    """Each admission: (where its wait started, when it was admitted)."""

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    @property
    def pending(self) -> bool:
        return self.admitted_at is None and self.finished_at is None


class KueueState:
    """The queues, the Workloads and the quota they hold."""

    def __init__(self, spec: Kueue, start: float, seed: int) -> None:
        self.spec = spec
        self.start = start
        self.seed = seed
        self.cluster_queues = {q.name: q for q in spec.cluster_queues}
        self.local_queues = {(q.namespace, q.name): q for q in spec.local_queues}
        self.workloads: dict[str, QueuedWorkload] = {}
        """By uid: every Workload not yet deleted (a finished one stays, as in Kueue)."""
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        """(ClusterQueue, accelerator) -> GPUs of its admitted Workloads."""
        self.dirty: dict[str, QueuedWorkload] = {}
        self.admission_waits: dict[tuple[str, str], list[float]] = defaultdict(list)
        """(ClusterQueue, priority class) -> every admission's wait, as Kueue observes it."""
        self.evictions: dict[tuple[str, str], int] = defaultdict(int)
        self._written: dict[tuple[str, str], str] = {}
        """(kind, key) -> the last ClusterQueue or LocalQueue object put, as JSON."""

    # ------------------------------------------------------------------ lifecycle

    def local_queue(self, namespace: str, name: str | None) -> LocalQueue | None:
        return self.local_queues.get((namespace, name)) if name else None

    def submit(self, job: Any, lq: LocalQueue, priority: int, now: float) -> QueuedWorkload:
        w = job.workload
        wl = QueuedWorkload(
            name=workload_name(job.name, job.uid), uid=uuid_str(self.seed, key("wl/" + job.uid)),
            namespace=w.namespace, job_name=job.name, job_uid=job.uid, local_queue=lq.name,
            cluster_queue=lq.cluster_queue, accelerator=w.accelerator, pods=w.pods,
            gpus_per_pod=w.gpus_per_pod, priority=priority, priority_class=w.priority_class,
            created_at=now, job=job, queued_at=now)
        self.workloads[wl.uid] = wl
        self.dirty[wl.uid] = wl
        return wl

    def finish(self, wl: QueuedWorkload, now: float, reason: str) -> None:
        """The Job ended (``Succeeded`` or ``Failed``): its quota is free."""
        if wl.finished_at is not None:
            return
        if wl.admitted_at is not None:
            self.usage[wl.cluster_queue, wl.accelerator] -= wl.gpus
        wl.finished_at, wl.finished_reason = now, reason
        self.dirty[wl.uid] = wl
        self._capacity_changed()

    def _capacity_changed(self) -> None:
        """Quota freed: every inadmissible Workload is tried again (Kueue requeues them on
        a change of the cluster queue)."""
        for wl in self.workloads.values():
            wl.inadmissible = False

    # ------------------------------------------------------------------ admission

    def _nominal(self, cq: ClusterQueue, accelerator: str) -> tuple[int, int | None]:
        for f in cq.flavors:
            if f.accelerator == accelerator:
                return f.nominal_gpus, f.borrowing_limit_gpus
        return 0, 0

    def _fits(self, cq: ClusterQueue, accelerator: str, gpus: int, freed: int = 0) -> bool:
        nominal, limit = self._nominal(cq, accelerator)
        used = self.usage[cq.name, accelerator] - freed
        if cq.cohort is None:
            return used + gpus <= nominal
        if used + gpus > nominal + (math.inf if limit is None else limit):
            return False
        members = [q for q in self.cluster_queues.values() if q.cohort == cq.cohort]
        capacity = sum(self._nominal(q, accelerator)[0] for q in members)
        in_use = sum(self.usage[q.name, accelerator] for q in members) - freed
        return in_use + gpus <= capacity

    def admit(self, now: float) -> tuple[list[QueuedWorkload], list[QueuedWorkload]]:
        """One scheduling pass: the Workloads admitted now, and those evicted to make room."""
        admitted: list[QueuedWorkload] = []
        evicted: list[QueuedWorkload] = []
        for cq in sorted(self.cluster_queues.values(), key=lambda q: q.name):
            pending = sorted((w for w in self.workloads.values() if w.pending and
                              w.cluster_queue == cq.name and not w.inadmissible),
                             key=lambda w: (-w.priority, w.queued_at, w.name))
            for wl in pending:
                victims: list[QueuedWorkload] = []
                if not self._fits(cq, wl.accelerator, wl.gpus):
                    victims = self._victims(cq, wl)
                    if not victims:
                        wl.inadmissible = True
                        self._not_admitted(cq, wl)
                        continue
                for v in victims:
                    self._evict(v, now, wl)
                    evicted.append(v)
                self.usage[cq.name, wl.accelerator] += wl.gpus
                wl.admitted_at = now
                wl.admissions.append((wl.queued_at, now))
                self.admission_waits[cq.name, wl.priority_class].append(now - wl.queued_at)
                self.dirty[wl.uid] = wl
                admitted.append(wl)
        return admitted, evicted

    def _victims(self, cq: ClusterQueue, wl: QueuedWorkload) -> list[QueuedWorkload]:
        """Admitted Workloads of lower priority in ``cq`` whose eviction lets ``wl`` in; none
        when it is not enough (or preemption is off)."""
        if cq.preemption != "LowerPriority":
            return []
        candidates = sorted((w for w in self.workloads.values()
                             if w.admitted_at is not None and w.finished_at is None
                             and w.cluster_queue == cq.name and w.accelerator == wl.accelerator
                             and w.priority < wl.priority),
                            key=lambda w: (w.priority, -(w.admitted_at or 0.0), w.name))
        chosen: list[QueuedWorkload] = []
        freed = 0
        for c in candidates:
            chosen.append(c)
            freed += c.gpus
            if self._fits(cq, wl.accelerator, wl.gpus, freed):
                return chosen
        return []

    def _available(self, cq: ClusterQueue, accelerator: str) -> int:
        """GPUs of ``accelerator`` ``cq`` could still reserve: its own quota and what it
        may borrow, within what its cohort has unused."""
        nominal, limit = self._nominal(cq, accelerator)
        used = self.usage[cq.name, accelerator]
        if cq.cohort is None:
            return max(0, nominal - used)
        members = [q for q in self.cluster_queues.values() if q.cohort == cq.cohort]
        unused = sum(self._nominal(q, accelerator)[0] - self.usage[q.name, accelerator]
                     for q in members)
        own = nominal - used + (10**9 if limit is None else limit)
        return max(0, min(own, unused))

    def _not_admitted(self, cq: ClusterQueue, wl: QueuedWorkload) -> None:
        """Kueue's flavor assigner's words for a Workload that does not fit."""
        more = wl.gpus - self._available(cq, wl.accelerator)
        message = (f"couldn't assign flavors to pod set main: insufficient unused quota for "
                   f"{GPU} in flavor {wl.accelerator}, {more} more needed")
        if message != wl.pending_message:
            wl.pending_message = message
            self.dirty[wl.uid] = wl

    def _path(self, name: str) -> str:
        """A ClusterQueue's place in its cohort tree, as preemption messages print it."""
        cohort = self.cluster_queues[name].cohort
        return f"/{cohort}/{name}" if cohort else f"/{name}"

    def _evict(self, wl: QueuedWorkload, now: float, by: QueuedWorkload) -> None:
        """Preempted by ``by``: quota released, the Workload requeued (its wait starts
        again at its first requeue, as Kueue's ``Requeued`` condition keeps that
        transition time)."""
        wl.evicted_message = wl.pending_message = (
            f"Preempted to accommodate a workload (UID: {by.uid}, JobUID: {by.job_uid}) due "
            f"to prioritization in the ClusterQueue; preemptor path: "
            f"{self._path(by.cluster_queue)}; preemptee path: {self._path(wl.cluster_queue)}")
        self.usage[wl.cluster_queue, wl.accelerator] -= wl.gpus
        wl.admitted_at = None
        wl.evicted_at = now
        if wl.requeued_at is None:
            wl.requeued_at = now
        wl.queued_at = wl.requeued_at
        self.evictions[wl.cluster_queue, wl.priority_class] += 1
        self.dirty[wl.uid] = wl

    # ------------------------------------------------------------------ objects

    def flush(self, store: ApiStore, now: float, ttl: float) -> None:
        """Write the Workloads that changed, and the queues whose status did. A finished
        Workload goes with its Job, ``ttl`` after it ended (the Job's TTL)."""
        for uid in sorted(self.dirty, key=lambda u: self.dirty[u].name):
            store.put("Workload", self.workload_object(self.dirty[uid]))
        self.dirty.clear()
        for uid, wl in list(self.workloads.items()):
            if wl.finished_at is not None and wl.finished_at + ttl <= now:
                store.delete("Workload", f"{wl.namespace}/{wl.name}")
                del self.workloads[uid]
        queues: list[tuple[str, str, Obj]] = [
            ("ClusterQueue", q.name, self.cluster_queue_object(q))
            for q in self.cluster_queues.values()]
        queues += [("LocalQueue", f"{q.namespace}/{q.name}", self.local_queue_object(q))
                   for q in self.local_queues.values()]
        for kind, name, obj in queues:
            text = json.dumps(obj, sort_keys=True)
            if self._written.get((kind, name)) != text:
                self._written[kind, name] = text
                store.put(kind, obj)

    @staticmethod
    def _eviction_conditions(wl: QueuedWorkload) -> list[Obj]:
        """``Evicted`` and ``Preempted``: true while it waits to be re-admitted, false
        (``QuotaReserved``, "Previously: ...") once it is."""
        assert wl.evicted_at is not None
        back = wl.admitted_at is not None and wl.admitted_at >= wl.evicted_at
        if not back:
            common: Obj = {"status": "True", "message": wl.evicted_message,
                           "lastTransitionTime": _ts(wl.evicted_at), "observedGeneration": 1}
            return [{"type": "Evicted", "reason": "Preempted", **common},
                    {"type": "Preempted", "reason": "InClusterQueue", **common}]
        assert wl.admitted_at is not None
        common = {"status": "False", "reason": "QuotaReserved",
                  "message": f"Previously: {wl.evicted_message}",
                  "lastTransitionTime": _ts(wl.admitted_at), "observedGeneration": 1}
        return [{"type": "Evicted", **common}, {"type": "Preempted", **common}]

    def workload_object(self, wl: QueuedWorkload) -> Obj:
        job = wl.job
        w = job.workload
        conditions: list[Obj] = []
        cq = wl.cluster_queue
        if wl.admitted_at is not None:
            at = _ts(wl.admitted_at)
            conditions += [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                 "message": f"Quota reserved in ClusterQueue {cq}", "lastTransitionTime": at,
                 "observedGeneration": 1},
                {"type": "Admitted", "status": "True", "reason": "Admitted",
                 "message": "The workload is admitted", "lastTransitionTime": at,
                 "observedGeneration": 1}]
        elif wl.finished_at is None:
            since = _ts(wl.evicted_at if wl.evicted_at is not None else wl.created_at)
            conditions.append({
                "type": "QuotaReserved", "status": "False", "reason": "Pending",
                "message": wl.pending_message, "lastTransitionTime": since,
                "observedGeneration": 1})
        if wl.evicted_at is not None:
            conditions += self._eviction_conditions(wl)
        if wl.requeued_at is not None:
            conditions.append({"type": "Requeued", "status": "True", "reason": "Preempted",
                               "message": wl.evicted_message,
                               "lastTransitionTime": _ts(wl.requeued_at),
                               "observedGeneration": 1})
        if wl.finished_at is not None:
            ok = wl.finished_reason == "Succeeded"
            conditions.append({
                "type": "Finished", "status": "True", "reason": wl.finished_reason,
                "message": "Job finished successfully" if ok else "Job has reached the "
                           "specified backoff limit", "lastTransitionTime": _ts(wl.finished_at),
                "observedGeneration": 1})
        status: Obj = {"conditions": conditions}
        if wl.admitted_at is not None and wl.finished_at is None:
            status["admission"] = {"clusterQueue": cq, "podSetAssignments": [{
                "name": "main", "count": wl.pods,
                "flavors": {"cpu": "default-flavor", "memory": "default-flavor",
                            GPU: wl.accelerator},
                "resourceUsage": {"cpu": str(4 * wl.pods), "memory": f"{32 * wl.pods}Gi",
                                  GPU: str(wl.gpus)}}]}
        elif wl.finished_at is None:
            status["resourceRequests"] = [{"name": "main", "resources": {
                "cpu": str(4 * wl.pods), "memory": f"{32 * wl.pods}Gi", GPU: str(wl.gpus)}}]
        gpus = str(wl.gpus_per_pod)
        return {
            "apiVersion": GROUP_VERSION, "kind": "Workload",
            "metadata": {
                "name": wl.name, "namespace": wl.namespace, "uid": wl.uid,
                "creationTimestamp": _ts(wl.created_at), "generation": 1,
                "finalizers": [] if wl.finished_at else ["kueue.x-k8s.io/resource-in-use"],
                "labels": {"kueue.x-k8s.io/job-uid": wl.job_uid},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                     "name": wl.job_name, "uid": wl.job_uid,
                                     "controller": True, "blockOwnerDeletion": True}]},
            "spec": {
                "active": True, "queueName": wl.local_queue, "priority": wl.priority,
                "priorityClassRef": {"group": "scheduling.k8s.io", "kind": "PriorityClass",
                                     "name": wl.priority_class},
                "podSets": [{"name": "main", "count": wl.pods, "template": {"spec": {
                    "containers": [{"name": "main", "image": f"ml/{w.name}:latest",
                                    "resources": {"requests": {"cpu": "4", "memory": "32Gi",
                                                               GPU: gpus},
                                                  "limits": {GPU: gpus}}}],
                    "nodeSelector": {"cloud.google.com/gke-accelerator": wl.accelerator},
                    "priorityClassName": wl.priority_class, "restartPolicy": "Never"}}}]},
            "status": status,
        }

    def _counts(self, match: Any) -> tuple[int, int]:
        pending = sum(1 for w in self.workloads.values() if w.pending and match(w))
        admitted = sum(1 for w in self.workloads.values()
                       if w.admitted_at is not None and w.finished_at is None and match(w))
        return pending, admitted

    def cluster_queue_object(self, cq: ClusterQueue) -> Obj:
        pending, admitted = self._counts(lambda w: w.cluster_queue == cq.name)
        usage = [{"name": f.accelerator, "resources": [{
            "name": GPU, "total": str(self.usage[cq.name, f.accelerator]),
            "borrowed": str(max(0, self.usage[cq.name, f.accelerator] - f.nominal_gpus)
                            if cq.cohort else 0)}]}
            for f in sorted(cq.flavors, key=lambda f: f.accelerator)]
        flavors = []
        for f in cq.flavors:
            quota: Obj = {"name": GPU, "nominalQuota": str(f.nominal_gpus)}
            if f.borrowing_limit_gpus is not None:
                quota["borrowingLimit"] = str(f.borrowing_limit_gpus)
            flavors.append({"name": f.accelerator, "resources": [quota]})
        spec: Obj = {
            "namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO", "stopPolicy": "None",
            "flavorFungibility": {"whenCanBorrow": "MayStopSearch",
                                  "whenCanPreempt": "TryNextFlavor"},
            "preemption": {"borrowWithinCohort": {"policy": "Never"},
                           "reclaimWithinCohort": "Never",
                           "withinClusterQueue": cq.preemption},
            "resourceGroups": [{"coveredResources": [GPU], "flavors": flavors}]}
        if cq.cohort:
            spec["cohortName"] = cq.cohort
        return {
            "apiVersion": GROUP_VERSION, "kind": "ClusterQueue",
            "metadata": {"name": cq.name, "uid": uuid_str(self.seed, key("cq/" + cq.name)),
                         "creationTimestamp": _ts(self.start), "generation": 1},
            "spec": spec,
            "status": self._queue_status(pending, admitted, usage, "Can admit new workloads"),
        }

    def _queue_status(self, pending: int, admitted: int, usage: list[Obj], ready: str) -> Obj:
        """A ClusterQueue's or LocalQueue's status: counts, GPU usage, Active since start."""
        return {"pendingWorkloads": pending, "reservingWorkloads": admitted,
                "admittedWorkloads": admitted, "flavorsReservation": usage,
                "flavorsUsage": usage,
                "conditions": [{"type": "Active", "status": "True", "reason": "Ready",
                                "message": ready, "lastTransitionTime": _ts(self.start),
                                "observedGeneration": 1}]}

    def local_queue_object(self, lq: LocalQueue) -> Obj:
        def mine(w: QueuedWorkload) -> bool:
            return w.namespace == lq.namespace and w.local_queue == lq.name

        pending, admitted = self._counts(mine)
        used: dict[str, int] = defaultdict(int)
        for w in self.workloads.values():
            if w.admitted_at is not None and w.finished_at is None and mine(w):
                used[w.accelerator] += w.gpus
        cq = self.cluster_queues[lq.cluster_queue]
        usage = [{"name": f.accelerator, "resources": [{"name": GPU,
                                                        "total": str(used[f.accelerator])}]}
                 for f in sorted(cq.flavors, key=lambda f: f.accelerator)]
        return {
            "apiVersion": GROUP_VERSION, "kind": "LocalQueue",
            "metadata": {"name": lq.name, "namespace": lq.namespace,
                         "uid": uuid_str(self.seed, key(f"lq/{lq.namespace}/{lq.name}")),
                         "creationTimestamp": _ts(self.start), "generation": 1},
            "spec": {"clusterQueue": lq.cluster_queue, "stopPolicy": "None"},
            "status": self._queue_status(pending, admitted, usage,
                                         "Can submit new workloads to localQueue"),
        }

    # ------------------------------------------------------------------ Kueue's metrics

    def exposition(self) -> str:
        """What Kueue's controller manager serves on its metrics port for these events
        (the leader replica, ``enableClusterQueueResources: true``)."""
        role = 'replica_role="leader"'
        out = ["# HELP kueue_admission_wait_time_seconds The time between a workload was "
               "created or requeued until admission, per 'cluster_queue'",
               "# TYPE kueue_admission_wait_time_seconds histogram"]
        for (cq, pc), waits in sorted(self.admission_waits.items()):
            labels = f'cluster_queue="{cq}",priority_class="{pc}",{role}'
            for bound in (*BUCKETS, math.inf):
                le = "+Inf" if bound == math.inf else f"{bound:g}"
                n = sum(1 for w in waits if w <= bound)
                out.append(f'kueue_admission_wait_time_seconds_bucket{{{labels},le="{le}"}} {n}')
            out.append(f"kueue_admission_wait_time_seconds_sum{{{labels}}} {sum(waits):g}")
            out.append(f"kueue_admission_wait_time_seconds_count{{{labels}}} {len(waits)}")
        out += ["# HELP kueue_admitted_workloads_total The total number of admitted workloads "
                "per 'cluster_queue'", "# TYPE kueue_admitted_workloads_total counter"]
        for (cq, pc), waits in sorted(self.admission_waits.items()):
            out.append(f'kueue_admitted_workloads_total{{cluster_queue="{cq}",'
                       f'priority_class="{pc}",{role}}} {len(waits)}')
        out += ["# HELP kueue_pending_workloads The number of pending workloads, per "
                "'cluster_queue' and 'status'.", "# TYPE kueue_pending_workloads gauge"]
        for name in sorted(self.cluster_queues):
            mine = [w for w in self.workloads.values() if w.pending and w.cluster_queue == name]
            stuck = sum(1 for w in mine if w.inadmissible)
            for status, n in (("active", len(mine) - stuck), ("inadmissible", stuck)):
                out.append(f'kueue_pending_workloads{{cluster_queue="{name}",{role},'
                           f'status="{status}"}} {n}')
        out += ["# HELP kueue_local_queue_pending_workloads The number of pending workloads, "
                "per 'local_queue' and 'status'.",
                "# TYPE kueue_local_queue_pending_workloads gauge"]
        for (ns, name) in sorted(self.local_queues):
            mine = [w for w in self.workloads.values()
                    if w.pending and w.namespace == ns and w.local_queue == name]
            stuck = sum(1 for w in mine if w.inadmissible)
            for status, n in (("active", len(mine) - stuck), ("inadmissible", stuck)):
                out.append(f'kueue_local_queue_pending_workloads{{name="{name}",namespace='
                           f'"{ns}",{role},status="{status}"}} {n}')
        for metric, help_, value in (
                ("nominal_quota", "resource nominal quota", lambda q, f: f.nominal_gpus),
                ("borrowing_limit", "resource borrowing limit",
                 lambda q, f: math.inf if f.borrowing_limit_gpus is None
                 else f.borrowing_limit_gpus),
                ("resource_usage", "total resource usage",
                 lambda q, f: self.usage[q.name, f.accelerator]),
                ("resource_reservation", "total resource reservation",
                 lambda q, f: self.usage[q.name, f.accelerator])):
            full = f"kueue_cluster_queue_{metric}"
            out += [f"# HELP {full} Reports the cluster_queue's {help_} within all the flavors",
                    f"# TYPE {full} gauge"]
            for q in sorted(self.cluster_queues.values(), key=lambda q: q.name):
                for f in q.flavors:
                    v = value(q, f)
                    text = "+Inf" if v == math.inf else f"{v:g}"
                    out.append(f'{full}{{cluster_queue="{q.name}",cohort="{q.cohort or ""}",'
                               f'flavor="{f.accelerator}",{role},resource="{GPU}"}} {text}')
        return "\n".join(out) + "\n"
