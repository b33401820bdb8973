"""The DuckDB warehouse: complete intervals appended once, whatever is written again."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from exporter import duck
from exporter.model import compute
from exporter.model.records import WorkloadInfo
from exporter.sinks.schema import TABLES
from exporter.sinks.warehouse import Warehouse
from exporter.sinks.warehouse.staging import write_groups
from tests.exporter.test_compute import node, reading, states


def rows(start: float) -> list[compute.UsageRow]:
    st = states([node()], {"n1": [reading(pods=("a",), DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.5,
                                          DCGM_FI_DEV_FB_USED=100, DCGM_FI_DEV_FB_FREE=900)]})
    return compute.usage_rows(st, start, 30.0)


def count(wh: Warehouse) -> tuple[int, float]:
    n, secs = wh.con.execute("SELECT count(*), sum(gpu_seconds) FROM gpu_usage").fetchone()  # type: ignore[misc]
    return n, secs


def test_intervals_aggregate_and_restart_does_not_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    wh = Warehouse(path, "c", interval=60.0)
    for t in (0.0, 30.0, 60.0):
        wh.add_usage(rows(t))
    wh.maybe_flush(90.0)                  # [0, 60) is complete, [60, 120) is not
    assert count(wh) == (1, 60.0)
    (util, mem) = wh.con.execute("SELECT utilization, memory_used_bytes FROM gpu_usage"
                                 ).fetchone()  # type: ignore[misc]
    assert util == 0.5 and mem == 100 * 1048576
    wh.close()
    # A restarted exporter replays [0, 60): the ids match, nothing is added.
    again = Warehouse(path, "c", interval=60.0)
    for t in (0.0, 30.0):
        again.add_usage(rows(t))
    again.flush(90.0)
    assert count(again) == (1, 60.0)
    assert again.rows_written["gpu_usage"] == 0   # its ids are there: a no-op
    again.close()


def test_restart_within_an_interval_completes_it(tmp_path: Path) -> None:
    """The first half of an interval, staged at shutdown, joins the second half."""
    path = tmp_path / "w.duckdb"
    first = Warehouse(path, "c", interval=60.0)
    first.add_usage(rows(0.0))
    first.flush(30.0)                      # shutdown mid-interval: nothing complete yet
    assert count(first) == (0, None)
    first.close()
    second = Warehouse(path, "c", interval=60.0)
    second.add_usage(rows(30.0))
    second.flush(60.0)
    assert count(second) == (1, 60.0)


def test_cost_and_pod_rows(tmp_path: Path) -> None:
    from tests.exporter.test_compute import pod

    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    wh.add_usage(rows(0.0) + rows(30.0))
    wh.add_pods([pod()], 60.0, lambda p: "team-x")
    wh.add_pods([pod()], 90.0, lambda p: "team-x")   # unchanged: not written again
    wh.maybe_flush(60.0)
    (cost,) = wh.con.execute("SELECT sum(cost_usd) FROM gpu_usage").fetchone()  # type: ignore[misc]
    assert abs(cost - 0.7 / 60) < 1e-12
    assert wh.con.execute("SELECT team, queue_wait_seconds FROM gpu_pods").fetchall() == [
        ("team-x", 60.0)]
    assert wh.rows_written["gpu_pods"] == 1


def keys(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The warehouse tables with a primary key."""
    return sorted(name for (name,) in con.execute(
        "SELECT table_name FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY' "
        "AND table_name IN ('gpu_usage', 'gpu_pods', 'availability_events')").fetchall())


def test_tables_have_no_key_and_a_rewrite_adds_nothing(tmp_path: Path) -> None:
    """No index grows with the tables; a pod state or an incident written again after a
    restart (a new ``updated``, a later ``end``) is not added twice."""
    from tests.exporter.test_compute import pod

    path = tmp_path / "w.duckdb"
    wh = Warehouse(path, "c", interval=60.0)
    wh.add_pods([pod()], 60.0, lambda p: "team-x")
    wh.add_event("n1", "pool", "GPU-1", "xid", 10.0, 50.0)
    wh.flush(60.0)
    assert keys(wh.con) == []
    wh.close()
    again = Warehouse(path, "c", interval=60.0)
    again.add_pods([pod()], 120.0, lambda p: "team-x")
    again.add_event("n1", "pool", "GPU-1", "xid", 10.0, 110.0)
    again.flush(120.0)
    assert dict(again.rows_written) == {"gpu_pods": 0, "availability_events": 0}
    assert again.con.execute("SELECT (SELECT count(*) FROM gpu_pods), "
                             "(SELECT count(*) FROM availability_events)").fetchone() == (1, 1)


def test_a_file_with_keyed_tables_is_rebuilt_without_keys(tmp_path: Path) -> None:
    """A file made when every table's ``id`` was its primary key and rows were staged in a
    table opens with its rows, the keys gone and the staged rows moved to a file, and goes
    on skipping rows written again."""
    from tests.exporter.test_compute import pod

    made = tmp_path / "made.duckdb"
    wh = Warehouse(made, "c", interval=60.0)
    for t in (0.0, 30.0, 60.0):
        wh.add_usage(rows(t))
    wh.add_pods([pod()], 60.0, lambda p: "team-x")
    wh.add_event("n1", "pool", "GPU-1", "xid", 10.0, 50.0)
    wh.flush(90.0)
    wh.close()
    old = tmp_path / "old.duckdb"   # the same rows, in the keyed layout
    con = duck.connect(old)
    con.execute(f"ATTACH {duck.quote(str(made))} AS made (READ_ONLY)")
    for table in TABLES:
        con.execute(table.duckdb_ddl().replace("(id VARCHAR NOT NULL", "(id VARCHAR PRIMARY KEY"))
        con.execute(f"INSERT INTO {table.name} SELECT * FROM made.{table.name}")
    # rows were staged in a table then: the interval [60, 120) staged, not yet written
    staged = duck.quote(f"{made}.staging/*.parquet")
    con.execute(f"CREATE TABLE usage_staging AS SELECT * FROM read_parquet({staged})")
    assert keys(con) == ["availability_events", "gpu_pods", "gpu_usage"]
    con.close()

    opened = Warehouse(old, "c", interval=60.0, outbox=True)
    assert keys(opened.con) == []
    assert "usage_staging" not in {t for (t,) in opened.con.execute("SHOW TABLES").fetchall()}
    assert [f.name for f in (tmp_path / "old.duckdb.staging").iterdir()] == [
        "usage-60.0-table.parquet"]
    assert count(opened) == (1, 60.0)
    assert opened.con.execute("SELECT pod_uid FROM gpu_pods_current").fetchall() == [("u",)]
    opened.add_usage(rows(0.0) + rows(90.0))     # [0, 60) again, [60, 120) completed
    opened.add_pods([pod()], 120.0, lambda p: "team-x")
    opened.flush(120.0)
    assert count(opened) == (2, 120.0)
    assert dict(opened.rows_written) == {"gpu_usage": 1, "gpu_pods": 0}
    assert opened.con.execute("SELECT count(*) FROM outbox").fetchone() == (1,)
    # the old table's rows are rolled up in place; then writes no longer look at it
    assert opened.tables.hourly_has_raw
    assert opened.roll_up(7200.0)
    assert not opened.tables.hourly_has_raw
    assert count(opened) == (2, 120.0)
    assert opened.con.execute("SELECT DISTINCT interval_seconds FROM gpu_usage_hourly"
                              ).fetchall() == [(3600.0,)]


DAY = 86400.0
HOUR = 3600.0
T0 = 1_794_182_400.0  # Monday 2026-11-09 00:00 UTC


def usage_tables(wh: Warehouse) -> list[str]:
    return sorted(name for (name,) in wh.con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'gpu_usage%'"
    ).fetchall())


def test_each_day_is_written_to_a_table_of_its_own(tmp_path: Path) -> None:
    """A flush across midnight writes each interval to its day's table; ``gpu_usage`` shows
    every day and the hourly rows as one; a rewrite of either day adds nothing; a day
    rolled up or past the retention is dropped whole, its rows counted."""
    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    for t in (T0 + DAY - 60, T0 + DAY - 30, T0 + DAY, T0 + DAY + 30):
        wh.add_usage(rows(t))
    wh.flush(T0 + DAY + 60)
    assert usage_tables(wh) == ["gpu_usage_hourly", "gpu_usage_raw_20261109",
                                "gpu_usage_raw_20261110"]
    assert count(wh) == (2, 120.0)
    for t in (T0 + DAY - 60, T0 + DAY):   # both intervals again, as after a restart
        wh.add_usage(rows(t))
    wh.flush(T0 + DAY + 60)
    assert count(wh) == (2, 120.0) and wh.rows_written["gpu_usage"] == 2
    assert wh.roll_up(T0 + DAY)           # the first day: rolled up, its table dropped
    assert usage_tables(wh) == ["gpu_usage_hourly", "gpu_usage_raw_20261110"]
    assert count(wh) == (2, 120.0)
    assert wh.con.execute("SELECT interval_seconds FROM gpu_usage ORDER BY time").fetchall() \
        == [(3600.0,), (60.0,)]
    wh.expire(T0 + 2 * DAY)               # both days past the retention
    assert usage_tables(wh) == ["gpu_usage_hourly"]
    assert count(wh) == (0, None)
    assert wh.rows_removed["gpu_usage", "expired"] == 2
    wh.close()


def sized(tmp_path: Path, sizes: dict[float, int]) -> dict[float, list[Path]]:
    """A staged file per interval, of the given size in bytes."""
    staged = {}
    for win, size in sizes.items():
        f = tmp_path / f"usage-{win!r}-0.parquet"
        f.write_bytes(b"x" * size)
        staged[win] = [f]
    return staged


@pytest.mark.parametrize(("sizes", "groups"), [
    ({}, []),
    ({T0: 5}, [[T0]]),
    ({T0: 4, T0 + 60: 4, T0 + 120: 4}, [[T0, T0 + 60], [T0 + 120]]),
    ({T0 + 60: 4, T0: 4, T0 + 120: 2}, [[T0, T0 + 60, T0 + 120]]),
    ({T0: 20, T0 + 60: 1}, [[T0], [T0 + 60]]),                 # one interval over the limit
    ({T0 + DAY - 60: 1, T0 + DAY: 1}, [[T0 + DAY - 60], [T0 + DAY]]),  # a day each
], ids=["nothing", "one", "by size", "in order", "one too big", "midnight"])
def test_a_flush_writes_whole_intervals_of_a_day_a_few_bytes_at_a_time(
        tmp_path: Path, sizes: dict[float, int], groups: list[list[float]]) -> None:
    got = list(write_groups(sized(tmp_path, sizes), limit=10))
    assert [wins for _, wins in got] == groups
    assert all(day == wins[0] - wins[0] % DAY for day, wins in got)


def test_a_file_gone_since_it_was_listed_counts_nothing(tmp_path: Path) -> None:
    staged = sized(tmp_path, {T0: 8, T0 + 60: 8})
    staged[T0][0].unlink()
    assert [wins for _, wins in write_groups(staged, limit=10)] == [[T0, T0 + 60]]


class Clock:
    """The warehouse's own clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_file_is_reopened_hourly_but_not_under_a_snapshot(tmp_path: Path) -> None:
    """At the first flush an hour after it was opened (on its own clock) the warehouse opens
    its file again (the memory DuckDB kept for what it wrote is let go), unless a snapshot
    is reading it; nothing written or staged is lost, and the outbox goes on with the new
    connection."""
    from exporter.sinks.outbox import Outbox

    clock = Clock()
    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0, outbox=True, clock=clock)
    box: Outbox = wh.open_outbox()
    wh.add_usage(rows(T0))
    wh.maybe_flush(T0 + 30)
    first = wh.con
    wh.add_usage(rows(T0 + 30))
    clock.now += 60
    wh.maybe_flush(T0 + 60)
    assert wh.con is first and count(wh) == (1, 60.0)
    wh._readers += 1                     # a snapshot under way
    wh.add_usage(rows(T0 + HOUR))
    clock.now += HOUR
    wh.maybe_flush(T0 + HOUR + 30)
    assert wh.con is first
    wh._readers -= 1
    wh.add_usage(rows(T0 + HOUR + 30))
    wh.maybe_flush(T0 + HOUR + 60)
    assert wh.con is not first
    assert count(wh) == (2, 120.0)
    batch = box.oldest(10)
    assert batch is not None and len(batch.rows) == 2
    box.remove(batch.seqs)
    assert box.size() == (0, 0)
    wh.close()


def test_checkpoints_and_reopens_follow_the_clock_not_the_rows_time(tmp_path: Path) -> None:
    """A replay writes two hours of rows while the warehouse's clock stands still: the file
    is checkpointed once (at the first flush) and never reopened; once the clock has moved
    15 minutes the next flush checkpoints again, and an hour reopens the file."""
    clock = Clock()
    path = tmp_path / "w.duckdb"
    wal = path.with_name(path.name + ".wal")
    wh = Warehouse(path, "c", interval=60.0, clock=clock)
    first = wh.con
    for t in range(0, int(2 * HOUR), 30):
        wh.add_usage(rows(T0 + t))
        wh.maybe_flush(T0 + t + 30)
    assert count(wh) == (120, 2 * HOUR)
    assert wal.stat().st_size > 0 and wh.con is first
    clock.now += 14 * 60
    wh.maybe_flush(T0 + 2 * HOUR + 30)
    assert wal.stat().st_size > 0
    clock.now += 60
    wh.maybe_flush(T0 + 2 * HOUR + 60)
    assert not wal.exists() or wal.stat().st_size == 0
    assert wh.con is first
    clock.now += HOUR
    wh.maybe_flush(T0 + 2 * HOUR + 90)
    assert wh.con is not first and count(wh) == (120, 2 * HOUR)
    wh.close()


WRITE_A_CYCLE = """
import sys
from datetime import UTC, datetime
from pathlib import Path

from exporter.model.compute import DeviceIdentity
from exporter.sinks.warehouse import Warehouse
from tests.exporter.test_compute import pod
from tests.exporter.test_warehouse import rows

wh = Warehouse(Path(sys.argv[1]), "c", interval=60.0, outbox=True, raw_retention=3600.0,
               retention=86400.0)
wh.resume.load()
for t in (0.0, 30.0, 60.0):
    wh.add_usage(rows(t))
    wh.add_pods([pod(uid=f"u{t}")], t, lambda p: "team-x")
wh.add_event("n1", "pool", "GPU-1", "xid", 10.0, 50.0)
wh.maybe_flush(90.0)
wh.finish_vanished({"u0.0"}, 90.0)
wh.roll_up(7200.0)
wh.expire(10.0)
wh.resume.save({"n1": {"d": DeviceIdentity("GPU-1", "d", "0", None)}},
              {("GPU-1", "xid"): (10.0, "n1", "pool")})
wh.resume.load()
wh.record_report("2026-W47", 100.0, Path(sys.argv[1]).parent)
assert wh.report_done("2026-W47")
wh.snapshot({"gpu_usage": (datetime(1970, 1, 1, tzinfo=UTC), datetime(1971, 1, 1, tzinfo=UTC))},
            Path(sys.argv[1]).parent / "snapshot")
box = wh.open_outbox()
batch = box.oldest(100)
assert batch is not None
box.remove(batch.seqs)
box.size()
box.trim(1 << 20)
assert wh.rows_written["gpu_usage"] == 1, dict(wh.rows_written)
wh.close()
print(sorted(m for m in ("pandas", "pyarrow", "numpy") if m in sys.modules))
"""


def test_writing_through_the_warehouse_imports_neither_pandas_nor_pyarrow(
        tmp_path: Path) -> None:
    """The exporter's warehouse work (staging, flushing, the retention, its state, the
    outbox) binds no parameters and scans no Python data in DuckDB: DuckDB's client would
    import pandas and pyarrow for that, some 100 MiB of the exporter's memory."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WRITE_A_CYCLE, str(tmp_path / "w.duckdb")],
                          capture_output=True, text=True, check=False,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[]"


def test_rows_a_failed_staging_kept_are_staged_once_by_interval(tmp_path: Path) -> None:
    """While nothing can be staged the cycles' rows wait; once staging works again each
    interval gets its file, every row once, and the intervals are written whole."""
    from tests.exporter.test_warehouse_faults import staging_broken

    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    with staging_broken(wh):
        for t in (0.0, 30.0):
            with pytest.raises(NotADirectoryError):
                wh.add_usage(rows(t))
    assert not list(wh.staging.directory.iterdir())  # nothing half-written left behind
    wh.add_usage(rows(60.0))
    assert sorted(f.name.split("-")[1] for f in wh.staging.directory.iterdir()) == ["0.0", "60.0"]
    wh.add_usage(rows(90.0))
    wh.flush(120.0)
    assert count(wh) == (2, 120.0)
    assert not list(wh.staging.directory.iterdir())


def test_month_to_date_spend_goes_on_across_a_restart_and_starts_again_each_month(
        tmp_path: Path) -> None:
    """The budget forecast's spend so far: the warehouse's rows of the month the first
    cycle falls in, then each interval's cost, from 0 again when a month begins."""
    from exporter.model.totals import Totals

    nov_30 = 1796083080.0   # 2026-11-30 23:58 UTC
    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    wh.add_usage(rows(nov_30) + rows(nov_30 + 30))
    wh.flush(nov_30 + 60)
    (cost,) = wh.con.execute("SELECT sum(cost_usd) FROM gpu_usage").fetchone()  # type: ignore[misc]
    team = wh.con.execute("SELECT DISTINCT team FROM gpu_usage").fetchone()[0]  # type: ignore[index]
    assert wh.resume.team_month_costs() == {("2026-11", team): pytest.approx(cost)}
    wh.close()

    again = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    restarted = Totals()
    restarted.seed_months(again.resume.team_month_costs())
    one = rows(nov_30 + 60)
    restarted.add(one)
    assert restarted.month == "2026-11"
    assert dict(restarted.month_cost) == {team: pytest.approx(cost + one[0].cost_usd)}
    restarted.add(rows(nov_30 + 120))   # 2026-12-01 00:00: a new month
    assert restarted.month == "2026-12"
    assert dict(restarted.month_cost) == {team: pytest.approx(one[0].cost_usd)}
    # read after the cycles began: it joins the month they are in
    late = Totals()
    late.add(one)
    late.seed_months(again.resume.team_month_costs())
    assert dict(late.month_cost) == {team: pytest.approx(cost + one[0].cost_usd)}


def test_a_file_from_before_the_allocation_columns_is_brought_up_to_date(
        tmp_path: Path) -> None:
    """A file, and an interval it staged, from before the ``allocation`` columns open with
    the columns added last and the rows kept (no allocation); new rows carry it."""
    from tests.exporter.test_compute import OWNERS, PRICE, pod

    path = tmp_path / "w.duckdb"
    wh = Warehouse(path, "c", interval=60.0)
    for t in (0.0, 30.0, 60.0):
        wh.add_usage(rows(t))
    wh.add_pods([pod()], 60.0, lambda p: "team-x")
    wh.flush(90.0)   # [60, 120) stays staged
    wh.close()
    con = duck.connect(path)   # the file as the release before them left it
    base = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    for table in base:
        schema = next((t for t in TABLES if t.name == table or
                       (t.name == "gpu_usage" and table.startswith("gpu_usage"))), None)
        if schema is not None and "allocation" in schema.names:
            for column in schema.names[schema.names.index("allocation"):]:
                con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    for staged in (tmp_path / "w.duckdb.staging").glob("*.parquet"):
        old = duck.quote(str(staged))
        con.execute(f"COPY (SELECT * EXCLUDE (allocation) FROM read_parquet({old})) "
                    f"TO {duck.quote(str(staged) + '.old')} (FORMAT parquet)")
        Path(str(staged) + ".old").replace(staged)
    con.close()

    opened = Warehouse(path, "c", interval=60.0)
    for table in TABLES:
        described = opened.con.execute(f"DESCRIBE {table.name}").fetchall()
        assert [r[0] for r in described] == table.names
    owners = {k: compute.Owner(o.uid, o.namespace, o.name, o.team, o.workload, "cc-1")
              for k, o in OWNERS.items()}
    st = compute.device_states({"n1": node()}, {"n1": [reading(
        pods=("a",), DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.5)]}, frozenset(), {}, owners, PRICE, {})
    opened.add_usage(compute.usage_rows(st, 90.0, 30.0) + compute.usage_rows(st, 120.0, 30.0))
    opened.add_pods([pod(uid="v")], 150.0, lambda p: "team-x", allocation_of=lambda p: "cc-1")
    opened.flush(180.0)
    assert opened.con.execute("SELECT epoch(time), allocation FROM gpu_usage ORDER BY 1"
                              ).fetchall() == [(0.0, None), (60.0, "cc-1"), (120.0, "cc-1")]
    assert opened.con.execute("SELECT pod_uid, allocation FROM gpu_pods ORDER BY 1"
                              ).fetchall() == [("u", None), ("v", "cc-1")]
    assert count(opened) == (3, 150.0)


def workload(uid: str = "wl1", admitted: float | None = None, finished: float | None = None,
             queued: float = 100.0) -> WorkloadInfo:
    return WorkloadInfo(uid=uid, namespace="team-a", name=f"job-{uid}-5f2a1",
                        local_queue="research", cluster_queue=None if admitted is None else "cq",
                        created_unix=100.0, queued_unix=queued, admitted_unix=admitted,
                        finished_unix=finished, gpus=8, accelerator="nvidia-h100-80gb",
                        priority=0, priority_class="", owner_kind="Job", owner_name=uid)


def workload_rows(wh: Warehouse) -> list[tuple[object, ...]]:
    return wh.con.execute(
        "SELECT workload_uid, state, epoch(queued), epoch(admitted), epoch(finished), "
        "cluster_queue, epoch(updated) FROM kueue_workloads ORDER BY updated, workload_uid"
    ).fetchall()


def test_a_workloads_states_each_get_a_row_and_its_deletion_ends_it(tmp_path: Path) -> None:
    """A row for each state it was in when the warehouse flushed (pending, admitted,
    requeued, finished); one written again with the same state adds nothing; a Workload
    gone from a complete list before it finished ends as Deleted when that list was taken,
    one that had finished just goes."""
    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    team, lq = (lambda w: "alpha"), (lambda w: w.cluster_queue or "research-cq")
    steps: list[tuple[float, list[WorkloadInfo], bool]] = [
        (120.0, [workload("a"), workload("b")], True),
        (180.0, [workload("a"), workload("b")], True),
        (240.0, [workload("a", admitted=200.0), workload("b")], True),
        (300.0, [workload("a", queued=300.0), workload("b")], True),
        (420.0, [workload("a", queued=300.0, finished=400.0)], False),  # b may be there
        (480.0, [workload("a", queued=300.0, finished=400.0)], True),
        (540.0, [], True)]
    for now, workloads, complete in steps:
        wh.add_workloads(workloads, now, team, lq, complete)
        wh.flush(now)
    assert workload_rows(wh) == [
        ("a", "Pending", 100.0, None, None, "research-cq", 120.0),
        ("b", "Pending", 100.0, None, None, "research-cq", 120.0),
        ("a", "Admitted", 100.0, 200.0, None, "cq", 240.0),
        ("a", "Pending", 300.0, None, None, "research-cq", 300.0),   # requeued
        ("a", "Finished", 300.0, None, 400.0, "research-cq", 420.0),
        ("b", "Deleted", 100.0, None, 480.0, "research-cq", 480.0),
    ]
    (team_of,) = wh.con.execute("SELECT DISTINCT team FROM kueue_workloads").fetchone()  # type: ignore[misc]
    assert team_of == "alpha"


def test_a_workload_gone_while_no_exporter_watched_ends_at_the_next_start(
        tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    wh = Warehouse(path, "c", interval=60.0)
    wh.add_workloads([workload("a"), workload("b", admitted=150.0), workload("c")], 120.0,
                     lambda w: "t", lambda w: "cq", complete=True)
    wh.flush(180.0)
    wh.close()
    wh = Warehouse(path, "c", interval=60.0)  # a and b went while it was down
    assert wh.finish_vanished_workloads({"c"}, 600.0) == 2
    wh.flush(660.0)
    ended = [r for r in workload_rows(wh) if r[1] == "Deleted"]
    assert ended == [("a", "Deleted", 100.0, None, 600.0, "cq", 600.0),
                     ("b", "Deleted", 100.0, 150.0, 600.0, "cq", 600.0)]
    assert wh.finish_vanished_workloads({"c"}, 700.0) == 0  # ended: not again


def test_every_state_between_two_flushes_keeps_its_row(tmp_path: Path) -> None:
    """A pod pending, running and done, and a Workload pending, admitted and finished, all
    within one flush interval (a replay flushes once a simulated day): each state is a row,
    so a window ending before the last state still sees the ones before it."""
    from tests.exporter.test_compute import pod

    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    team, lq = (lambda w: "alpha"), (lambda w: w.cluster_queue or "research-cq")
    for now, p, w in (
            (120.0, pod(phase="Pending", node=None, scheduled_unix=None), workload("a")),
            (180.0, pod(), workload("a", admitted=150.0)),
            (240.0, pod(phase="Succeeded", finished_unix=230.0),
             workload("a", admitted=150.0, finished=230.0))):
        wh.add_pods([p], now, lambda p: "alpha")
        wh.add_workloads([w], now, team, lq, complete=True)
    wh.flush(300.0)
    assert wh.con.execute("SELECT phase, epoch(updated) FROM gpu_pods ORDER BY updated"
                          ).fetchall() == [("Pending", 120.0), ("Running", 180.0),
                                           ("Succeeded", 240.0)]
    assert [(r[1], r[6]) for r in workload_rows(wh)] == [
        ("Pending", 120.0), ("Admitted", 180.0), ("Finished", 240.0)]
