"""The retention: ``gpu_usage`` rows older than ``raw_retention`` rolled up to one row per
hour in ``HOURLY`` (how each column combines is declared in ``schema``), each day's table
dropped once it is rolled up, and rows older than ``retention`` deleted."""

from __future__ import annotations

import time
from collections.abc import Callable

import duckdb

from exporter.sinks.batch_files import at
from exporter.sinks.schema import GPU_USAGE, TABLES, Column
from exporter.sinks.warehouse.tables import DAY, HOUR, HOURLY, UsageTables

MAINTENANCE_INTERVAL = HOUR
"""How often old rows are rolled up and expired rows deleted."""
ROLLUP_BUDGET_SECONDS = 2.0
"""Longest a maintenance pass rolls up for; a backlog (a file older than the retention
when it is first set) is worked off over the following flushes."""


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


class Retention:
    """Rolls up and expires the rows of the file's tables."""

    def __init__(self, tables: UsageTables, rows_removed: dict[tuple[str, str], int],
                 connection: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        self.tables = tables
        self.rows_removed = rows_removed
        """Rows taken out, by table and why (rolled_up, expired)."""
        self._connection = connection

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self._connection()

    def roll_up(self, before: float, budget_seconds: float = ROLLUP_BUDGET_SECONDS) -> bool:
        """Replace the ``gpu_usage`` rows that started before ``before`` (an hour boundary
        at most) by one row per hour, device, pod and state in ``HOURLY``, an hour at a time
        (a bounded transaction in DuckDB's small memory) for at most ``budget_seconds``; a
        day's table is dropped once every row of it is rolled up. True when no such row is
        left. Local only: BigQuery keeps its rows as they were sent (its retention is the
        dataset's partition expiration)."""
        before -= before % HOUR
        deadline = time.monotonic() + budget_seconds
        sources = [*([(None, HOURLY)] if self.tables.hourly_has_raw else []),
                   *sorted((d, t) for d, t in self.tables.raw.items() if d < before)]
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
                self.tables.look_at_hourly()
            elif day + DAY <= before:
                self.tables.drop(day)
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

    def expire(self, before: float) -> None:
        """Delete every row whose event time is before ``before``; a day's table wholly
        before it is dropped."""
        raw = self.tables.raw
        for table in TABLES:
            parts = [table.name] if table is not GPU_USAGE else \
                [HOURLY, *(t for d, t in raw.items() if d < before < d + DAY)]
            for name in parts:
                gone = self.con.execute(f"DELETE FROM {name} WHERE {table.partition_by} "
                                        f"< {at(before)}").fetchone()
                self.rows_removed[table.name, "expired"] += int(gone[0]) if gone else 0
        for day in sorted(d for d in raw if d + DAY <= before):
            (n,) = self.con.execute(f"SELECT count(*) FROM {raw[day]}").fetchone() or (0,)
            self.tables.drop(day)
            self.rows_removed[GPU_USAGE.name, "expired"] += int(n)
