"""The local warehouse: DuckDB tables ``gpu_usage``, ``gpu_pods``, ``availability_events``
and, on a cluster with Kueue, ``kueue_quotas`` and ``kueue_workloads``.

``gpu_usage`` has one row per device, owner and warehouse interval (default 60 s):
GPU-seconds, cost and time-weighted means of the DCGM readings. Each cycle's rows are
staged as the cycle ends, one Parquet file per interval in the directory beside the
database (``<file>.staging``: a kill loses at most the cycle under way), and aggregated in
SQL once their interval is complete; the files go once their rows are written. Staged as
rows of a table in the database, they were inserted and deleted again every interval: at
8,000 GPUs that cost 25-30 ms of a cycle's CPU and nearly tripled the write-ahead log (4.9
MiB a cycle, 1.8 MiB without). A file made when staging was a table (``usage_staging``)
has its staged rows moved to files as it opens. A file the warehouse cannot use (a staged
file that does not read, a stray, a write-ahead log DuckDB dropped) is set aside in the
staging directory's ``quarantine`` folder, counted and logged once, and the writes go on.
Every row has a deterministic id (a hash of cluster, interval, device, pod and state) and a
write skips the ids already there, so a restart or a retried flush never double-counts. The
tables have no key: DuckDB holds a key's index in memory, and it would grow with the table
past the connection's small memory limit.

``gpu_usage`` is a view over one table per UTC day (``gpu_usage_raw_20261109``) and one of
hourly rows (``HOURLY``). A write goes to its day's table and looks only at the intervals it
writes, so neither it nor DuckDB's checkpoint after it grows with the months behind it; the
small ``gpu_pods`` and ``availability_events`` are looked up by the ids written. A file
made when ``gpu_usage`` was one keyed table opens with the keys dropped and that table as
``HOURLY``. ``gpu_pods`` keeps the latest state of each GPU pod, ``kueue_workloads`` of
each Workload; ``availability_events`` one row per incident.

Hourly, the retention rolls ``gpu_usage`` rows older than ``raw_retention`` up to one row per
hour in ``HOURLY`` (how each column combines is declared in ``schema``), dropping each day's
table once it is rolled up, and deletes rows older than ``retention``. ``snapshot`` copies
what a week's report reads to Parquet, and ``report_runs`` records the weeks whose scheduled
report is made (``scheduled_report``).

Batches reach DuckDB as a file that a statement reads, written next to the database and
deleted once read: each cycle's usage rows as Parquet, the few other rows as CSV
(``batch_files``). Statements take no bound parameters, their values written into them as
literals: DuckDB's Python client imports pandas (and pyarrow) to bind parameters or to scan
Python data, some 100 MiB the exporter does without.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from itertools import compress, repeat
from operator import attrgetter
from pathlib import Path
from typing import Any, Concatenate

import duckdb

from exporter import duck
from exporter.bottleneck import CLOCK_REASONS
from exporter.compute import XID, Admission, DeviceIdentity, UsageRow
from exporter.health import QUARANTINE_REASONS, QuarantineReason
from exporter.logs import ctx
from exporter.records import (
    DELETED,
    WORKLOAD_ADMITTED,
    WORKLOAD_PENDING,
    ClusterQueueInfo,
    PodInfo,
    WorkloadInfo,
)
from exporter.sinks import outbox
from exporter.sinks.batch_files import Encoded, at, literal, read_csv, write_csv, write_parquet
from exporter.sinks.outbox import DDL as OUTBOX_DDL
from exporter.sinks.schema import (
    AVAILABILITY_EVENTS,
    BY_NAME,
    FIELDS,
    GPU_PODS,
    GPU_USAGE,
    KUEUE_QUOTAS,
    KUEUE_WORKLOADS,
    TABLES,
    Column,
    Table,
)

log = logging.getLogger(__name__)

_STAGE_TYPES = {
    "win": "DOUBLE", **dict.fromkeys((
        "device_id", "pod_uid", "state", "node", "node_pool", "zone", "gpu_model",
        "provisioning", "gpu_uuid", "gpu_index", "mig_profile", "namespace", "pod", "team",
        "workload", "reason", "allocation"), "VARCHAR"),
    **dict.fromkeys(("gpu_seconds", "utilized", "cost", "price", *FIELDS,
                     "memory_used_bytes", "memory_total_bytes"), "DOUBLE"),
    "last_xid": "BIGINT", "clock_event_reasons": "BIGINT",
}
_STAGED = "usage-{win!r}-{serial}.parquet"
"""A staged file: its rows' interval (start, Unix seconds) and a serial unique to it."""
QUARANTINE = "quarantine"
"""The folder in the staging directory that files the warehouse cannot use are moved to,
kept for a look and never read again (``QUARANTINE_REASONS``)."""
_STAGED_KEYS = frozenset({"win", "device_id", "pod_uid", "state", "gpu_seconds"})
"""Columns every staged file has had, whichever release staged it."""
_NOT_THE_FILE = (duckdb.OutOfMemoryException, duckdb.FatalException,
                 duckdb.InternalException, duckdb.InterruptException)
"""What DuckDB raises for a fault of its own, whatever it reads: never a reason to set a file
aside. What a damaged file raises varies with the damage (``InvalidInputException`` for a
file that is not Parquet, a bare ``duckdb.Error`` for a page that does not decode, ...)."""
_LEGACY_STAGING = "usage_staging"
"""The table rows were staged in before the staging files."""
_STAGE_OF_DEVICE = {
    "device_id": "device_id", "state": "state", "node": "node", "node_pool": "pool",
    "zone": "zone", "gpu_model": "accelerator", "provisioning": "provisioning",
    "gpu_uuid": "gpu_uuid", "gpu_index": "gpu_index", "mig_profile": "mig_profile",
    "reason": "reason", "price": "price_usd_per_hour",
    "memory_used_bytes": "memory_used_bytes", "memory_total_bytes": "memory_total_bytes"}
"""Staged columns taken from the row's device, and its attribute."""
_STAGE_OF_OWNER = {"namespace": "namespace", "pod": "name", "team": "team",
                   "workload": "workload", "allocation": "allocation"}
"""... from the row's owner (NULL for none)."""
_STAGE_OF_ROW = {"gpu_seconds": "seconds", "utilized": "utilized_seconds",
                 "cost": "cost_usd"}
_WEIGHTED = ",\n".join(
    f"sum({c} * gpu_seconds) / sum(CASE WHEN {c} IS NOT NULL THEN gpu_seconds END)"
    for c in FIELDS)
_AGGREGATE = f"""
SELECT md5(concat_ws('|', {{cluster}}, win, device_id, pod_uid, state)) AS id,
       to_timestamp(win), {{interval}}, {{cluster}},
       any_value(node), any_value(node_pool), any_value(zone), any_value(gpu_model),
       any_value(provisioning), any_value(gpu_uuid), any_value(gpu_index),
       any_value(mig_profile), device_id, any_value(namespace), any_value(pod),
       nullif(pod_uid, ''), any_value(team), any_value(workload), state, any_value(reason),
       sum(gpu_seconds),
       CASE WHEN count(utilized) > 0 THEN sum(utilized) / sum(gpu_seconds) END,
       {_WEIGHTED},
       max(memory_used_bytes), max(memory_total_bytes), max(last_xid),
       bit_or(clock_event_reasons), any_value(price), sum(cost),
       nullif(any_value(allocation), '')
FROM {{source}}
GROUP BY win, device_id, pod_uid, state
"""
"""Staged rows as ``gpu_usage`` rows, in its column order."""


CURRENT_PODS_VIEW = """CREATE OR REPLACE VIEW gpu_pods_current AS
SELECT * FROM gpu_pods
QUALIFY row_number() OVER (PARTITION BY cluster, pod_uid ORDER BY updated DESC) = 1"""
"""Each pod's latest row: its current (or final) state."""


REPORT_RUNS_DDL = """CREATE TABLE IF NOT EXISTS report_runs (
    week VARCHAR PRIMARY KEY, finished TIMESTAMPTZ NOT NULL, directory VARCHAR)"""
"""Weeks whose scheduled report has been written (and mailed): each is reported once."""

STATE_DDL = (
    """CREATE TABLE IF NOT EXISTS device_inventory (
        cluster VARCHAR NOT NULL, node VARCHAR NOT NULL, device_id VARCHAR NOT NULL,
        gpu_uuid VARCHAR NOT NULL, gpu_index VARCHAR, mig_profile VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS open_incidents (
        cluster VARCHAR NOT NULL, gpu_uuid VARCHAR NOT NULL, reason VARCHAR NOT NULL,
        start_time DOUBLE NOT NULL, node VARCHAR, node_pool VARCHAR)""",
)
"""What the exporter needs to go on counting after a restart: every device DCGM has shown,
and the incidents still open (a restart in an outage neither ends it nor loses it)."""

Incidents = Mapping[tuple[str, str], tuple[float, str, str]]
"""(GPU UUID, reason) -> (start, node, pool) of each GPU now unavailable."""

HOUR = 3600.0
MAINTENANCE_INTERVAL = HOUR
"""How often old rows are rolled up and expired rows deleted."""
CHECKPOINT_INTERVAL = 900.0
"""How often the write-ahead log is checkpointed into the file. Left to DuckDB (at 16 MB of
log), a checkpoint came every few cycles at 8,000 GPUs and cost 0.2-1.3 s of that cycle's
CPU; every 15 minutes it is one cycle in 30, and the log stays under 60 MB (replayed at a
restart after a kill). Counted on the warehouse's ``clock``, not on the rows' time."""
REOPEN_INTERVAL = HOUR
"""How long the file stays open. At 8,000 GPUs DuckDB's share of the process grew about
4 MiB an hour it was open (beyond its memory limit's accounting): RSS 289 -> 308 MiB over
250 cycles; reopened every 30 minutes, 287-295 MiB. A reopen costs about 0.03 s (0.3 s
on a month-old file). Counted on the warehouse's ``clock``, not on the rows' time."""
ALLOCATOR_FLUSH = "8MB"
"""DuckDB gives freed memory back to the system after freeing this much at once (its
default, 512 MB, is more than the connection may hold: what a flush or a checkpoint freed
stayed with the process; at 8,000 GPUs this holds RSS about 17 MiB lower)."""
EXTERNAL_FILE_CACHE = False
"""Whether DuckDB keeps the files it reads in memory: never here. Each staged file is read
once and then deleted, yet DuckDB kept its bytes in whatever room its memory limit left
(up to 38 MB at 80 GPUs), and an entry per file name in its object cache until the file
was closed (about 160 bytes more each cycle). No file the warehouse reads is read twice."""
CHECKPOINT_WAL = "1GB"
"""DuckDB's own checkpoint threshold: past ``CHECKPOINT_INTERVAL``'s log, only a guard."""
WRITE_BYTES = 2 << 20
"""Most staged Parquet one transaction of a flush reads (whole intervals, at least one).
A transaction holds what it writes, and the outbox's copy, in memory until it commits:
with the outbox on, 8.4 MB of files (a day of the default scenario in one transaction, at
a ``flush_interval`` of a day) and 6 MB ran out of the connection's 64 MB, 4 MB did not;
half that leaves room at any ``flush_interval``."""
PENDING_ROWS_MAX = 1_000_000
"""Most usage rows kept in memory while staging fails (an hour of 8,000 GPUs at the default
30 s interval); past it they are dropped, counted as removed for reason ``unstaged``."""
ROLLUP_BUDGET_SECONDS = 2.0
"""Longest a maintenance pass rolls up for; a backlog (a file older than the retention
when it is first set) is worked off over the following flushes."""


_INVENTORY_TYPES = dict.fromkeys(
    ("cluster", "node", "device_id", "gpu_uuid", "gpu_index", "mig_profile"), "VARCHAR")
_INCIDENTS_TYPES = {"cluster": "VARCHAR", "gpu_uuid": "VARCHAR", "reason": "VARCHAR",
                    "start_time": "DOUBLE", "node": "VARCHAR", "node_pool": "VARCHAR"}


def _rolled(c: Column) -> str:
    """The column's hourly value over a group of rows (see ``schema.Rollup``)."""
    match c.rollup:
        case "key":
            return c.name
        case "sum":
            return f"sum({c.name})"
        case "mean":
            return (f"sum({c.name} * gpu_seconds) / "
                    f"sum(CASE WHEN {c.name} IS NOT NULL THEN gpu_seconds END)")
        case "max":
            return f"max({c.name})"
        case "or":
            return f"bit_or({c.name})"
        case "any":
            return f"any_value({c.name})"


_HOUR_OF = "to_timestamp(floor(epoch(time) / 3600) * 3600)"
_KEYS = [c.name for c in GPU_USAGE.columns if c.rollup == "key"]
_ROLLUP_RANGE = "interval_seconds < 3600 AND time >= {lo} AND time < {hi}"
_ROLLUP = "SELECT " + ", ".join({
    "id": f"md5(concat_ws('|', cluster, epoch({_HOUR_OF}), device_id, coalesce(pod_uid, ''), "
          "state, 'hour'))",
    "time": _HOUR_OF, "interval_seconds": "3600.0"}.get(c.name) or _rolled(c)
    for c in GPU_USAGE.columns) + \
    f" FROM {{source}} WHERE {_ROLLUP_RANGE} GROUP BY {', '.join([_HOUR_OF, *_KEYS])}"
"""One row per hour, device, pod and state of the ``gpu_usage`` rows in a range, in the
table's column order: totals and GPU-second-weighted means stay what they were."""

DAY = 86400.0
OPEN_WORKLOAD_STATES = (WORKLOAD_PENDING, WORKLOAD_ADMITTED)
HOURLY = "gpu_usage_hourly"
"""The rolled-up ``gpu_usage`` rows (and a file's rows from before the daily tables)."""
_RAW_PREFIX = "gpu_usage_raw_"


def _write_groups(staged: Mapping[float, Sequence[Path]], limit: int = WRITE_BYTES
                  ) -> Iterator[tuple[float, list[float]]]:
    """The intervals of ``staged`` (their files by interval) in the order a flush writes
    them, a transaction each: their UTC day, and its intervals in order, as many as fit in
    ``limit`` bytes of files (one at least). A file gone since it was listed counts 0."""
    day, size = math.nan, 0
    wins: list[float] = []
    for win in sorted(staged):
        here = sum(_size(f) for f in staged[win])
        if wins and (win - win % DAY != day or size + here > limit):
            yield day, wins
            wins, size = [], 0
        day = win - win % DAY
        wins.append(win)
        size += here
    if wins:
        yield day, wins


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def raw_table(day: float) -> str:
    """The table of the ``gpu_usage`` rows at the warehouse interval of the UTC day that
    starts at ``day``: ``gpu_usage_raw_20261109``."""
    return _RAW_PREFIX + datetime.fromtimestamp(day, UTC).strftime("%Y%m%d")


def _day_of(table: str) -> float:
    return datetime.strptime(table.removeprefix(_RAW_PREFIX), "%Y%m%d").replace(
        tzinfo=UTC).timestamp()


def _usage_ddl(name: str) -> str:
    return GPU_USAGE.duckdb_ddl().replace(f" {GPU_USAGE.name} (", f" {name} (", 1)


def _base_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {name for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND NOT temporary").fetchall()}


def row_id(*parts: object) -> str:
    return hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=16).hexdigest()


def _ts(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


def _held(con: duckdb.DuckDBPyConnection, name: str, table: Table) -> Table:
    """``table`` as table ``name`` of the file holds it: the columns it has, which are a
    beginning of today's (a later release adds its columns last, ``schema``)."""
    have = duck.held_columns(con).get(name, [])
    if have != table.names[:len(have)]:
        raise duckdb.CatalogException(
            f"table {name} has columns {have}, not a beginning of {table.names}")
    return replace(table, columns=table.columns[:len(have)])


def _drop_keys(con: duckdb.DuckDBPyConnection, staging: Path) -> list[str]:
    """Rebuild without their primary key the tables a file made by an earlier version keyed
    on ``id`` (one transaction), each with the columns it holds; the names of the tables
    rebuilt."""
    keyed = [name for (name,) in con.execute(
        "SELECT DISTINCT table_name FROM duckdb_constraints() WHERE constraint_type = "
        "'PRIMARY KEY' AND database_name = current_database() AND schema_name = 'main' "
        f"AND table_name IN ({', '.join(literal(t.name) for t in TABLES)})").fetchall()]
    if not keyed:
        return []
    con.execute("BEGIN")
    try:
        con.execute("DROP VIEW IF EXISTS gpu_pods_current")
        for name in keyed:
            table = _held(con, name, BY_NAME[name])
            con.execute(table.duckdb_ddl().replace(f" {name} (", f" _unkeyed_{name} (", 1))
            con.execute(f"INSERT INTO _unkeyed_{name} SELECT {', '.join(table.names)} "
                        f"FROM {name}")
            con.execute(f"DROP TABLE {name}")
            con.execute(f"ALTER TABLE _unkeyed_{name} RENAME TO {name}")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return keyed


def _usage_to_hourly(con: duckdb.DuckDBPyConnection, staging: Path) -> list[str]:
    """``gpu_usage`` as one table, as files were before the daily ones: that table is
    ``HOURLY`` (it takes rows at any interval); [its name] when renamed."""
    if GPU_USAGE.name not in _base_tables(con):
        return []
    con.execute(f"ALTER TABLE {GPU_USAGE.name} RENAME TO {HOURLY}")
    return [GPU_USAGE.name]


def _add_columns(con: duckdb.DuckDBPyConnection, name: str, table: Table) -> list[str]:
    """Bring table ``name``, a ``table`` of a file made by an earlier release, up to date:
    add the columns it lacks, which come last (``schema``); the names of those added."""
    have = _held(con, name, table).names
    if not have or have == table.names:
        return []
    added = table.columns[len(have):]
    for c in added:
        con.execute(f"ALTER TABLE {name} ADD COLUMN {c.name} {table.duckdb_types[c.name]}")
    return [c.name for c in added]


def _add_all_columns(con: duckdb.DuckDBPyConnection, staging: Path) -> list[str]:
    """Every table of ``TABLES`` (``gpu_usage``'s daily and hourly ones) given the columns
    of later releases; ``table.column`` of each added."""
    added: list[str] = []
    for name in sorted(_base_tables(con)):
        table = GPU_USAGE if name == HOURLY or name.startswith(_RAW_PREFIX) else \
            BY_NAME.get(name)
        if table is not None:
            added += [f"{name}.{c}" for c in _add_columns(con, name, table)]
    return added


def _staging_to_files(con: duckdb.DuckDBPyConnection, staging: Path) -> list[str]:
    """The rows a file from before the staging files staged in ``usage_staging`` moved to
    the ``staging`` directory, one file per interval, named after it alone (a move cut short
    is made again whole), and the table dropped; the files' names and the table's."""
    if _LEGACY_STAGING not in _base_tables(con):
        return []
    moved = []
    for (win,) in con.execute(f"SELECT DISTINCT win FROM {_LEGACY_STAGING}").fetchall():
        name = staging / _STAGED.format(win=float(win), serial="table")
        con.execute(f"COPY (SELECT * FROM {_LEGACY_STAGING} WHERE win = "
                    f"{literal(float(win))}) TO {duck.quote(str(name))} (FORMAT parquet)")
        moved.append(name.name)
    con.execute(f"DROP TABLE {_LEGACY_STAGING}")
    return [*moved, _LEGACY_STAGING]


def _staged_columns(con: duckdb.DuckDBPyConnection, staging: Path) -> list[str]:
    """Each staged file of an earlier release that lacks columns staged since rewritten with
    them, null (a flush reads an interval's files by name, and a column none of them has
    does not bind); the names of the files rewritten."""
    rewritten = []
    for f in sorted(staging.glob("usage-*.parquet")):
        part = f.with_name(f.name + ".part")
        try:
            have = {n for (n,) in con.execute(
                f"SELECT name FROM parquet_schema({duck.quote(str(f))})").fetchall()}
            if not _STAGE_TYPES.keys() - have:
                continue
            cols = ", ".join(c if c in have else f"CAST(NULL AS {t}) AS {c}"
                             for c, t in _STAGE_TYPES.items())
            con.execute(f"COPY (SELECT {cols} FROM read_parquet({duck.quote(str(f))})) TO "
                        f"{duck.quote(str(part))} (FORMAT parquet)")
        except (duckdb.OutOfMemoryException, duckdb.FatalException, duckdb.InternalException,
                duckdb.InterruptException):
            raise                          # DuckDB's own fault, not the file's
        except duckdb.Error:               # a file that does not read: left to the flush
            part.unlink(missing_ok=True)
            continue
        with part.open("rb") as written:   # on disk before it takes the staged file's name
            os.fsync(written.fileno())
        os.replace(part, f)
        rewritten.append(f.name)
    return rewritten


@dataclass(frozen=True, slots=True)
class Migration:
    """One step from a file of an earlier layout towards today's."""

    name: str
    step: Callable[[duckdb.DuckDBPyConnection, Path], list[str]]
    """Applied to the file's connection and its staging directory: what it changed (empty
    when the file needed nothing). Each step is idempotent: run again on a file it has
    brought up to date (or one a kill interrupted), it does what is left."""


MIGRATIONS = (
    Migration("unkeyed", _drop_keys),
    Migration("daily_tables", _usage_to_hourly),
    Migration("columns", _add_all_columns),
    Migration("staging_files", _staging_to_files),
    Migration("staged_columns", _staged_columns),
)
"""The chain every file runs as it opens, in this order: a file of any earlier layout
(0.1.0's and each since, listed in the CHANGELOG) comes out in today's. A step may rely on
those before it (the columns are added to the tables the first two leave), never on those
after."""


def migrate(con: duckdb.DuckDBPyConnection, staging: Path) -> dict[str, list[str]]:
    """Run ``MIGRATIONS`` in order on the file; what each step changed, by its name (only
    the steps that changed something)."""
    done: dict[str, list[str]] = {}
    for m in MIGRATIONS:
        if changed := m.step(con, staging):
            done[m.name] = changed
    return done


def _locked[**P, R](method: Callable[Concatenate[Warehouse, P], R]
                   ) -> Callable[Concatenate[Warehouse, P], R]:
    """Run ``method`` holding the warehouse's lock: one writer at a time, whichever thread
    it is in (the cycle's worker, the final flush at shutdown)."""
    def run(self: Warehouse, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.lock:
            return method(self, *args, **kwargs)
    functools.update_wrapper(run, method)
    return run


class Warehouse:
    """Stages usage rows each cycle and appends complete intervals to DuckDB.

    Its writing methods may run in a worker thread (the service keeps DuckDB's work off its
    event loop); they hold ``lock``, so two threads never write at once. The few reads
    from other threads (``report_done``, ``snapshot``, the BigQuery outbox) use cursors of
    their own."""

    def __init__(self, path: Path, cluster: str, interval: float,
                 flush_interval: float | None = None, outbox: bool = False,
                 raw_retention: float = 0.0, retention: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        """The file's own time, on which it is checkpointed and reopened: the process's
        seconds, whatever time the rows are of (a replay writes a week of rows in a minute,
        and what those two cadences look after, the log's size and DuckDB's memory, grows
        with the work done, not with the time written about)."""
        self.cluster = cluster
        self.interval = interval
        self.flush_interval = max(interval, flush_interval or interval)
        self.raw_retention = raw_retention
        """``gpu_usage`` rows older than this are rolled up to hourly ones (0: never)."""
        self.retention = retention
        """Rows older than this are deleted (0: never)."""
        self.quarantined: dict[QuarantineReason, int] = dict.fromkeys(QUARANTINE_REASONS, 0)
        """Files set aside in the quarantine folder, by why (``QUARANTINE_REASONS``)."""
        self.con = self._connect()
        self._opened: float | None = None
        """The ``clock``'s time of the first write since the file was opened."""
        self._readers = 0
        """Snapshots reading on cursors of their own (the file is not reopened under them)."""
        self._staging = self._staging_directory()
        """The staged files, each the rows of one interval (``_STAGED``)."""
        self.migrated = migrate(self.con, self._staging)
        """What ``MIGRATIONS`` changed as the file opened, by step."""
        tables = _base_tables(self.con)
        self.con.execute(_usage_ddl(HOURLY))
        self._raw: dict[float, str] = {_day_of(t): t for t in sorted(tables)
                                       if t.startswith(_RAW_PREFIX)}
        """UTC day -> the table of its rows at the warehouse interval."""
        self._usage_view()
        (self._hourly_has_raw,) = self.con.execute(
            f"SELECT EXISTS (SELECT 1 FROM {HOURLY} WHERE interval_seconds < 3600)"
        ).fetchone() or (False,)
        """Whether ``HOURLY`` still holds rows at the warehouse interval (a file from before
        the daily tables): rolled up like a day's, and checked by writes."""
        for table in TABLES:
            if table is not GPU_USAGE:
                self.con.execute(table.duckdb_ddl())
        self.con.execute(CURRENT_PODS_VIEW)
        self._encoded: Encoded = {}
        """The last staged file's string columns (most come back the same, cycle after
        cycle)."""
        self.con.execute(REPORT_RUNS_DDL)
        for ddl in STATE_DDL:
            self.con.execute(ddl)
        self.with_outbox = outbox
        """Also queue every new row for BigQuery (see ``exporter.sinks.outbox``)."""
        if outbox:
            for ddl in OUTBOX_DDL:
                self.con.execute(ddl)
        self._unstaged: dict[str, list[Any]] = {name: [] for name in _STAGE_TYPES}
        """Rows not staged yet, by column: the current cycle's, and those of cycles whose
        staging failed (at most ``PENDING_ROWS_MAX``)."""
        self._pods: dict[str, dict[str, Any]] = {}
        self._pod_signatures: dict[str, tuple[Any, ...]] = {}
        self._pod_models: dict[str, str] = {}
        self._events: list[dict[str, Any]] = []
        self._quotas: dict[str, dict[str, Any]] = {}
        self._quota_signatures: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._workloads: dict[str, dict[str, Any]] = {}
        self._workload_rows: dict[str, dict[str, Any]] = {}
        """Each Workload's last row, by uid: what a row for its deletion repeats."""
        self._workload_signatures: dict[str, tuple[Any, ...]] = {}
        self.rows_written: dict[str, int] = defaultdict(int)
        self.rows_removed: dict[tuple[str, str], int] = {
            (GPU_USAGE.name, "rolled_up"): 0, (GPU_USAGE.name, "unstaged"): 0,
            **{(t.name, "expired"): 0 for t in TABLES}}
        """Rows taken out by the retention, by table and why (rolled_up, expired)."""
        self._next_flush = 0.0
        self._next_maintenance = 0.0
        self._next_checkpoint = -math.inf
        self._saved: tuple[object, object] | None = None
        """The state last saved or loaded (``save_state`` writes only changes)."""
        self.lock = threading.RLock()

    def _staging_directory(self) -> Path:
        """The directory of the staged files, made if need be."""
        if str(self.path) == ":memory:":
            return Path(tempfile.mkdtemp(prefix="gpu-usage-staging-"))
        directory = self.path.with_name(self.path.name + ".staging")
        directory.mkdir(exist_ok=True)
        for part in directory.glob("*.part"):  # a file a kill cut short: never staged
            part.unlink()
        return directory

    def _staged(self) -> dict[float, list[Path]]:
        """The staged files by the interval of their rows; any other file in the staging
        directory (a name that gives no interval, a stray) is set aside."""
        out: dict[float, list[Path]] = defaultdict(list)
        for f in self._staging.iterdir():
            if f.name == QUARANTINE or f.suffix == ".part":
                continue
            if not (f.name.startswith("usage-") and f.name.endswith(".parquet")):
                self._quarantine(f, "stray", "not a staged file")
                continue
            try:
                win = float(f.name.split("-")[1])
            except ValueError:
                self._quarantine(f, "name", "its name gives no interval")
                continue
            if not math.isfinite(win):
                self._quarantine(f, "name", "its name gives no interval")
                continue
            out[win].append(f)
        return out

    def _quarantine_dir(self) -> Path:
        return self.path.with_name(self.path.name + ".staging") / QUARANTINE \
            if str(self.path) != ":memory:" else self._staging / QUARANTINE

    def _quarantine(self, path: Path, reason: QuarantineReason, error: str,
                    copy: bool = False) -> None:
        """Move (or ``copy``) ``path`` to the quarantine folder, never to be read again;
        counted and logged."""
        directory = self._quarantine_dir()
        directory.mkdir(parents=True, exist_ok=True)
        dest = directory / path.name
        if dest.exists():
            dest = directory / f"{path.name}.{time.time_ns()}"
        if copy:
            shutil.copyfile(path, dest)
        else:
            path.replace(dest)
        self.quarantined[reason] += 1
        log.warning("warehouse file quarantined", extra=ctx(
            file=str(path), moved_to=str(dest), reason=reason, error=error))

    def _unusable(self, files: Sequence[str]) -> list[tuple[str, QuarantineReason, str]]:
        """The staged files among ``files`` DuckDB cannot read as staged rows, each with
        why: their Parquet metadata first (a file that is not Parquet or is cut short, one
        without the staged columns), then, when each of those reads, every value of each
        (a damaged page). Only called once a write of them failed."""
        bad: list[tuple[str, QuarantineReason, str]] = []
        for f in files:
            try:
                names = {name for (name,) in self.con.execute(
                    f"SELECT name FROM parquet_schema({duck.quote(f)})").fetchall()}
            except _NOT_THE_FILE:
                raise
            except duckdb.Error as exc:
                bad.append((f, "unreadable", " ".join(str(exc).split())))
                continue
            if missing := _STAGED_KEYS - names:
                bad.append((f, "foreign", f"no column {', '.join(sorted(missing))}"))
        if bad:
            return bad
        for f in files:
            try:
                self.con.execute(f"SELECT max(COLUMNS(*)) FROM read_parquet({duck.quote(f)})"
                                 ).fetchall()
            except _NOT_THE_FILE:
                raise
            except duckdb.Error as exc:
                bad.append((f, "unreadable", " ".join(str(exc).split())))
        return bad

    @contextlib.contextmanager
    def _scratch(self, suffix: str) -> Iterator[str]:
        """The path of a new file next to the database, deleted on leaving."""
        directory = self.path.parent if str(self.path) != ":memory:" else None
        fd, name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=suffix,
                                    dir=directory)
        os.close(fd)
        try:
            yield name
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)

    @contextlib.contextmanager
    def _csv(self, rows: Iterable[Sequence[object]], types: Mapping[str, str]
             ) -> Iterator[str]:
        """``rows`` (in the order of ``types``' columns) as a relation to read in SQL."""
        with self._scratch(".csv") as name:
            write_csv(name, rows)
            yield read_csv(name, types)

    def _connect(self) -> duckdb.DuckDBPyConnection:
        # A small appender, not an analytics engine: bound DuckDB's memory and threads.
        wal = Path(f"{self.path}.wal")
        logged = wal.stat().st_size if str(self.path) != ":memory:" and wal.exists() else 0
        con = duck.connect(self.path, memory_limit="64MB", threads=1)
        if logged:
            self._check_wal(con, wal, logged)
        con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_WAL}'")
        con.execute(f"SET allocator_bulk_deallocation_flush_threshold = '{ALLOCATOR_FLUSH}'")
        con.execute(f"SET enable_external_file_cache = {str(EXTERNAL_FILE_CACHE).lower()}")
        return con

    def _check_wal(self, con: duckdb.DuckDBPyConnection, wal: Path, logged: int) -> None:
        """Set aside a copy of the write-ahead log DuckDB found at ``wal`` (``logged``
        bytes) and did not replay: a damaged log is dropped without an error, and its
        changes (at most ``CHECKPOINT_INTERVAL`` of rows) are lost. A log replayed is held
        as DuckDB's own; one it dropped it leaves on disk as it was, until the first write
        empties it."""
        row = con.execute("SELECT wal_size FROM pragma_database_size()").fetchone()
        replayed = row is not None and row[0] != "0 bytes"
        try:
            kept = wal.stat().st_size == logged
        except OSError:  # replayed and checkpointed away
            kept = False
        if replayed or not kept:
            return
        lost = (f"DuckDB did not replay the write-ahead log ({logged} bytes): the changes "
                "since the last checkpoint are lost")
        try:
            self._quarantine(wal, "wal", lost, copy=True)
        except OSError as exc:
            self.quarantined["wal"] += 1
            log.warning("warehouse file quarantined", extra=ctx(
                file=str(wal), reason="wal", error=lost, copy_failed=str(exc)))

    def _reopen(self) -> None:
        """Close and open the file again every ``REOPEN_INTERVAL`` of the ``clock`` (when no
        snapshot reads it). DuckDB keeps memory for what it writes for as long as the file
        is open; a reopen gives it back, and what the next writes need is read again as they
        go."""
        now = self.clock()
        if self._opened is None:
            self._opened = now
        if now - self._opened < REOPEN_INTERVAL or self._readers:
            return
        self.con.close()
        self.con = self._connect()
        self._opened = now

    def _usage_view(self) -> None:
        """``gpu_usage``: the hourly rows and every day's, as one relation."""
        parts = [HOURLY, *(self._raw[d] for d in sorted(self._raw))]
        self.con.execute(f"CREATE OR REPLACE VIEW {GPU_USAGE.name} AS "
                         + " UNION ALL ".join(f"SELECT * FROM {t}" for t in parts))

    def _raw_table(self, day: float) -> str:
        """The day's table, made (and added to the view) when it is first written."""
        if day not in self._raw:
            self.con.execute(_usage_ddl(raw_table(day)))
            self._raw[day] = raw_table(day)
            self._usage_view()
        return self._raw[day]

    @_locked
    def add_usage(self, rows: Sequence[UsageRow]) -> None:
        """Stage one cycle's rows in the file (one batch, one statement); DuckDB aggregates
        them per interval when they flush. Rows whose staging fails are kept for the next
        call, up to ``PENDING_ROWS_MAX`` (then those kept are dropped, and counted)."""
        cols = self._unstaged
        if len(cols["win"]) > PENDING_ROWS_MAX:
            self.rows_removed[GPU_USAGE.name, "unstaged"] += len(cols["win"])
            cols = self._unstaged = {name: [] for name in _STAGE_TYPES}
        if rows:  # column by column, each in one pass at C speed where it can be
            devices = list(map(attrgetter("device"), rows))
            owners = list(map(attrgetter("owner"), rows))
            fields = list(map(attrgetter("fields"), devices))
            cols["win"] += [t - t % self.interval for t in map(attrgetter("start"), rows)]
            cols["pod_uid"] += map(getattr, owners, repeat("uid"), repeat(""))
            for col, attr in _STAGE_OF_DEVICE.items():
                cols[col] += map(attrgetter(attr), devices)
            for col, attr in _STAGE_OF_OWNER.items():
                cols[col] += map(getattr, owners, repeat(attr), repeat(None))
            for col, attr in _STAGE_OF_ROW.items():
                cols[col] += map(attrgetter(attr), rows)
            for col, field in FIELDS.items():
                cols[col] += map(dict.get, fields, repeat(field))
            cols["last_xid"] += map(int, map(dict.get, fields, repeat(XID), repeat(0)))
            cols["clock_event_reasons"] += [
                None if r is None else int(r)
                for r in map(dict.get, fields, repeat(CLOCK_REASONS))]
        self._stage()

    def _stage(self) -> None:
        """Write the rows not staged yet to a file per interval (on disk before it is
        named, so a staged file is always whole)."""
        cols = self._unstaged
        rest: dict[str, list[Any]]
        while wins := cols["win"]:
            win = wins[0]
            if wins.count(win) == len(wins):  # one interval, unless staging failed before
                batch, rest = cols, {name: [] for name in _STAGE_TYPES}
            else:
                mine = [w == win for w in wins]
                others = [not m for m in mine]
                batch = {name: list(compress(values, mine)) for name, values in cols.items()}
                rest = {name: list(compress(values, others)) for name, values in cols.items()}
            self._stage_file(win, batch)
            self._unstaged = cols = rest  # staged once: never again

    def _stage_file(self, win: float, batch: Mapping[str, Sequence[Any]]) -> None:
        """One interval's rows as a staged file, named once it is whole on disk."""
        name = self._staging / _STAGED.format(win=float(win), serial=time.time_ns())
        part = name.with_suffix(".part")
        try:
            write_parquet(str(part), batch, _STAGE_TYPES, self._encoded)
            fd = os.open(part, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            part.replace(name)
        except BaseException:
            part.unlink(missing_ok=True)
            raise

    @_locked
    def add_pods(self, pods: Iterable[PodInfo], now: float,
                 team_of: Callable[[PodInfo], str],
                 model_of: Callable[[PodInfo], str] = lambda p: p.accelerator or "",
                 allocation_of: Callable[[PodInfo], str] = lambda p: "",
                 admission_of: Callable[[PodInfo], Admission | None] = lambda p: None) -> None:
        """Buffer a row for each GPU pod whose state changed. ``model_of`` gives its GPU
        model (its selector's, else its node's); a pod keeps the last model known for it
        once its node is gone."""
        for p in pods:
            if p.gpus <= 0:
                continue
            signature = (p.phase, p.node, p.scheduled_unix, p.finished_unix, p.reason)
            if self._pod_signatures.get(p.uid) == signature:
                continue  # unchanged since it was last written
            self._pod_signatures[p.uid] = signature
            model = self._pod_models[p.uid] = model_of(p) or self._pod_models.get(p.uid, "")
            kueue = admission_of(p)
            queued = min(p.created_unix, kueue.queued_unix) if kueue else p.created_unix
            wait = None if p.scheduled_unix is None else p.scheduled_unix - queued
            self._pods[p.uid] = {
                "id": row_id(self.cluster, p.uid, *signature), "cluster": self.cluster,
                "pod_uid": p.uid, "namespace": p.namespace, "pod": p.name,
                "team": team_of(p), "workload": p.workload,
                "owner_kind": p.owner_kind, "gpus": p.gpus, "gpu_model": model or None,
                "node": p.node, "phase": p.phase, "created": _ts(p.created_unix),
                "scheduled": _ts(p.scheduled_unix), "finished": _ts(p.finished_unix),
                "queue_wait_seconds": wait, "reason": p.reason, "priority": p.priority,
                "priority_class": p.priority_class, "queue": p.queue, "updated": _ts(now),
                "allocation": allocation_of(p) or None, "queued": _ts(queued),
                "admission_wait_seconds": kueue.wait_seconds if kueue else None,
                "cluster_queue": (kueue.cluster_queue or None) if kueue else None}

    @_locked
    def add_quotas(self, queues: Iterable[ClusterQueueInfo], now: float) -> None:
        """Buffer a row for each ClusterQueue GPU flavor whose quota changed, or that has
        no row of this UTC day yet (so the last quota outlives the retention). ``queues``
        are all the cluster has: what is remembered of the others (deleted) is forgotten."""
        day = now - now % DAY
        listed: set[tuple[str, str]] = set()
        for q in queues:
            for flavor, f in q.flavors.items():
                listed.add((q.name, flavor))
                signature = (q.cohort, f.nominal_gpus, f.borrowing_limit_gpus, day)
                if self._quota_signatures.get((q.name, flavor)) == signature:
                    continue
                self._quota_signatures[q.name, flavor] = signature
                self._quotas[f"{q.name}/{flavor}"] = {
                    "id": row_id(self.cluster, q.name, flavor, *signature),
                    "cluster": self.cluster, "cluster_queue": q.name, "cohort": q.cohort,
                    "flavor": flavor, "nominal_gpus": f.nominal_gpus,
                    "borrowing_limit_gpus": f.borrowing_limit_gpus, "updated": _ts(now)}
        for gone in self._quota_signatures.keys() - listed:
            del self._quota_signatures[gone]

    @_locked
    def add_workloads(self, workloads: Iterable[WorkloadInfo], now: float,
                      team_of: Callable[[WorkloadInfo], str],
                      cluster_queue_of: Callable[[WorkloadInfo], str],
                      complete: bool) -> None:
        """Buffer a row for each Kueue Workload whose state changed. With ``complete`` (the
        Workloads are all the cluster has), one written before that is no longer among
        them and had not finished gets a last row, ``Deleted`` at ``now``."""
        present = set()
        for w in workloads:
            present.add(w.uid)
            queue = cluster_queue_of(w)
            signature = (w.state, w.queued_unix, w.admitted_unix, w.finished_unix, queue,
                         w.gpus)
            if self._workload_signatures.get(w.uid) == signature:
                continue  # unchanged since it was last written
            self._workload_signatures[w.uid] = signature
            row = {
                "cluster": self.cluster, "workload_uid": w.uid, "namespace": w.namespace,
                "workload": w.name, "owner_kind": w.owner_kind or None,
                "owner_name": w.owner_name or None, "team": team_of(w),
                "local_queue": w.local_queue or None,
                "cluster_queue": queue or None, "gpus": w.gpus,
                "gpu_model": w.accelerator or None,
                "priority_class": w.priority_class or None, "state": w.state,
                "created": _ts(w.created_unix), "queued": _ts(w.queued_unix),
                "admitted": _ts(w.admitted_unix), "finished": _ts(w.finished_unix)}
            self._workload_state(row, now)
        if complete:
            for uid in [u for u in self._workload_rows if u not in present]:
                last = self._workload_rows.pop(uid)
                self._workload_signatures.pop(uid, None)
                if last["state"] in OPEN_WORKLOAD_STATES:
                    self._workload_state(last | {"state": DELETED, "finished": _ts(now)}, now,
                                         last=True)

    def _workload_state(self, row: dict[str, Any], now: float, last: bool = False) -> None:
        """Buffer ``row`` (a ``kueue_workloads`` row, less its id and time) as observed at
        ``now``; remembered unless it is the Workload's ``last``."""
        row = {k: v for k, v in row.items() if k not in ("id", "updated")}
        if not last:
            self._workload_rows[row["workload_uid"]] = row
        self._workloads[row["workload_uid"]] = row | {
            "id": row_id(self.cluster, row["workload_uid"], row["state"], row["queued"],
                         row["admitted"], row["finished"], row["cluster_queue"]),
            "updated": _ts(now)}

    @_locked
    def finish_vanished_workloads(self, present: Collection[str], now: float) -> int:
        """End the Workloads the table still shows waiting or admitted that the cluster no
        longer lists: gone while no exporter watched. Their last row is written again with
        state ``Deleted`` and ``finished`` at ``now``, when it was noticed."""
        found = self.con.execute(
            f"SELECT * FROM {KUEUE_WORKLOADS.name} WHERE cluster = {literal(self.cluster)} "
            f"QUALIFY row_number() OVER (PARTITION BY workload_uid ORDER BY updated DESC) = 1")
        names = [c[0] for c in found.description or ()]
        rows = [dict(zip(names, values, strict=True)) for values in found.fetchall()]
        listed = set(present)
        gone = [r for r in rows
                if r["state"] in OPEN_WORKLOAD_STATES and r["workload_uid"] not in listed]
        for row in gone:
            self._workload_state(row | {"state": DELETED, "finished": _ts(now)}, now, last=True)
        return len(gone)

    @_locked
    def finish_vanished(self, present: Collection[str], now: float) -> int:
        """End the pods the table still shows live that the cluster no longer lists: gone
        while no exporter watched (a restart, an outage). Their last row is written again
        with phase ``Deleted`` and ``finished`` at ``now``, when it was noticed."""
        uids = ", ".join(map(literal, present))
        found = self.con.execute(
            f"SELECT * FROM gpu_pods_current WHERE cluster = {literal(self.cluster)} AND "
            f"finished IS NULL AND pod_uid NOT IN (SELECT unnest([{uids}]::VARCHAR[]))")
        names = [c[0] for c in found.description or ()]
        rows = [dict(zip(names, values, strict=True)) for values in found.fetchall()]
        for row in rows:
            row |= {"phase": DELETED, "finished": _ts(now), "updated": _ts(now)}
            row["id"] = row_id(self.cluster, row["pod_uid"], DELETED, row["node"],
                               row["scheduled"], now, row["reason"])
            self._pods[row["pod_uid"]] = row
        return len(rows)

    @_locked
    def add_event(self, node: str, pool: str, gpu_uuid: str, reason: str, start: float,
                  end: float) -> None:
        self._events.append({
            "id": row_id(self.cluster, gpu_uuid, reason, start), "cluster": self.cluster,
            "node": node, "node_pool": pool, "gpu_uuid": gpu_uuid, "reason": reason,
            "start_time": _ts(start), "end_time": _ts(end), "seconds": end - start})

    @_locked
    def maybe_flush(self, now: float) -> None:
        """``flush`` when the flush interval has passed and apply the retention hourly, both
        at ``now``, the rows' time; checkpoint and reopen the file on its ``clock``."""
        if now >= self._next_flush:
            self.flush(now)
        if self.clock() >= self._next_checkpoint:
            self.checkpoint()
        if now >= self._next_maintenance:
            self.maintain(now)
        self._reopen()

    @_locked
    def checkpoint(self) -> None:
        """Write the changes in the write-ahead log to the file (every
        ``CHECKPOINT_INTERVAL`` of the ``clock``; a replay, once at its end)."""
        self.con.execute("CHECKPOINT")
        self._next_checkpoint = self.clock() + CHECKPOINT_INTERVAL

    @_locked
    def maintain(self, now: float) -> None:
        """Roll up ``gpu_usage`` rows older than ``raw_retention`` and delete rows older than
        ``retention``."""
        done = True
        if self.raw_retention > 0:
            done = self.roll_up(now - self.raw_retention)
        if self.retention > 0:
            self.expire(now - self.retention)
        self._next_maintenance = now + (0.0 if not done else MAINTENANCE_INTERVAL)

    @_locked
    def roll_up(self, before: float, budget_seconds: float = ROLLUP_BUDGET_SECONDS) -> bool:
        """Replace the ``gpu_usage`` rows that started before ``before`` (an hour boundary
        at most) by one row per hour, device, pod and state in ``HOURLY``, an hour at a time
        (a bounded transaction in DuckDB's small memory) for at most ``budget_seconds``; a
        day's table is dropped once every row of it is rolled up. True when no such row is
        left. Local only: BigQuery keeps its rows as they were sent (its retention is the
        dataset's partition expiration)."""
        before -= before % HOUR
        deadline = time.monotonic() + budget_seconds
        sources = [*([(None, HOURLY)] if self._hourly_has_raw else []),
                   *sorted((d, t) for d, t in self._raw.items() if d < before)]
        for day, source in sources:
            while True:
                row = self.con.execute(
                    f"SELECT epoch(min(time)) FROM {source} WHERE interval_seconds < 3600 "
                    f"AND time < {at(before)}").fetchone()
                if row is None or row[0] is None:
                    break
                lo = row[0] - row[0] % HOUR
                self._roll_hour(source, lo, min(before, lo + HOUR))
                if time.monotonic() > deadline:
                    return False
            if day is None:  # a file's rows from before the daily tables: all rolled up?
                (self._hourly_has_raw,) = self.con.execute(
                    f"SELECT EXISTS (SELECT 1 FROM {HOURLY} WHERE interval_seconds < 3600)"
                ).fetchone() or (False,)
            elif day + DAY <= before:
                self.con.execute(f"DROP TABLE {source}")
                del self._raw[day]
                self._usage_view()
        return True

    def _roll_hour(self, source: str, lo: float, hi: float) -> None:
        span = {"lo": at(lo), "hi": at(hi)}
        self.con.execute("BEGIN")
        try:
            self.con.execute("CREATE TEMP TABLE _rolled AS "
                             + _ROLLUP.format(source=source, **span))
            gone = self.con.execute(f"DELETE FROM {source} WHERE "
                                    + _ROLLUP_RANGE.format(**span)).fetchone()
            self.con.execute(f"INSERT INTO {HOURLY} SELECT * FROM _rolled")
            self.con.execute("DROP TABLE _rolled")
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.rows_removed[GPU_USAGE.name, "rolled_up"] += int(gone[0]) if gone else 0

    @_locked
    def expire(self, before: float) -> None:
        """Delete every row whose event time is before ``before``; a day's table wholly
        before it is dropped."""
        for table in TABLES:
            parts = [table.name] if table is not GPU_USAGE else \
                [HOURLY, *(t for d, t in self._raw.items() if d < before < d + DAY)]
            for name in parts:
                gone = self.con.execute(f"DELETE FROM {name} WHERE {table.partition_by} "
                                        f"< {at(before)}").fetchone()
                self.rows_removed[table.name, "expired"] += int(gone[0]) if gone else 0
        for day in sorted(d for d in self._raw if d + DAY <= before):
            name = self._raw.pop(day)
            (n,) = self.con.execute(f"SELECT count(*) FROM {name}").fetchone() or (0,)
            self.con.execute(f"DROP TABLE {name}")
            self.rows_removed[GPU_USAGE.name, "expired"] += int(n)
            self._usage_view()

    def snapshot(self, ranges: Mapping[str, tuple[datetime, datetime]],
                 directory: Path) -> None:
        """Copy the rows of each table named in ``ranges`` whose event time is in its range
        to ``<table>.parquet`` in ``directory`` (what ``analytics.store.ParquetStore``
        reads). On a cursor of its own, so it may run in a thread while cycles go on."""
        directory.mkdir(parents=True, exist_ok=True)
        with self.lock:
            cur = self.con.cursor()
            self._readers += 1
        try:
            cur.execute("SET TimeZone = 'UTC'")
            for name, (start, end) in ranges.items():
                col = BY_NAME[name].partition_by
                part = directory / f"{name}.parquet.part"
                cur.execute(f"COPY (SELECT * FROM {name} WHERE {col} >= {literal(start)} "
                            f"AND {col} < {literal(end)}) TO {duck.quote(str(part))} "
                            "(FORMAT parquet)")
                part.replace(directory / f"{name}.parquet")
        finally:
            with self.lock:
                cur.close()
                self._readers -= 1

    def team_month_costs(self) -> dict[tuple[str, str], float]:
        """Each team's cost of allocated GPUs by UTC calendar month (``"2026-11"``), over
        the latest two months the warehouse holds: a restarted exporter's month-to-date
        spend goes on from them."""
        c = literal(self.cluster)
        return {(month, team): float(cost) for month, team, cost in self.con.execute(f"""
            SELECT strftime(time, '%Y-%m') AS month, COALESCE(team, ''), SUM(cost_usd)
            FROM gpu_usage
            WHERE cluster = {c} AND state = 'allocated' AND cost_usd IS NOT NULL
              AND time >= (SELECT date_trunc('month', max(time)) - INTERVAL 1 MONTH
                           FROM gpu_usage WHERE cluster = {c})
            GROUP BY ALL""").fetchall()}

    def load_state(self) -> tuple[dict[str, dict[str, DeviceIdentity]],
                                  dict[tuple[str, str], tuple[float, str, str]]]:
        """The device inventory and open incidents the last run saved."""
        inventory: dict[str, dict[str, DeviceIdentity]] = {}
        for node, device_id, uuid, index, mig in self.con.execute(
                "SELECT node, device_id, gpu_uuid, gpu_index, mig_profile FROM "
                f"device_inventory WHERE cluster = {literal(self.cluster)} "
                "ORDER BY node, device_id").fetchall():
            inventory.setdefault(node, {})[device_id] = DeviceIdentity(uuid, device_id, index,
                                                                       mig)
        incidents = {(uuid, reason): (start, node, pool) for uuid, reason, start, node, pool
                     in self.con.execute(
                         "SELECT gpu_uuid, reason, start_time, node, node_pool FROM "
                         f"open_incidents WHERE cluster = {literal(self.cluster)}").fetchall()}
        self._saved = (inventory, incidents)
        return inventory, dict(incidents)

    @_locked
    def save_state(self, inventory: Mapping[str, Mapping[str, DeviceIdentity]],
                   incidents: Incidents) -> None:
        """Replace the saved inventory and open incidents, when they changed (one
        transaction, right away: it must hold at a SIGKILL)."""
        if self._saved == (inventory, incidents):
            return
        devices = [(self.cluster, node, d.device_id, d.gpu_uuid, d.gpu_index, d.mig_profile)
                   for node, devs in inventory.items() for d in devs.values()]
        open_ = [(self.cluster, uuid, reason, float(start), node, pool)
                 for (uuid, reason), (start, node, pool) in incidents.items()]
        cur = self.con.cursor()
        try:
            cur.execute("BEGIN")
            for table, rows, types in (("device_inventory", devices, _INVENTORY_TYPES),
                                       ("open_incidents", open_, _INCIDENTS_TYPES)):
                cur.execute(f"DELETE FROM {table} WHERE cluster = {literal(self.cluster)}")
                if rows:
                    with self._csv(rows, types) as source:
                        cur.execute(f"INSERT INTO {table} SELECT * FROM {source}")
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        finally:
            cur.close()
        self._saved = ({n: dict(d) for n, d in inventory.items()}, dict(incidents))

    def report_done(self, week: str) -> bool:
        """Whether the scheduled report of ``week`` (``2026-W47``) has been made."""
        with self.lock, self.con.cursor() as cur:
            return cur.execute("SELECT count(*) FROM report_runs WHERE week = "
                               + literal(week)).fetchone() != (0,)

    def record_report(self, week: str, finished: float, directory: Path) -> None:
        with self.lock, self.con.cursor() as cur:
            cur.execute(f"INSERT OR REPLACE INTO report_runs VALUES ({literal(week)}, "
                        f"{at(finished)}, {literal(str(directory))})")

    @_locked
    def flush(self, now: float, partial: bool = False) -> None:
        """Write every interval that ended by ``now``; the rest stays staged in the file, so
        an exporter restarted within an interval completes it instead of losing it.
        ``partial`` also writes unfinished intervals (the end of a finite run, the demo)."""
        self._next_flush = now - now % self.flush_interval + self.flush_interval
        self._stage()
        self._write_usage(math.inf if partial else now)
        if self._pods:
            self._append(GPU_PODS, "SELECT * FROM _batch", batch=self._pods.values())
            self._pods.clear()
        if self._events:
            self._append(AVAILABILITY_EVENTS, "SELECT * FROM _batch", batch=self._events)
            self._events.clear()
        if self._quotas:
            self._append(KUEUE_QUOTAS, "SELECT * FROM _batch", batch=self._quotas.values())
            self._quotas.clear()
        if self._workloads:
            self._append(KUEUE_WORKLOADS, "SELECT * FROM _batch",
                         batch=self._workloads.values())
            self._workloads.clear()

    def _write_usage(self, now: float) -> None:
        """Aggregate every staged interval that ended by ``now`` into its day's table, a few
        intervals at a time (one transaction each, ``WRITE_BYTES`` of files at most), then
        delete their files. A write is checked
        against the rows of the intervals it writes, in that table (and in ``HOURLY``,
        which holds a file's rows from before the daily tables), so files a kill left
        after their rows were written add nothing."""
        complete = {win: files for win, files in self._staged().items()
                    if win + self.interval <= now}
        for day, wins in _write_groups(complete):
            files = [str(f) for win in wins for f in complete[win]]
            try:
                self._write_day(day, wins, files)
            except _NOT_THE_FILE:
                raise
            except duckdb.Error:  # a damaged file? set it aside, and write the others
                bad = self._unusable(files)
                if not bad:
                    raise
                for f, reason, error in bad:
                    self._quarantine(Path(f), reason, error)
                files = [f for f in files if f not in {b[0] for b in bad}]
                if files:
                    self._write_day(day, wins, files)
            for f in files:
                os.unlink(f)

    def _write_day(self, day: float, wins: Sequence[float], files: Sequence[str]) -> None:
        """The rows of the staged ``files``, of intervals ``wins`` of one UTC ``day``, into
        its table (one transaction; ``wins`` in order)."""
        table = self._raw_table(day)
        source = (f"read_parquet([{', '.join(map(duck.quote, files))}], "
                  "union_by_name = true)")  # a file staged by an earlier release
        between = f"time BETWEEN {at(wins[0])} AND {at(wins[-1])}"
        self._append(GPU_USAGE, _AGGREGATE.format(
                         cluster=literal(self.cluster),
                         interval=literal(float(self.interval)), source=source),
                     into=table, existing=(
                         f"(SELECT id FROM {table} WHERE {between}" + (
                             f" UNION ALL SELECT id FROM {HOURLY} WHERE interval_seconds "
                             f"< 3600 AND {between}" if self._hourly_has_raw else "") + ")"))

    def _append(self, table: Table, source: str,
                batch: Iterable[Mapping[str, object]] | None = None, into: str | None = None,
                existing: str | None = None) -> None:
        """Insert the rows of ``source`` (a query, over ``batch``, rows of ``table``, as
        ``_batch``) into ``into`` (default: the table) but those whose id is among
        ``existing`` (a query of ids that holds every row a new one may repeat; default:
        the table's rows with an id of the batch); the new ones also go to the outbox, as
        rows of ``table``. One transaction."""
        into = into or table.name
        existing = existing or f"(SELECT id FROM {into} WHERE id IN (SELECT id FROM _batch))"
        insert = f"SELECT s.* FROM ({source}) s ANTI JOIN {existing} o ON s.id = o.id"
        self.con.execute("BEGIN")
        try:
            if batch is not None:
                names = table.names
                with self._csv(([row[n] for n in names] for row in batch),
                               table.duckdb_types) as rows:
                    self.con.execute(f"CREATE TEMP TABLE _batch AS SELECT * FROM {rows}")
            if self.with_outbox:  # the new rows themselves, for the outbox
                self.con.execute(f"CREATE TEMP TABLE _fresh AS SELECT * FROM {into} LIMIT 0")
                self.con.execute(f"INSERT INTO _fresh {insert}")
                row = self.con.execute(f"INSERT INTO {into} SELECT * FROM _fresh").fetchone()
                added = int(row[0]) if row else 0
                if added:
                    self.con.execute(outbox.add_sql(table.name, "_fresh", table.partition_by))
            else:
                row = self.con.execute(f"INSERT INTO {into} {insert}").fetchone()
                added = int(row[0]) if row else 0
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        finally:
            for name in ("_batch", "_fresh"):
                with contextlib.suppress(duckdb.Error):
                    self.con.execute(f"DROP TABLE IF EXISTS temp.{name}")
        self.rows_written[table.name] += added

    def open_outbox(self) -> outbox.Outbox:
        """The outbox, for a sender in another thread."""
        return outbox.Outbox(lambda: self.con, self.lock)

    @_locked
    def close(self) -> None:
        self.con.close()
        if str(self.path) == ":memory:":
            shutil.rmtree(self._staging, ignore_errors=True)

    @_locked
    def forget_pod(self, uid: str) -> None:
        """Drop the change-tracking of a pod that is gone for good."""
        self._pod_signatures.pop(uid, None)
        self._pod_models.pop(uid, None)
