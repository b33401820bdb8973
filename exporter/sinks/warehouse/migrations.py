"""The chain that brings a file of any earlier release up to today's layout, step by step
(``MIGRATIONS``), as it opens: its keys dropped, ``gpu_usage`` split into daily and hourly
tables, the columns of later releases added, the rows staged in a table moved to staged
files and staged files given the columns staged since."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb

from exporter import duck
from exporter.sinks.batch_files import literal
from exporter.sinks.schema import BY_NAME, GPU_USAGE, TABLES, Table
from exporter.sinks.warehouse.staging import STAGE_TYPES, STAGED
from exporter.sinks.warehouse.tables import HOURLY, RAW_PREFIX, base_tables

_LEGACY_STAGING = "usage_staging"
"""The table rows were staged in before the staging files."""


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
    if GPU_USAGE.name not in base_tables(con):
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
    for name in sorted(base_tables(con)):
        table = GPU_USAGE if name == HOURLY or name.startswith(RAW_PREFIX) else \
            BY_NAME.get(name)
        if table is not None:
            added += [f"{name}.{c}" for c in _add_columns(con, name, table)]
    return added


def _staging_to_files(con: duckdb.DuckDBPyConnection, staging: Path) -> list[str]:
    """The rows a file from before the staging files staged in ``usage_staging`` moved to
    the ``staging`` directory, one file per interval, named after it alone (a move cut short
    is made again whole), and the table dropped; the files' names and the table's."""
    if _LEGACY_STAGING not in base_tables(con):
        return []
    moved = []
    for (win,) in con.execute(f"SELECT DISTINCT win FROM {_LEGACY_STAGING}").fetchall():
        name = staging / STAGED.format(win=float(win), serial="table")
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
            if not STAGE_TYPES.keys() - have:
                continue
            cols = ", ".join(c if c in have else f"CAST(NULL AS {t}) AS {c}"
                             for c, t in STAGE_TYPES.items())
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
