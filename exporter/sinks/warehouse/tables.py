"""The file's ``gpu_usage``: one table per UTC day (``gpu_usage_raw_20261109``) and one of
hourly rows (``HOURLY``), and the view over them all; the tables of a file, the view of
each pod's latest row."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import duckdb

from exporter.sinks.schema import GPU_USAGE

HOUR = 3600.0
DAY = 86400.0
HOURLY = "gpu_usage_hourly"
"""The rolled-up ``gpu_usage`` rows (and a file's rows from before the daily tables)."""
RAW_PREFIX = "gpu_usage_raw_"

CURRENT_PODS_VIEW = """CREATE OR REPLACE VIEW gpu_pods_current AS
SELECT * FROM gpu_pods
QUALIFY row_number() OVER (PARTITION BY cluster, pod_uid ORDER BY updated DESC) = 1"""
"""Each pod's latest row: its current (or final) state."""


def raw_table(day: float) -> str:
    """The table of the ``gpu_usage`` rows at the warehouse interval of the UTC day that
    starts at ``day``: ``gpu_usage_raw_20261109``."""
    return RAW_PREFIX + datetime.fromtimestamp(day, UTC).strftime("%Y%m%d")


def day_of(table: str) -> float:
    return datetime.strptime(table.removeprefix(RAW_PREFIX), "%Y%m%d").replace(
        tzinfo=UTC).timestamp()


def usage_ddl(name: str) -> str:
    return GPU_USAGE.duckdb_ddl().replace(f" {GPU_USAGE.name} (", f" {name} (", 1)


def base_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {name for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND NOT temporary").fetchall()}


class UsageTables:
    """The tables ``gpu_usage`` is a view over: ``HOURLY`` and a table per day, each made
    when its day is first written."""

    def __init__(self, connection: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        self._connection = connection
        con = connection()
        tables = base_tables(con)
        con.execute(usage_ddl(HOURLY))
        self.raw: dict[float, str] = {day_of(t): t for t in sorted(tables)
                                      if t.startswith(RAW_PREFIX)}
        """UTC day -> the table of its rows at the warehouse interval."""
        self.view()
        self.hourly_has_raw = False
        """Whether ``HOURLY`` still holds rows at the warehouse interval (a file from before
        the daily tables): rolled up like a day's, and checked by writes."""
        self.look_at_hourly()

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self._connection()

    def look_at_hourly(self) -> None:
        """Find out again whether ``HOURLY`` holds rows at the warehouse interval."""
        (self.hourly_has_raw,) = self.con.execute(
            f"SELECT EXISTS (SELECT 1 FROM {HOURLY} WHERE interval_seconds < 3600)"
        ).fetchone() or (False,)

    def view(self) -> None:
        """``gpu_usage``: the hourly rows and every day's, as one relation."""
        parts = [HOURLY, *(self.raw[d] for d in sorted(self.raw))]
        self.con.execute(f"CREATE OR REPLACE VIEW {GPU_USAGE.name} AS "
                         + " UNION ALL ".join(f"SELECT * FROM {t}" for t in parts))

    def table(self, day: float) -> str:
        """The day's table, made (and added to the view) when it is first written."""
        if day not in self.raw:
            self.con.execute(usage_ddl(raw_table(day)))
            self.raw[day] = raw_table(day)
            self.view()
        return self.raw[day]

    def drop(self, day: float) -> str:
        """Drop the day's table, and take it out of the view; its name."""
        name = self.raw.pop(day)
        self.con.execute(f"DROP TABLE {name}")
        self.view()
        return name
