"""Scenario files: the simulated cluster, its job stream and its faults, validated once.

A scenario is YAML. Every field is checked before anything is built, and a bad file gets
one error naming the field and what it may be (``ScenarioError``); the simulator never
serves a half-built cluster. The embedded default lives in ``scenarios/default.yaml``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from exporter.model.catalog import FATAL_XIDS, GPU_MODELS
from exporter.model.durations import Duration

Accelerator = Literal[
    "nvidia-h200-141gb", "nvidia-h100-80gb", "nvidia-a100-80gb", "nvidia-tesla-a100",
    "nvidia-l4", "nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100", "nvidia-tesla-p4"
]
"""Every model of the catalogue (``tests/simulator`` checks that they are the same)."""
Profile = Literal[
    "healthy", "input_bound", "small_batch", "comm_bound", "memory_bound", "idle", "throttled"
]
WorkloadKind = Literal["pretraining", "finetuning", "batch_inference", "serving", "notebook"]
MigLayout = Literal["instances", "gpu_and_instances"]
"""What a dcgm-exporter prints for a MIG-partitioned GPU: one series set per instance
(2.4.0-rc.3 and later, default ``--devices f``), or the GPU's own series beside its
instances' (2.4.0-rc.1 and -rc.2)."""
DcgmHostname = Literal["node", "pod"]
"""What a dcgm-exporter prints in ``Hostname``: its node's name, or its own pod's name (as
versions that take the container's hostname do)."""
KNOWN_XIDS = FATAL_XIDS | {63, 94}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the field."""


DnsName = Annotated[str, Field(min_length=1, max_length=40, pattern=_DNS_LABEL.pattern)]
LabelKey = Annotated[str, Field(pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}"
                                        r"[A-Za-z0-9])?$")]
LabelValue = Annotated[str, Field(max_length=63, pattern=r"^([A-Za-z0-9]([A-Za-z0-9._-]*"
                                                         r"[A-Za-z0-9])?)?$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Namespace(_Model):
    name: DnsName
    team: DnsName | None = None
    """Value of the ``team`` label on the namespace and its pods; absent when None."""
    team_on_pods: bool = True
    """Whether its pods carry the ``team`` label too; False: only the namespace does."""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """More labels on the namespace (not on its pods): a ``cost-center``, say."""


class Sharing(_Model):
    strategy: Literal["time-sharing"] = "time-sharing"
    max_shared_clients_per_gpu: int = Field(ge=2, le=48)


class Autoscaling(_Model):
    min_nodes: int = Field(ge=0)
    max_nodes: int = Field(ge=1)
    provisioning_delay: Duration = 300.0
    scale_down_delay: Duration = 600.0

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.max_nodes < self.min_nodes:
            raise ValueError("max_nodes must be >= min_nodes")
        return self


class Taint(_Model):
    """A taint on every node of a pool (``spec.taints``), beside GKE's own."""

    key: LabelKey
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class Toleration(_Model):
    """A toleration on a workload's pods (``spec.tolerations``), beside the GPU one."""

    key: LabelKey | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class Pool(_Model):
    name: DnsName
    accelerator: Accelerator
    gpus_per_node: int = Field(ge=1, le=16)
    nodes: int = Field(ge=0)
    zone: str = "us-central1-a"
    spot: bool = False
    sharing: Sharing | None = None
    mig_partition_size: str | None = None
    dcgm_mig_layout: MigLayout = "instances"
    dcgm_hostname: DcgmHostname = "node"
    autoscaling: Autoscaling | None = None
    recreate_delay: Duration = 300.0
    """How long a preempted spot node takes to come back (managed instance group refill)."""
    taints: list[Taint] = Field(default_factory=list)
    """More taints on its nodes (a pool dedicated to one team, say)."""

    @model_validator(mode="after")
    def _gpu_options(self) -> Self:
        model = GPU_MODELS[self.accelerator]
        if self.gpus_per_node not in model.machine_types:
            allowed = ", ".join(str(n) for n in sorted(model.machine_types))
            raise ValueError(
                f"gpus_per_node {self.gpus_per_node} is not offered for {self.accelerator}; "
                f"allowed: {allowed}"
            )
        if self.mig_partition_size is not None:
            if not model.mig_profiles:
                raise ValueError(f"mig_partition_size: {self.accelerator} does not support MIG")
            if self.mig_partition_size not in model.mig_profiles:
                allowed = ", ".join(model.mig_profiles)
                raise ValueError(
                    f"mig_partition_size {self.mig_partition_size!r} is not a profile of "
                    f"{self.accelerator}; allowed: {allowed}"
                )
            if self.sharing is not None:
                raise ValueError("a pool uses either sharing or mig_partition_size, not both")
        elif self.dcgm_mig_layout != "instances":
            raise ValueError("dcgm_mig_layout applies to a pool with mig_partition_size")
        return self

    @property
    def units_per_gpu(self) -> int:
        """How many ``nvidia.com/gpu`` units one physical GPU advertises."""
        if self.sharing is not None:
            return self.sharing.max_shared_clients_per_gpu
        if self.mig_partition_size is not None:
            profile = GPU_MODELS[self.accelerator].mig_profiles[self.mig_partition_size]
            return 7 // profile.compute_slices
        return 1

    @property
    def machine_type(self) -> str:
        return GPU_MODELS[self.accelerator].machine_types[self.gpus_per_node]


class Workload(_Model):
    name: DnsName
    kind: WorkloadKind
    namespace: DnsName
    accelerator: Accelerator
    spot: bool = False
    sharing: Literal["time-sharing"] | None = None
    mig_partition_size: str | None = None
    gpus_per_pod: int = Field(default=1, ge=1, le=16)
    pods: int = Field(default=1, ge=1, le=64)
    """Pods per job (a multi-node pre-training job has several)."""
    arrivals_per_day: float | None = Field(default=None, ge=0)
    """Mean job arrivals per day (Poisson); 0 means jobs come only from ``Cluster.submit``."""
    replicas: int | None = Field(default=None, ge=1)
    """Always-on pods (serving, notebooks) instead of arriving jobs."""
    duration: tuple[Duration, Duration] = (3600.0, 3600.0)
    """Run time of a job's pods, drawn uniformly between the two bounds."""
    startup: Duration = 0.0
    """Time from start to the first kernel (image pull, data loading); the GPU sits idle."""
    priority_class: str = "default"
    profiles: dict[Profile, float] = Field(default_factory=lambda: {"healthy": 1.0})  # type: ignore[arg-type]
    """Workload profile mix: each job draws one profile with these weights."""
    queue: str | None = None
    """Kueue LocalQueue name, carried as the ``kueue.x-k8s.io/queue-name`` label."""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """More labels on its pods."""
    annotations: dict[LabelKey, str] = Field(default_factory=dict)
    """Annotations on its pods."""
    max_retries: int = Field(default=6, ge=0)
    accelerator_selector: bool = True
    """Whether its pods name ``accelerator`` in a ``cloud.google.com/gke-accelerator``
    nodeSelector. Without it they select it by a required node affinity instead, and only
    their node tells the model."""
    accelerators: list[Accelerator] = Field(default_factory=list)
    """More accelerators its pods accept beside ``accelerator``: their required node
    affinity is ``cloud.google.com/gke-accelerator In`` all of them, so a pod runs on a
    pool of any (with ``accelerator_selector: false``; Kueue quotas and time-sharing's
    clients per GPU are ``accelerator``'s)."""
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """More nodeSelector terms on its pods. A label no pool's nodes carry (a pool that
    does not exist here, say) leaves them unschedulable: the manifest error it models."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """More tolerations on its pods (for a pool's ``taints``)."""
    active_deadline: Duration | None = None
    """Its Jobs' ``activeDeadlineSeconds``: a Job still running or waiting this long after
    it started fails (``DeadlineExceeded``) and its pods are deleted."""

    @model_validator(mode="after")
    def _shape(self) -> Self:
        if (self.arrivals_per_day is None) == (self.replicas is None):
            raise ValueError("set exactly one of arrivals_per_day (jobs) or replicas (always on)")
        if self.duration[0] <= 0 or self.duration[1] < self.duration[0]:
            raise ValueError("duration must be [min, max] with 0 < min <= max")
        if not self.profiles or any(w < 0 for w in self.profiles.values()) or sum(
            self.profiles.values()
        ) <= 0:
            raise ValueError("profiles must give positive weights to at least one profile")
        if self.sharing is not None and self.gpus_per_pod != 1:
            raise ValueError("pods on time-shared GPUs request exactly 1 nvidia.com/gpu")
        if self.mig_partition_size is not None and self.gpus_per_pod != 1:
            raise ValueError("pods on MIG instances request exactly 1 nvidia.com/gpu")
        if self.accelerators and self.accelerator_selector:
            raise ValueError("accelerators (more models a pod accepts) need "
                             "accelerator_selector: false: a nodeSelector names one model")
        return self


JobName = Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_LABEL.pattern)]


class TracedJob(_Model):
    """One job of a replayed trace: a Job of ``workload`` (a template with
    ``arrivals_per_day: 0``) submitted at ``at`` under its own name, with its own run time
    and profile, instead of one drawn at random."""

    name: JobName
    workload: DnsName
    at: float
    """Offset from the scenario start of its submission; negative: submitted before the
    scenario starts (a job carried into it), its pods created then and waiting or run at
    the start."""
    run: Duration
    """Run time of each of its pods."""
    profile: Profile = "healthy"

    @field_validator("run")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("run must be positive")
        return value


class Fault(_Model):
    """Something that goes wrong at ``at``, by ``kind``:

    - ``xid``: ``node``'s GPU ``gpu`` reports XID ``code`` for ``duration``; a fatal code
      takes the GPU away meanwhile (79: it falls off the bus) and fails its pods.
    - ``node_not_ready``: ``node`` is NotReady (powered off or rebooting: its GPUs draw
      nothing) for ``duration``; its pods are evicted after ``not_ready_eviction``; when it
      is Ready again its GPUs' energy counters restart at 0 (the driver loaded at boot).
    - ``spot_preemption``: ``pool``'s first node (or ``node``) is reclaimed and deleted.
    - ``endpoint``: ``node``'s dcgm-exporter refuses, errs or hangs (``mode``) for
      ``duration``.
    - ``driver_reload``: ``node``'s NVIDIA driver reloads: every GPU's energy counter
      (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``) restarts at 0, nothing else changes (the
      node stays Ready, its pods run on). Instantaneous: no ``duration``, ``gpu``, ``code``
      or ``mode``.
    """

    at: Duration
    """Offset from the scenario start."""
    kind: Literal["xid", "node_not_ready", "spot_preemption", "endpoint", "driver_reload"]
    node: str | None = None
    """``POOL/INDEX``: the INDEX-th node of the pool alive at that moment (0-based)."""
    pool: str | None = None
    gpu: int = Field(default=0, ge=0)
    code: int | None = None
    duration: Duration = 3600.0
    mode: Literal["refuse", "error", "hang"] | None = None
    restart_cost: Duration = 0.0
    """spot_preemption: the run time each reclaimed pod loses (its work since its last
    checkpoint), run again by the pod that replaces it; 0: it resumes where it stopped."""

    @model_validator(mode="after")
    def _shape(self) -> Self:
        if self.restart_cost and self.kind != "spot_preemption":
            raise ValueError("restart_cost is only for kind spot_preemption")
        if self.kind == "spot_preemption":
            if self.pool is None and self.node is None:
                raise ValueError("spot_preemption needs pool (or node)")
        elif self.node is None:
            raise ValueError(f"{self.kind} needs node: 'POOL/INDEX'")
        if self.node is not None and not re.match(r"^[a-z0-9-]+/\d+$", self.node):
            raise ValueError(f"node {self.node!r} must look like 'POOL/INDEX', e.g. 'h100/0'")
        if self.kind == "xid":
            if self.code not in KNOWN_XIDS:
                allowed = ", ".join(str(c) for c in sorted(KNOWN_XIDS))
                raise ValueError(f"code {self.code!r} is not a simulated XID; allowed: {allowed}")
        elif self.code is not None:
            raise ValueError("code is only for kind xid")
        if self.kind == "endpoint" and self.mode is None:
            raise ValueError("endpoint faults need mode: refuse, error or hang")
        if self.kind != "endpoint" and self.mode is not None:
            raise ValueError("mode is only for kind endpoint")
        if self.kind == "driver_reload":
            for name in ("duration", "gpu"):
                if name in self.model_fields_set:
                    raise ValueError(f"{name} is not for kind driver_reload (it is "
                                     "instantaneous and reloads the whole node's driver)")
        return self

    @property
    def pool_name(self) -> str:
        if self.node is not None:
            return self.node.split("/")[0]
        assert self.pool is not None
        return self.pool

    @property
    def node_index(self) -> int:
        return int(self.node.split("/")[1]) if self.node is not None else 0


class Stockout(_Model):
    """A time during which scale-ups of an autoscaled pool fail: the zone has no
    capacity for its machines (``out_of_resources``) or the project's quota is spent
    (``quota_exceeded``). The cluster autoscaler backs off and tries again, as it does."""

    pool: DnsName
    at: Duration
    """Offset from the scenario start."""
    duration: Duration = 3600.0
    reason: Literal["out_of_resources", "quota_exceeded"] = "out_of_resources"


class FlavorQuota(_Model):
    """A ClusterQueue's GPU quota in one ResourceFlavor: the flavor of an accelerator
    (named after it, selecting its nodes by ``cloud.google.com/gke-accelerator``)."""

    accelerator: Accelerator
    nominal_gpus: int = Field(ge=0)
    """``nominalQuota`` of ``nvidia.com/gpu``."""
    borrowing_limit_gpus: int | None = Field(default=None, ge=0)
    """``borrowingLimit``: the most it may borrow from its cohort's unused quota; None:
    unlimited (within a cohort), no borrowing without one."""


class ClusterQueue(_Model):
    name: DnsName
    cohort: DnsName | None = None
    """``spec.cohortName``: ClusterQueues of a cohort lend each other their unused quota."""
    flavors: list[FlavorQuota] = Field(min_length=1)
    preemption: Literal["Never", "LowerPriority"] = "Never"
    """``preemption.withinClusterQueue``: whether a workload that does not fit evicts
    admitted ones of lower priority in its ClusterQueue."""


class LocalQueue(_Model):
    name: DnsName
    namespace: DnsName
    cluster_queue: DnsName


class Kueue(_Model):
    """Kueue's queues: Jobs of a workload whose ``queue`` names a LocalQueue here are
    created suspended, with a Workload; their pods are created once it is admitted."""

    cluster_queues: list[ClusterQueue] = Field(min_length=1)
    local_queues: list[LocalQueue] = Field(default_factory=list)


class Profiling(_Model):
    """Which optional DCGM fields the simulated dcgm-exporters emit.

    A default dcgm-exporter install has SM_ACTIVE, SM_OCCUPANCY, NVLink bytes and the
    clock event reasons switched off; GKE's managed DCGM and most tuned installs enable them.
    """

    sm_fields: bool = True
    nvlink: bool = True
    clock_events: bool = True
    dcp: bool = True
    """All DCGM_FI_PROF_* fields; off models GPUs or drivers without DCP support."""


class DcgmService(_Model):
    """A Service in front of the dcgm-exporters of some pools' nodes: one URL, each request
    answered by the next node's exporter in turn (round robin), as kube-proxy does."""

    pools: list[DnsName] | None = None
    """The pools whose nodes it fronts; None: every pool."""


class Scenario(_Model):
    cluster: DnsName = "demo"
    project: str = "demo-project"
    region: str = "us-central1"
    kubernetes_version: str = "v1.33.5-gke.1201000"
    seed: int = 1
    start: datetime = datetime(2026, 11, 16, tzinfo=UTC)
    step: Duration = 30.0
    """The simulator's time step (and, unless ``dcgm_collect_interval`` says otherwise, how
    often the dcgm-exporters collect)."""
    dcgm_collect_interval: Duration | None = None
    """How often each dcgm-exporter collects (its ``-c``, ``DCGM_EXPORTER_INTERVAL``): a
    whole multiple of ``step``, at each multiple of it from ``start``; between collections
    its page shows what it collected last (a node's exporter that starts collects at once).
    None: every step."""
    completed_pod_ttl: Duration = 600.0
    not_ready_eviction: Duration = 300.0
    """Pods on a NotReady node are evicted after this long (the default toleration)."""
    system_reserved_gpus: int = Field(default=0, ge=0)
    profiling: Profiling = Profiling()
    priority_classes: dict[str, int] = Field(
        default_factory=lambda: {"default": 0}
    )
    namespaces: list[Namespace]
    pools: list[Pool] = Field(min_length=1)
    workloads: list[Workload] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)
    stockouts: list[Stockout] = Field(default_factory=list)
    dcgm_service: DcgmService = DcgmService()
    kueue: Kueue | None = None
    """Kueue installed, with these queues; None: no Kueue (a ``queue`` is a label only)."""
    jobs: list[TracedJob] = Field(default_factory=list)
    """Jobs submitted at given times (a replayed trace), beside the workloads' own."""
    placement: Literal["compact", "spread"] = "compact"
    """Which feasible node the scheduler binds a pod to: the one it leaves with the fewest
    free GPUs (bin-packing, kube-scheduler's MostAllocated scoring) or the most
    (LeastAllocated, its default scoring without GPU weights)."""

    @field_validator("start")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    @field_validator("step")
    @classmethod
    def _step(cls, value: float) -> float:
        if value < 1 or value != int(value):
            raise ValueError("step must be a whole number of seconds >= 1")
        return value

    @model_validator(mode="after")
    def _collection(self) -> Self:
        every = self.dcgm_collect_interval
        if every is not None and (every < self.step or every % self.step):
            raise ValueError(f"dcgm_collect_interval ({every:g} s) must be a whole multiple "
                             f"of step ({self.step:g} s)")
        return self

    @model_validator(mode="after")
    def _references(self) -> Self:
        _unique("namespaces", [n.name for n in self.namespaces])
        _unique("pools", [p.name for p in self.pools])
        _unique("workloads", [w.name for w in self.workloads])
        namespaces = {n.name for n in self.namespaces}
        pools = {p.name: p for p in self.pools}
        self.priority_classes.setdefault("default", 0)
        for i, w in enumerate(self.workloads):
            where = f"workloads[{i}] ({w.name})"
            if w.namespace not in namespaces:
                raise ValueError(f"{where}: namespace {w.namespace!r} is not one of "
                                 f"{', '.join(sorted(namespaces))}")
            if w.priority_class not in self.priority_classes:
                raise ValueError(f"{where}: priority_class {w.priority_class!r} is not one of "
                                 f"{', '.join(sorted(self.priority_classes))}")
            if not any(pool_selects(p, w) for p in self.pools):
                raise ValueError(f"{where}: no pool offers {_describe_selector(w)}")
            fits = [p for p in self.pools if pool_selects(p, w)]
            biggest = max(_pool_units_per_node(p) for p in fits)
            if w.gpus_per_pod > biggest:
                raise ValueError(f"{where}: gpus_per_pod {w.gpus_per_pod} exceeds the largest "
                                 f"matching node ({biggest} nvidia.com/gpu)")
        self._kueue_references()
        workloads = {w.name: w for w in self.workloads}
        for i, job in enumerate(self.jobs):
            template = workloads.get(job.workload)
            if template is None or template.replicas is not None:
                raise ValueError(f"jobs[{i}] ({job.name}): workload {job.workload!r} is not a "
                                 "workload of Jobs (arrivals_per_day)")
        _unique("jobs", [f"{workloads[j.workload].namespace}/{j.name}" for j in self.jobs])
        for i, f in enumerate(self.faults):
            if f.pool_name not in pools:
                raise ValueError(f"faults[{i}]: pool {f.pool_name!r} is not one of "
                                 f"{', '.join(sorted(pools))}")
            pool = pools[f.pool_name]
            if f.kind == "xid" and f.gpu >= pool.gpus_per_node:
                raise ValueError(f"faults[{i}]: gpu {f.gpu} does not exist on {pool.name} "
                                 f"(gpus 0..{pool.gpus_per_node - 1})")
            if f.kind == "spot_preemption" and not pool.spot:
                raise ValueError(f"faults[{i}]: spot_preemption needs a spot pool; "
                                 f"{pool.name} is on-demand")
        for i, so in enumerate(self.stockouts):
            if so.pool not in pools:
                raise ValueError(f"stockouts[{i}]: pool {so.pool!r} is not one of "
                                 f"{', '.join(sorted(pools))}")
            if pools[so.pool].autoscaling is None:
                raise ValueError(f"stockouts[{i}]: pool {so.pool} does not autoscale: only "
                                 "a scale-up can meet a stockout")
        for name in self.dcgm_service.pools or ():
            if name not in pools:
                raise ValueError(f"dcgm_service: pool {name!r} is not one of "
                                 f"{', '.join(sorted(pools))}")
        return self

    def _kueue_references(self) -> None:
        """Each Kueue-managed workload's LocalQueue exists in its namespace, and its
        ClusterQueue has a flavor of its accelerator."""
        if self.kueue is None:
            return
        k = self.kueue
        _unique("kueue.cluster_queues", [q.name for q in k.cluster_queues])
        _unique("kueue.local_queues", [f"{q.namespace}/{q.name}" for q in k.local_queues])
        cqs = {q.name: q for q in k.cluster_queues}
        namespaces = {n.name for n in self.namespaces}
        for q in k.cluster_queues:
            _unique(f"kueue.cluster_queues ({q.name}).flavors", [f.accelerator for f in q.flavors])
            if q.cohort is None and any(f.borrowing_limit_gpus is not None for f in q.flavors):
                raise ValueError(f"kueue.cluster_queues ({q.name}): borrowing_limit_gpus "
                                 "needs a cohort")
        for lq in k.local_queues:
            if lq.cluster_queue not in cqs:
                raise ValueError(f"kueue.local_queues ({lq.name}): cluster_queue "
                                 f"{lq.cluster_queue!r} is not one of {', '.join(sorted(cqs))}")
            if lq.namespace not in namespaces:
                raise ValueError(f"kueue.local_queues ({lq.name}): namespace {lq.namespace!r} "
                                 "is not a namespace of the scenario")
        local = {(q.namespace, q.name): q for q in k.local_queues}
        for w in self.workloads:
            if w.queue is None:
                continue
            where = f"workloads ({w.name})"
            queue = local.get((w.namespace, w.queue))
            if queue is None:
                raise ValueError(f"{where}: queue {w.queue!r} is not a LocalQueue of "
                                 f"namespace {w.namespace}")
            if w.replicas is not None:
                raise ValueError(f"{where}: Kueue queues the workloads' Jobs: a queue needs "
                                 "arrivals_per_day, not replicas")
            if w.accelerator not in {f.accelerator for f in cqs[queue.cluster_queue].flavors}:
                raise ValueError(f"{where}: ClusterQueue {queue.cluster_queue} has no quota for "
                                 f"{w.accelerator}")

    def scaled(self, nodes: int) -> Scenario:
        """The same cluster grown or shrunk to about ``nodes`` nodes, load scaled alike."""
        current = sum(p.nodes for p in self.pools)
        if current == 0:
            raise ScenarioError("--nodes: the scenario has no nodes to scale")
        factor = nodes / current
        counts = _apportion([p.nodes for p in self.pools], nodes)
        pools = []
        for pool, count in zip(self.pools, counts, strict=True):
            update: dict[str, Any] = {"nodes": count}
            if pool.autoscaling is not None:
                lo = round(pool.autoscaling.min_nodes * factor)
                hi = max(lo, count, round(pool.autoscaling.max_nodes * factor), 1)
                update["autoscaling"] = pool.autoscaling.model_copy(
                    update={"min_nodes": min(lo, count), "max_nodes": hi})
            pools.append(pool.model_copy(update=update))
        workloads = []
        for w in self.workloads:
            if w.arrivals_per_day is not None:
                workloads.append(w.model_copy(update={"arrivals_per_day":
                                                      w.arrivals_per_day * factor}))
            else:
                assert w.replicas is not None
                workloads.append(w.model_copy(update={"replicas":
                                                      max(1, round(w.replicas * factor))}))
        kueue = self.kueue
        if kueue is not None:  # quotas grow with the cluster
            kueue = kueue.model_copy(update={"cluster_queues": [q.model_copy(update={
                "flavors": [f.model_copy(update={
                    "nominal_gpus": round(f.nominal_gpus * factor),
                    "borrowing_limit_gpus": None if f.borrowing_limit_gpus is None
                    else round(f.borrowing_limit_gpus * factor)}) for f in q.flavors]})
                for q in kueue.cluster_queues]})
        return self.model_copy(update={"pools": pools, "workloads": workloads, "kueue": kueue})


def _pool_units_per_node(pool: Pool) -> int:
    return pool.gpus_per_node * pool.units_per_gpu


def pool_selects(pool: Pool, w: Workload) -> bool:
    """Whether ``pool`` offers the GPUs workload ``w`` asks for: its accelerator (or one of
    the others it accepts), spot or
    on-demand, sharing and MIG profile. Its ``node_selector`` and ``tolerations`` may still
    exclude the pool (``simulator.placement`` decides where its pods may run)."""
    return (pool.accelerator in (w.accelerator, *w.accelerators) and pool.spot == w.spot
            and (pool.sharing.strategy if pool.sharing else None) == w.sharing
            and pool.mig_partition_size == w.mig_partition_size)


def _describe_selector(w: Workload) -> str:
    parts = [" or ".join([w.accelerator, *w.accelerators]), "spot" if w.spot else "on-demand"]
    if w.sharing:
        parts.append(w.sharing)
    if w.mig_partition_size:
        parts.append(f"MIG {w.mig_partition_size}")
    return " ".join(parts)


def _unique(what: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what}: name {name!r} is used twice")
        seen.add(name)


def _apportion(weights: list[int], total: int) -> list[int]:
    """Split ``total`` in proportion to ``weights`` (largest remainder, deterministic)."""
    s = sum(weights)
    exact = [w * total / s for w in weights]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def format_error(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in err["loc"])
        loc = loc.replace(".[", "[")
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            msg = f"{err['input']!r} is not allowed; allowed values: {expected}"
        lines.append(f"{source}: {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


def parse_scenario(data: Mapping[str, Any], source: str = "scenario") -> Scenario:
    """Validate a scenario mapping; raises ``ScenarioError`` naming the field at fault."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_error(source, exc)) from None


EMBEDDED = ("default", "fleet", "europe", "kueue")
"""Scenarios shipped in the package, loadable by name."""


def load_scenario(path: str | Path | None = None) -> Scenario:
    """Load a scenario file, or an embedded one by name (``default`` when ``path`` is None)."""
    name = "default" if path is None else str(path)
    if name in EMBEDDED:
        text = resources.files("simulator").joinpath(f"scenarios/{name}.yaml").read_text()
        source = f"{name}.yaml"
    else:
        try:
            text = Path(name).read_text()
        except OSError as exc:
            raise ScenarioError(f"{name}: cannot read scenario: {exc.strerror}") from None
        source = name
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario is a YAML mapping of fields")
    return parse_scenario(data, source)
