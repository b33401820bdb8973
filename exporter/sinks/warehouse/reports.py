"""What the scheduled report reads of the warehouse: the weeks whose report is made
(``report_runs``) and a week's rows copied to Parquet (``snapshot``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

import duckdb

from exporter import duck
from exporter.sinks.batch_files import at, literal
from exporter.sinks.schema import BY_NAME

REPORT_RUNS_DDL = """CREATE TABLE IF NOT EXISTS report_runs (
    week VARCHAR PRIMARY KEY, finished TIMESTAMPTZ NOT NULL, directory VARCHAR)"""
"""Weeks whose scheduled report has been written (and mailed): each is reported once."""


def snapshot(cur: duckdb.DuckDBPyConnection, ranges: Mapping[str, tuple[datetime, datetime]],
             directory: Path) -> None:
    """Copy, on the cursor ``cur``, the rows of each table named in ``ranges`` whose event
    time is in its range to ``<table>.parquet`` in ``directory``."""
    cur.execute("SET TimeZone = 'UTC'")
    for name, (start, end) in ranges.items():
        col = BY_NAME[name].partition_by
        part = directory / f"{name}.parquet.part"
        cur.execute(f"COPY (SELECT * FROM {name} WHERE {col} >= {literal(start)} "
                    f"AND {col} < {literal(end)}) TO {duck.quote(str(part))} "
                    "(FORMAT parquet)")
        part.replace(directory / f"{name}.parquet")


class ReportRuns:
    """The weeks whose scheduled report is made, each read and written on a cursor of its
    own, holding ``lock``."""

    def __init__(self, connection: Callable[[], duckdb.DuckDBPyConnection],
                 lock: threading.RLock) -> None:
        self._connection = connection
        self._lock = lock
        connection().execute(REPORT_RUNS_DDL)

    def done(self, week: str) -> bool:
        """Whether the scheduled report of ``week`` (``2026-W47``) has been made."""
        with self._lock, self._connection().cursor() as cur:
            return cur.execute("SELECT count(*) FROM report_runs WHERE week = "
                               + literal(week)).fetchone() != (0,)

    def record(self, week: str, finished: float, directory: Path) -> None:
        with self._lock, self._connection().cursor() as cur:
            cur.execute(f"INSERT OR REPLACE INTO report_runs VALUES ({literal(week)}, "
                        f"{at(finished)}, {literal(str(directory))})")
