"""Ground truth: what really happened in the simulated cluster, from its own state.

The cluster writes a *segment* whenever what a DCGM device does changes (a pod binds or
leaves, the GPU goes down or comes back), plus pod lifecycle records, GPU incidents and
spot interruptions. ``TruthLog.report`` turns them into the figures the exporter must
reproduce over a window ``[start, end)``:

- GPU-seconds by state (``allocated``, ``unallocated``, ``unavailable``), attributed to
  pod, namespace, team, node pool, GPU model and provisioning. A time-shared GPU's seconds
  are split evenly among the pods sharing it in that step; a MIG instance counts as its
  fraction of the parent GPU (compute slices / 7). A GPU that is down is ``unavailable``
  even while a pod still holds it.
- Utilisation: mean ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` per device over the steps it was up;
  per pod, the GPU-time-weighted mean over the devices it held.
- Queue wait per pod: creation to ``PodScheduled=True`` (still pending: until ``end``).
- Downtime incidents per GPU with their reason, clipped to the window.
- Energy: each segment's joules (the power its device drew over it, constant over the
  segment, times its length; 0 on a NotReady node, which is powered off), split as the
  GPU-seconds are (``GpuSeconds.joules``, ``GroundTruth.joules_by``). The GPU's energy
  counter (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``) advances by the same energy, so between
  two reads with no reset between them its difference x 1e-3 is the joules of its devices'
  segments; its resets to 0 (``counter_resets``: a driver reload, a node that comes back
  Ready) are recorded with their time.
- Why things waited: every step, each pending pod and each Kueue Workload not admitted,
  with its cause (``simulator.causes``), kept as runs of steps per thing and cause
  (``pending_segments``); and the free physical GPUs of each pool by use, as GPU-seconds
  and runs (``free_gpu_seconds``, ``free_segments``).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from exporter.model.catalog import GPU_MODELS
from simulator.profiles import UNALLOCATED, Activity, activity, combine
from simulator.rng import key, mix
from simulator.scenario import Pool, Scenario


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    node: str
    pool: str
    accelerator: str
    provisioning: str  # "spot" or "on-demand"
    zone: str
    gpu_uuid: str
    gpu_index: int
    mig_profile: str | None
    instance_id: int | None
    fraction: float
    memory_mib: int
    clients: int
    key: int
    has_nvlink: bool

    @property
    def device_id(self) -> str:
        """The GPU UUID, with ``/<GPU_I_ID>`` for a MIG instance."""
        return self.gpu_uuid if self.instance_id is None else f"{self.gpu_uuid}/{self.instance_id}"


@dataclass(frozen=True, slots=True)
class PodRef:
    uid: str
    name: str
    namespace: str
    team: str | None
    workload: str
    profile: str
    key: int
    running_at: float
    multi_gpu: bool


@dataclass(frozen=True, slots=True)
class Segment:
    device: DeviceInfo
    start: float
    end: float
    down: str | None
    occupants: tuple[PodRef, ...]
    joules: float
    """Energy the device drew over the segment: its power (constant over the segment) times
    its length; 0 on a NotReady (powered-off) node."""


@dataclass(slots=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    team: str | None
    workload: str
    profile: str
    accelerator: str
    created_at: float
    scheduled_at: float | None = None
    finished_at: float | None = None
    node: str | None = None
    phase: str = "Pending"
    reason: str | None = None
    workload_uid: str | None = None
    """Its Kueue Workload, when Kueue queued its Job."""
    gpus: int = 0
    """``nvidia.com/gpu`` it asks for."""


@dataclass(slots=True)
class WorkloadRecord:
    """A Kueue Workload: when it was created and each admission (with where Kueue's wait
    started: creation, or its first requeue)."""

    uid: str
    namespace: str
    name: str
    team: str | None
    local_queue: str
    cluster_queue: str
    gpus: int
    created_at: float
    admissions: list[tuple[float, float]] = field(default_factory=list)
    evictions: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Incident:
    node: str
    gpu_uuid: str
    reason: str  # node_not_ready, gpu_missing, xid
    start: float
    end: float | None = None
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class CounterReset:
    """A GPU's energy counter restarted at 0 at ``at``: its driver loaded again
    (``why``: ``driver_reload``, or ``node_restart`` when its NotReady node came back). A
    counter read at ``at`` or later reads from the new start."""

    node: str
    gpu_uuid: str
    at: float
    why: str


@dataclass(frozen=True, slots=True)
class Interruption:
    node: str
    pool: str
    at: float
    pod_uids: tuple[str, ...]


@dataclass(slots=True)
class PendingSegment:
    """A run of steps during which one pod (or Workload) waited for one cause."""

    uid: str
    kind: str
    """``pod``, or ``workload``: a Kueue Workload not admitted (no pod yet)."""
    namespace: str
    cause: str
    start: float
    end: float
    gpus: int
    """``nvidia.com/gpu`` it asked for (a Workload: all its pods')."""

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * (self.end - self.start)


@dataclass(slots=True)
class FreeSegment:
    """A run of steps during which a pool had the same free physical GPUs of one use."""

    pool: str
    use: str
    start: float
    end: float
    gpus: float


def _clipped(segments: list[Any], start: float | None, end: float | None) -> list[Any]:
    out = []
    for seg in segments:
        lo = seg.start if start is None else max(start, seg.start)
        hi = seg.end if end is None else min(end, seg.end)
        if hi > lo:
            out.append(dataclasses.replace(seg, start=lo, end=hi))
    return out


@dataclass(frozen=True, slots=True)
class GpuSeconds:
    """GPU-seconds of one device in one state, attributed to one pod (or none)."""

    state: str
    pod_uid: str | None
    pod: str | None
    namespace: str | None
    team: str | None
    workload: str | None
    node: str
    pool: str
    accelerator: str
    provisioning: str
    device_id: str
    seconds: float
    joules: float
    """The energy of those seconds: the device's, split among the pods sharing it as the
    seconds are."""


@dataclass(frozen=True, slots=True)
class GroundTruth:
    start: float
    end: float
    gpu_seconds: list[GpuSeconds]
    device_utilization: dict[str, float]
    pod_utilization: dict[str, float]
    pods: dict[str, PodRecord]
    incidents: list[Incident]
    interruptions: list[Interruption]
    profiles: dict[str, str] = field(default_factory=dict)
    """Workload name -> its workload profile (the label a bottleneck diagnosis should find)."""
    workloads: dict[str, WorkloadRecord] = field(default_factory=dict)
    """Kueue Workloads created before the window's end, by uid."""
    pending: list[PendingSegment] = field(default_factory=list)
    """Why things waited in the window, clipped to it."""
    free_gpu_seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    """(pool, use) -> free physical GPU-seconds in the window."""
    counter_resets: list[CounterReset] = field(default_factory=list)
    """The GPUs' energy counters that restarted at 0 in the window."""

    def seconds_by(self, *fields: str, state: str | None = None) -> dict[tuple[Any, ...], float]:
        """Sum GPU-seconds grouped by the named ``GpuSeconds`` fields."""
        out: dict[tuple[Any, ...], float] = defaultdict(float)
        for row in self.gpu_seconds:
            if state is None or row.state == state:
                out[tuple(getattr(row, f) for f in fields)] += row.seconds
        return dict(out)

    def joules_by(self, *fields: str, state: str | None = None) -> dict[tuple[Any, ...], float]:
        """Sum joules grouped by the named ``GpuSeconds`` fields."""
        out: dict[tuple[Any, ...], float] = defaultdict(float)
        for row in self.gpu_seconds:
            if state is None or row.state == state:
                out[tuple(getattr(row, f) for f in fields)] += row.joules
        return dict(out)

    def queue_wait(self, uid: str) -> float | None:
        """Seconds from creation to scheduling (pending pods: until the window's end)."""
        rec = self.pods.get(uid)
        if rec is None:
            return None
        until = rec.scheduled_at if rec.scheduled_at is not None else self.end
        return max(0.0, until - rec.created_at)

    def total_wait(self, uid: str) -> float | None:
        """The wait a user feels for the pod: from its Kueue Workload's creation (the Job's
        submission) when Kueue queued it, else from the pod's, to its scheduling."""
        rec = self.pods.get(uid)
        if rec is None:
            return None
        wl = self.workloads.get(rec.workload_uid or "")
        start = wl.created_at if wl is not None else rec.created_at
        until = rec.scheduled_at if rec.scheduled_at is not None else self.end
        return max(0.0, until - start)

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "gpu_seconds": [asdict(r) for r in self.gpu_seconds],
            "device_utilization": self.device_utilization,
            "pod_utilization": self.pod_utilization,
            "pods": {uid: {**asdict(p), "queue_wait_seconds": self.queue_wait(uid),
                           "total_wait_seconds": self.total_wait(uid)}
                     for uid, p in self.pods.items()},
            "workloads": {uid: asdict(w) for uid, w in self.workloads.items()},
            "incidents": [asdict(i) for i in self.incidents],
            "interruptions": [asdict(i) for i in self.interruptions],
            "profiles": self.profiles,
            "pending": [asdict(p) for p in self.pending],
            "free_gpu_seconds": [{"pool": pool, "use": use, "gpu_seconds": v}
                                 for (pool, use), v in sorted(self.free_gpu_seconds.items())],
            "counter_resets": [asdict(r) for r in self.counter_resets],
        }


class TruthLog:
    """Append-only record of what the cluster did; ``report`` answers for a window."""

    def __init__(self, scenario: Scenario) -> None:
        self._seed = scenario.seed
        self._start = scenario.start.timestamp()
        self._step = int(scenario.step)
        self.segments: list[Segment] = []
        self.pods: dict[str, PodRecord] = {}
        self.workloads: dict[str, WorkloadRecord] = {}
        self.incidents: list[Incident] = []
        self.interruptions: list[Interruption] = []
        self.counter_resets: list[CounterReset] = []
        self._open: dict[tuple[str, str], Incident] = {}
        self._pending: list[PendingSegment] = []
        self._pending_last: dict[str, PendingSegment] = {}
        self._free: list[FreeSegment] = []
        self._free_last: dict[tuple[str, str], FreeSegment] = {}

    # ------------------------------------------------------------------ recording

    def device(self, node: str, pool: Pool, gpu_uuid: str, gpu_index: int,
               mig_profile: str | None, instance_id: int | None, fraction: float,
               memory_mib: int) -> DeviceInfo:
        model = GPU_MODELS[pool.accelerator]
        return DeviceInfo(
            node=node, pool=pool.name, accelerator=pool.accelerator,
            provisioning="spot" if pool.spot else "on-demand", zone=pool.zone,
            gpu_uuid=gpu_uuid, gpu_index=gpu_index, mig_profile=mig_profile,
            instance_id=instance_id, fraction=fraction, memory_mib=memory_mib,
            clients=pool.units_per_gpu if pool.sharing is not None else 1,
            key=mix(self._seed, key(gpu_uuid), instance_id or 0), has_nvlink=model.has_nvlink,
        )

    def segment(self, device: DeviceInfo, start: float, end: float, down: str | None,
                occupants: tuple[PodRef, ...], joules: float) -> None:
        self.segments.append(Segment(device, start, end, down, occupants, joules))

    def counter_reset(self, node: str, gpu_uuid: str, t: float, why: str) -> None:
        self.counter_resets.append(CounterReset(node, gpu_uuid, t, why))

    def pod_created(self, uid: str, namespace: str, name: str, team: str | None,
                    workload: str, profile: str, accelerator: str, t: float,
                    workload_uid: str | None = None, gpus: int = 0) -> None:
        self.pods[uid] = PodRecord(uid, namespace, name, team, workload, profile, accelerator, t,
                                   workload_uid=workload_uid, gpus=gpus)

    def workload_created(self, uid: str, namespace: str, name: str, team: str | None,
                         local_queue: str, cluster_queue: str, gpus: int, t: float) -> None:
        self.workloads[uid] = WorkloadRecord(uid, namespace, name, team, local_queue,
                                             cluster_queue, gpus, t)

    def workload_admitted(self, uid: str, queued_at: float, t: float) -> None:
        self.workloads[uid].admissions.append((queued_at, t))

    def workload_evicted(self, uid: str, t: float) -> None:
        self.workloads[uid].evictions.append(t)

    def pod_ref(self, uid: str, name: str, namespace: str, team: str | None, workload: str,
                profile: str, pod_key: int, running_at: float, multi_gpu: bool) -> PodRef:
        return PodRef(uid, name, namespace, team, workload, profile, pod_key, running_at,
                      multi_gpu)

    def pod_scheduled(self, uid: str, t: float, node: str) -> None:
        rec = self.pods[uid]
        rec.scheduled_at = t
        rec.node = node
        rec.phase = "Running"

    def pod_finished(self, uid: str, t: float, phase: str, reason: str) -> None:
        rec = self.pods[uid]
        rec.finished_at = t
        rec.phase = phase
        rec.reason = reason

    def down_start(self, node: str, gpu_uuids: list[str], reason: str, t: float,
                   xid: int | None = None) -> None:
        for uuid in gpu_uuids:
            if (uuid, reason) not in self._open:
                inc = Incident(node, uuid, reason, t, None, xid)
                self._open[(uuid, reason)] = inc
                self.incidents.append(inc)

    def down_end(self, node: str, gpu_uuids: list[str], reason: str, t: float) -> None:
        for uuid in gpu_uuids:
            inc = self._open.pop((uuid, reason), None)
            if inc is not None:
                inc.end = t

    def interruption(self, node: str, pool: str, t: float, pod_uids: list[str]) -> None:
        self.interruptions.append(Interruption(node, pool, t, tuple(pod_uids)))

    def waiting(self, t: float, rows: Iterable[Any], end: float | None = None) -> None:
        """What waited from ``t`` to ``end`` (default: the step from ``t``), as
        ``simulator.causes.Waiting`` rows."""
        end = t + self._step if end is None else end
        for w in rows:
            last = self._pending_last.get(w.uid)
            if last is not None and last.cause == w.cause and last.end == t \
                    and last.gpus == w.gpus:
                last.end = end
                continue
            seg = PendingSegment(w.uid, w.kind, w.namespace, w.cause, t, end, w.gpus)
            self._pending.append(seg)
            self._pending_last[w.uid] = seg

    def free(self, t: float, gpus: dict[tuple[str, str], float],
             end: float | None = None) -> None:
        """The free physical GPUs by (pool, use) from ``t`` to ``end`` (default: the step
        from ``t``)."""
        end = t + self._step if end is None else end
        for (pool, use), n in gpus.items():
            last = self._free_last.get((pool, use))
            if last is not None and last.end == t and abs(last.gpus - n) < 1e-9:
                last.end = end
                continue
            seg = FreeSegment(pool, use, t, end, n)
            self._free.append(seg)
            self._free_last[pool, use] = seg

    def pending_segments(self, start: float | None = None,
                         end: float | None = None) -> list[PendingSegment]:
        """Why things waited, as runs (uid, kind, namespace, cause, start, end, gpus),
        clipped to ``[start, end)``."""
        return _clipped(self._pending, start, end)

    def pending_gpu_seconds(self, start: float | None = None,
                            end: float | None = None) -> dict[str, float]:
        """Cause -> GPU-seconds waited (GPUs asked x seconds) in ``[start, end)``."""
        out: dict[str, float] = defaultdict(float)
        for seg in self.pending_segments(start, end):
            out[seg.cause] += seg.gpu_seconds
        return dict(out)

    def free_segments(self, start: float | None = None,
                      end: float | None = None) -> list[FreeSegment]:
        """Free physical GPUs of each pool and use, as runs, clipped to ``[start, end)``."""
        return _clipped(self._free, start, end)

    def free_gpu_seconds(self, start: float | None = None,
                         end: float | None = None) -> dict[tuple[str, str], float]:
        """(pool, use) -> free physical GPU-seconds in ``[start, end)``."""
        out: dict[tuple[str, str], float] = defaultdict(float)
        for seg in self.free_segments(start, end):
            out[seg.pool, seg.use] += seg.gpus * (seg.end - seg.start)
        return dict(out)

    # ------------------------------------------------------------------ values

    def device_activity(self, device: DeviceInfo, occupants: list[PodRef], t: float,
                        step: int) -> Activity:
        """What DCGM shows for ``device`` during ``step`` (starting at ``t``)."""
        if not occupants:
            return UNALLOCATED
        shares = [activity(p.profile, p.key, device.key, step, t >= p.running_at, p.multi_gpu,
                           device.has_nvlink) for p in occupants]
        return combine(shares, device.clients)

    # ------------------------------------------------------------------ queries

    def report(self, start: float, end: float, utilization: bool = True) -> GroundTruth:
        """The truth for ``[start, end)``; segments must be closed up to ``end``.

        ``utilization=False`` skips the per-step utilisation figures (the costly part).
        """
        seconds: dict[tuple[Any, ...], float] = defaultdict(float)
        joules: dict[tuple[Any, ...], float] = defaultdict(float)
        dev_sum: dict[str, float] = defaultdict(float)
        dev_n: dict[str, int] = defaultdict(int)
        pod_sum: dict[str, float] = defaultdict(float)
        pod_w: dict[str, float] = defaultdict(float)
        step = self._step
        for seg in self.segments:
            lo, hi = max(start, seg.start), min(end, seg.end)
            if hi <= lo:
                continue
            d = seg.device
            base = (d.node, d.pool, d.accelerator, d.provisioning, d.device_id)
            span = (hi - lo) * d.fraction
            energy = seg.joules * (hi - lo) / (seg.end - seg.start)  # constant power
            if seg.down is not None:
                seconds[("unavailable", None, *base)] += span
                joules[("unavailable", None, *base)] += energy
                continue
            if not seg.occupants:
                seconds[("unallocated", None, *base)] += span
                joules[("unallocated", None, *base)] += energy
            else:
                for p in seg.occupants:
                    seconds[("allocated", p, *base)] += span / len(seg.occupants)
                    joules[("allocated", p, *base)] += energy / len(seg.occupants)
            first = -(-(lo - self._start) // step)
            last = -(-(hi - self._start) // step)
            if not utilization:
                continue
            if not seg.occupants:  # an idle GPU: GR engine active is 0 in every step
                dev_n[d.device_id] += int(last - first)
                continue
            occupants = list(seg.occupants)
            weight = step * d.fraction / max(1, len(occupants))
            for k in range(int(first), int(last)):
                t = self._start + k * step
                gr = self.device_activity(d, occupants, t, k).gr_engine_active
                dev_sum[d.device_id] += gr
                dev_n[d.device_id] += 1
                for p in occupants:
                    pod_sum[p.uid] += gr * weight
                    pod_w[p.uid] += weight
        rows = []
        for row_key, secs in sorted(seconds.items(), key=lambda kv: _sort_key(kv[0])):
            state, ref, node, pool, accel, prov, device_id = row_key
            rows.append(GpuSeconds(
                state=state, pod_uid=ref.uid if ref else None, pod=ref.name if ref else None,
                namespace=ref.namespace if ref else None, team=ref.team if ref else None,
                workload=ref.workload if ref else None, node=node, pool=pool,
                accelerator=accel, provisioning=prov, device_id=device_id, seconds=secs,
                joules=joules[row_key]))
        pods = {uid: rec for uid, rec in self.pods.items()
                if rec.created_at < end and (rec.finished_at is None or rec.finished_at > start)}
        incidents = [Incident(i.node, i.gpu_uuid, i.reason, max(i.start, start),
                              min(i.end, end) if i.end is not None else end, i.xid)
                     for i in self.incidents
                     if i.start < end and (i.end is None or i.end > start)]
        return GroundTruth(
            start=start, end=end, gpu_seconds=rows,
            device_utilization={k: dev_sum[k] / dev_n[k] for k in sorted(dev_n)},
            pod_utilization={k: pod_sum[k] / pod_w[k] for k in sorted(pod_w) if pod_w[k] > 0},
            pods=pods, incidents=incidents,
            interruptions=[i for i in self.interruptions if start <= i.at < end],
            profiles={rec.workload: rec.profile for rec in pods.values()},
            workloads={uid: w for uid, w in self.workloads.items() if w.created_at < end},
            pending=self.pending_segments(start, end),
            free_gpu_seconds=self.free_gpu_seconds(start, end),
            counter_resets=[r for r in self.counter_resets if start <= r.at < end],
        )


def _sort_key(k: tuple[Any, ...]) -> tuple[Any, ...]:
    state, ref, *rest = k
    return (state, ref.uid if ref else "", *rest)
