"""The warehouse's retention: old ``gpu_usage`` rows rolled up to hours with the same totals
and means, rows past the retention deleted, both counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from analytics.queries import USAGE
from analytics.store import DuckDBStore
from exporter.config import load_config
from exporter.errors import ConfigError
from exporter.model import compute
from exporter.sinks.warehouse import MAINTENANCE_INTERVAL, Warehouse
from tests.exporter.test_compute import node, pod, reading, states

DAY = 86400.0
T0 = 1_794_182_400.0  # Monday 2026-11-09 00:00 UTC


def minute_rows(start: float, busy: float) -> list[compute.UsageRow]:
    st = states([node(capacity_gpus=2, allocatable_gpus=2)], {"n1": [
        reading("GPU-a", pods=("a",), DCGM_FI_PROF_GR_ENGINE_ACTIVE=busy,
                DCGM_FI_DEV_FB_USED=100 + busy * 1000, DCGM_FI_DEV_FB_FREE=900,
                DCGM_FI_DEV_CLOCKS_EVENT_REASONS=0x20 if busy > 0.8 else 0),
        reading("GPU-b", DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.0)]})
    return compute.usage_rows(st, start, 60.0)


def filled(path: Path, hours: float, start: float = T0) -> Warehouse:
    """Minute rows for ``hours``, the load changing every minute."""
    wh = Warehouse(path, "c", interval=60.0)
    for m in range(int(hours * 60)):
        wh.add_usage(minute_rows(start + m * 60, (m % 10) / 10))
    wh.flush(start + hours * 3600)
    return wh


def by_hour(wh: Warehouse) -> list[tuple[object, ...]]:
    return wh.con.execute("""
        SELECT floor(epoch(time) / 3600), device_id, state, round(sum(gpu_seconds), 6),
               round(sum(cost_usd), 9),
               round(sum(utilization * gpu_seconds) / sum(gpu_seconds), 9),
               round(sum(gr_engine_active * gpu_seconds) / sum(gpu_seconds), 9),
               max(memory_used_bytes), bit_or(clock_event_reasons), any_value(namespace)
        FROM gpu_usage GROUP BY ALL ORDER BY ALL""").fetchall()


def test_rolled_up_hours_keep_totals_and_means(tmp_path: Path) -> None:
    wh = filled(tmp_path / "w.duckdb", hours=3)
    before = by_hour(wh)
    assert wh.con.execute("SELECT count(*) FROM gpu_usage").fetchone() == (2 * 180,)
    assert wh.roll_up(T0 + 2 * 3600 + 1800)        # the third hour is not old enough
    assert by_hour(wh) == before
    assert wh.con.execute("SELECT interval_seconds, count(*) FROM gpu_usage GROUP BY ALL "
                          "ORDER BY ALL").fetchall() == [(60.0, 2 * 60), (3600.0, 2 * 2)]
    assert wh.rows_removed["gpu_usage", "rolled_up"] == 2 * 120
    assert wh.roll_up(T0 + 2 * 3600)               # again: nothing left to roll up
    assert wh.rows_removed["gpu_usage", "rolled_up"] == 2 * 120
    wh.close()


def test_the_weekly_figures_are_the_same_after_a_rollup(tmp_path: Path) -> None:
    wh = filled(tmp_path / "w.duckdb", hours=6)
    params = {"start": _ts(T0), "end": _ts(T0 + 7 * DAY), "prev_start": _ts(T0 - 7 * DAY),
              "team": None, "cluster": None}
    store = DuckDBStore(con=wh.con)
    raw = store.query(USAGE, params)
    wh.roll_up(T0 + 6 * 3600)
    rolled = store.query(USAGE, params)
    cols = ["gpu_seconds", "utilized_seconds", "cost_usd", "idle_seconds", "idle_cost_usd"]
    assert rolled[cols].sum().round(6).equals(raw[cols].sum().round(6))
    assert raw["cost_usd"].sum() > 0
    wh.close()


def _ts(t: float):  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC)


def test_a_backlog_is_rolled_up_an_hour_at_a_time(tmp_path: Path) -> None:
    wh = filled(tmp_path / "w.duckdb", hours=2)
    for day in (1, 2):                              # two more days, two hours each
        wh.add_usage([r for m in range(120) for r in minute_rows(T0 + day * DAY + m * 60, 0.5)])
    wh.flush(T0 + 3 * DAY)
    assert not wh.roll_up(T0 + 3 * DAY, budget_seconds=0.0)   # one hour, then out of time
    assert wh.con.execute("SELECT count(*) FROM gpu_usage WHERE interval_seconds = 3600"
                          ).fetchone() == (2,)
    assert wh.roll_up(T0 + 3 * DAY)
    assert wh.con.execute("SELECT DISTINCT interval_seconds FROM gpu_usage").fetchall() == \
        [(3600.0,)]
    wh.close()


def test_rows_past_the_retention_are_deleted_from_every_table(tmp_path: Path) -> None:
    wh = filled(tmp_path / "w.duckdb", hours=1)
    wh.add_pods([pod()], T0 + 600, lambda p: "team-x")
    wh.add_event("n1", "p", "GPU-a", "xid", T0 + 60, T0 + 120)
    wh.flush(T0 + 3600)
    wh.add_usage(minute_rows(T0 + 10 * DAY, 0.5))
    wh.flush(T0 + 10 * DAY + 60)
    wh.expire(T0 + 5 * DAY)
    assert wh.con.execute("SELECT count(*) FROM gpu_usage").fetchone() == (2,)
    assert wh.con.execute("SELECT count(*) FROM gpu_pods").fetchone() == (0,)
    assert wh.con.execute("SELECT count(*) FROM availability_events").fetchone() == (0,)
    assert wh.rows_removed["gpu_usage", "expired"] == 2 * 60
    assert wh.rows_removed["gpu_pods", "expired"] == 1
    assert wh.rows_removed["availability_events", "expired"] == 1
    wh.close()


def test_maintenance_runs_hourly_from_the_flush(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0, raw_retention=DAY,
                   retention=3 * DAY)
    for m in range(60):
        wh.add_usage(minute_rows(T0 + m * 60, 0.5))
    wh.maybe_flush(T0 + 3600)
    assert wh.rows_removed["gpu_usage", "rolled_up"] == 0   # an hour old: kept as it is
    wh.maybe_flush(T0 + DAY + 3600)                         # a day later: rolled up
    assert wh.rows_removed["gpu_usage", "rolled_up"] == 2 * 60
    wh.add_usage(minute_rows(T0 + 4 * DAY, 0.5))
    wh.maybe_flush(T0 + 4 * DAY + 60)
    assert wh.rows_removed["gpu_usage", "expired"] == 2      # the hourly rows, 4 days old
    wh.maybe_flush(T0 + 4 * DAY + MAINTENANCE_INTERVAL / 2)  # not again within the hour
    assert wh.con.execute("SELECT count(*) FROM gpu_usage").fetchone() == (2,)
    wh.close()


@pytest.mark.parametrize(("retention", "error"), [
    ({"raw": "40d", "keep": "30d"}, "retention.raw cannot be longer than retention.keep"),
    ({"raw": "forever"}, "not a duration"),
])
def test_retention_is_validated(retention: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        load_config(None, {"warehouse": {"retention": retention}})


def test_retention_off() -> None:
    cfg = load_config(None, {"warehouse": {"retention": {"raw": 0, "keep": 0}}})
    assert (cfg.warehouse.retention.raw, cfg.warehouse.retention.keep) == (0.0, 0.0)
