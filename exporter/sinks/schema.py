"""The warehouse tables, defined once: DuckDB's DDL, the Arrow schemas and BigQuery's
schema are all derived from ``TABLES``.

Columns added in a later release come last, so that a file or dataset made before is
brought up to date by adding them (``Warehouse`` and ``BigQuerySink.ensure_tables`` do).

Every table has a deterministic ``id`` (a hash of what makes the row unique), so a row
written twice is the same row. Each is day-partitioned in BigQuery on its event time —
the time a row is written about, close to the time it is written, so streaming inserts
never fall outside the partitions BigQuery accepts — and clustered by cluster, namespace
and node pool where it has them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import pyarrow as pa

FIELDS = {
    "gr_engine_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "sm_occupancy": "DCGM_FI_PROF_SM_OCCUPANCY",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "pcie_tx_bytes_per_second": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "pcie_rx_bytes_per_second": "DCGM_FI_PROF_PCIE_RX_BYTES",
    "nvlink_tx_bytes_per_second": "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "nvlink_rx_bytes_per_second": "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "gpu_util_percent": "DCGM_FI_DEV_GPU_UTIL",
    "power_watts": "DCGM_FI_DEV_POWER_USAGE",
    "temperature_celsius": "DCGM_FI_DEV_GPU_TEMP",
}
"""``gpu_usage`` columns holding a DCGM field's GPU-second-weighted mean over the interval."""

# BigQuery's type names; the other engines' follow from them.
STRING, TIMESTAMP, FLOAT, INTEGER = "STRING", "TIMESTAMP", "FLOAT", "INTEGER"

_DUCKDB = {STRING: "VARCHAR", TIMESTAMP: "TIMESTAMPTZ", FLOAT: "DOUBLE", INTEGER: "BIGINT"}


Rollup = Literal["key", "sum", "mean", "max", "or", "any"]
"""How a ``gpu_usage`` column is combined when old rows are rolled up to hourly ones: a
grouping key, a sum, a GPU-second-weighted mean, a maximum, a bitwise OR, or any value (the
same for every row of a group)."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    description: str
    required: bool = False
    rollup: Rollup = "any"


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    description: str
    columns: tuple[Column, ...]
    partition_by: str
    """The TIMESTAMP column BigQuery partitions by day (and requires a filter on)."""
    cluster_by: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def arrow_schema(self) -> pa.Schema:
        """The table as Arrow batches hold it (pyarrow is imported when first asked for:
        the exporter's own writes do without it)."""
        return _arrow_schema(self.columns)

    @property
    def duckdb_types(self) -> dict[str, str]:
        """Each column's DuckDB type, in the table's order."""
        return {c.name: _DUCKDB[c.type] for c in self.columns}

    def duckdb_ddl(self) -> str:
        """No key: an index on ``id`` would live in DuckDB's memory and grow with the table;
        the warehouse keeps ids unique itself (``Warehouse`` anti-joins each write)."""
        cols = ", ".join(f"{c.name} {_DUCKDB[c.type]}" + (" NOT NULL" if c.required else "")
                         for c in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({cols})"


def _c(name: str, type_: str, description: str, required: bool = False,
       rollup: Rollup = "any") -> Column:
    return Column(name, type_, description, required, rollup)


_ALLOCATION = ("The pod's value of the configured allocation dimension (config: allocation, "
               "e.g. a cost-center label or annotation); null for none.")

GPU_USAGE = Table(
    "gpu_usage",
    "One row per GPU (or MIG instance), pod and state per warehouse interval.",
    (
        _c("id", STRING, "Hash of cluster, interval, device, pod and state.", True),
        _c("time", TIMESTAMP, "Start of the interval.", True),
        _c("interval_seconds", FLOAT, "Length of the interval: the warehouse interval, or "
           "3600 for rows rolled up to hours once older than warehouse.retention.raw.", True),
        _c("cluster", STRING, "Cluster name.", True, rollup="key"),
        _c("node", STRING, "Node name."),
        _c("node_pool", STRING, "GKE node pool."),
        _c("zone", STRING, "Zone of the node."),
        _c("gpu_model", STRING, "Accelerator, as GKE names it (nvidia-h100-80gb)."),
        _c("provisioning", STRING, "on-demand or spot."),
        _c("gpu_uuid", STRING, "The physical GPU."),
        _c("gpu_index", STRING, "GPU index on the node."),
        _c("mig_profile", STRING, "MIG profile of the instance; null for a whole GPU."),
        _c("device_id", STRING, "GPU UUID, or UUID/instance for a MIG instance.", True,
           rollup="key"),
        _c("namespace", STRING, "Namespace of the pod holding the device."),
        _c("pod", STRING, "Pod holding the device."),
        _c("pod_uid", STRING, "UID of that pod.", rollup="key"),
        _c("team", STRING, "Team of that pod."),
        _c("workload", STRING, "The pod's controller (Job, Deployment, ...)."),
        _c("state", STRING, "allocated, unallocated or unavailable.", True, rollup="key"),
        _c("reason", STRING, "Why unavailable: node_not_ready, gpu_missing, xid."),
        _c("gpu_seconds", FLOAT, "Device-seconds in this state (a pod's share when "
           "time-shared).", True, rollup="sum"),
        _c("utilization", FLOAT, "Mean utilisation 0-1; null when unknown.", rollup="mean"),
        *[_c(name, FLOAT, f"GPU-second-weighted mean of {field}.", rollup="mean")
          for name, field in FIELDS.items()],
        _c("memory_used_bytes", FLOAT, "Peak framebuffer memory in use.", rollup="max"),
        _c("memory_total_bytes", FLOAT, "Framebuffer memory size.", rollup="max"),
        _c("last_xid", INTEGER, "Last XID error code reported.", rollup="max"),
        _c("clock_event_reasons", INTEGER, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS (before DCGM 3.x "
           "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS) bits seen in the interval (OR): 0x20 "
           "thermal, 0x4/0x80 power, 0x8/0x40 hardware slowdown.",
           rollup="or"),
        _c("price_usd_per_hour", FLOAT, "Hourly price after discount; null if unpriced.",
           rollup="mean"),
        _c("cost_usd", FLOAT, "Cost of the row's GPU-seconds; null if unpriced.", rollup="sum"),
        _c("allocation", STRING, _ALLOCATION),
        _c("energy_joules", FLOAT, "The row's share of its GPU's energy over the interval "
           "(DCGM's energy counter, split as cost is); null where unknown.", rollup="sum"),
        _c("energy_basis", STRING, "Where the energy comes from: counter, reset (the "
           "counter restarted or jumped: the power integral), power (no counter, or one "
           "that stopped counting: the power integral); an hourly row's weakest.",
           rollup="max"),
        _c("co2e_grams", FLOAT, "Location-based CO2e of that energy: energy x PUE x the "
           "region's grid carbon intensity; null where unknown.", rollup="sum"),
        _c("idle_energy_joules", FLOAT, "Of that energy, what the GPU drew while a pod held it "
           "idle (utilisation under 5 % in the exporter's cycle); null where unknown.",
           rollup="sum"),
    ),
    partition_by="time",
    cluster_by=("cluster", "namespace", "node_pool"),
)

GPU_PODS = Table(
    "gpu_pods",
    "One row per GPU pod and state: a new row whenever its phase, node, scheduling or "
    "termination changes; its latest row (by updated) is its current state.",
    (
        _c("id", STRING, "Hash of cluster, pod UID and the state.", True),
        _c("cluster", STRING, "Cluster name.", True),
        _c("pod_uid", STRING, "Pod UID.", True),
        _c("namespace", STRING, "Namespace."),
        _c("pod", STRING, "Pod name."),
        _c("team", STRING, "Team (pod label, else namespace label, else namespace)."),
        _c("workload", STRING, "The pod's controller."),
        _c("owner_kind", STRING, "Kind of that controller."),
        _c("gpus", INTEGER, "GPUs requested (nvidia.com/gpu)."),
        _c("gpu_model", STRING, "Accelerator requested."),
        _c("node", STRING, "Node it runs on."),
        _c("phase", STRING, "Pod phase (Pending, Running, Succeeded, Failed, Unknown), or "
           "Deleted: deleted before it ended."),
        _c("created", TIMESTAMP, "Creation time."),
        _c("scheduled", TIMESTAMP, "When PodScheduled turned true."),
        _c("finished", TIMESTAMP, "When it ended: its containers' end, else its deletion "
           "(deletionTimestamp, else when the exporter saw it gone)."),
        _c("queue_wait_seconds", FLOAT, "scheduled - queued: the wait before admission "
           "included."),
        _c("reason", STRING, "Termination reason (Terminated for a spot preemption)."),
        _c("priority", INTEGER, "Pod priority."),
        _c("priority_class", STRING, "PriorityClass name."),
        _c("queue", STRING, "Kueue queue name."),
        _c("updated", TIMESTAMP, "When this state was observed.", True),
        _c("allocation", STRING, _ALLOCATION),
        _c("queued", TIMESTAMP, "When its wait began: its creation, or, for a pod of a Job "
           "Kueue queued, its Workload's (the Job's submission)."),
        _c("admission_wait_seconds", FLOAT, "Kueue: its Workload's creation (or last "
           "requeue) to admission; null for a pod Kueue did not queue."),
        _c("cluster_queue", STRING, "Kueue ClusterQueue that admitted its Workload."),
    ),
    partition_by="updated",
    cluster_by=("cluster", "namespace", "team"),
)

AVAILABILITY_EVENTS = Table(
    "availability_events",
    "One row per incident: a GPU unavailable from start to end, and why.",
    (
        _c("id", STRING, "Hash of cluster, GPU, reason and start.", True),
        _c("cluster", STRING, "Cluster name.", True),
        _c("node", STRING, "Node of the GPU."),
        _c("node_pool", STRING, "Its node pool."),
        _c("gpu_uuid", STRING, "The GPU."),
        _c("reason", STRING, "node_not_ready, gpu_missing or xid."),
        _c("start_time", TIMESTAMP, "When it became unavailable.", True),
        _c("end_time", TIMESTAMP, "When it was back.", True),
        _c("seconds", FLOAT, "end_time - start_time.", True),
    ),
    partition_by="end_time",
    cluster_by=("cluster", "node_pool"),
)

KUEUE_QUOTAS = Table(
    "kueue_quotas",
    "One row per Kueue ClusterQueue and GPU flavor each day, and whenever its quota "
    "changes: its latest row (by updated) is its quota.",
    (
        _c("id", STRING, "Hash of cluster, ClusterQueue, flavor, quota and day.", True),
        _c("cluster", STRING, "Cluster name.", True),
        _c("cluster_queue", STRING, "Kueue ClusterQueue.", True),
        _c("cohort", STRING, "Its cohort (spec.cohortName); empty for none."),
        _c("flavor", STRING, "ResourceFlavor with an nvidia.com/gpu quota."),
        _c("nominal_gpus", FLOAT, "nominalQuota of nvidia.com/gpu."),
        _c("borrowing_limit_gpus", FLOAT, "borrowingLimit; null: none set."),
        _c("updated", TIMESTAMP, "When this quota was observed.", True),
    ),
    partition_by="updated",
    cluster_by=("cluster", "cluster_queue"),
)

KUEUE_WORKLOADS = Table(
    "kueue_workloads",
    "One row per Kueue Workload and state: a new row whenever it is admitted, requeued, "
    "finished or deleted; its latest row (by updated) is its current state. A Workload "
    "waiting for admission has no pod yet: this table is where its wait shows.",
    (
        _c("id", STRING, "Hash of cluster, Workload UID and the state.", True),
        _c("cluster", STRING, "Cluster name.", True),
        _c("workload_uid", STRING, "Workload UID.", True),
        _c("namespace", STRING, "Namespace."),
        _c("workload", STRING, "Workload name."),
        _c("owner_kind", STRING, "Kind of the object Kueue queued (Job, JobSet, ...)."),
        _c("owner_name", STRING, "Its name."),
        _c("team", STRING, "Team (its pods' label, else namespace label, else namespace)."),
        _c("local_queue", STRING, "LocalQueue it was submitted to."),
        _c("cluster_queue", STRING, "ClusterQueue that admitted it, else its LocalQueue's."),
        _c("gpus", INTEGER, "GPUs its pods request (nvidia.com/gpu), all pod sets."),
        _c("gpu_model", STRING, "Accelerator its pods select; null for any."),
        _c("priority_class", STRING, "WorkloadPriorityClass (or PriorityClass) name."),
        _c("state", STRING, "Pending, Admitted, Finished, or Deleted: deleted before it "
           "finished."),
        _c("created", TIMESTAMP, "Creation time."),
        _c("queued", TIMESTAMP, "When its wait began: its creation, or its last requeue."),
        _c("admitted", TIMESTAMP, "When Admitted turned true; null while it waits."),
        _c("finished", TIMESTAMP, "When Finished turned true, else its deletion (when the "
           "exporter saw it gone)."),
        _c("updated", TIMESTAMP, "When this state was observed.", True),
    ),
    partition_by="updated",
    cluster_by=("cluster", "namespace", "team"),
)

GPU_PENDING = Table(
    "gpu_pending",
    "One row per waiting GPU pod (or Kueue Workload with no pod yet), cause and warehouse "
    "interval: how long it waited in the interval and why (``exporter.model.pending``).",
    (
        _c("id", STRING, "Hash of cluster, interval, what waits and cause.", True),
        _c("time", TIMESTAMP, "Start of the interval.", True),
        _c("interval_seconds", FLOAT, "Length of the interval."),
        _c("cluster", STRING, "Cluster name.", True),
        _c("namespace", STRING, "Namespace."),
        _c("team", STRING, "Team (label, else namespace label, else namespace)."),
        _c("workload", STRING, "Its controller (Job, StatefulSet, ...), or for a Workload the "
           "object Kueue queued."),
        _c("kind", STRING, "pod, or workload: a Kueue Workload not admitted (no pod yet)."),
        _c("uid", STRING, "Pod UID, or Workload UID.", True),
        _c("name", STRING, "Pod name, or Workload name."),
        _c("gpus", INTEGER, "GPUs it asks for (a Workload: all its pods')."),
        _c("gpus_per_pod", INTEGER, "GPUs one of its pods asks for."),
        _c("gpu_model", STRING, "Accelerator it selects; empty for any."),
        _c("node_pool", STRING, "The node pool it fits (of several, the one with the most "
           "free GPUs); empty when none does."),
        _c("cause", STRING, "Why it waited: quota, no_capacity, scaling_up, stockout, "
           "fragmented, unschedulable, starting or preempted.", True),
        _c("seconds", FLOAT, "Seconds of the interval it waited for this cause.", True),
        _c("gpu_seconds", FLOAT, "gpus x seconds.", True),
        _c("wait_seconds", FLOAT, "Its wait so far at the end of the interval."),
        _c("evidence", STRING, "The words the cause was decided on: the scheduler's, the "
           "cluster autoscaler's, Kueue's or the kubelet's message."),
        _c("evidence_source", STRING, "Who said them (default-scheduler, cluster-autoscaler, "
           "kueue, kubelet), or exporter: decided from the free GPUs alone."),
        _c("cluster_queue", STRING, "Kueue ClusterQueue, when Kueue queued it."),
        _c("expected_start", TIMESTAMP, "When the queue forecast made at the interval's "
           "start expected it to start (the live queue played forward: "
           "``exporter.model.forecast``); null when it found no start within its horizon, "
           "or made none."),
    ),
    partition_by="time",
    cluster_by=("cluster", "namespace", "team"),
)

GPU_FREE = Table(
    "gpu_free",
    "One row per node pool, what could use its free GPUs, and warehouse interval: free "
    "GPU-seconds and their cost, split by whether a waiting pod could use them "
    "(``exporter.model.pending``).",
    (
        _c("id", STRING, "Hash of cluster, interval, node pool and use.", True),
        _c("time", TIMESTAMP, "Start of the interval.", True),
        _c("interval_seconds", FLOAT, "Length of the interval."),
        _c("cluster", STRING, "Cluster name.", True),
        _c("node_pool", STRING, "Node pool.", True),
        _c("gpu_model", STRING, "Its GPU model."),
        _c("provisioning", STRING, "spot or on-demand."),
        _c("zone", STRING, "Its zone (of several, the first)."),
        _c("use", STRING, "usable: a waiting pod fits on the node; stranded: fragment (a "
           "waiting pod fits the pool but needs more GPUs than the node has free), quota "
           "(only Workloads Kueue holds back fit), mismatch (pods wait, none fits), "
           "no_demand (nothing waits).", True),
        _c("gpu_seconds", FLOAT, "Free physical GPU-seconds (a MIG slice its fraction, a "
           "time-shared GPU once).", True),
        _c("cost_usd", FLOAT, "Their cost (the GPUs' price x (1 - discount))."),
        _c("fragmentation_ratio", FLOAT, "The pool's fragmentation against the pods "
           "waiting for it, the mean over the interval's snapshots in which a pod that "
           "fits the pool waited: the share of its free GPUs on nodes where such a pod "
           "asked more than the node had free; NULL where none waited. (Earlier releases "
           "wrote 1 - most free GPUs on one node / free GPUs; the report reads "
           "fragmentation from the GPU-hours by use instead.)"),
        _c("largest_free_gpus", INTEGER, "Most free GPUs (Kubernetes' units) on one node "
           "of the pool in the interval."),
    ),
    partition_by="time",
    cluster_by=("cluster", "node_pool"),
)

TABLES = (GPU_USAGE, GPU_PODS, AVAILABILITY_EVENTS, KUEUE_QUOTAS, KUEUE_WORKLOADS,
          GPU_PENDING, GPU_FREE)
BY_NAME = {t.name: t for t in TABLES}


@functools.cache
def _arrow_schema(columns: tuple[Column, ...]) -> pa.Schema:
    import pyarrow as pa

    types = {STRING: pa.string(), TIMESTAMP: pa.timestamp("us", tz="UTC"),
             FLOAT: pa.float64(), INTEGER: pa.int64()}
    return pa.schema([pa.field(c.name, types[c.type], nullable=not c.required)
                      for c in columns])
