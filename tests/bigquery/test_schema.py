"""One schema: DuckDB, Arrow, BigQuery and docs/warehouse.md all say the same columns."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from exporter.sinks.bigquery import table_definition
from exporter.sinks.schema import TABLES, Table
from exporter.sinks.warehouse import Warehouse

WAREHOUSE_DOC = (Path(__file__).parents[2] / "docs" / "warehouse.md").read_text()


@pytest.mark.parametrize("table", TABLES, ids=[t.name for t in TABLES])
def test_every_engine_gets_the_same_columns(table: Table, tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "w.duckdb", "c", 60.0)
    described = wh.con.execute(f"DESCRIBE {table.name}").fetchall()
    assert [r[0] for r in described] == table.names
    assert table.arrow_schema.names == table.names
    bq = table_definition(table, f"p.d.{table.name}")
    assert [f.name for f in bq.schema] == table.names
    assert [f.field_type for f in bq.schema] == [c.type for c in table.columns]
    assert [f.mode == "REQUIRED" for f in bq.schema] == [c.required for c in table.columns]
    assert all(f.description for f in bq.schema)
    assert bq.time_partitioning.field == table.partition_by
    assert table.partition_by in table.names
    assert set(table.cluster_by) <= set(table.names)
    assert bq.require_partition_filter


def test_duckdb_requires_columns_and_holds_no_index(tmp_path: Path) -> None:
    """Required columns are NOT NULL; no key or index grows in DuckDB's memory with the
    tables (the warehouse skips repeated ids itself)."""
    wh = Warehouse(tmp_path / "w.duckdb", "c", 60.0)
    with pytest.raises(duckdb.ConstraintException):
        wh.con.execute("INSERT INTO availability_events VALUES (NULL, 'c', 'n', 'p', 'g', "
                       "'xid', now(), now(), 1)")
    names = [t.name for t in TABLES]
    marks = ", ".join("?" for _ in names)
    assert wh.con.execute(
        "SELECT table_name, constraint_type FROM duckdb_constraints() WHERE table_name IN "
        f"({marks}) AND constraint_type NOT IN ('NOT NULL')", names).fetchall() == []
    assert wh.con.execute("SELECT index_name FROM duckdb_indexes() WHERE table_name IN "
                          f"({marks})", names).fetchall() == []


@pytest.mark.parametrize("table", TABLES, ids=[t.name for t in TABLES])
def test_docs_list_every_column_in_order(table: Table) -> None:
    """Each table's section of docs/warehouse.md has one row per column (docs/build.py)."""
    section = WAREHOUSE_DOC.split(f"\n### `{table.name}`\n", 1)[1].split("\n### ", 1)[0]
    assert re.findall(r"^\| `(\w+)` \|", section, re.M) == table.names
