"""Where the analytics read from: the local DuckDB warehouse or BigQuery.

Queries are written once, in BigQuery's dialect (GoogleSQL), with named ``@parameters``
for every value and ``{table}`` placeholders for the warehouse tables. On BigQuery they
run as they are, the values sent as typed query parameters; on DuckDB they are
translated by sqlglot and the values bound as ``$parameters``. Values are never
formatted into SQL. The heavy aggregation runs in the warehouse; pandas gets the result.
"""

from __future__ import annotations

import functools
import re
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import duckdb
import pandas as pd
import pyarrow as pa
import sqlglot

from exporter import duck
from exporter.sinks.schema import BY_NAME, TABLES

if TYPE_CHECKING:  # a heavy import, needed only for BigQuery
    from google.cloud import bigquery

Param = str | int | float | bool | datetime | Sequence[str] | None
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
MEMORY_LIMIT = "256MB"
"""DuckDB's share of a report's memory; it spills to disk beyond."""


class Store(Protocol):
    def query(self, sql: str, params: Mapping[str, Param] | None = None) -> pd.DataFrame:
        """Run GoogleSQL with ``{table}`` placeholders and ``@name`` parameters."""
        ...


BATCH = 32_768
"""Rows per batch when a result is streamed."""


def batches(store: Store, sql: str, params: Mapping[str, Param] | None = None,
            rows: int = BATCH) -> Iterator[pa.RecordBatch]:
    """A result as Arrow record batches, the first one possibly empty (it carries the
    schema): streamed where the store can, else the whole frame as one batch."""
    stream = getattr(store, "batches", None)
    if stream is not None:
        yield from stream(sql, params, rows)
        return
    table = pa.Table.from_pandas(store.query(sql, params), preserve_index=False)
    yield pa.RecordBatch.from_pylist([], schema=table.schema)
    yield from table.to_batches(rows)


def _used(sql: str, params: Mapping[str, Param] | None) -> dict[str, Param]:
    """The parameters the SQL names (callers may pass a common superset)."""
    return {k: v for k, v in (params or {}).items() if re.search(rf"@{k}\b", sql)}


def _tables(sql: str, qualify: Any) -> str:
    def table(m: re.Match[str]) -> str:
        if m.group(1) not in BY_NAME:
            raise ValueError(f"unknown warehouse table {m.group(1)!r}")
        return str(qualify(m.group(1)))
    return _PLACEHOLDER.sub(table, sql)


def _present_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Give a file written by an earlier release the tables and columns of this one, as
    temporary views over what it holds: a table it lacks is empty, a column it lacks is
    NULL (what the exporter adds to the file when it next opens it for writing)."""
    held = duck.held_columns(con)
    row = con.execute("SELECT current_database()").fetchone()
    catalog = str(row[0]) if row else "main"
    for table in TABLES:
        have = set(held.get(table.name, ()))
        if have >= set(table.names):
            continue
        types = table.duckdb_types
        columns = ", ".join(n if n in have else f"NULL::{types[n]} AS {n}"
                            for n in table.names)
        source = f' FROM "{catalog}".main.{table.name}' if have else " LIMIT 0"
        con.execute(f"CREATE TEMP VIEW {table.name} AS SELECT {columns}{source}")


@functools.lru_cache(maxsize=256)
def duckdb_sql(sql: str) -> str:
    """GoogleSQL with ``{table}`` placeholders as DuckDB's SQL, translated once per text (a
    report and each team's slice run the same queries; the values are bound, not in it)."""
    return sqlglot.transpile(_tables(sql, lambda name: name), read="bigquery",
                             write="duckdb")[0]


class DuckDBStore:
    """The warehouse file, read-only."""

    def __init__(self, path: Path | str | None = None,
                 con: duckdb.DuckDBPyConnection | None = None) -> None:
        """A file, opened read-only; or a cursor on a connection this process holds."""
        if con is not None:
            self.con = con.cursor()
            self.con.execute("SET TimeZone = 'UTC'")
        elif path is not None:
            self.con = duck.connect(path, read_only=True, memory_limit=MEMORY_LIMIT)
            _present_schema(self.con)
        else:
            raise ValueError("DuckDBStore needs a path or a connection")
        self.con.execute("SET enable_progress_bar = false")

    def query(self, sql: str, params: Mapping[str, Param] | None = None) -> pd.DataFrame:
        return self.con.execute(duckdb_sql(sql), _used(sql, params)).to_arrow_table() \
            .to_pandas()

    def batches(self, sql: str, params: Mapping[str, Param] | None = None,
                rows: int = BATCH) -> Iterator[pa.RecordBatch]:
        reader = self.con.execute(duckdb_sql(sql), _used(sql, params)).to_arrow_reader(rows)
        yield pa.RecordBatch.from_pylist([], schema=reader.schema)
        yield from reader

    def close(self) -> None:
        self.con.close()


class ParquetStore(DuckDBStore):
    """A week's snapshot of the warehouse: one Parquet file per table, as the running
    exporter writes it for its scheduled report (``gpu_usage.parquet``, ...), queried in an
    in-memory DuckDB. A table without a file is empty."""

    def __init__(self, directory: Path | str) -> None:
        directory = Path(directory)
        if not directory.is_dir():
            raise ValueError(f"no warehouse snapshot at {directory}")
        con = duck.connect(memory_limit=MEMORY_LIMIT)
        for name, table in BY_NAME.items():
            file = directory / f"{name}.parquet"
            if file.exists():
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet("
                            f"{duck.quote(str(file))})")
            else:
                con.execute(table.duckdb_ddl())
        super().__init__(con=con)
        self._owner = con

    def close(self) -> None:
        super().close()
        self._owner.close()


class ArrowStore(DuckDBStore):
    """Warehouse tables held in memory as Arrow tables (a replay's), queried in place by an
    in-memory DuckDB. A table not given is empty. A query that needs more than
    ``memory_limit`` spills to a temporary directory of its own (removed on ``close``),
    not to ``.tmp`` wherever the process runs."""

    def __init__(self, tables: Mapping[str, pa.Table],
                 memory_limit: str = MEMORY_LIMIT, threads: int | None = None) -> None:
        spill = tempfile.mkdtemp(prefix="gke-gpu-replay-")
        self._spill = weakref.finalize(self, shutil.rmtree, spill, ignore_errors=True)
        con = duck.connect(memory_limit=memory_limit, threads=threads)
        con.execute(f"SET temp_directory = {duck.quote(spill)}")
        super().__init__(con=con)
        self._owner = con
        self.tables: dict[str, pa.Table] = {}
        self.hold(tables)

    def hold(self, tables: Mapping[str, pa.Table]) -> None:
        """Query ``tables`` from now on, in place of those held."""
        self.tables = dict(tables)
        for name, table in BY_NAME.items():
            held = self.tables.get(name)
            if held is None:
                held = self.tables[name] = table.arrow_schema.empty_table()
            self.con.register(name, held)

    def save(self, path: Path) -> None:
        """The tables written to a DuckDB file at ``path`` (replaced)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self.con.execute(f"ATTACH {duck.quote(str(path))} AS saved")
        try:
            for name, table in BY_NAME.items():
                self.con.execute(table.duckdb_ddl().replace(
                    f"EXISTS {name} (", f"EXISTS saved.{name} (", 1))
                self.con.execute(f"INSERT INTO saved.{name} SELECT * FROM {name}")
        finally:
            self.con.execute("DETACH saved")

    def close(self) -> None:
        super().close()
        self._owner.close()
        self._spill()


def _parameter(name: str, value: Param) -> bigquery.ScalarQueryParameter | \
        bigquery.ArrayQueryParameter:
    from google.cloud import bigquery

    if isinstance(value, bool):
        return bigquery.ScalarQueryParameter(name, "BOOL", value)
    if isinstance(value, int):
        return bigquery.ScalarQueryParameter(name, "INT64", value)
    if isinstance(value, float):
        return bigquery.ScalarQueryParameter(name, "FLOAT64", value)
    if isinstance(value, datetime):
        return bigquery.ScalarQueryParameter(name, "TIMESTAMP", value)
    if isinstance(value, str) or value is None:
        return bigquery.ScalarQueryParameter(name, "STRING", value)
    return bigquery.ArrayQueryParameter(name, "STRING", list(value))


class BigQueryStore:
    """A BigQuery dataset holding the warehouse tables."""

    def __init__(self, client: bigquery.Client, dataset: str,
                 timeout: float = 300.0) -> None:
        self.client = client
        self.dataset = dataset
        """``project.dataset``, validated by the config."""
        self.timeout = timeout

    def query(self, sql: str, params: Mapping[str, Param] | None = None) -> pd.DataFrame:
        from google.cloud import bigquery

        config = bigquery.QueryJobConfig(query_parameters=[
            _parameter(k, v) for k, v in _used(sql, params).items()])
        rows = self.client.query_and_wait(
            _tables(sql, lambda name: f"`{self.dataset}.{name}`"), job_config=config,
            wait_timeout=self.timeout)
        return rows.to_arrow(create_bqstorage_client=False).to_pandas()

    def batches(self, sql: str, params: Mapping[str, Param] | None = None,
                rows: int = BATCH) -> Iterator[pa.RecordBatch]:
        from google.cloud import bigquery

        config = bigquery.QueryJobConfig(query_parameters=[
            _parameter(k, v) for k, v in _used(sql, params).items()])
        result = self.client.query_and_wait(
            _tables(sql, lambda name: f"`{self.dataset}.{name}`"), job_config=config,
            wait_timeout=self.timeout, page_size=rows)
        schema = result.to_arrow(create_bqstorage_client=False).schema \
            if result.total_rows == 0 else None
        if schema is not None:
            yield pa.RecordBatch.from_pylist([], schema=schema)
            return
        yield from result.to_arrow_iterable()
