"""Where a report keeps its per-pod rows: a DuckDB database of its own, in a temporary
directory that goes with it.

The warehouse aggregates a week to one row per pod; a fleet runs hundreds of thousands of
pods a week. Those rows stream from the store in batches into the workspace, and the
per-workload tables are computed there in SQL, so Python holds summaries, the rows a
report shows and one batch at a time, never every pod. The workspace keeps its tables on
disk (compressed) and at most ``MEMORY_LIMIT`` of them in memory.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from exporter import duck

MEMORY_LIMIT = "128MB"
"""The workspace's share of a report's memory."""
BATCH = 8192
"""Rows per chunk streamed to a file."""


class Workspace:
    """A temporary DuckDB database with the report's per-pod and per-workload tables."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="report-workspace-")
        self._held: list[duckdb.DuckDBPyConnection] = []
        self._names = itertools.count()
        weakref.finalize(self, Workspace._cleanup, self._held, self._dir)

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The database, opened when first used (again after ``close``)."""
        if not self._held:
            con = duck.connect(Path(self._dir) / "workspace.duckdb", memory_limit=MEMORY_LIMIT)
            con.execute("SET enable_progress_bar = false")
            con.execute(f"SET temp_directory = {duck.quote(self._dir)}")
            con.execute("SET preserve_insertion_order = true")
            self._held.append(con)
        return self._held[0]

    def close(self) -> None:
        """Close the database, keeping its tables: a report waiting to be written holds no
        memory for them. It opens again when read."""
        while self._held:
            self._held.pop().close()

    @staticmethod
    def _cleanup(held: list[duckdb.DuckDBPyConnection], directory: str) -> None:
        for con in held:
            con.close()
        shutil.rmtree(directory, ignore_errors=True)

    def load(self, table: str, batches: Iterable[pa.RecordBatch],
             transform: Callable[[pa.Table], pa.Table] = lambda t: t) -> None:
        """Create ``table`` from the batches, each transformed on its way in."""
        created = False
        for batch in batches:
            t = transform(pa.Table.from_batches([batch]))
            self.con.register("_batch", t)
            if created:
                self.con.execute(f"INSERT INTO {table} SELECT * FROM _batch")
            else:
                self.con.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT * FROM _batch")
                created = True
            self.con.unregister("_batch")
        if not created:
            raise ValueError(f"no schema for {table}: give at least one (empty) batch")

    def put(self, table: str, frame: pd.DataFrame) -> None:
        """Create ``table`` from a (small) frame."""
        t = pa.Table.from_pandas(frame, preserve_index=False)
        self.load(table, t.to_batches() or [pa.RecordBatch.from_pylist([], schema=t.schema)])

    def frame(self, sql: str, params: dict[str, Any] | None = None) -> pd.DataFrame:
        return self.con.execute(sql, params or {}).to_arrow_table().to_pandas()

    def chunks(self, sql: str, rows: int = BATCH) -> Iterator[pd.DataFrame]:
        """The result of ``sql`` in frames of up to ``rows`` rows."""
        reader = self.con.cursor().execute(sql).to_arrow_reader(rows)
        for batch in reader:
            if batch.num_rows:
                yield batch.to_pandas()

    def table(self, sql: str, finish: Callable[[pd.DataFrame], pd.DataFrame] | None = None
              ) -> Table:
        """A report table: the rows of ``sql``, in its order, materialised here."""
        name = f"_t{next(self._names)}"
        self.con.execute(f"CREATE TABLE {name} AS {sql}")
        return Table(self, name, finish)


class Table:
    """A report table kept in the workspace. The report reads its head and its sums; its
    files are written a batch at a time (``chunks``)."""

    def __init__(self, ws: Workspace, name: str,
                 finish: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
                 where: str = "", order: str = "", drop: tuple[str, ...] = ()) -> None:
        self.ws, self.name, self._finish = ws, name, finish
        self._where, self._order, self._drop = where, order, drop
        self._len: int | None = None

    def _sql(self, limit: int | None = None) -> str:
        where = f" WHERE {self._where}" if self._where else ""
        order = f" ORDER BY {self._order}" if self._order else ""  # else as stored
        tail = f" LIMIT {int(limit)}" if limit is not None else ""
        return f"SELECT * FROM {self.name}{where}{order}{tail}"

    def _done(self, f: pd.DataFrame) -> pd.DataFrame:
        f = self._finish(f) if self._finish else f
        return f.drop(columns=list(self._drop)) if self._drop else f

    def __len__(self) -> int:
        if self._len is None:
            where = f" WHERE {self._where}" if self._where else ""
            row = self.ws.con.execute(f"SELECT count(*) FROM {self.name}{where}").fetchone()
            self._len = int(row[0]) if row else 0
        return self._len

    @property
    def empty(self) -> bool:
        return len(self) == 0

    @property
    def columns(self) -> list[str]:
        return [str(c) for c in self.head(0).columns]

    def head(self, n: int = 5) -> pd.DataFrame:
        return self._done(self.ws.frame(self._sql(n)))

    def frame(self) -> pd.DataFrame:
        """Every row (for small tables and tests)."""
        return self._done(self.ws.frame(self._sql()))

    def chunks(self, rows: int = BATCH) -> Iterator[pd.DataFrame]:
        for f in self.ws.chunks(self._sql(), rows):
            yield self._done(f)

    def __getattr__(self, column: str) -> pd.Series:
        """A column, read whole, as a frame's attribute reads it."""
        if column.startswith("_") or column in ("ws", "name"):
            raise AttributeError(column)
        stored = [d[0] for d in self.ws.con.execute(
            f"SELECT * FROM {self.name} LIMIT 0").description]
        if column in stored and column not in self._drop:
            where = f" WHERE {self._where}" if self._where else ""
            order = f" ORDER BY {self._order}" if self._order else ""
            return self.ws.frame(f'SELECT "{column}" FROM {self.name}{where}{order}')[column]
        if column in self.columns:
            return self.frame()[column]
        raise AttributeError(f"no column {column!r} in the table")

    def sum(self, column: str) -> float:
        where = f" WHERE {self._where}" if self._where else ""
        row = self.ws.con.execute(
            f"SELECT COALESCE(SUM({column}), 0) FROM {self.name}{where}").fetchone()
        return float(row[0]) if row else 0.0

    def view(self, where: str = "", order: str = "", drop: tuple[str, ...] = ()
             ) -> Table:
        """The rows that match ``where``, in another order, less some columns."""
        return Table(self.ws, self.name, self._finish, where, order, drop)
