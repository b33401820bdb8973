"""The records that flow from the sources to compute and the sinks, and the words they
are written in.

Sources parse what they read into these records (``sources.kube``: ``NodeInfo`` and
``PodInfo``; ``sources.dcgm`` (through ``sources.dcgm_parser``), ``sources.prometheus_api``
and ``sources.cloud_monitoring``: ``DeviceReading``); ``compute`` and the sinks read them and
never the sources' wire formats.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

State = Literal["allocated", "unallocated", "unavailable"]
"""A device's allocation state at one snapshot (``compute``'s definitions)."""
Reason = Literal["node_not_ready", "gpu_missing", "xid"]
"""Why a device is ``unavailable``."""
Provisioning = Literal["spot", "on-demand"]
"""How a node's VM is bought: spot (preemptible) or on demand."""
UtilizationSource = Literal["gr_engine_active", "gpu_util", "duty_cycle"]
"""Which reading a device's utilisation comes from (DCGM's GR engine activity, DCGM's
GPU_UTIL, GKE's duty cycle)."""
DUTY_CYCLE = "kubernetes.io/container/accelerator/duty_cycle"
ACCELERATOR_MEMORY_USED = "kubernetes.io/container/accelerator/memory_used"
ACCELERATOR_MEMORY_TOTAL = "kubernetes.io/container/accelerator/memory_total"
"""GKE system metrics (percent, bytes, bytes): the readings where no DCGM is collected."""
REJECT_REASONS = frozenset({"malformed", "no_gpu_uuid", "blank", "not_finite", "duplicate",
                            "too_long", "too_many_series", "unknown_node",
                            "too_many_devices"})
"""Why a DCGM sample is dropped."""
PageRead = Literal["plan", "new_plan", "full", "plan_failed"]
"""How a dcgm-exporter page was read: by the plan learnt from an earlier page of its
shape; by a plan learnt from this page (its shape new or changed); by the full parser (a
value no plan vouches for, or a shape with no plan); by the full parser after its plan
failed on it."""
PAGE_READS: tuple[PageRead, ...] = ("plan", "new_plan", "full", "plan_failed")
KUBE_ERROR_REASONS = frozenset({"http_403", "http_429", "http_503", "refused", "timeout",
                                "bad_answer"})
"""The errors a Kubernetes watch most often meets, exported from zero (others as they happen)."""
DELETED = "Deleted"
"""The phase a pod deleted before it ended keeps for good (Kubernetes has no word for it:
its last phase was Pending, Running or Unknown)."""
WORKLOAD_PENDING, WORKLOAD_ADMITTED, WORKLOAD_FINISHED = "Pending", "Admitted", "Finished"
"""A Kueue Workload's states as the warehouse writes them (and ``DELETED``: deleted before it
finished); the first two are open."""


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint (``spec.taints``)."""

    key: str
    value: str
    effect: str
    """``NoSchedule``, ``PreferNoSchedule`` or ``NoExecute``."""


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration (``spec.tolerations``); ``key`` None with ``Exists``: every taint."""

    key: str | None
    operator: str
    """``Equal`` (the default) or ``Exists``."""
    value: str
    effect: str | None
    """None: every effect."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One node-selector requirement of a required node-affinity term: on a node label, or
    (a ``matchFields`` requirement) on key ``metadata.name``, the node's name."""

    key: str
    operator: str
    """``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt`` or ``Lt``."""
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PodConstraints:
    """Where a pod may run: what ``requiredDuringSchedulingIgnoredDuringExecution`` and the
    node selector ask of a node's labels, and the taints it tolerates."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: tuple[tuple[Requirement, ...], ...] = ()
    """Required node-affinity terms, any of which a node must meet (each term: all its
    requirements; a term with none meets no node, as Kubernetes reads it); empty: no
    affinity."""
    tolerations: tuple[Toleration, ...] = ()


NO_CONSTRAINTS = PodConstraints()


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    pool: str
    accelerator: str | None
    provisioning: Provisioning
    zone: str
    instance_type: str
    ready: bool
    capacity_gpus: int
    allocatable_gpus: int
    clients_per_gpu: int
    """``max-shared-clients-per-gpu`` on time-shared nodes, else 1."""
    mig_profile: str | None
    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    """All its labels (where a pod's node selector and affinity look)."""
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    """``spec.unschedulable``: cordoned."""


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    node: str | None
    phase: str
    gpus: int
    created_unix: float
    """Creation time, Unix seconds (as are the times below)."""
    scheduled_unix: float | None
    """When ``PodScheduled`` turned true; None while unscheduled."""
    finished_unix: float | None
    """When its last container ended; None while running."""
    labels: dict[str, str]
    workload: str
    owner_kind: str
    priority: int
    priority_class: str
    queue: str | None
    accelerator: str | None
    reason: str | None
    """Why it ended: container termination reason, or the pod's (e.g. ``Terminated`` for a
    spot preemption, ``NodeLost``)."""
    container_ports: dict[str, int] = field(default_factory=dict)
    ip: str | None = None
    deleted_unix: float | None = None
    """``metadata.deletionTimestamp``: when a graceful deletion will have ended it; absent
    on a pod removed at once (forced, or never scheduled)."""
    annotations: dict[str, str] = field(default_factory=dict)
    """The annotations the exporter reads (``allocation.annotation``), not all of them."""
    constraints: PodConstraints = NO_CONSTRAINTS
    scheduling_gates: tuple[str, ...] = ()
    """``spec.schedulingGates`` names (Kueue's ``kueue.x-k8s.io/admission`` while it holds
    the pod)."""
    unschedulable_reason: str | None = None
    """``PodScheduled=False``'s reason (``Unschedulable``, ``SchedulingGated``); None when
    scheduled or never tried."""
    unschedulable_message: str = ""
    """That condition's message: the scheduler's own words (``0/15 nodes are available:
    ...``)."""
    unschedulable_unix: float | None = None
    """That condition's last transition."""
    waiting_reason: str | None = None
    """A container's ``state.waiting.reason`` while none runs (``ContainerCreating``,
    ``ImagePullBackOff``, ``PodInitializing``)."""
    disrupted: bool = False
    """``DisruptionTarget=True``: evicted, preempted, or its node reclaimed or lost."""


@dataclass(frozen=True, slots=True)
class PodOnDevice:
    namespace: str
    pod: str
    container: str


@dataclass(slots=True)
class DeviceReading:
    """One DCGM entity in one scrape: identity, the pods on it, and its field values."""

    uuid: str
    gpu_index: str
    hostname: str
    model_name: str
    mig_profile: str | None
    mig_instance: str | None
    pods: list[PodOnDevice] = field(default_factory=list)
    fields: dict[str, float] = field(default_factory=dict)

    @property
    def device_id(self) -> str:
        return self.uuid if self.mig_instance is None else f"{self.uuid}/{self.mig_instance}"


def gpu_model(pod: PodInfo, nodes: Mapping[str, NodeInfo]) -> str:
    """The GPU model of a pod: the one its ``cloud.google.com/gke-accelerator`` nodeSelector
    names, else that of the node it was scheduled on; "" for a pod that names none and is
    not (or no longer) on a known node, e.g. a pending one."""
    if pod.accelerator:
        return pod.accelerator
    node = nodes.get(pod.node) if pod.node else None
    return (node.accelerator or "") if node is not None else ""


@dataclass(slots=True)
class ParseResult:
    """The devices of one answer, the samples kept and why the others were dropped."""

    devices: list[DeviceReading]
    samples: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    """Counts of dropped lines by reason (``REJECT_REASONS``)."""
    read_by: PageRead | None = field(default=None, compare=False)
    """How a dcgm-exporter page was read (None for samples from a query API)."""
    plan_error: str | None = field(default=None, compare=False)
    """Why the page's plan failed, when ``read_by`` is ``plan_failed``."""

    def reject(self, reason: str, n: int = 1) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + n


@dataclass(frozen=True, slots=True)
class PodEvent:
    """A Kubernetes Event about a pod (``core/v1`` Event or ``events.k8s.io/v1``), as the
    events watch keeps it: the newest of each reason per pod."""

    namespace: str
    pod: str
    pod_uid: str
    reason: str
    """``FailedScheduling``, ``TriggeredScaleUp``, ``NotTriggerScaleUp``, ``FailedScaleUp``,
    ``Preempted``, ``Pulling``..."""
    message: str
    component: str
    """Who said it: ``source.component`` or ``reportingController`` (``default-scheduler``,
    ``cluster-autoscaler``, ``kubelet``, ``kueue-admission``...)."""
    first_unix: float
    last_unix: float
    """When it was last said (``lastTimestamp``, else the series' last observed time, else
    ``eventTime``)."""
    count: int = 1


@dataclass(slots=True)
class TargetScrape:
    """What one target gave this cycle."""

    target: str
    result: ParseResult
    duration_seconds: float
    bytes_read: int
    complete: bool = True
    """Whether the devices are every GPU of their nodes (per-container sources: not)."""
    page_crc: int | None = None
    """The CRC-32 of the page as it came (dcgm-exporter's; None from other sources): two
    pages alike in it and ``bytes_read`` are the same page."""


# ---------------------------------------------------------------------------- Kueue


@dataclass(frozen=True, slots=True)
class AdmissionCheck:
    """One of a Workload's ``status.admissionChecks``: a ProvisioningRequest check is
    ``Pending`` until its nodes exist, ``Retry`` or ``Rejected`` when they could not be
    provisioned."""

    name: str
    state: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    uid: str
    namespace: str
    name: str
    local_queue: str
    cluster_queue: str | None
    """The ClusterQueue it reserves quota in (``status.admission``); None before."""
    created_unix: float
    queued_unix: float
    """Where Kueue's wait starts: creation, else the last ``Requeued`` transition."""
    admitted_unix: float | None
    """``Admitted=True``'s transition; None while it waits."""
    finished_unix: float | None
    gpus: int
    """``nvidia.com/gpu`` of all its pods: each pod set's count x its pods' request."""
    accelerator: str | None
    """The GPU model its pods select (``cloud.google.com/gke-accelerator``), if they do."""
    priority: int
    priority_class: str
    owner_kind: str
    owner_name: str
    """The object Kueue made it for (a Job, a JobSet...): its pods' top-level owner."""
    labels: dict[str, str] = field(default_factory=dict)
    """Its first pod set's template labels (a ``team``, say)."""
    gpus_per_pod: int = 0
    """``nvidia.com/gpu`` one pod of its largest pod set requests."""
    quota_reserved: bool = False
    """``QuotaReserved=True``: quota is held for it (admission checks may still run)."""
    pending_message: str = ""
    """Why it is not admitted, in Kueue's words: ``QuotaReserved=False``'s message
    (``couldn't assign flavors to pod set main: insufficient unused quota for
    nvidia.com/gpu in flavor a100, 4 more needed``), else a pending admission check's."""
    evicted_reason: str | None = None
    """The reason of its last ``Evicted=True`` (``Preempted``, ``PodsReadyTimeout``,
    ``InactiveWorkload``...), while it waits again; None if never evicted."""
    admission_checks: tuple[AdmissionCheck, ...] = ()
    """``status.admissionChecks``."""

    @property
    def pending(self) -> bool:
        return self.admitted_unix is None and self.finished_unix is None

    @property
    def state(self) -> str:
        if self.finished_unix is not None:
            return WORKLOAD_FINISHED
        return WORKLOAD_PENDING if self.admitted_unix is None else WORKLOAD_ADMITTED


@dataclass(frozen=True, slots=True)
class FlavorQuota:
    nominal_gpus: float
    borrowing_limit_gpus: float | None
    """None: no limit (within its cohort)."""
    used_gpus: float
    """``flavorsUsage``: GPUs of its admitted Workloads."""
    borrowed_gpus: float


@dataclass(frozen=True, slots=True)
class ClusterQueueInfo:
    name: str
    cohort: str
    flavors: dict[str, FlavorQuota]
    """Per ResourceFlavor with an ``nvidia.com/gpu`` quota."""
    pending_workloads: int
    admitted_workloads: int


@dataclass(frozen=True, slots=True)
class LocalQueueInfo:
    namespace: str
    name: str
    cluster_queue: str
    pending_workloads: int
    admitted_workloads: int
