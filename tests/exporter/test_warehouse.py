"""The DuckDB warehouse: complete intervals appended once, whatever is written again."""

from __future__ import annotations

from pathlib import Path

from exporter import compute
from exporter.sinks.warehouse import Warehouse
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
    assert again.rows_written["gpu_usage"] == 0   # the primary key made it a no-op
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
