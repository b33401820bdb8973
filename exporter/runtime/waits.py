"""Why GPU demand waits, cycle by cycle: the evidence of each waiting pod and Kueue
Workload gathered from the snapshot (its conditions, the events about it, Kueue's words,
the free GPUs of the nodes it fits), its cause (``pending.decide``), the free GPUs no
waiting pod could use (``pending.pools_free``), and what the cycles add up to: GPU-seconds
waited by cause, the warehouse's rows, the autoscaler's failed scale-ups."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from exporter.model import compute
from exporter.model.pending import (
    KUEUE_GATE,
    Demand,
    Evidence,
    FreeRow,
    PendingRow,
    Room,
    Said,
    ScaleUp,
    WaitFigures,
    Waiting,
    WaitKey,
    decide,
    free_units,
    pools_free,
    room,
)
from exporter.model.records import (
    NodeInfo,
    PodConstraints,
    PodEvent,
    PodInfo,
    Toleration,
    WorkloadInfo,
    gpu_model,
)
from exporter.model.scheduling_words import scale_up_failure, scale_up_word
from exporter.model.snapshot import Snapshot

DISRUPTED_REASONS = frozenset({"Terminated", "NodeLost", "Preempted", "Evicted",
                               "DeletionByTaintManager"})
"""A pod's reason that says it was taken away rather than failed (with
``DisruptionTarget``, the kubelet's and the controllers' words)."""
SLOT_MEMORY_SECONDS = 7 * 86400.0
"""How long a disrupted slot is remembered while nothing of it runs again."""
SCALE_UP_EVENTS = ("TriggeredScaleUp", "NotTriggerScaleUp", "FailedScaleUp")
ANY_TAINT = (Toleration(None, "Exists", "", None),)

Slot = tuple[str, str, str, str]
"""(namespace, controller kind, controller, index): the place a replacement pod takes."""


def workload_constraints(wl: WorkloadInfo) -> PodConstraints:
    """Where a Kueue Workload with no pod yet may run: the accelerator it selects, any
    taint tolerated (its pods' template is not known)."""
    return PodConstraints(
        {"cloud.google.com/gke-accelerator": wl.accelerator} if wl.accelerator else {},
        (), ANY_TAINT)


def slot_of(pod: PodInfo) -> Slot:
    index = pod.labels.get("batch.kubernetes.io/job-completion-index") or (
        pod.name if pod.owner_kind == "StatefulSet" else "")
    return (pod.namespace, pod.owner_kind, pod.workload, index)


def _shape(constraints: PodConstraints, gpus: int) -> tuple[object, ...]:
    """What a pod's room depends on: pods of one template share it."""
    return (tuple(sorted(constraints.node_selector.items())), constraints.affinity,
            constraints.tolerations, gpus)


def _newest(events: Mapping[str, PodEvent], reasons: Sequence[str]) -> PodEvent | None:
    found = [events[r] for r in reasons if r in events]
    return max(found, key=lambda e: e.last_unix) if found else None


def _said(event: PodEvent | None) -> Said | None:
    return None if event is None else Said(event.message, event.component, event.last_unix)


class Waits:
    """The slots whose pods were taken away, the pools seen, and the last cycle's waits."""

    def __init__(self) -> None:
        self._disrupted: dict[Slot, tuple[float, Said]] = {}
        """Slot -> when its pod was taken away, and how."""
        self._shapes: dict[str, NodeInfo] = {}
        """Pool -> the last node of it seen: what its next node will look like."""
        self._gpu_seconds: dict[WaitKey, float] = defaultdict(float)
        self._failures: dict[tuple[str, str], int] = defaultdict(int)
        self._failure_counts: dict[tuple[str, float], int] = {}
        """(pod uid, the event's first time) -> its count already added."""
        self.figures = WaitFigures()
        """The last cycle's."""
        self._time: float | None = None
        self._expected: Mapping[str, float | None] = {}
        """Waiting uid -> its expected start, as the last forecast had it."""

    @property
    def shapes(self) -> Mapping[str, NodeInfo]:
        """Pool -> the last node of it seen."""
        return self._shapes

    def expect(self, starts: Mapping[str, float | None]) -> None:
        """The expected starts the rows of what waits now will carry."""
        self._expected = starts

    def observe(self, snap: Snapshot, team: Callable[[PodInfo], str],
                workload_team: Callable[[WorkloadInfo], str],
                cluster_queue: Callable[[WorkloadInfo], str],
                has_pods: Callable[[WorkloadInfo], bool],
                states: Sequence[compute.DeviceState]
                ) -> tuple[list[PendingRow], list[FreeRow]]:
        """Decide this snapshot's waits; return the rows of the last one's, which held
        from its time to this one's."""
        now = snap.now
        rows: list[PendingRow] = []
        free_rows: list[FreeRow] = []
        last = self.figures
        if self._time is not None and now > self._time:
            start, seconds = self._time, now - self._time
            for w in last.waiting:
                self._gpu_seconds[w.key] += w.gpus * seconds
                rows.append(PendingRow(start, seconds, w, self._expected.get(w.uid)))
            for pf in last.pools.values():
                for use in pf.gpus:
                    free_rows.append(FreeRow(start, seconds, pf, use))
        self._time = now
        for node in snap.nodes.values():
            if node.allocatable_gpus > 0 and node.pool:
                self._shapes[node.pool] = node
        self._remember_disruptions(snap)
        free = free_units(snap.nodes, snap.pods.values())
        waiting: list[Waiting] = []
        demands: dict[tuple[object, ...], Demand] = {}
        rooms: dict[tuple[object, ...], Room] = {}

        def room_of(constraints: PodConstraints, gpus: int) -> Room:
            shape = _shape(constraints, gpus)
            found = rooms.get(shape)
            if found is None:
                found = rooms[shape] = room(constraints, gpus, snap.nodes, free, self._shapes)
            return found

        for pod in snap.pods.values():
            if pod.gpus <= 0 or pod.phase != "Pending":
                continue
            events = snap.events.get(pod.uid, {})
            verdict = decide(self._evidence(pod, events),
                             room_of(pod.constraints, pod.gpus), now)
            self._count_failures(pod, events, verdict.pool)
            waiting.append(Waiting(
                "pod", pod.uid, pod.namespace, pod.name, pod.workload, team(pod),
                gpu_model(pod, snap.nodes), pod.gpus, pod.gpus,
                compute.queue_wait_seconds(pod, now), verdict))
            if verdict.cause != "starting":
                held = verdict.cause == "quota"
                demands.setdefault((*_shape(pod.constraints, pod.gpus), held),
                                   Demand(pod.constraints, pod.gpus, held))
        for wl in snap.workloads.values():
            if not wl.pending or wl.gpus <= 0 or has_pods(wl):
                continue
            per_pod = wl.gpus_per_pod or wl.gpus
            constraints = workload_constraints(wl)
            verdict = decide(self._workload_evidence(wl, constraints, per_pod),
                             room_of(constraints, per_pod), now)
            waiting.append(Waiting(
                "workload", wl.uid, wl.namespace, wl.name, wl.owner_name, workload_team(wl),
                wl.accelerator or "", wl.gpus, per_pod,
                compute.admission_wait_seconds(wl.created_unix, None, now), verdict,
                cluster_queue(wl)))
            # no pod of it exists yet: whatever it waits for, Kueue has not let it in
            demands.setdefault((*_shape(constraints, per_pod), True),
                               Demand(constraints, per_pod, held=True))
        pools = pools_free(snap.nodes, free, list(demands.values()), _gpu_prices(states))
        self.figures = WaitFigures(tuple(waiting), pools, dict(self._gpu_seconds),
                                   dict(self._failures))
        return rows, free_rows

    def _remember_disruptions(self, snap: Snapshot) -> None:
        now = snap.now
        for pod in (*snap.pods.values(), *snap.ended_pods):
            if pod.gpus <= 0:
                continue
            slot = slot_of(pod)
            if pod.disrupted or (pod.reason in DISRUPTED_REASONS and pod.phase in (
                    "Failed", "Deleted")):
                when = pod.finished_unix or now
                known = self._disrupted.get(slot)
                if known is None or known[0] < when:
                    self._disrupted[slot] = (when, Said(
                        f"replaces pod {pod.name}, which ended {pod.reason or 'disrupted'}",
                        "exporter", when))
            elif pod.scheduled_unix is not None and slot in self._disrupted and \
                    pod.scheduled_unix >= self._disrupted[slot][0]:
                del self._disrupted[slot]
        for slot in [s for s, (t, _) in self._disrupted.items()
                     if now - t > SLOT_MEMORY_SECONDS]:
            del self._disrupted[slot]

    def _evidence(self, pod: PodInfo, events: Mapping[str, PodEvent]) -> Evidence:
        scheduled = pod.scheduled_unix is not None
        taken = self._disrupted.get(slot_of(pod))
        preempted = taken[1] if taken is not None and not scheduled and \
            pod.created_unix >= taken[0] - 1.0 else None
        held = None
        if KUEUE_GATE in pod.scheduling_gates:
            held = Said(pod.unschedulable_message or f"gated by {KUEUE_GATE}", "kueue",
                        pod.unschedulable_unix or pod.created_unix)
        scheduler = _said(events.get("FailedScheduling"))
        if pod.unschedulable_message and (scheduler is None or (
                pod.unschedulable_unix or 0.0) > scheduler.unix):
            scheduler = Said(pod.unschedulable_message, "default-scheduler",
                             pod.unschedulable_unix or 0.0)
        scale = _newest(events, SCALE_UP_EVENTS)
        word: ScaleUp | None = None if scale is None else scale_up_word(scale.reason,
                                                                        scale.message)
        starting = None
        if scheduled:
            pulling = _newest(events, ("Pulling", "Failed", "BackOff"))
            words = pod.waiting_reason or "ContainerCreating"
            if pulling is not None:
                words = f"{words}: {pulling.message}"
            starting = Said(words, "kubelet", pulling.last_unix if pulling else 0.0)
        return Evidence(pod.gpus, pod.constraints, scheduled=scheduled, preempted=preempted,
                        held=held, scale_up=word, scale_up_said=_said(scale),
                        scheduler=scheduler, starting=starting)

    def _workload_evidence(self, wl: WorkloadInfo, constraints: PodConstraints,
                           per_pod: int) -> Evidence:
        preempted = None
        if wl.evicted_reason:
            preempted = Said(wl.pending_message or f"evicted by Kueue: {wl.evicted_reason}",
                             "kueue", wl.queued_unix)
        provisioning: Literal["pending", "failed"] | None = None
        provisioning_said = None
        if wl.quota_reserved:
            for check in wl.admission_checks:
                if check.state in ("Retry", "Rejected"):
                    provisioning, provisioning_said = "failed", Said(check.message, "kueue")
                    break
                if check.state == "Pending":
                    provisioning, provisioning_said = "pending", Said(check.message, "kueue")
        held = None if wl.quota_reserved else Said(
            wl.pending_message or "waiting for quota", "kueue", wl.queued_unix)
        return Evidence(per_pod, constraints, preempted=preempted, held=held,
                        provisioning=provisioning, provisioning_said=provisioning_said)

    def _count_failures(self, pod: PodInfo, events: Mapping[str, PodEvent], pool: str) -> None:
        failed = events.get("FailedScaleUp")
        if failed is None:
            return
        key = (pod.uid, failed.first_unix)
        added = self._failure_counts.get(key, 0)
        if failed.count > added:
            self._failures[pool, scale_up_failure(failed.message)] += failed.count - added
            self._failure_counts[key] = failed.count

    def pod_gone(self, uid: str) -> None:
        for key in [k for k in self._failure_counts if k[0] == uid]:
            del self._failure_counts[key]


def _gpu_prices(states: Sequence[compute.DeviceState]) -> dict[str, float]:
    """Node -> the price of one of its physical GPUs an hour (after discount), from its
    devices' prices."""
    price: dict[str, float] = defaultdict(float)
    share: dict[str, float] = defaultdict(float)
    for d in states:
        if d.price_usd_per_hour is not None and d.fraction > 0:
            price[d.node] += d.price_usd_per_hour
            share[d.node] += d.fraction
    return {n: price[n] / share[n] for n in price if share[n] > 0}
