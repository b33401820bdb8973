"""The simulated GKE GPU cluster: nodes, GPUs, pods, the scheduler, autoscaler and faults.

``Cluster`` is a deterministic state machine over virtual time. ``advance`` moves it in
whole steps; within a step, things happen in a fixed order (why things wait during the
step that ends, then faults (``simulator.faults``), containers started, completions,
deletions, Job deadlines, evictions, new nodes, arrivals, Kueue, scheduling
(``simulator.scheduler``), autoscaling (``simulator.autoscaler``), Events
(``simulator.events``)), always at a step boundary.
Every change is written to the ``ApiStore`` as Kubernetes objects, and every change to what
a GPU does, and why each waiting pod waits (``simulator.causes``), to the ``TruthLog``, so
the ground truth comes from this state, never from what the HTTP side shows.

A bound pod whose workload has a ``startup`` stays ``Pending`` (scheduled, its container
``ContainerCreating`` while the kubelet pulls its image) until it runs.

Each GPU has DCGM's energy counter (``Gpu.energy_mj``, mJ since its driver loaded). Every
device draws a constant power over each of its truth segments (``_segment_watts``, the
load curve of ``simulator.profiles``), which ends whenever that could change: a pod binds,
its containers start, it leaves, the GPU or its node goes down or comes back. The counter
advances by that power, and the segment's ``joules`` in the truth are the same energy. A
NotReady node is powered off (0 W, its counters stand still) and its GPUs' counters restart
at 0 when it comes back Ready (the driver loaded at boot); a GPU down for an XID, or
missing, keeps drawing its idle floor; a ``driver_reload`` fault resets a Ready node's
counters to 0 and changes nothing else. The truth records each reset (``counter_resets``).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Literal

from exporter.model.catalog import GPU_MODELS, GpuModel
from simulator import causes, clock, events, faults, objects, scheduler
from simulator.autoscaler import Autoscaler, CaWords, instance_group
from simulator.events import KUBELET, SCHEDULER, EventLog, Involved, SilentLog
from simulator.kueue import KueueState, QueuedWorkload
from simulator.placement import Placement
from simulator.profiles import PROFILES, Activity, mean_power_ratio
from simulator.rng import key, mix, uuid_str
from simulator.scenario import Fault, Pool, Scenario, Workload
from simulator.store import ApiStore
from simulator.truth import DeviceInfo, PodRef, TruthLog

MIG_INSTANCE_IDS = {1: (7, 8, 9, 10, 11, 12, 13), 2: (3, 4, 5), 3: (1, 2), 7: (0,)}
"""GPU instance ids NVIDIA's MIG placement gives each profile size on a 7-slice GPU."""

_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
EndpointMode = Literal["ok", "refuse", "error", "hang"]
RETRY_SECONDS = 300.0
"""How often the scheduler retries a pod it could not place, nothing else changing
(``podMaxInUnschedulablePodsDuration``)."""


def _suffix(*values: int, length: int = 5) -> str:
    h = mix(*values)
    out = []
    for _ in range(length):
        h, r = divmod(h, len(_NAME_ALPHABET))
        out.append(_NAME_ALPHABET[r])
    return "".join(out)


@dataclass(slots=True, eq=False)
class Device:
    """A DCGM entity: a whole GPU, or one MIG instance of it."""

    gpu: Gpu
    info: DeviceInfo
    occupants: list[Pod] = field(default_factory=list)
    since: float = 0.0


@dataclass(slots=True, eq=False)
class Gpu:
    node: Node
    index: int
    uuid: str
    pci_bus_id: str
    devices: list[Device] = field(default_factory=list)
    down_reason: str | None = None
    xid: int = 0
    fault_until: float = 0.0
    energy_mj: float = 0.0
    """``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ since the driver loaded) at the start of
    its devices' open segments; ``Cluster.gpu_energy_mj`` adds what they drew since."""


@dataclass(slots=True, eq=False)
class Node:
    name: str
    uid: str
    pool: Pool
    model: GpuModel
    ordinal: int
    address: str
    created_at: float
    gpus: list[Gpu] = field(default_factory=list)
    units: list[Pod | None] = field(default_factory=list)
    ready: bool = True
    ready_since: float = 0.0
    not_ready_until: float = 0.0
    deleted: bool = False
    empty_since: float | None = None
    endpoint_mode: EndpointMode = "ok"
    endpoint_until: float = 0.0
    dcgm_pod_name: str = ""
    per_gpu: int = field(init=False)
    """``nvidia.com/gpu`` units one of its GPUs advertises (its pool's)."""
    down_gpus: int = 0
    """Its GPUs with a ``down_reason`` (``set_down`` keeps it)."""

    def __post_init__(self) -> None:
        self.per_gpu = self.pool.units_per_gpu

    def unit_gpu(self, unit: int) -> Gpu:
        return self.gpus[unit // self.per_gpu]

    def unit_device(self, unit: int) -> Device:
        gpu = self.unit_gpu(unit)
        if self.pool.mig_partition_size is not None:
            return gpu.devices[unit % self.per_gpu]
        return gpu.devices[0]

    def healthy_unit(self, unit: int) -> bool:
        return self.unit_gpu(unit).down_reason is None

    def set_down(self, gpu: Gpu, reason: str | None) -> None:
        """``gpu`` (one of this node's) down for ``reason``, or up again (None)."""
        self.down_gpus += (reason is not None) - (gpu.down_reason is not None)
        gpu.down_reason = reason

    @property
    def allocatable(self) -> int:
        """``nvidia.com/gpu`` the device plugin offers: units on healthy GPUs."""
        return self.per_gpu * (len(self.gpus) - self.down_gpus)

    def free_units(self) -> list[int]:
        if not self.down_gpus:
            return [u for u, p in enumerate(self.units) if p is None]
        per, gpus = self.per_gpu, self.gpus
        return [u for u, p in enumerate(self.units)
                if p is None and gpus[u // per].down_reason is None]

    def free_count(self) -> int:
        """``len(free_units())``."""
        return self.units.count(None) if not self.down_gpus else len(self.free_units())

    @property
    def schedulable(self) -> bool:
        return self.ready and not self.deleted


@dataclass(slots=True, eq=False)
class Job:
    name: str
    uid: str
    workload: Workload
    owner_kind: str
    profile: str
    run_seconds: float
    key: int
    retries: int = 0
    queued: QueuedWorkload | None = None
    """Its Kueue Workload, when a LocalQueue queues it."""
    suspended: bool = False
    """Evicted by Kueue: its pods are deleted, not replaced, until it is admitted again."""
    succeeded: int = 0
    """Pods of its current run that succeeded."""
    ended: bool = False
    """Failed for good (its ``activeDeadlineSeconds`` passed): its pods are not replaced."""
    submitted_at: float | None = None
    """When a traced job carried into the scenario was submitted (before its start): its
    first pods' creation time."""


@dataclass(slots=True, eq=False)
class Pod:
    name: str
    uid: str
    namespace: str
    team: str | None
    job: Job
    index: int
    key: int
    gpus: int
    priority: int
    created_at: float
    remaining_seconds: float | None
    """Run time still needed (None: runs until stopped)."""
    ip: str
    scheduled_at: float | None = None
    started_at: float | None = None
    running_at: float | None = None
    finished_at: float | None = None
    phase: str = "Pending"
    node: Node | None = None
    units: tuple[int, ...] = ()
    reason: str | None = None
    message: str | None = None
    exit_code: int | None = None
    unschedulable_since: float | None = None
    unschedulable_message: str = ""
    deleted: bool = False
    deletion_at: float | None = None
    """When a graceful deletion removes it (its ``deletionTimestamp``)."""
    deletion_grace_seconds: int = 0
    ref: PodRef | None = None
    replaces_disrupted: bool = False
    """It replaces a pod of its slot whose node was reclaimed, lost or scaled down."""
    ca: CaWords = field(default_factory=CaWords)
    """What the cluster autoscaler last told it."""
    failed_scheduling_at: float | None = None
    """The scheduler's last ``FailedScheduling`` for it."""

    @property
    def workload(self) -> Workload:
        return self.job.workload

    @property
    def workload_name(self) -> str:
        """The controller a person would name: Job, StatefulSet, or the ReplicaSet's
        Deployment (the ReplicaSet name less its pod-template-hash)."""
        return self.job.workload.name if self.job.owner_kind == "ReplicaSet" else self.job.name


class Cluster:
    """The whole simulated cluster at virtual time ``now``."""

    def __init__(self, scenario: Scenario, store: ApiStore | None = None,
                 dcgm_port: int = objects.DCGM_PORT, headless: bool = False) -> None:
        self.scenario = scenario
        self.headless = headless
        """No API side: no objects written, no Events (a replay that only reads the truth)."""
        self.dcgm_port = dcgm_port
        self.store = store if store is not None else ApiStore()
        self.truth = TruthLog(scenario)
        self.step = int(scenario.step)
        self.start = scenario.start.timestamp()
        self.now = self.start
        self.seed = scenario.seed
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, Pod] = {}  # live (not deleted) pods by namespace/name
        self.pending: list[Pod] = []
        self._teams = {n.name: n.team for n in scenario.namespaces}
        self._pools = {p.name: p for p in scenario.pools}
        self._node_counter = 0
        self._pod_counter = 0
        self._pool_counters = {p.name: 0 for p in scenario.pools}
        self.placement = Placement(scenario)
        self.events = (SilentLog if headless else EventLog)(
            self.store, self.seed, f"{SCHEDULER}-gke-{scenario.cluster}-control-plane")
        self.autoscaler = Autoscaler(self)
        self._starting: list[tuple[float, int, Pod]] = []  # (runs at, tiebreak, pod)
        self._deadlines: list[tuple[float, int, Job]] = []  # (activeDeadline at, ..., Job)
        self._faults = sorted(enumerate(scenario.faults), key=lambda f: (f[1].at, f[0]))
        self._fault_cursor = 0
        self._arrivals: dict[str, tuple[random.Random, float]] = {}
        self._dirty_pods: dict[str, Pod] = {}
        self._dirty_nodes: dict[str, Node] = {}
        self._to_delete: list[tuple[float, Pod]] = []
        self._ends: list[tuple[float, int, Pod]] = []  # (completion time, tiebreak, pod)
        self._end_seq = itertools.count()
        self._faulty: dict[str, Node] = {}  # nodes with a fault in progress
        self._traced = sorted(scenario.jobs, key=lambda j: j.at)
        self._traced_cursor = 0
        self._workloads = {w.name: w for w in scenario.workloads}
        self._rework = 0.0  # run time lost by the pods the fault being applied ends
        self.freed = 0
        """Counts the changes that may let a pod the scheduler refused in: GPUs freed, and
        every change ``reshaped`` counts."""
        self.reshaped = 0
        """Counts the changes to the nodes: added or deleted, Ready or not, GPUs down or
        back."""
        self._by_pool: tuple[int, dict[str, list[Node]]] = (-1, {})
        self.refused: dict[tuple[str, int], str] = {}
        """The scheduler's message to each shape of pod (workload, GPUs) no node could take,
        as of ``refused_since``."""
        self.refused_since = -1
        self._scaled = True
        """The last step scaled a pool up (the next may scale another): ``advance_to``
        takes the step after it. The first step is always taken."""
        self.kueue = KueueState(scenario.kueue, self.start, self.seed) \
            if scenario.kueue is not None else None
        self._bootstrap()

    # ----------------------------------------------------------------- public API

    @property
    def step_index(self) -> int:
        return round((self.now - self.start) / self.step)

    def advance(self, seconds: float) -> None:
        """Move virtual time forward by whole steps covering ``seconds``."""
        for _ in range(math.ceil(seconds / self.step - 1e-9)):
            self._tick(self.step)

    def advance_to(self, end: float) -> int:
        """Move to ``end`` (the first step boundary at or after it) by the steps at which
        something can change (``simulator.clock``): the state and truth ``advance`` makes
        step by step, without the quiet steps between. Returns the steps taken."""
        if end <= self.now + 1e-9:
            return 0
        end = clock.on_grid(self, end)
        taken = 0
        while self.now < end - 1e-9:
            due = self.now if self._scaled else clock.next_change(self)
            self._tick(min(end, end if due is None else clock.on_grid(self, due)) - self.now)
            taken += 1
        return taken

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes.values() if not n.deleted]

    def nodes_by_pool(self) -> dict[str, list[Node]]:
        """The live nodes of each pool that has any, by name (kept until the nodes change:
        not to be changed)."""
        if self._by_pool[0] != self.reshaped:
            groups: dict[str, list[Node]] = {}
            for n in sorted(self.live_nodes(), key=lambda n: n.name):
                groups.setdefault(n.pool.name, []).append(n)
            self._by_pool = (self.reshaped, groups)
        return self._by_pool[1]

    def _reshape(self) -> None:
        """The nodes changed (and so may their free GPUs)."""
        self.reshaped += 1
        self.freed += 1

    def pending_pods(self) -> list[Pod]:
        """Pods in phase Pending: waiting for a node, then bound and being started."""
        return self.pending + [p for _, _, p in self._starting
                               if p.phase == "Pending" and not p.deleted]

    def device_activity(self, device: Device, step: int | None = None) -> Activity | None:
        """What DCGM shows for ``device`` during ``step`` (default: now); None if missing."""
        step = self.step_index if step is None else step
        return self.truth.device_activity(device.info, [p.ref for p in device.occupants
                                                        if p.ref is not None],
                                          self.start + step * self.step, step)

    def submit(self, workload: str, *, profile: str | None = None,
               run_seconds: float | None = None) -> list[Pod]:
        """Create one job of ``workload`` now and run a scheduling pass; returns its pods."""
        w = next(w for w in self.scenario.workloads if w.name == workload)
        job = self._new_job(w, "Job", self._pod_counter)
        if profile is not None:
            job.profile = profile
        if run_seconds is not None:
            job.run_seconds = float(math.ceil(run_seconds / self.step) * self.step)
        self._start_job(job)
        self._admit()
        self._schedule()
        self._flush()
        return [p for p in self.pods.values() if p.job is job]

    def delete_pod(self, pod: Pod, *, grace_seconds: int = 30) -> None:
        """Delete a pod now, in whatever phase, as ``kubectl delete pod`` does.

        A scheduled pod is deleted gracefully: its object gets ``deletionTimestamp`` (now +
        ``grace_seconds``) and keeps its GPUs until then, when it is removed (its containers
        killed if still running); the watch's DELETED event carries the stamp. With
        ``grace_seconds=0`` (``--force --grace-period=0``, or the pod garbage collector after
        its node is lost), and for a pod not scheduled, it is removed at once, its object as
        it last was. A pod that had not ended is replaced by its controller, as a failed one
        would be."""
        if pod.deleted or pod.deletion_at is not None:
            return
        if grace_seconds > 0 and pod.node is not None:
            pod.deletion_at = self.now + grace_seconds
            pod.deletion_grace_seconds = grace_seconds
            self._to_delete.append((pod.deletion_at, pod))
            self._dirty_pods[f"{pod.namespace}/{pod.name}"] = pod
        else:
            self._remove(pod)
        self._schedule()
        self._flush()

    def inject(self, fault: Fault) -> None:
        """Apply a fault now (on-demand injection); ``fault.at`` is ignored."""
        faults.apply(self, fault)
        self._flush()

    # ----------------------------------------------------------------- the step

    def _tick(self, span: float) -> None:
        """The ``span`` seconds from now (whole steps, during which nothing changes), then
        what happens at their end."""
        waits, free = causes.observe(self)  # the steps that end at now + span
        self.truth.waiting(self.now, waits, self.now + span)
        self.truth.free(self.now, free, self.now + span)
        self.now += span
        t = self.now
        attempts = len(self.autoscaler.attempts)
        faults.due(self, t)
        faults.end(self, t)
        self._start_due(t)
        while self._ends and self._ends[0][0] <= t + 1e-9:
            _, _, pod = heapq.heappop(self._ends)
            if pod.phase == "Running":
                self._finish(pod, "Succeeded", "Completed", 0, None)
        self._delete_due(t)
        self._deadlines_due(t)
        faults.evict_not_ready(self, t)
        self.autoscaler.due(t)
        self._arrive(t)
        self._admit()
        self._schedule()
        self.autoscaler.run(t)
        self.events.tick(t)
        self._scaled = len(self.autoscaler.attempts) > attempts
        self._flush()

    # ----------------------------------------------------------------- bootstrap

    def _bootstrap(self) -> None:
        for ns in self.scenario.namespaces:
            self.store.put("Namespace", objects.namespace(ns, self.start, self.seed))
        for pool in self.scenario.pools:
            for _ in range(pool.nodes):
                self._add_node(pool)
        faults.due(self, self.now)  # a fault at offset 0 holds from the start
        for w in self.scenario.workloads:
            if w.replicas is not None:
                owner = "ReplicaSet" if w.kind == "serving" else "StatefulSet"
                self._create_pods(self._new_job(w, owner, 0))
            elif w.arrivals_per_day:
                rng = random.Random(mix(self.seed, key(w.name)))
                self._arrivals[w.name] = (rng, self.start + self._interarrival(rng, w))
        self._traced_due(self.now)
        self._admit()
        self._schedule()
        self._flush()

    def _interarrival(self, rng: random.Random, w: Workload) -> float:
        assert w.arrivals_per_day is not None
        return rng.expovariate(w.arrivals_per_day / 86400.0)

    # ----------------------------------------------------------------- nodes

    def _add_node(self, pool: Pool) -> Node:
        model = GPU_MODELS[pool.accelerator]
        ordinal = self._pool_counters[pool.name]
        self._pool_counters[pool.name] += 1
        n = self._node_counter
        self._node_counter += 1
        name = f"{instance_group(self.scenario, pool)}-{_suffix(self.seed, n, 4)[:4]}"
        node = Node(name=name, uid=uuid_str(self.seed, key(name)), pool=pool, model=model,
                    ordinal=ordinal, address=f"127.1.{n // 250}.{n % 250 + 1}",
                    created_at=self.now, ready_since=self.now)
        node.dcgm_pod_name = f"dcgm-exporter-{_suffix(self.seed, key(name), 1)}"
        profile = model.mig_profiles.get(pool.mig_partition_size or "")
        for g in range(pool.gpus_per_node):
            gpu = Gpu(node=node, index=g, uuid="GPU-" + uuid_str(self.seed, key(name), g),
                      pci_bus_id=f"00000000:{_BUS_IDS[g % len(_BUS_IDS)]}:00.0",
                      energy_mj=float(mix(self.seed, key(name), g) % 10**10))
            if profile is not None:
                ids = MIG_INSTANCE_IDS[profile.compute_slices]
                for i in range(pool.units_per_gpu):
                    info = self.truth.device(node.name, pool, gpu.uuid, g, profile.name,
                                             ids[i], profile.fraction, profile.memory_mib)
                    gpu.devices.append(Device(gpu, info, since=self.now))
            else:
                info = self.truth.device(node.name, pool, gpu.uuid, g, None, None, 1.0,
                                         model.memory_mib)
                gpu.devices.append(Device(gpu, info, since=self.now))
            node.gpus.append(gpu)
        node.units = [None] * (pool.gpus_per_node * pool.units_per_gpu)
        node.empty_since = self.now
        self.nodes[name] = node
        self._reshape()
        self._dirty_nodes[name] = node
        return node

    def _delete_node(self, node: Node, reason: str) -> None:
        for pod in sorted({p for p in node.units if p is not None}, key=lambda p: p.name):
            self._finish(pod, "Failed", reason, 143,
                         "Pod was terminated in response to imminent node shutdown.")
        for gpu in node.gpus:
            for device in gpu.devices:
                self._close_segment(device)
            self.truth.down_end(node.name, [gpu.uuid], "node_not_ready", self.now)
            if gpu.down_reason is not None:
                self.truth.down_end(node.name, [gpu.uuid], gpu.down_reason, self.now)
        node.deleted = True
        self._reshape()
        self._dirty_nodes[node.name] = node

    def _node_in_pool(self, pool_name: str, index: int) -> Node | None:
        alive = sorted((n for n in self.nodes.values() if n.pool.name == pool_name
                        and not n.deleted), key=lambda n: n.ordinal)
        return alive[index] if index < len(alive) else None

    # ----------------------------------------------------------------- truth segments

    def _close_segment(self, device: Device) -> None:
        if self.now > device.since:
            node = device.gpu.node
            down = "node_not_ready" if not node.ready else device.gpu.down_reason
            watts = self._segment_watts(device)
            seconds = self.now - device.since
            self.truth.segment(device.info, device.since, self.now, down,
                               tuple(p.ref for p in device.occupants if p.ref is not None),
                               watts * seconds)
            device.gpu.energy_mj += watts * seconds * 1e3
        device.since = self.now

    def _segment_watts(self, device: Device) -> float:
        """The power ``device`` draws over its open segment, constant over it: nothing on a
        NotReady node (powered off, or rebooting); a GPU down for an XID, or missing, at
        its idle floor; else the GPU model's load curve at its pods' mean power ratio
        (``simulator.profiles``: idle floor without a pod, the mean of their ratios on a
        time-shared GPU); a MIG instance its fraction of that."""
        gpu = device.gpu
        node = gpu.node
        if not node.ready:
            return 0.0
        ratio = 0.0
        if gpu.down_reason is None and device.occupants:
            ratios = [mean_power_ratio(p.ref.profile, device.since >= p.ref.running_at - 1e-9)
                      for p in device.occupants if p.ref is not None]
            ratio = sum(ratios) / len(ratios) if ratios else 0.0
        m = node.model
        watts = m.idle_power_watts + ratio * (m.power_limit_watts - m.idle_power_watts)
        return watts * device.info.fraction

    def gpu_energy_mj(self, gpu: Gpu) -> float:
        """The GPU's energy counter at ``now``: mJ since its driver loaded, the sum of its
        devices' energy. It only grows, but for a reset to 0 when the driver reloads (a
        ``driver_reload`` fault, or a NotReady node coming back); it stands still while
        its node is NotReady."""
        open_part = sum(self._segment_watts(d) * (self.now - d.since) * 1e3 for d in gpu.devices)
        return gpu.energy_mj + open_part

    def _reset_counters(self, node: Node, why: str) -> None:
        """The node's driver loaded again now: each GPU's energy counter restarts at 0."""
        for gpu in node.gpus:
            self._close_gpu(gpu)
            gpu.energy_mj = 0.0
            self.truth.counter_reset(node.name, gpu.uuid, self.now, why)

    def _close_gpu(self, gpu: Gpu) -> None:
        for device in gpu.devices:
            self._close_segment(device)

    # ----------------------------------------------------------------- jobs and pods

    def _job_name(self, w: Workload, owner_kind: str, ordinal: int) -> str:
        if owner_kind == "Job":
            return f"{w.name}-{_suffix(self.seed, key(w.name), ordinal)}"
        if owner_kind == "ReplicaSet":
            return f"{w.name}-{_suffix(self.seed, key(w.name), length=10)}"
        return w.name

    def _new_job(self, w: Workload, owner_kind: str, ordinal: int) -> Job:
        rng = random.Random(mix(self.seed, key(w.name), ordinal, 17))
        profiles = sorted(w.profiles)
        profile = rng.choices(profiles, weights=[w.profiles[p] for p in profiles])[0]
        assert profile in PROFILES
        lo, hi = w.duration
        run = math.ceil(rng.uniform(lo, hi) / self.step) * self.step
        name = self._job_name(w, owner_kind, ordinal)
        return Job(name=name, uid=uuid_str(self.seed, key(name)), workload=w,
                   owner_kind=owner_kind, profile=profile, run_seconds=float(run),
                   key=mix(self.seed, key(name), ordinal))

    def _create_pods(self, job: Job, remaining: float | None = None,
                     only_index: int | None = None) -> list[Pod]:
        w = job.workload
        made = []
        always_on = w.replicas is not None
        count = w.replicas if w.replicas is not None else w.pods
        created = self.now if job.submitted_at is None else job.submitted_at
        job.submitted_at = None  # the pods that replace these are created when they do
        for i in range(count) if only_index is None else [only_index]:
            n = self._pod_counter
            self._pod_counter += 1
            if job.owner_kind == "StatefulSet":
                name = f"{job.name}-{i}"
            elif job.owner_kind == "Job" and w.pods > 1:
                name = f"{job.name}-{i}-{_suffix(self.seed, n)}"
            else:
                name = f"{job.name}-{_suffix(self.seed, n)}"
            pod = Pod(
                name=name, uid=uuid_str(self.seed, n, 1), namespace=w.namespace,
                team=self._teams[w.namespace], job=job, index=i,
                key=mix(self.seed, job.key, n), gpus=w.gpus_per_pod,
                priority=self.scenario.priority_classes[w.priority_class],
                created_at=created,
                remaining_seconds=None if always_on else (
                    job.run_seconds if remaining is None else remaining),
                ip=f"10.{52 + n // 65536 % 64}.{n // 256 % 256}.{n % 256}",
            )
            self.pods[f"{pod.namespace}/{pod.name}"] = pod
            self.pending.append(pod)
            made.append(pod)
            self._dirty_pods[f"{pod.namespace}/{pod.name}"] = pod
            self.truth.pod_created(pod.uid, pod.namespace, pod.name, pod.team, pod.workload_name,
                                   job.profile, w.accelerator, created,
                                   job.queued.uid if job.queued is not None else None,
                                   pod.gpus)
        return made

    def _arrive(self, t: float) -> None:
        for w in self.scenario.workloads:
            if w.name not in self._arrivals:
                continue
            rng, due = self._arrivals[w.name]
            while due <= t + 1e-9:
                ordinal = self._pod_counter
                job = self._new_job(w, "Job", ordinal)
                self._start_job(job)
                due += self._interarrival(rng, w)
            self._arrivals[w.name] = (rng, due)
        self._traced_due(t)

    def _traced_due(self, t: float) -> None:
        """Submit the traced jobs whose time has come by ``t`` (at the start, those carried
        into the scenario too)."""
        while self._traced_cursor < len(self._traced) and \
                self.start + self._traced[self._traced_cursor].at <= t + 1e-9:
            traced = self._traced[self._traced_cursor]
            self._traced_cursor += 1
            w = self._workloads[traced.workload]
            ordinal = self._pod_counter
            drawn = self._job_name(w, "Job", ordinal)  # its pods' keys are a drawn job's
            job = Job(name=traced.name, uid=uuid_str(self.seed, key(traced.name), 2),
                      workload=w, owner_kind="Job", profile=traced.profile,
                      run_seconds=float(math.ceil(traced.run / self.step - 1e-9) * self.step),
                      key=mix(self.seed, key(drawn), ordinal))
            if traced.at < 0:
                job.submitted_at = self.start + traced.at
            self._start_job(job)

    def _start_job(self, job: Job) -> None:
        """A new Job: its pods, or, when a LocalQueue queues it, a Workload and no pod until
        Kueue admits it."""
        w = job.workload
        lq = self.kueue.local_queue(w.namespace, w.queue) if self.kueue is not None else None
        if self.kueue is None or lq is None:
            self._create_pods(job)
            self._deadline(job)
            return
        priority = self.scenario.priority_classes[w.priority_class]
        submitted = self.now if job.submitted_at is None else job.submitted_at
        job.submitted_at = None  # its pods are created when Kueue admits it
        job.queued = self.kueue.submit(job, lq, priority, submitted)
        self.truth.workload_created(job.queued.uid, w.namespace, job.queued.name,
                                    self._teams[w.namespace], lq.name, lq.cluster_queue,
                                    job.queued.gpus, submitted)

    def _admit(self) -> None:
        """Kueue's pass: the Jobs it evicts lose their pods; those it admits get theirs."""
        if self.kueue is None:
            return
        admitted, evicted = self.kueue.admit(self.now)
        for wl in evicted:
            job = wl.job
            job.suspended = True
            for pod in [p for p in self.pods.values() if p.job is job]:
                if pod.phase not in ("Succeeded", "Failed"):
                    self._remove(pod)
            job.suspended = False
            self.truth.workload_evicted(wl.uid, self.now)
        for wl in admitted:
            wl.job.succeeded = 0
            self._create_pods(wl.job)
            self._deadline(wl.job)  # a resumed Job's startTime is its admission
            self.truth.workload_admitted(wl.uid, wl.queued_at, self.now)

    def _finish(self, pod: Pod, phase: str, reason: str, exit_code: int,
                message: str | None) -> None:
        """End a pod: release its GPUs; replace it if its controller would."""
        if pod.phase in ("Succeeded", "Failed"):
            return
        ran = (self.now - pod.running_at) if pod.running_at is not None else 0.0
        if pod in self.pending:
            self.pending.remove(pod)
        self._release(pod)
        pod.phase = phase
        pod.reason = reason
        pod.message = message
        pod.exit_code = exit_code
        pod.finished_at = self.now
        self._dirty_pods[f"{pod.namespace}/{pod.name}"] = pod
        self._to_delete.append((self.now + self.scenario.completed_pod_ttl, pod))
        self.truth.pod_finished(pod.uid, self.now, phase, reason)
        job = pod.job
        if phase == "Succeeded" and job.queued is not None and self.kueue is not None:
            job.succeeded += 1
            if job.succeeded >= job.workload.pods:
                self.kueue.finish(job.queued, self.now, "Succeeded")
        if phase == "Failed":
            self._replace(pod, ran)

    def _replace(self, pod: Pod, ran: float) -> None:
        """What the pod's controller does when it fails (or is deleted) after ``ran``
        seconds: a new pod with the same index, or none when the job is out of retries."""
        job = pod.job
        if job.suspended or job.ended:
            return  # Kueue evicted it (it runs again once admitted again), or it failed
        if job.owner_kind == "StatefulSet":  # recreated under the same name at once
            pod.deleted = True
            k = f"{pod.namespace}/{pod.name}"
            self.pods.pop(k, None)
            self._dirty_pods.pop(k, None)
            self.store.delete("Pod", k)
        made: list[Pod] = []
        if job.workload.replicas is not None:
            made = self._create_pods(job, only_index=pod.index)
        elif job.retries < job.workload.max_retries:
            job.retries += 1
            done = max(0.0, ran - self._rework)  # what it keeps of its run
            left = None if pod.remaining_seconds is None else max(
                float(self.step), pod.remaining_seconds - done)
            made = self._create_pods(job, remaining=left, only_index=pod.index)
        elif job.queued is not None and self.kueue is not None:
            self.kueue.finish(job.queued, self.now, "Failed")
        for new in made:
            new.replaces_disrupted = pod.reason in objects.DISRUPTIONS

    def _release(self, pod: Pod) -> None:
        node = pod.node
        if node is None or not pod.units:
            return
        touched: dict[int, Device] = {}
        for u in pod.units:
            d = node.unit_device(u)
            touched[id(d)] = d
        for d in touched.values():
            self._close_segment(d)
            d.occupants.remove(pod)
        for u in pod.units:
            node.units[u] = None
        self.freed += 1
        if all(p is None for p in node.units):
            node.empty_since = self.now
        self._dirty_nodes[node.name] = node

    def _delete_due(self, t: float) -> None:
        keep = []
        for due, pod in self._to_delete:
            if due <= t + 1e-9:
                self._remove(pod)
            else:
                keep.append((due, pod))
        self._to_delete = keep

    def _remove(self, pod: Pod) -> None:
        """Take a pod out of the cluster now. One that had not ended stops here, its GPUs
        freed, and its controller replaces it."""
        k = f"{pod.namespace}/{pod.name}"
        if self.pods.get(k) is not pod:
            return  # gone already (a StatefulSet pod replaced under its name)
        ended = pod.phase in ("Succeeded", "Failed")
        pod.deleted = True
        del self.pods[k]
        self._dirty_pods[k] = pod
        if ended:
            return
        ran = (self.now - pod.running_at) if pod.running_at is not None else 0.0
        if pod in self.pending:
            self.pending.remove(pod)
        self._release(pod)
        pod.phase = "Deleted"  # what the exporter calls it; the API never shows it
        pod.finished_at = self.now
        self.truth.pod_finished(pod.uid, self.now, "Deleted", "Deleted")
        self._replace(pod, ran)

    # ----------------------------------------------------------------- scheduling

    def _schedule(self) -> None:
        scheduler.schedule(self)

    def _unschedulable(self, pod: Pod, message: str) -> None:
        """The scheduler could not place ``pod`` now: its condition says why, and its
        ``FailedScheduling`` event (again on each retry, every 5 minutes)."""
        first = pod.unschedulable_since is None
        if first or message != pod.unschedulable_message:
            if first:
                pod.unschedulable_since = self.now
            pod.unschedulable_message = message
            self._dirty_pods[f"{pod.namespace}/{pod.name}"] = pod
        elif pod.failed_scheduling_at is not None and \
                self.now - pod.failed_scheduling_at < RETRY_SECONDS - 1e-9:
            return
        pod.failed_scheduling_at = self.now
        if self.events.kept:
            self.events.record(_involved(pod), "FailedScheduling", message,
                               component=SCHEDULER, now=self.now, warning=True)

    def _bind(self, pod: Pod, node: Node, units: list[int]) -> None:
        touched: dict[int, Device] = {}
        for u in units:
            d = node.unit_device(u)
            touched[id(d)] = d
        for d in touched.values():
            self._close_segment(d)
        for u in units:
            assert node.units[u] is None, "GPU unit double-allocated"
            node.units[u] = pod
        pod.node = node
        pod.units = tuple(units)
        pod.scheduled_at = self.now
        pod.started_at = self.now
        startup = math.ceil(pod.workload.startup / self.step - 1e-9) * self.step
        pod.running_at = self.now + startup
        pod.phase = "Running" if startup <= 0 else "Pending"
        if self.events.kept:
            self.events.record(_involved(pod), "Scheduled",
                               events.scheduled(pod.namespace, pod.name, node.name),
                               component=SCHEDULER, now=self.now)
        if startup > 0:
            heapq.heappush(self._starting, (pod.running_at, next(self._end_seq), pod))
            if self.events.kept:
                self.events.record(_involved(pod, container=True), "Pulling",
                                   events.pulling(objects.image(pod.workload, self.scenario)),
                                   component=KUBELET, now=self.now, host=node.name)
        if pod.remaining_seconds is not None:
            heapq.heappush(self._ends, (pod.running_at + pod.remaining_seconds,
                                        next(self._end_seq), pod))
        multi = pod.gpus > 1 or pod.workload.pods > 1
        pod.ref = self.truth.pod_ref(pod.uid, pod.name, pod.namespace, pod.team,
                                     pod.workload_name, pod.job.profile, pod.key, pod.running_at,
                                     multi)
        for d in touched.values():
            d.occupants.append(pod)
        node.empty_since = None
        self.truth.pod_scheduled(pod.uid, self.now, node.name)
        self._dirty_pods[f"{pod.namespace}/{pod.name}"] = pod
        self._dirty_nodes[node.name] = node

    def _start_due(self, t: float) -> None:
        """Bound pods whose containers start by ``t``: their image is pulled, they run."""
        while self._starting and self._starting[0][0] <= t + 1e-9:
            _, _, pod = heapq.heappop(self._starting)
            if pod.phase != "Pending" or pod.deleted or pod.node is None:
                continue
            # what its GPUs draw changes: their segments end here
            devices = {id(d): d for d in map(pod.node.unit_device, pod.units)}
            for d in devices.values():
                self._close_segment(d)
            pod.phase = "Running"
            self._dirty_pods[f"{pod.namespace}/{pod.name}"] = pod
            if not self.events.kept:
                continue
            took = t - (pod.scheduled_at or t)
            image = objects.image(pod.workload, self.scenario)
            self.events.record(_involved(pod, container=True), "Pulled",
                               events.pulled(image, took, objects.image_bytes(pod.workload)),
                               component=KUBELET, now=t, host=pod.node.name)

    def _deadline(self, job: Job) -> None:
        if job.workload.active_deadline is not None:
            heapq.heappush(self._deadlines, (self.now + job.workload.active_deadline,
                                             next(self._end_seq), job))

    def _deadlines_due(self, t: float) -> None:
        """Jobs past their ``activeDeadlineSeconds`` fail: the Job controller deletes
        their pods, waiting or running, and makes no more."""
        while self._deadlines and self._deadlines[0][0] <= t + 1e-9:
            _, _, job = heapq.heappop(self._deadlines)
            live = [p for p in self.pods.values() if p.job is job
                    and p.phase not in ("Succeeded", "Failed")]
            if not live:
                continue
            job.ended = True
            for pod in sorted(live, key=lambda p: p.name):
                self._remove(pod)
            if job.queued is not None and self.kueue is not None:
                self.kueue.finish(job.queued, t, "Failed")

    # ----------------------------------------------------------------- API objects

    def _flush(self) -> None:
        """Write every object that changed during this step to the API store."""
        if self.headless:
            for node in self._dirty_nodes.values():
                if node.deleted:
                    self.nodes.pop(node.name, None)
            self._dirty_nodes.clear()
            self._dirty_pods.clear()
            return
        for name in sorted(self._dirty_nodes):
            node = self._dirty_nodes[name]
            dcgm_key = f"gke-managed-system/{node.dcgm_pod_name}"
            if node.deleted:
                self.store.delete("Pod", dcgm_key)
                self.store.delete("Node", node.name)
                self.nodes.pop(node.name, None)
            else:
                self.store.put("Node", objects.node(node, self.scenario, self.now))
                if self.store.get("Pod", dcgm_key) is None:
                    self.store.put("Pod", objects.dcgm_exporter_pod(node, self.scenario,
                                                                self.dcgm_port))
        self._dirty_nodes.clear()
        for k in sorted(self._dirty_pods):
            pod = self._dirty_pods[k]
            if pod.deleted:
                self.store.delete("Pod", k)
            else:
                self.store.put("Pod", objects.pod(pod, self.scenario, self.placement))
        self._dirty_pods.clear()
        if self.kueue is not None:
            self.kueue.flush(self.store, self.now, self.scenario.completed_pod_ttl)

    def gpus_by_state(self) -> dict[str, float]:
        """Physical GPUs in each state now, as the truth's segments count them (a MIG
        instance its fraction, a time-shared GPU once): allocated, unallocated, unavailable
        (its node not Ready, or the GPU down)."""
        out = dict.fromkeys(("allocated", "unallocated", "unavailable"), 0.0)
        for node in self.live_nodes():
            for gpu in node.gpus:
                for d in gpu.devices:
                    state = ("unavailable" if not node.ready or gpu.down_reason is not None
                             else "allocated" if d.occupants else "unallocated")
                    out[state] += d.info.fraction
        return out

    def close(self) -> None:
        """Close open truth segments at ``now`` (call before reading the truth)."""
        for node in self.live_nodes():
            for gpu in node.gpus:
                self._close_gpu(gpu)


_BUS_IDS = ("04", "05", "0A", "0B", "84", "85", "8A", "8B", "C4", "C5", "CA", "CB",
            "44", "45", "4A", "4B")


def _involved(pod: Pod, container: bool = False) -> Involved:
    """The pod (or its container) as an event's ``involvedObject``."""
    path = f"spec.containers{{{objects.container_name(pod.workload)}}}" if container else None
    return Involved("Pod", pod.namespace, pod.name, pod.uid, path)
