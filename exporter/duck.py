"""Opening a DuckDB database the same way everywhere: nothing downloaded, times in UTC.

DuckDB installs and loads extensions on first use, downloading them into ``~/.duckdb``. The
product uses only what the ``duckdb`` wheel links in (ICU for time zones, Parquet, JSON), so
autoinstall is off: a query that would need anything else fails instead of reaching out to
the network or writing into a read-only home. The time zone is set after connecting, once
the linked-in ICU is loaded (in the connect config it would be applied before that).

A file held by another process (the running exporter) cannot be opened, even read-only;
``WarehouseLocked`` says so in one line, with the process that holds it.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from exporter.errors import ConfigError


class WarehouseLocked(ConfigError):
    """The DuckDB file is open in another process."""

    def __init__(self, path: Path | str, holder: str) -> None:
        self.path = Path(path)
        self.holder = holder
        super().__init__(f"the warehouse {path} is open in another process ({holder}, "
                         "normally the running exporter): DuckDB lets only one process "
                         "open it")


def quote(text: str) -> str:
    """A SQL string literal, for the few statements that take no parameters (a view over a
    file, ``COPY ... TO``)."""
    return "'" + text.replace("'", "''") + "'"


def connect(path: Path | str = ":memory:", *, read_only: bool = False,
            memory_limit: str | None = None, threads: int | None = None
            ) -> duckdb.DuckDBPyConnection:
    """A connection with autoinstall off and ``TimeZone`` UTC."""
    config: dict[str, str | bool | int | float | list[str]] = {
        "autoinstall_known_extensions": False}
    if memory_limit is not None:
        config["memory_limit"] = memory_limit
    if threads is not None:
        config["threads"] = threads
    try:
        con = duckdb.connect(str(path), read_only=read_only, config=config)
    except duckdb.IOException as exc:
        if "Could not set lock" in str(exc):
            pid = re.search(r"PID (\d+)", str(exc))
            raise WarehouseLocked(path, f"PID {pid.group(1)}" if pid else "unknown PID") \
                from None
        raise
    con.execute("SET TimeZone = 'UTC'")
    return con


def held_columns(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """The columns of each table and view of the connection's file (schema ``main``), in
    their order."""
    held: dict[str, list[str]] = {}
    for table, column in con.execute(
            "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = "
            "current_database() AND schema_name = 'main' ORDER BY table_name, column_index"
    ).fetchall():
        held.setdefault(table, []).append(column)
    return held
