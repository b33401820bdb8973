"""Rows on their way to BigQuery, kept in the warehouse's DuckDB file.

The warehouse adds a table's new rows here in the same transaction that writes them
locally, so nothing written locally can miss BigQuery and nothing is sent that was not
written: the outbox survives restarts and SIGKILL with the file. The sender takes the
oldest rows of a table in order, and deletes them once BigQuery has answered for them.
Its size is bounded: past ``max_bytes`` the oldest rows are dropped, and the drop counted.

Statements take no bound parameters (the few numbers are written into them): DuckDB's
Python client imports pandas to bind parameters, which the exporter does without.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

import duckdb

DDL = (
    "CREATE SEQUENCE IF NOT EXISTS outbox_seq",
    """CREATE TABLE IF NOT EXISTS outbox (
        seq BIGINT PRIMARY KEY DEFAULT nextval('outbox_seq'),
        tbl VARCHAR NOT NULL,       -- the table the row belongs to
        id VARCHAR NOT NULL,        -- its deterministic id
        part TIMESTAMPTZ NOT NULL,  -- its partitioning time
        row VARCHAR NOT NULL        -- the row, as JSON
    )""",
)


def add_sql(table: str, relation: str, partition_by: str) -> str:
    """SQL that puts every row of ``relation`` (rows just written to ``table``) in the
    outbox, in the order they are to be sent. Identifiers come from the schema."""
    return (f"INSERT INTO outbox (tbl, id, part, row) SELECT '{table}', id, {partition_by}, "
            f"to_json({relation}) FROM {relation} ORDER BY {partition_by}, id")


@dataclass(frozen=True, slots=True)
class Batch:
    table: str
    seqs: list[int]
    ids: list[str]
    rows: list[dict[str, object]]
    first: datetime
    last: datetime
    """The span of the rows' partitioning times."""


class Outbox:
    """The sender's view of the outbox, for a thread of its own: each call takes a cursor
    of the warehouse's connection of the moment (the warehouse reopens its file hourly)
    while holding its lock."""

    def __init__(self, connection: Callable[[], duckdb.DuckDBPyConnection],
                 lock: threading.RLock) -> None:
        self._connection = connection
        self._lock = lock

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._lock, self._connection().cursor() as cur:
            yield cur

    def oldest(self, limit: int) -> Batch | None:
        """The oldest rows of the table whose turn it is, at most ``limit``."""
        with self._cursor() as cur:
            found = cur.execute(
                "SELECT seq, tbl, id, part, row FROM outbox WHERE tbl = "
                f"(SELECT tbl FROM outbox ORDER BY seq LIMIT 1) ORDER BY seq LIMIT {int(limit)}"
            ).fetchall()
        if not found:
            return None
        parts = [r[3] for r in found]
        return Batch(found[0][1], [r[0] for r in found], [r[2] for r in found],
                     [json.loads(r[4]) for r in found], min(parts), max(parts))

    def remove(self, seqs: list[int]) -> None:
        if not seqs:
            return
        with self._cursor() as cur:
            cur.execute("DELETE FROM outbox WHERE seq IN (SELECT unnest([" +
                        ", ".join(str(int(s)) for s in seqs) + "]::BIGINT[]))")

    def size(self) -> tuple[int, int]:
        """(rows, bytes) waiting."""
        with self._cursor() as cur:
            rows, size = cur.execute("SELECT count(*), coalesce(sum(strlen(row)), 0) "
                                     "FROM outbox").fetchone() or (0, 0)
        return int(rows), int(size)

    def trim(self, max_bytes: int) -> dict[str, int]:
        """Drop the oldest rows until at most ``max_bytes`` wait; returns the dropped rows
        per table."""
        with self._cursor() as cur:
            dropped = cur.execute(
                f"""DELETE FROM outbox WHERE seq <= (
                       SELECT max(seq) FROM (
                           SELECT seq, sum(strlen(row)) OVER (ORDER BY seq DESC) AS newer
                           FROM outbox) WHERE newer > {int(max_bytes)})
                   RETURNING tbl""").fetchall()
        out: dict[str, int] = defaultdict(int)
        for (table,) in dropped:
            out[table] += 1
        return dict(out)

    def close(self) -> None:
        """Nothing to release: each call's cursor is closed with it."""
