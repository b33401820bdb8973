"""A warehouse several clusters write to (a shared BigQuery dataset): the report over all
of them puts them side by side; ``--cluster`` reports one, exactly as if it were alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analytics.report import WeeklyReport, build
from analytics.store import DuckDBStore
from analytics.week import parse_week
from tests.analytics.test_report import PRICES
from tests.timing import limit

WEEK = parse_week("2026-W47")


def report(path: Path, only_cluster: str | None = None, team: str | None = None
           ) -> WeeklyReport:
    store = DuckDBStore(path)
    try:
        return build(store, WEEK, PRICES, 0.995, "config-name", team=team,
                     only_cluster=only_cluster)
    finally:
        store.close()


def week_cost(path: Path, cluster: str) -> float:
    store = DuckDBStore(path)  # as the reports open it: one configuration per file
    try:
        row = store.con.execute(
            "SELECT sum(cost_usd) FROM gpu_usage WHERE cluster = ? AND time >= TIMESTAMP "
            "'2026-11-16 00:00:00+00' AND time < TIMESTAMP '2026-11-23 00:00:00+00'",
            [cluster]).fetchone()
    finally:
        store.close()
    assert row is not None
    return float(row[0])


def test_all_clusters_side_by_side(shared_warehouse: Path) -> None:
    r = report(shared_warehouse)
    assert r.title.endswith("— c, d, all teams")
    by = r.frame("cost_by_cluster").set_index("cluster")
    assert list(by.index) == ["c", "d"]
    for name in ("c", "d"):
        assert by.cost_usd[name] == pytest.approx(week_cost(shared_warehouse, name), abs=0.01)
    assert by.cost_usd.sum() == pytest.approx(r.headline["cost_usd"], abs=0.01)
    assert by.previous_cost_usd["d"] == 0  # d wrote nothing the week before
    assert r.frame("cost_by_team").cost_usd.sum() == pytest.approx(by.cost_usd.sum(), abs=0.01)


@pytest.mark.parametrize("team", [None, "alpha"])
def test_one_cluster_of_a_shared_warehouse_is_reported_as_if_alone(
        shared_warehouse: Path, small_warehouse: Path, team: str | None) -> None:
    shared, alone = report(shared_warehouse, "c", team), report(small_warehouse, team=team)
    assert shared.title == alone.title.replace("config-name", "c")
    assert shared.headline == alone.headline
    assert list(shared.tables) == list(alone.tables)
    assert "cost_by_cluster" not in shared.tables
    for name in shared.tables:
        pd.testing.assert_frame_equal(shared.frame(name), alone.frame(name), obj=name)


def test_a_cluster_alone_has_no_cluster_table_and_its_own_name(small_warehouse: Path) -> None:
    r = report(small_warehouse)
    assert "cost_by_cluster" not in r.tables
    assert r.title.endswith("— c, all teams")  # the data's name, not the config's


def test_the_second_cluster_on_its_own(shared_warehouse: Path) -> None:
    r = report(shared_warehouse, "d")
    assert r.title.endswith("— d, all teams")
    assert r.headline["cost_usd"] == pytest.approx(week_cost(shared_warehouse, "d"), abs=0.01)
    assert r.headline["coverage"] == 1.0


def test_report_weekly_cluster_option(shared_warehouse: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "report", "weekly", "--week", "2026-W47",
         "--store", f"duckdb:{shared_warehouse}", "--cluster", "d", "--out", str(out)],
        capture_output=True, text=True, timeout=limit(120), check=False)
    assert done.returncode == 0, done.stderr
    text = (out / "report.md").read_text()
    assert text.startswith("# GPU cost and bottleneck report 2026-W47 — d, all teams")
    assert "## Cost by cluster" not in text
