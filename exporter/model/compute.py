"""The product's definitions, as pure functions: no I/O, no clock, no logging.

==================  =====================================================================
figure              definition
==================  =====================================================================
utilisation         ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (0-1); without profiling,
                    ``DCGM_FI_DEV_GPU_UTIL / 100`` (which overstates work: it only says a
                    kernel ran); without DCGM, GKE's container accelerator duty cycle / 100
                    (the same NVML figure as GPU_UTIL). The source used is recorded.
devices            Kubernetes and DCGM together: every GPU a node's capacity says it has (physical
                    GPUs: ``nvidia.com/gpu`` / clients per GPU when time-shared; MIG
                    instances on a partitioned node) is a device from the first cycle,
                    priced from the node's labels, whether or not DCGM has shown it; so is
                    every device DCGM has shown. One DCGM has never shown is identified as
                    ``<node>/k8s-<index>`` (the lowest GPU indices DCGM has not reported;
                    MIG: ``<node>/k8s-mig-<n>``), that name standing for its UUID too.
                    A node holds at most the physical GPUs Kubernetes counts plus one
                    (a GPU that came back under a new UUID), 7 MIG instances each
                    (``admit``); a device neither reported for ``dcgm.retire_after`` nor
                    counted by Kubernetes is retired (``retire``).
allocation state    ``unavailable`` (node not Ready, whatever its dcgm-exporter says; on a
                    Ready node whose exporter answered, a GPU Kubernetes or an earlier
                    scrape knows that the answer lacks; fatal XID) before ``allocated`` (a
                    pod holds it) before ``unallocated``. A Ready node whose dcgm-exporter
                    did not answer is *unknown*: no state, no cost, no downtime.
available GPUs      sum of allocatable GPUs of Ready nodes - system-reserved, in physical GPUs
                    (a time-shared GPU counts once, a MIG slice as its fraction).
queue wait          creation to ``PodScheduled=True``; a pending pod's wait so far. For a pod
                    of a Job that Kueue queued: from its Workload's creation (the Job's
                    submission), the wait for admission included.
admission wait      Kueue: a Workload's creation, or its last requeue, to its admission
                    (``Admitted=True``), as Kueue's own histogram measures it.
cost                hourly price(model, region, provisioning) x (1 - discount) x hours x
                    fraction of the GPU; a time-shared GPU's cost split evenly among the
                    pods on it; unallocated and unavailable GPU time to the pool.
effective cost      cost / utilised GPU-hours = price x (1 - discount) / utilisation;
                    only where utilised GPU-seconds > 0.
energy, CO2e        a GPU's energy counter's increase over the interval, split as cost
                    is (``energy``, where its definitions are).
availability        (total - down) / total over the window; downtime by reason.
team                the pod's team label, else its namespace's, else the namespace.
allocation          finance's own dimension (``allocation``): the pod's label, else its
                    annotation, else its namespace's label; else none ("").
==================  =====================================================================

A device's state observed at one snapshot holds until the next one: ``usage_rows``
integrates the earlier snapshot's states over the time between the two.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.model.catalog import FATAL_XIDS, GPUS_OF_MACHINE
from exporter.model.energy import FIELDS_READ as ENERGY_FIELDS
from exporter.model.energy import Energy, EnergyBasis, gpu_fractions
from exporter.model.records import (
    ACCELERATOR_MEMORY_TOTAL,
    ACCELERATOR_MEMORY_USED,
    DUTY_CYCLE,
    DeviceReading,
    NodeInfo,
    PodInfo,
    PodOnDevice,
    Provisioning,
    Reason,
    State,
    UtilizationSource,
)

GR_ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
XID = "DCGM_FI_DEV_XID_ERRORS"
FB_USED, FB_FREE, FB_RESERVED = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                                 "DCGM_FI_DEV_FB_RESERVED")
MIB = 1024 * 1024
MIG_SLICES = 7
"""Compute slices of a GPU: the most MIG instances one GPU can have."""
UNCOUNTED_NODE_GPUS = 16
"""Physical GPUs a node may hold while Kubernetes counts none (no device plugin yet): the
most any GPU machine type has (a2-megagpu-16g)."""
FIELDS_READ = (GR_ENGINE, GPU_UTIL, XID, FB_USED, FB_FREE, FB_RESERVED, *ENERGY_FIELDS)
"""The DCGM fields these definitions read."""


@dataclass(frozen=True, slots=True)
class Admission:
    """How Kueue let a pod's Job in: its Workload's creation, its admission wait (None while
    waiting) and the ClusterQueue."""

    queued_unix: float
    wait_seconds: float | None
    cluster_queue: str


@dataclass(frozen=True, slots=True)
class Owner:
    """A pod as cost and utilisation are attributed to it."""

    uid: str
    namespace: str
    name: str
    team: str
    workload: str
    allocation: str = ""
    """The pod's value of ``allocation`` ("" for none, or when none is configured)."""


@dataclass(slots=True)
class DeviceState:
    """One GPU (or MIG instance) at one snapshot. Never changed once made (not frozen: a
    frozen dataclass of this size takes four times as long to build, 8,000 a cycle)."""

    node: str
    pool: str
    accelerator: str
    provisioning: Provisioning
    zone: str
    gpu_uuid: str
    device_id: str
    gpu_index: str
    mig_profile: str | None
    fraction: float
    state: State
    reason: Reason | None
    owners: tuple[Owner, ...]
    utilization: float | None
    utilization_source: UtilizationSource | None
    price_usd_per_hour: float | None
    """List price x (1 - discount) x fraction; None when the book has no price."""
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    """``memory_bytes`` of the fields: None where unknown."""
    fields: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """What the exporter remembers of a device after it has seen it once."""

    gpu_uuid: str
    device_id: str
    gpu_index: str
    mig_profile: str | None


@dataclass(slots=True)
class UsageRow:
    """GPU time of one device over one interval, attributed to one owner (or none)."""

    start: float
    seconds: float
    """GPU-seconds (wall seconds x fraction of the GPU / pods sharing it)."""
    utilized_seconds: float | None
    cost_usd: float | None
    device: DeviceState
    owner: Owner | None
    joules: float | None = None
    """The row's share of its GPU's energy over the interval (``energy``); None where
    unknown."""
    energy_basis: EnergyBasis | None = None
    co2e_grams: float | None = None
    """``joules`` x the zone's carbon factor; None where either is unknown."""


# ---------------------------------------------------------------------------- definitions


def utilization(fields: Mapping[str, float]
                ) -> tuple[float | None, UtilizationSource | None]:
    """A device's utilisation (0-1) and which field it came from; (None, None) if unknown."""
    # each clamped to [0, 1] as min(1, max(0, x)) would, NaN to 0, in a third of the time
    gr = fields.get(GR_ENGINE)
    if gr is not None:
        return (gr if 0.0 < gr <= 1.0 else 1.0 if gr > 1.0 else 0.0), "gr_engine_active"
    util = fields.get(GPU_UTIL)
    if util is not None:
        util /= 100.0
        return (util if 0.0 < util <= 1.0 else 1.0 if util > 1.0 else 0.0), "gpu_util"
    duty = fields.get(DUTY_CYCLE)
    if duty is not None:
        duty /= 100.0
        return (duty if 0.0 < duty <= 1.0 else 1.0 if duty > 1.0 else 0.0), "duty_cycle"
    return None, None


def memory_bytes(fields: Mapping[str, float]) -> tuple[float | None, float | None]:
    """Framebuffer memory in use and its size, in bytes; None where unknown. DCGM reports
    MiB; the size is used + free + reserved (reserved is absent on older drivers: 0). GKE's
    system metrics give both in bytes."""
    used, free = fields.get(FB_USED), fields.get(FB_FREE)
    if used is None:
        return fields.get(ACCELERATOR_MEMORY_USED), fields.get(ACCELERATOR_MEMORY_TOTAL)
    if free is None:
        return used * MIB, None
    return used * MIB, (used + free + fields.get(FB_RESERVED, 0.0)) * MIB


def mig_fraction(profile: str | None) -> float:
    """Share of the parent GPU a MIG instance is: compute slices / 7 (``3g.20gb`` → 3/7)."""
    if not profile:
        return 1.0
    head = profile.split("g.", 1)[0]
    return int(head) / 7 if head.isdigit() and 0 < int(head) <= 7 else 1.0


def on_demand_gpus(nodes: Iterable[NodeInfo]) -> dict[str, float]:
    """Physical GPUs per model on on-demand nodes (what a commitment covers): a node's
    machine type's GPU count where the catalogue knows it, else its GPU capacity (MIG
    instances as their share of a GPU)."""
    out: dict[str, float] = {}
    for node in nodes:
        if not node.accelerator or node.provisioning != "on-demand":
            continue
        gpus = GPUS_OF_MACHINE.get((node.accelerator, node.instance_type))
        count = float(gpus) if gpus is not None else \
            node.capacity_gpus * mig_fraction(node.mig_profile)
        out[node.accelerator] = out.get(node.accelerator, 0.0) + count
    return out


def allocation_of(pod_labels: Mapping[str, str], pod_annotations: Mapping[str, str],
                  namespace: str, namespace_labels: Mapping[str, Mapping[str, str]],
                  label: str | None, annotation: str | None) -> str:
    """The pod's value of the allocation dimension: its label, else its annotation, else
    its namespace's label; "" when none has one."""
    return ((label and pod_labels.get(label)) or (annotation and pod_annotations.get(annotation))
            or (label and namespace_labels.get(namespace, {}).get(label)) or "")


UNKNOWN_TEAM = "unknown"
"""The team of a GPU's pod when the exporter cannot know it: the pod is not in its view
and was never seen, and its namespace is not either (``team_of``, ``unviewed_owner``)."""


def team_of(pod_labels: Mapping[str, str], namespace: str,
            namespace_labels: Mapping[str, Mapping[str, str]], team_label: str,
            namespaces_listed: bool = True) -> str:
    """The pod's ``team_label``, else its namespace's, else the namespace's name. The
    last two need the namespaces: before they are listed (an RBAC grant missing, say), a
    pod without the label is ``UNKNOWN_TEAM``'s, never its namespace's name guessed."""
    if team := pod_labels.get(team_label):
        return team
    if namespace in namespace_labels:
        return namespace_labels[namespace].get(team_label) or namespace
    return namespace if namespaces_listed else UNKNOWN_TEAM


def unknown_owner(namespace: str, pod: str) -> Owner:
    """A pod the exporter knows nothing of but its name: ``UNKNOWN_TEAM``'s."""
    return Owner("", namespace, pod, UNKNOWN_TEAM, pod)


def unviewed_owner(namespace: str, pod: str,
                   namespace_labels: Mapping[str, Mapping[str, str]], team_label: str) -> Owner:
    """The owner of a GPU whose DCGM labels name a pod the exporter does not hold (its pods
    not listed yet, or forbidden): the team its namespace's labels give (its name, when the
    listed namespace has no ``team_label``), else ``UNKNOWN_TEAM``; the pod's own labels are
    not known, so neither is its uid or allocation."""
    labels = namespace_labels.get(namespace)
    team = UNKNOWN_TEAM if labels is None else labels.get(team_label) or namespace
    return Owner("", namespace, pod, team, pod)


def queue_wait_seconds(pod: PodInfo, now: float, queued_unix: float | None = None) -> float:
    """Creation (``queued_unix``: its Kueue Workload's creation, when Kueue queued its
    Job) to scheduling; for a pod still pending, its wait until ``now``."""
    end = pod.scheduled_unix if pod.scheduled_unix is not None else now
    return max(0.0, end - min(pod.created_unix, queued_unix or pod.created_unix))


def admission_wait_seconds(queued_unix: float, admitted_unix: float | None,
                           now: float) -> float:
    """Kueue's wait: from creation or the last requeue to admission; for a Workload still
    waiting, its wait until ``now``."""
    return max(0.0, (admitted_unix if admitted_unix is not None else now) - queued_unix)


def per_utilized_hour(amount: float, utilized_gpu_seconds: float) -> float | None:
    """An amount (dollars, kWh, grams of CO2e) per utilised GPU-hour; None where nothing was
    utilised."""
    if utilized_gpu_seconds <= 0:
        return None
    return amount / (utilized_gpu_seconds / 3600.0)


def effective_cost_per_utilized_hour(cost_usd: float, utilized_gpu_seconds: float) -> float | None:
    """Cost of one utilised GPU-hour; None where nothing was utilised."""
    return per_utilized_hour(cost_usd, utilized_gpu_seconds)


def availability(up_seconds: float, down_seconds: float) -> float | None:
    total = up_seconds + down_seconds
    return None if total <= 0 else up_seconds / total


def available_gpus(nodes: Iterable[NodeInfo], reserved: int) -> float:
    """sum of allocatable physical GPUs of Ready nodes - system-reserved (never below 0)."""
    total = 0.0
    for n in nodes:
        if n.ready and n.accelerator:
            total += n.allocatable_gpus / n.clients_per_gpu * mig_fraction(n.mig_profile)
    return max(0.0, total - reserved)


# ---------------------------------------------------------------------------- states


def kubernetes_devices(node: NodeInfo) -> int:
    """How many devices Kubernetes says ``node`` has: its ``nvidia.com/gpu`` capacity, over
    the clients per GPU on a time-shared node (MIG instances on a partitioned one)."""
    return node.capacity_gpus // max(1, node.clients_per_gpu)


def physical_gpus(node: NodeInfo) -> int:
    """How many physical GPUs Kubernetes says ``node`` has (MIG instances as their
    fraction of a GPU, rounded up)."""
    return -int(-kubernetes_devices(node) * mig_fraction(node.mig_profile) // 1)


def admit(devices: Sequence[DeviceReading], known: Collection[str], node: NodeInfo | None,
          max_devices: int) -> tuple[list[DeviceReading], list[DeviceReading]]:
    """The readings of one node's devices it can hold, and the rest (rejected, never
    billed). A node holds the physical GPUs Kubernetes counts plus one (a GPU that came
    back under a new UUID while the old one is remembered), each whole or as at most 7 MIG
    instances; ``UNCOUNTED_NODE_GPUS`` (at most ``max_devices``) where Kubernetes counts
    none. When more GPUs are reported, the ``known`` ones (GPU UUIDs) are kept, then new
    ones, in the order reported, up to the count alone."""
    counted = physical_gpus(node) if node is not None else 0
    room = counted or min(max_devices, UNCOUNTED_NODE_GPUS)
    order = list(dict.fromkeys(d.uuid for d in devices))
    if len(order) <= room + 1:
        allowed = set(order)
    else:
        allowed = {u for u in order if u in known}
        for u in order:
            if len(allowed) >= room:
                break
            allowed.add(u)
    kept: list[DeviceReading] = []
    rejected: list[DeviceReading] = []
    instances: dict[str, int] = {}
    for d in devices:
        ok = d.uuid in allowed
        if ok and d.mig_instance is not None:
            instances[d.uuid] = instances.get(d.uuid, 0) + 1
            ok = instances[d.uuid] <= MIG_SLICES
        (kept if ok else rejected).append(d)
    return kept, rejected


def unseen_devices(node: NodeInfo, known: Iterable[DeviceIdentity]) -> list[DeviceIdentity]:
    """Identities for the devices Kubernetes counts on ``node`` beyond the ``known`` ones
    (shown by DCGM): ``<node>/k8s-<index>`` on the lowest GPU indices DCGM has not
    reported, ``<node>/k8s-mig-<n>`` for MIG instances."""
    known = list(known)
    missing = kubernetes_devices(node) - len(known)
    if missing <= 0:
        return []
    if node.mig_profile:
        return [DeviceIdentity(f"{node.name}/k8s-mig-{n}", f"{node.name}/k8s-mig-{n}", "",
                               node.mig_profile) for n in range(missing)]
    taken = {k.gpu_index for k in known}
    free = (str(i) for i in range(kubernetes_devices(node) + len(known)) if str(i) not in taken)
    return [DeviceIdentity(f"{node.name}/k8s-{i}", f"{node.name}/k8s-{i}", i, None)
            for i, _ in zip(free, range(missing), strict=False)]


def device_states(
    nodes: Mapping[str, NodeInfo],
    readings: Mapping[str, Sequence[DeviceReading]],
    unknown_nodes: frozenset[str],
    inventory: Mapping[str, Mapping[str, DeviceIdentity]],
    owners: Mapping[tuple[str, str], Owner],
    price: Mapping[tuple[str, str], float],
    discounts: Mapping[str, float],
    default_discount: float = 0.0,
    complete: bool = True,
    last_seen: Mapping[str, float] | None = None,
    unviewed: Callable[[str, str], Owner] | None = None,
) -> list[DeviceState]:
    """Every known device's state at one snapshot.

    ``readings`` maps node name to the devices its dcgm-exporter reported; nodes in
    ``unknown_nodes`` did not answer; a Ready node with no entry in ``readings`` is unknown
    too. ``complete`` says the readings list every GPU of the nodes they cover; they do not
    when they come per container (GKE's system metrics): then a known GPU not in them is
    idle (unallocated, no readings), not missing. ``inventory`` is every device DCGM has
    shown before, by node; the devices Kubernetes counts beyond those are added
    (``unseen_devices``).
    ``owners`` resolves (namespace, pod) from DCGM's pod labels, ``unviewed`` a pod not
    in it (default: ``UNKNOWN_TEAM``'s, never a team guessed); ``price`` maps
    (accelerator, provisioning) to USD per GPU-hour.

    A node never has more devices than Kubernetes counts or its answer shows, whichever is
    more: a remembered device beyond that (a GPU that came back under a new UUID) has no
    state until it is retired; those reported most recently (``last_seen``, device id to
    time) are kept first. Where Kubernetes counts none, or the readings are not
    ``complete``, every known device is.
    """
    seen_at = last_seen or {}
    out: list[DeviceState] = []
    unviewed_pod = unviewed or unknown_owner

    def owner_of(p: PodOnDevice) -> Owner:
        return owners.get((p.namespace, p.pod)) or unviewed_pod(p.namespace, p.pod)

    for name in sorted(nodes):
        node = nodes[name]
        if not node.accelerator:
            continue
        list_price = price.get((node.accelerator, node.provisioning))
        unit_price = None if list_price is None else \
            list_price * (1.0 - discounts.get(node.pool, default_discount))

        def make(ident: DeviceIdentity, state: State, reason: Reason | None,
                 devs_owners: tuple[Owner, ...], fields: Mapping[str, float],
                 node: NodeInfo = node, unit_price: float | None = unit_price) -> DeviceState:
            profile = ident.mig_profile
            frac = 1.0 if profile is None else mig_fraction(profile)
            util, source = utilization(fields) if state != "unavailable" else (None, None)
            used, total = memory_bytes(fields)
            # positional: by keyword, a 19-field dataclass takes three times as long to build
            return DeviceState(
                node.name, node.pool, node.accelerator or "", node.provisioning, node.zone,
                ident.gpu_uuid, ident.device_id, ident.gpu_index, profile, frac, state,
                reason, devs_owners, util, source,
                None if unit_price is None else unit_price * frac, used, total, fields)

        reported = readings.get(name, ())
        remembered = inventory.get(name, {})
        known = without_superseded(remembered, reported)
        fresh = [identity(dev, remembered) for dev in reported]
        for ident in fresh:
            known.setdefault(ident.device_id, ident)
        known.update((i.device_id, i) for i in unseen_devices(node, known.values()))
        counted = kubernetes_devices(node)
        if not node.ready:
            down = sorted(known.values(), key=lambda i: -seen_at.get(i.device_id, 0.0))
            for ident in down[:counted] if counted else down:
                out.append(make(ident, "unavailable", "node_not_ready", (), {}))
            continue
        if name in unknown_nodes or (complete and name not in readings):
            continue  # unknown: absent, never zero
        seen: set[str] = set()
        for dev, ident in zip(reported, fresh, strict=True):
            seen.add(ident.device_id)
            xid = int(dev.fields.get(XID, 0))
            devs_owners = tuple(map(owner_of, dev.pods)) if dev.pods else ()
            if xid in FATAL_XIDS:
                out.append(make(ident, "unavailable", "xid", (), dev.fields))
            elif devs_owners:
                out.append(make(ident, "allocated", None, devs_owners, dev.fields))
            else:
                out.append(make(ident, "unallocated", None, (), dev.fields))
        missing = sorted((i for d, i in known.items() if d not in seen),
                         key=lambda i: -seen_at.get(i.device_id, 0.0))
        if counted and complete:
            missing = missing[:max(0, counted - len(seen))]
        for ident in missing:
            out.append(make(ident, "unavailable", "gpu_missing", (), {}) if complete
                       else make(ident, "unallocated", None, (), {}))
    return out


def identity(dev: DeviceReading, known: Mapping[str, DeviceIdentity]) -> DeviceIdentity:
    """The identity of the device a reading is of: the one ``known`` holds when it is the
    same (most of the time: it is not made again), else a new one."""
    device_id = dev.device_id
    ident = known.get(device_id)
    if ident is None or ident.gpu_uuid != dev.uuid or ident.gpu_index != dev.gpu_index \
            or ident.mig_profile != dev.mig_profile:
        ident = DeviceIdentity(dev.uuid, device_id, dev.gpu_index, dev.mig_profile)
    return ident


def remember(inventory: Mapping[str, Mapping[str, DeviceIdentity]],
             readings: Mapping[str, Sequence[DeviceReading]],
             nodes: Mapping[str, NodeInfo]) -> dict[str, dict[str, DeviceIdentity]]:
    """The device inventory after this snapshot: new devices added, deleted nodes dropped."""
    out = {n: dict(devs) for n, devs in inventory.items() if n in nodes}
    for node, devs in readings.items():
        if node not in nodes:
            continue
        known = out[node] = without_superseded(out.get(node, {}), devs)
        for d in devs:
            ident = identity(d, known)
            known.setdefault(ident.device_id, ident)
    return out


def retire(inventory: Mapping[str, Mapping[str, DeviceIdentity]],
           nodes: Mapping[str, NodeInfo], last_seen: Mapping[str, float], now: float,
           retire_after: float) -> dict[str, dict[str, DeviceIdentity]]:
    """The inventory less the devices to forget: on each node, those beyond the count
    Kubernetes gives (the most recently reported kept first) that DCGM has not reported
    for ``retire_after`` seconds (``last_seen``: device id to the time it last was; a
    device without one counts as seen ``now``)."""
    out: dict[str, dict[str, DeviceIdentity]] = {}
    for name, devs in inventory.items():
        node = nodes.get(name)
        counted = kubernetes_devices(node) if node is not None else 0
        if len(devs) <= counted:  # each ranks within the count
            out[name] = dict(devs)
            continue
        recent = sorted(devs.values(), key=lambda i: -last_seen.get(i.device_id, now))
        out[name] = {i.device_id: i for rank, i in enumerate(recent)
                     if rank < counted or now - last_seen.get(i.device_id, now) < retire_after}
    return out


def without_superseded(known: Mapping[str, DeviceIdentity],
                       devices: Iterable[DeviceReading]) -> dict[str, DeviceIdentity]:
    """``known`` (a node's remembered devices) less those one scrape's ``devices`` replace:
    a whole GPU whose MIG instances are reported now (MIG was enabled), or the instances
    of a GPU reported whole now (MIG was disabled). The same physical GPU is never both
    a device and its instances, so the replaced identity is not a missing GPU."""
    partitioned: set[str] = set()
    whole: set[str] = set()
    for d in devices:
        (whole if d.mig_instance is None else partitioned).add(d.uuid)
    return {device_id: ident for device_id, ident in known.items()
            if not (ident.gpu_uuid in partitioned and device_id == ident.gpu_uuid)
            and not (ident.gpu_uuid in whole and device_id != ident.gpu_uuid)}


def usage_rows(states: Sequence[DeviceState], start: float, seconds: float,
               energy: Mapping[str, Energy] | None = None,
               carbon: Mapping[str, float] | None = None) -> list[UsageRow]:
    """GPU time, utilised time, cost and energy of each device over ``[start, start +
    seconds)``: ``energy`` is each physical GPU's over the interval (``energy.gpu_energy``),
    split as cost is; ``carbon`` each zone's grams of CO2e per joule."""
    rows: list[UsageRow] = []
    energy = energy or {}
    carbon = carbon or {}
    whole = gpu_fractions(states) if energy else {}
    for d in states:
        gpu_seconds = seconds * d.fraction
        cost = None if d.price_usd_per_hour is None else d.price_usd_per_hour * seconds / 3600
        e = energy.get(d.gpu_uuid)
        joules = basis = co2e = None
        if e is not None:
            joules, basis = e.joules * d.fraction / whole[d.gpu_uuid], e.basis
            factor = carbon.get(d.zone)
            co2e = None if factor is None else joules * factor
        if d.state != "allocated" or not d.owners:
            used = d.utilization * gpu_seconds if d.utilization is not None else None
            rows.append(UsageRow(start, gpu_seconds, used, cost, d, None, joules, basis, co2e))
            continue
        n = len(d.owners)
        share_used = d.utilization * gpu_seconds / n if d.utilization is not None else None
        share_cost = None if cost is None else cost / n
        share_joules = None if joules is None else joules / n
        share_co2e = None if co2e is None else co2e / n
        for owner in d.owners:
            rows.append(UsageRow(start, gpu_seconds / n, share_used, share_cost, d, owner,
                                 share_joules, basis, share_co2e))
    return rows
