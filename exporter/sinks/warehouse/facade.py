"""``Warehouse``: the file as the service sees it. It owns the DuckDB connection, the lock
its writers hold and the schedule of flushes, checkpoints, reopens and maintenance, and
hands the work to the warehouse's parts."""

from __future__ import annotations

import functools
import logging
import math
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Concatenate

import duckdb

from exporter import duck
from exporter.logs import ctx
from exporter.model.compute import Admission, UsageRow
from exporter.model.pending import FreeRow, PendingRow
from exporter.model.records import ClusterQueueInfo, PodInfo, WorkloadInfo
from exporter.sinks import outbox
from exporter.sinks.outbox import DDL as OUTBOX_DDL
from exporter.sinks.schema import (
    AVAILABILITY_EVENTS,
    GPU_FREE,
    GPU_PENDING,
    GPU_PODS,
    GPU_USAGE,
    KUEUE_QUOTAS,
    KUEUE_WORKLOADS,
    TABLES,
)
from exporter.sinks.warehouse import reports
from exporter.sinks.warehouse.changes import Changes
from exporter.sinks.warehouse.migrations import migrate
from exporter.sinks.warehouse.reports import ReportRuns
from exporter.sinks.warehouse.resume import ResumeStore
from exporter.sinks.warehouse.retention import (
    MAINTENANCE_INTERVAL,
    ROLLUP_BUDGET_SECONDS,
    Retention,
)
from exporter.sinks.warehouse.staging import (
    QUARANTINE,
    Quarantine,
    Staging,
    staging_directory,
)
from exporter.sinks.warehouse.tables import CURRENT_PODS_VIEW, HOUR, UsageTables
from exporter.sinks.warehouse.waits import WaitRows
from exporter.sinks.warehouse.writes import Writer

log = logging.getLogger("exporter.sinks.warehouse")

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
        self.lock = threading.RLock()
        staged = staging_directory(path)
        self.quarantine = Quarantine(staged / QUARANTINE)
        self.quarantined = self.quarantine.counts
        """Files set aside in the quarantine folder, by why (``QUARANTINE_REASONS``)."""
        self.con = self._connect()
        self._opened: float | None = None
        """The ``clock``'s time of the first write since the file was opened."""
        self._readers = 0
        """Snapshots reading on cursors of their own (the file is not reopened under them)."""
        self.rows_written: dict[str, int] = defaultdict(int)
        self.rows_removed: dict[tuple[str, str], int] = {
            (GPU_USAGE.name, "rolled_up"): 0, (GPU_USAGE.name, "unstaged"): 0,
            **{(t.name, "expired"): 0 for t in TABLES}}
        """Rows taken out by the retention, by table and why (rolled_up, expired)."""

        def connection() -> duckdb.DuckDBPyConnection:
            return self.con
        self.staging = Staging(staged, interval, self.quarantine, self.rows_removed,
                               connection)
        self.migrated = migrate(self.con, self.staging.directory)
        """What ``MIGRATIONS`` changed as the file opened, by step."""
        self.tables = UsageTables(connection)
        for table in TABLES:
            if table is not GPU_USAGE:
                self.con.execute(table.duckdb_ddl())
        self.con.execute(CURRENT_PODS_VIEW)
        self.report_runs = ReportRuns(connection, self.lock)
        self.resume = ResumeStore(connection, self.lock, cluster, path)
        """The resume state: what a restarted exporter goes on from."""
        self.with_outbox = outbox
        """Also queue every new row for BigQuery (see ``exporter.sinks.outbox``)."""
        if outbox:
            for ddl in OUTBOX_DDL:
                self.con.execute(ddl)
        self.changes = Changes(cluster, connection)
        self.waits = WaitRows(cluster, interval)
        self.writer = Writer(path, cluster, interval, outbox, self.tables, self.staging,
                             self.rows_written, connection)
        self._retention = Retention(self.tables, self.rows_removed, connection)
        self._next_flush = 0.0
        self._next_maintenance = 0.0
        self._next_checkpoint = -math.inf

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
            self.quarantine.put(wal, "wal", lost, copy=True)
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

    @_locked
    def add_usage(self, rows: Sequence[UsageRow]) -> None:
        """Stage one cycle's rows in the file (one batch, one statement); DuckDB aggregates
        them per interval when they flush. Rows whose staging fails are kept for the next
        call, up to ``PENDING_ROWS_MAX`` (then those kept are dropped, and counted)."""
        self.staging.add(rows)
        self._stage()

    def _stage(self) -> None:
        self.staging.stage()

    @_locked
    def add_waits(self, pending: list[PendingRow], free: list[FreeRow]) -> None:
        """Sum a cycle's waits and free GPUs into their intervals (``WaitRows``)."""
        self.waits.add(pending, free)

    @_locked
    def add_pods(self, pods: Iterable[PodInfo], now: float,
                 team_of: Callable[[PodInfo], str],
                 model_of: Callable[[PodInfo], str] = lambda p: p.accelerator or "",
                 allocation_of: Callable[[PodInfo], str] = lambda p: "",
                 admission_of: Callable[[PodInfo], Admission | None] = lambda p: None) -> None:
        """Buffer a row for each GPU pod whose state changed (``Changes.add_pods``)."""
        self.changes.add_pods(pods, now, team_of, model_of, allocation_of, admission_of)

    @_locked
    def add_quotas(self, queues: Iterable[ClusterQueueInfo], now: float) -> None:
        """Buffer a row for each ClusterQueue GPU flavor whose quota changed
        (``Changes.add_quotas``)."""
        self.changes.add_quotas(queues, now)

    @_locked
    def add_workloads(self, workloads: Iterable[WorkloadInfo], now: float,
                      team_of: Callable[[WorkloadInfo], str],
                      cluster_queue_of: Callable[[WorkloadInfo], str],
                      complete: bool) -> None:
        """Buffer a row for each Kueue Workload whose state changed
        (``Changes.add_workloads``)."""
        self.changes.add_workloads(workloads, now, team_of, cluster_queue_of, complete)

    @_locked
    def finish_vanished_workloads(self, present: Collection[str], now: float) -> int:
        """End the Workloads the table still shows open that the cluster no longer lists
        (``Changes.finish_vanished_workloads``)."""
        return self.changes.finish_vanished_workloads(present, now)

    @_locked
    def finish_vanished(self, present: Collection[str], now: float) -> int:
        """End the pods the table still shows live that the cluster no longer lists
        (``Changes.finish_vanished``)."""
        return self.changes.finish_vanished(present, now)

    @_locked
    def add_event(self, node: str, pool: str, gpu_uuid: str, reason: str, start: float,
                  end: float) -> None:
        self.changes.add_event(node, pool, gpu_uuid, reason, start, end)

    @_locked
    def forget_pod(self, uid: str) -> None:
        """Drop the change-tracking of a pod that is gone for good."""
        self.changes.forget_pod(uid)

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
    def flush(self, now: float, partial: bool = False) -> None:
        """Write every interval that ended by ``now``; the rest stays staged in the file, so
        an exporter restarted within an interval completes it instead of losing it.
        ``partial`` also writes unfinished intervals (the end of a finite run, the demo)."""
        self._next_flush = now - now % self.flush_interval + self.flush_interval
        self._stage()
        self.writer.usage(math.inf if partial else now)
        changes, append = self.changes, self.writer.append
        if changes.pods:
            append(GPU_PODS, "SELECT * FROM _batch", batch=changes.pods.values())
            changes.pods.clear()
        if changes.events:
            append(AVAILABILITY_EVENTS, "SELECT * FROM _batch", batch=changes.events)
            changes.events.clear()
        if changes.quotas:
            append(KUEUE_QUOTAS, "SELECT * FROM _batch", batch=changes.quotas.values())
            changes.quotas.clear()
        if changes.workloads:
            append(KUEUE_WORKLOADS, "SELECT * FROM _batch", batch=changes.workloads.values())
            changes.workloads.clear()
        upto = math.inf if partial else now
        pending, free = self.waits.ready(upto)
        if pending:
            append(GPU_PENDING, "SELECT * FROM _batch", batch=pending)
        if free:
            append(GPU_FREE, "SELECT * FROM _batch", batch=free)
        self.waits.drop(upto)

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
        """Roll the ``gpu_usage`` rows that started before ``before`` up to hourly ones, for
        at most ``budget_seconds``; True when none is left (``Retention.roll_up``)."""
        return self._retention.roll_up(before, budget_seconds)

    @_locked
    def expire(self, before: float) -> None:
        """Delete every row whose event time is before ``before`` (``Retention.expire``)."""
        self._retention.expire(before)

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
            reports.snapshot(cur, ranges, directory)
        finally:
            with self.lock:
                cur.close()
                self._readers -= 1

    def report_done(self, week: str) -> bool:
        """Whether the scheduled report of ``week`` (``2026-W47``) has been made."""
        return self.report_runs.done(week)

    def record_report(self, week: str, finished: float, directory: Path) -> None:
        self.report_runs.record(week, finished, directory)

    def open_outbox(self) -> outbox.Outbox:
        """The outbox, for a sender in another thread."""
        return outbox.Outbox(lambda: self.con, self.lock)

    @_locked
    def close(self) -> None:
        self.con.close()
        if str(self.path) == ":memory:":
            shutil.rmtree(self.staging.directory, ignore_errors=True)
