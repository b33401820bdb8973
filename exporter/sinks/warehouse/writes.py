"""Rows into the file's tables, each new one also into the outbox when it is on: a flush's
staged intervals aggregated into their day's table, a few at a time, and the batches of the
other tables. A write skips the ids already there, so a restart or a retried flush never
double-counts. Batches reach DuckDB as a file that a statement reads, written next to the
database and deleted once read (``csv_batch``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import duckdb

from exporter import duck
from exporter.sinks import outbox
from exporter.sinks.batch_files import at, literal, read_csv, write_csv
from exporter.sinks.schema import FIELDS, GPU_USAGE, Table
from exporter.sinks.warehouse.staging import NOT_THE_FILE, Staging, write_groups
from exporter.sinks.warehouse.tables import HOURLY, UsageTables

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
       nullif(any_value(allocation), ''), sum(energy), max(energy_basis), sum(co2e),
       sum(idle_energy)
FROM {{source}}
GROUP BY win, device_id, pod_uid, state
"""

@contextlib.contextmanager
def _scratch(database: Path, suffix: str) -> Iterator[str]:
    """The path of a new file next to the database, deleted on leaving."""
    directory = database.parent if str(database) != ":memory:" else None
    fd, name = tempfile.mkstemp(prefix=f".{database.name}.", suffix=suffix, dir=directory)
    os.close(fd)
    try:
        yield name
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


@contextlib.contextmanager
def csv_batch(database: Path, rows: Iterable[Sequence[object]], types: Mapping[str, str]
              ) -> Iterator[str]:
    """``rows`` (in the order of ``types``' columns) as a relation to read in SQL, from a
    file next to ``database``."""
    with _scratch(database, ".csv") as name:
        write_csv(name, rows)
        yield read_csv(name, types)


class Writer:
    """Writes the staged intervals and the other tables' batches, counting the rows
    written by table."""

    def __init__(self, database: Path, cluster: str, interval: float, with_outbox: bool,
                 tables: UsageTables, staging: Staging, rows_written: dict[str, int],
                 connection: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        self.database = database
        self.cluster = cluster
        self.interval = interval
        self.with_outbox = with_outbox
        """Also queue every new row for BigQuery (see ``exporter.sinks.outbox``)."""
        self.tables = tables
        self.staging = staging
        self.rows_written = rows_written
        self._connection = connection

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self._connection()

    def usage(self, now: float) -> None:
        """Aggregate every staged interval that ended by ``now`` into its day's table, a few
        intervals at a time (one transaction each, ``WRITE_BYTES`` of files at most), then
        delete their files. A write is checked
        against the rows of the intervals it writes, in that table (and in ``HOURLY``,
        which holds a file's rows from before the daily tables), so files a kill left
        after their rows were written add nothing."""
        complete = {win: files for win, files in self.staging.staged().items()
                    if win + self.interval <= now}
        for day, wins in write_groups(complete):
            files = [str(f) for win in wins for f in complete[win]]
            try:
                self._write_day(day, wins, files)
            except NOT_THE_FILE:
                raise
            except duckdb.Error:  # a damaged file? set it aside, and write the others
                bad = self.staging.unusable(files)
                if not bad:
                    raise
                for f, reason, error in bad:
                    self.staging.quarantine.put(Path(f), reason, error)
                files = [f for f in files if f not in {b[0] for b in bad}]
                if files:
                    self._write_day(day, wins, files)
            for f in files:
                os.unlink(f)

    def _write_day(self, day: float, wins: Sequence[float], files: Sequence[str]) -> None:
        """The rows of the staged ``files``, of intervals ``wins`` of one UTC ``day``, into
        its table (one transaction; ``wins`` in order)."""
        table = self.tables.table(day)
        source = (f"read_parquet([{', '.join(map(duck.quote, files))}], "
                  "union_by_name = true)")  # a file staged by an earlier release
        between = f"time BETWEEN {at(wins[0])} AND {at(wins[-1])}"
        self.append(GPU_USAGE, _AGGREGATE.format(
                        cluster=literal(self.cluster),
                        interval=literal(float(self.interval)), source=source),
                    into=table, existing=(
                        f"(SELECT id FROM {table} WHERE {between}" + (
                            f" UNION ALL SELECT id FROM {HOURLY} WHERE interval_seconds "
                            f"< 3600 AND {between}" if self.tables.hourly_has_raw else "")
                        + ")"))

    def append(self, table: Table, source: str,
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
                with csv_batch(self.database, ([row[n] for n in names] for row in batch),
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
