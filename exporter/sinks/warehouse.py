"""The local warehouse: DuckDB tables ``gpu_usage``, ``gpu_pods``, ``availability_events``.

``gpu_usage`` has one row per device, owner and warehouse interval (default 60 s):
GPU-seconds, cost and time-weighted means of the DCGM readings. Each cycle's rows are
buffered, staged in one Arrow batch per flush (``usage_staging``, in the same file), and
aggregated in SQL once their interval is complete; every row has a deterministic id (a hash
of cluster, interval, device, pod and state) and the tables' primary keys make a repeated
write a no-op, so a restart or a retried flush never double-counts. ``gpu_pods`` keeps
the latest state of each GPU pod; ``availability_events`` one row per incident.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from exporter.compute import XID, UsageRow, memory_bytes
from exporter.sources.kube import PodInfo

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

USAGE_SCHEMA = pa.schema([
    ("id", pa.string()), ("time", pa.timestamp("us", tz="UTC")),
    ("interval_seconds", pa.float64()), ("cluster", pa.string()), ("node", pa.string()),
    ("node_pool", pa.string()), ("zone", pa.string()), ("gpu_model", pa.string()),
    ("provisioning", pa.string()), ("gpu_uuid", pa.string()), ("gpu_index", pa.string()),
    ("mig_profile", pa.string()), ("device_id", pa.string()), ("namespace", pa.string()),
    ("pod", pa.string()), ("pod_uid", pa.string()), ("team", pa.string()),
    ("workload", pa.string()), ("state", pa.string()), ("reason", pa.string()),
    ("gpu_seconds", pa.float64()), ("utilization", pa.float64()),
    *[(name, pa.float64()) for name in FIELDS],
    ("memory_used_bytes", pa.float64()), ("memory_total_bytes", pa.float64()),
    ("last_xid", pa.int64()), ("price_usd_per_hour", pa.float64()), ("cost_usd", pa.float64()),
])



def _duck_type(t: pa.DataType) -> str:
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ"
    if pa.types.is_int64(t):
        return "BIGINT"
    if pa.types.is_float64(t):
        return "DOUBLE"
    return "VARCHAR"


_DDL = [
    "CREATE TABLE IF NOT EXISTS gpu_usage ("
    + ", ".join(f"{f.name} {_duck_type(f.type)}" + (" PRIMARY KEY" if f.name == "id" else "")
                for f in USAGE_SCHEMA) + ")",
    """CREATE TABLE IF NOT EXISTS gpu_pods (
        id VARCHAR PRIMARY KEY, cluster VARCHAR, namespace VARCHAR, pod VARCHAR,
        team VARCHAR, workload VARCHAR, owner_kind VARCHAR, gpus BIGINT, gpu_model VARCHAR,
        node VARCHAR, phase VARCHAR, created TIMESTAMPTZ, scheduled TIMESTAMPTZ,
        finished TIMESTAMPTZ, queue_wait_seconds DOUBLE, reason VARCHAR, priority BIGINT,
        priority_class VARCHAR, queue VARCHAR, updated TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS availability_events (
        id VARCHAR PRIMARY KEY, cluster VARCHAR, node VARCHAR, node_pool VARCHAR,
        gpu_uuid VARCHAR, reason VARCHAR, start_time TIMESTAMPTZ, end_time TIMESTAMPTZ,
        seconds DOUBLE)""",
]


_STAGE_SCHEMA = pa.schema([
    ("win", pa.float64()), ("device_id", pa.string()), ("pod_uid", pa.string()),
    ("state", pa.string()), ("node", pa.string()), ("node_pool", pa.string()),
    ("zone", pa.string()), ("gpu_model", pa.string()), ("provisioning", pa.string()),
    ("gpu_uuid", pa.string()), ("gpu_index", pa.string()), ("mig_profile", pa.string()),
    ("namespace", pa.string()), ("pod", pa.string()), ("team", pa.string()),
    ("workload", pa.string()), ("reason", pa.string()), ("gpu_seconds", pa.float64()),
    ("utilized", pa.float64()), ("cost", pa.float64()), ("price", pa.float64()),
    *[(name, pa.float64()) for name in FIELDS],
    ("memory_used_bytes", pa.float64()), ("memory_total_bytes", pa.float64()),
    ("last_xid", pa.int64()),
])
_STAGE_COLUMNS = _STAGE_SCHEMA.names
_STAGE_DDL = ("CREATE TABLE IF NOT EXISTS usage_staging ("
              + ", ".join(f"{f.name} {_duck_type(f.type)}" for f in _STAGE_SCHEMA) + ")")
_WEIGHTED = ",\n".join(
    f"sum({c} * gpu_seconds) / sum(CASE WHEN {c} IS NOT NULL THEN gpu_seconds END)"
    for c in FIELDS)
_AGGREGATE = f"""
INSERT OR IGNORE INTO gpu_usage ({", ".join(USAGE_SCHEMA.names)})
SELECT md5(concat_ws('|', ?, win, device_id, pod_uid, state)), to_timestamp(win), ?, ?,
       any_value(node), any_value(node_pool), any_value(zone), any_value(gpu_model),
       any_value(provisioning), any_value(gpu_uuid), any_value(gpu_index),
       any_value(mig_profile), device_id, any_value(namespace), any_value(pod),
       nullif(pod_uid, ''), any_value(team), any_value(workload), state, any_value(reason),
       sum(gpu_seconds),
       CASE WHEN count(utilized) > 0 THEN sum(utilized) / sum(gpu_seconds) END,
       {_WEIGHTED},
       max(memory_used_bytes), max(memory_total_bytes), max(last_xid), any_value(price),
       sum(cost)
FROM usage_staging WHERE {{where}}
GROUP BY win, device_id, pod_uid, state
"""


def row_id(*parts: object) -> str:
    return hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=16).hexdigest()


def _ts(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


class Warehouse:
    """Buffers usage rows per interval and appends complete intervals to DuckDB."""

    def __init__(self, path: Path, cluster: str, interval: float,
                 flush_interval: float | None = None) -> None:
        self.path = path
        self.cluster = cluster
        self.interval = interval
        self.flush_interval = max(interval, flush_interval or interval)
        # A small appender, not an analytics engine: bound DuckDB's memory and threads.
        self.con = duckdb.connect(str(path), config={"memory_limit": "128MB", "threads": 1})
        for ddl in _DDL:
            self.con.execute(ddl)
        self.con.execute(_STAGE_DDL)
        self._cols: dict[str, list[Any]] = {name: [] for name in _STAGE_COLUMNS}
        """Rows of the cycles since the last flush, by column."""
        self._pods: dict[str, dict[str, Any]] = {}
        self._pod_signatures: dict[str, tuple[Any, ...]] = {}
        self._events: list[dict[str, Any]] = []
        self.rows_written: dict[str, int] = defaultdict(int)
        self._next_flush = 0.0

    def add_usage(self, rows: Sequence[UsageRow]) -> None:
        """Buffer one cycle's rows; DuckDB aggregates them per interval when they flush."""
        cols = self._cols
        readings: dict[int, tuple[Any, ...]] = {}
        for r in rows:
            d, o = r.device, r.owner
            vals = readings.get(id(d))
            if vals is None:
                f = d.fields
                vals = readings[id(d)] = (*(f.get(name) for name in FIELDS.values()),
                                          *memory_bytes(f), int(f.get(XID, 0)))
            row = (r.start - r.start % self.interval, d.device_id, o.uid if o else "",
                   d.state, d.node, d.pool, d.zone, d.accelerator, d.provisioning,
                   d.gpu_uuid, d.gpu_index, d.mig_profile, o.namespace if o else None,
                   o.name if o else None, o.team if o else None, o.workload if o else None,
                   d.reason, r.seconds, r.utilized_seconds, r.cost_usd,
                   d.price_usd_per_hour, *vals)
            for name, value in zip(_STAGE_COLUMNS, row, strict=True):
                cols[name].append(value)

    def add_pods(self, pods: Iterable[PodInfo], now: float,
                 team_of: Callable[[PodInfo], str]) -> None:
        for p in pods:
            if p.gpus <= 0:
                continue
            signature = (p.phase, p.node, p.scheduled, p.finished, p.reason)
            if self._pod_signatures.get(p.uid) == signature:
                continue  # unchanged since it was last written
            self._pod_signatures[p.uid] = signature
            wait = None if p.scheduled is None else p.scheduled - p.created
            self._pods[p.uid] = {
                "id": p.uid, "cluster": self.cluster, "namespace": p.namespace, "pod": p.name,
                "team": team_of(p), "workload": p.workload,
                "owner_kind": p.owner_kind, "gpus": p.gpus, "gpu_model": p.accelerator,
                "node": p.node, "phase": p.phase, "created": _ts(p.created),
                "scheduled": _ts(p.scheduled), "finished": _ts(p.finished),
                "queue_wait_seconds": wait, "reason": p.reason, "priority": p.priority,
                "priority_class": p.priority_class, "queue": p.queue, "updated": _ts(now)}

    def add_event(self, node: str, pool: str, gpu_uuid: str, reason: str, start: float,
                  end: float) -> None:
        self._events.append({
            "id": row_id(self.cluster, gpu_uuid, reason, start), "cluster": self.cluster,
            "node": node, "node_pool": pool, "gpu_uuid": gpu_uuid, "reason": reason,
            "start_time": _ts(start), "end_time": _ts(end), "seconds": end - start})

    def maybe_flush(self, now: float) -> None:
        """``flush`` when the flush interval has passed."""
        if now >= self._next_flush:
            self.flush(now)

    def flush(self, now: float, partial: bool = False) -> None:
        """Write every interval that ended by ``now``; the rest stays staged in the file, so
        an exporter restarted within an interval completes it instead of losing it.
        ``partial`` also writes unfinished intervals (the end of a finite run, the demo)."""
        self._next_flush = now - now % self.flush_interval + self.flush_interval
        if self._cols["win"]:
            self._insert("INSERT INTO usage_staging SELECT * FROM _batch",
                         pa.Table.from_pydict(self._cols, schema=_STAGE_SCHEMA))
            self._cols = {name: [] for name in _STAGE_COLUMNS}
        self._write_usage(math.inf if partial else now)
        if self._pods:
            self.rows_written["gpu_pods"] += self._insert(
                "INSERT OR REPLACE INTO gpu_pods SELECT * FROM _batch",
                pa.Table.from_pylist(list(self._pods.values())))
            self._pods.clear()
        if self._events:
            self.rows_written["availability_events"] += self._insert(
                "INSERT OR IGNORE INTO availability_events SELECT * FROM _batch",
                pa.Table.from_pylist(self._events))
            self._events.clear()

    def _write_usage(self, now: float) -> None:
        """Aggregate every staged interval that ended by ``now`` into ``gpu_usage``."""
        complete = "win + ? <= ?"
        params = [self.cluster, self.interval, self.cluster, self.interval, now]
        self.con.execute("BEGIN")
        try:
            row = self.con.execute(_AGGREGATE.format(where=complete), params).fetchone()
            self.con.execute(f"DELETE FROM usage_staging WHERE {complete}",
                             [self.interval, now])
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.rows_written["gpu_usage"] += int(row[0]) if row else 0

    def _insert(self, sql: str, table: pa.Table) -> int:
        """Run one INSERT over ``table`` (as ``_batch``); returns the rows it added."""
        self.con.register("_batch", table)
        try:
            row = self.con.execute(sql).fetchone()
        finally:
            self.con.unregister("_batch")
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.con.close()

    def forget_pod(self, uid: str) -> None:
        """Drop the change-tracking of a pod that is gone for good."""
        self._pod_signatures.pop(uid, None)
