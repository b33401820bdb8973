"""Why jobs waited and what to do about it, in the report of a warehouse that records why
pods waited (``conftest.waits_rows``): golden sections, the actions joined with the report's
own tables and the warehouse's hours, each team's slice, and warehouses that do not say."""

from __future__ import annotations

import os
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from analytics import render
from analytics.charts import CHARTS
from analytics.figures.actions import LEVERS, LONG_WAIT_SECONDS
from analytics.figures.headline import Pricing
from analytics.figures.waits import COMPATIBLE
from analytics.report import WeeklyReport, build
from analytics.store import DuckDBStore, ParquetStore
from analytics.week import reads
from analytics.workspace import Table
from exporter import duck
from exporter.sinks.schema import GPU_PENDING
from exporter.sinks.warehouse import Warehouse
from tests.analytics.conftest import HOSTILE
from tests.analytics.test_report import BOOK, report
from tests.analytics.test_scheduled_report import W47

GOLDEN = Path(__file__).parents[1] / "golden" / "report_waits.md"
SHOWN = ("What to do this week", "Why jobs waited", "Stuck workloads", "Stranded GPUs by pool",
         "Savings this week's data points to")


@pytest.fixture(scope="module")
def platform(waits_warehouse: Path) -> WeeklyReport:
    return report(waits_warehouse)


@pytest.fixture(scope="module")
def alpha(waits_warehouse: Path) -> WeeklyReport:
    return report(waits_warehouse, team="alpha")


def sections(markdown: str, titles: tuple[str, ...]) -> str:
    """The Markdown of the sections with these titles, in the report's order."""
    parts = re.split(r"(?m)^(?=## )", markdown)
    return "".join(p for p in parts if p.removeprefix("## ").split("\n", 1)[0] in titles)


def test_the_sections_match_the_golden_file(platform: WeeklyReport,
                                            alpha: WeeklyReport) -> None:
    """The platform's actions, waits, stuck workloads, stranded GPUs and savings, then team
    alpha's actions and waits."""
    text = (sections(render.markdown(platform), SHOWN) + "\n# team alpha\n\n" +
            sections(render.markdown(alpha), SHOWN[:3]))
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


HOURLY = """
WITH free AS (
  SELECT node_pool, time_bucket(INTERVAL 1 HOUR, time) AS hour, use,
         sum(gpu_seconds) / 3600 AS gpu_hours, sum(cost_usd) AS cost_usd
  FROM gpu_free GROUP BY ALL),
fits AS (
  SELECT DISTINCT node_pool, time_bucket(INTERVAL 1 HOUR, time) AS hour FROM gpu_pending
  WHERE node_pool <> '')
SELECT free.*, bool_or(use IN ('usable', 'fragment', 'quota'))
                   OVER (PARTITION BY free.node_pool, free.hour)
               OR fits.node_pool IS NOT NULL AS demand
FROM free LEFT JOIN fits USING (node_pool, hour)
"""
"""The warehouse's free GPUs, hour by hour, each hour with whether a pod that fits the pool
waited in it (its free GPUs usable, a fragment or quota-held, or a ``gpu_pending`` row of
the pool): the hours the report's actions are checked against."""


def _hourly(path: Path) -> pd.DataFrame:
    con = duck.connect(path, read_only=True)
    try:
        return con.execute(HOURLY).to_arrow_table().to_pandas()
    finally:
        con.close()


def test_no_idle_hour_is_kept_because_pods_waited_unless_a_pod_that_fits_waited_in_it(
        waits_warehouse: Path, platform: WeeklyReport) -> None:
    r = platform
    act, stranded = r.frame("actions"), r.frame("stranded").set_index("node_pool")
    hourly = _hourly(waits_warehouse)
    downs = act[act.action == "scale this pool down"]
    saving = {w.split(" ")[0]: s for w, s in zip(downs["where"], downs.weekly_saving_usd,
                                                  strict=True)}
    for pool, hours in hourly.groupby("node_pool"):
        offered = saving.get(str(pool), 0.0)
        # every free GPU of an hour no pod that fits waited in is offered as a saving
        assert offered >= hours[~hours.demand].cost_usd.sum() - 0.005, pool
        # what is kept (not offered) lies in hours a pod that fits waited in
        assert hours.cost_usd.sum() - offered <= hours[hours.demand].cost_usd.sum() + 0.005
        # and is what the stranded table says a waiting pod could use
        row = stranded.loc[pool]
        assert offered == pytest.approx(row.removable_cost_usd)
        kept = hours[hours.use.isin(COMPATIBLE)]
        assert row.free_gpu_hours - row.mismatch_gpu_hours - row.no_demand_gpu_hours == \
            pytest.approx(kept.gpu_hours.sum())
        assert row.hours_with_demand >= kept.hour.nunique()
        said = re.search(r"(\S+) GPU-hours more sat free in the (\d+) hours pods that fit it "
                         r"waited", " ".join(downs[downs["where"].str.startswith(f"{pool} (")]
                                             .why))
        if said:
            assert float(said[1].replace(",", "")) == pytest.approx(kept.gpu_hours.sum())
            assert int(said[2]) == kept.hour.nunique()
            assert hours[hours.hour.isin(kept.hour)].demand.all()
    savings = r.frame("savings").set_index("lever").weekly_saving_usd
    assert savings["autoscaling"] == pytest.approx(stranded.removable_cost_usd.sum())
    assert not act.why.str.contains("do not remove|no [a-z0-9-]+ queue").any()


def test_every_lever_answers_a_cause_the_waits_table_shows_for_its_place(
        platform: WeeklyReport) -> None:
    r = platform
    act, waits = r.frame("actions"), r.frame("waits")
    levers = act[act.answers.isin(list(LEVERS))]
    assert set(levers.answers) == {"fragmented", "no_capacity", "quota", "unschedulable",
                                   "stockout", "preempted"}
    for a in levers.itertuples():
        assert a.action == LEVERS[a.answers].action
        mine = waits[waits.cause == a.answers]
        place = {"quota": "ClusterQueue " + mine.cluster_queue,
                 "unschedulable": mine.gpu_model}.get(
            str(a.answers), mine.node_pool + " (" + mine.gpu_model + ")")
        rows = mine[place == a.where]
        assert len(rows) and rows.p90_seconds.max() > LONG_WAIT_SECONDS, a.where
        assert f"{rows.gpu_hours.sum():,.0f} GPU-hours waited" in a.why or \
            f"{rows.gpu_hours.sum():,.1f} GPU-hours waited" in a.why
    # the causes waited for briefly (a 6-minute image pull, a 20-minute scale-up) call for
    # nothing
    assert not act.answers.isin(["starting", "scaling_up"]).any()


def test_a_lever_names_only_the_free_gpus_of_the_hours_its_pods_waited(
        waits_warehouse: Path, platform: WeeklyReport) -> None:
    """alpha's pods waited six hours for the full H100 pool, while the spot H100 pool sat
    free for twelve: the lever counts the six that overlap."""
    act = platform.frame("actions").set_index("answers")
    assert "in the same hours 24 GPU-hours of nvidia-h100-80gb sat free in h100-spot (spot)" \
        in act.loc["no_capacity", "why"]
    con = duck.connect(waits_warehouse, read_only=True)
    (overlap,), = con.execute("""
        SELECT sum(f.gpu_seconds) / 3600 FROM gpu_free f
        WHERE f.node_pool = 'h100-spot' AND f.use = 'mismatch' AND f.time IN (
            SELECT time FROM gpu_pending WHERE cause = 'no_capacity')""").fetchall()
    con.close()
    assert overlap == 24


def _frame(t: pd.DataFrame | Table) -> pd.DataFrame:
    return t.frame() if isinstance(t, Table) else t


def test_a_team_sees_its_own_waits_and_the_levers_for_them(platform: WeeklyReport,
                                                          alpha: WeeklyReport) -> None:
    for name in ("waits", "stuck_workloads"):
        mine = platform.frame(name)[platform.frame(name).team == "alpha"]
        pd.testing.assert_frame_equal(alpha.frame(name), mine.reset_index(drop=True))
    assert "stranded" not in alpha.tables  # capacity is the platform's
    theirs = platform.frame("actions")
    theirs = theirs[theirs.answers.isin(list(alpha.frame("waits").cause))]
    mine = alpha.frame("actions")
    pd.testing.assert_frame_equal(mine[mine.answers.notna()].reset_index(drop=True),
                                  theirs.reset_index(drop=True))
    assert "move batch Jobs to spot" in set(mine.action)


def test_every_format_carries_the_waits(platform: WeeklyReport, tmp_path: Path) -> None:
    import json

    render.write(platform, tmp_path)
    tables = json.loads((tmp_path / "report.json").read_text())["tables"]
    assert len(tables["stuck_workloads"]) == 7 and len(tables["waits"]) == 8
    assert tables["stuck_workloads"][0]["last_waited"] == "2026-11-18T12:00:00+00:00"
    first = tables["stuck_workloads"][0]
    assert (first["cause"], first["latest_cause"]) == ("fragmented", "no_capacity"), \
        "the cause that cost it the most time, the latest beside it"
    stranded = (tmp_path / "stranded.csv").read_text().splitlines()
    assert stranded[0].startswith("week,cluster,node_pool,") and len(stranded) == 6
    assert (tmp_path / "waits.png").read_bytes()[:4] == b"\x89PNG"
    assert "Stuck workloads" in (tmp_path / "report.html").read_text()


def test_a_week_snapshot_reports_the_same_waits(waits_warehouse: Path, tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    shutil.copy(waits_warehouse, path)
    wh = Warehouse(path, "c", interval=3600.0)
    wh.snapshot(reads(W47), tmp_path / "snap")
    wh.close()
    for team in (None, "beta"):
        a, b = (_built(s, team) for s in (DuckDBStore(path), ParquetStore(tmp_path / "snap")))
        for name in ("waits", "stuck_workloads", "stranded", "actions"):
            if name in a.tables:
                pd.testing.assert_frame_equal(_frame(a.tables[name]), _frame(b.tables[name]),
                                              obj=name)


def _built(store: DuckDBStore, team: str | None) -> WeeklyReport:
    try:
        return build(store, W47, Pricing.of(BOOK), 0.995, "c", team=team)
    finally:
        store.close()


def test_a_file_without_the_waits_tables_reports_and_says_it_records_no_causes(
        small_warehouse: Path, tmp_path: Path) -> None:
    """A file of a release before ``gpu_pending`` and ``gpu_free``: the tables missing
    altogether. The report opens it, says so, and reconciles over the week as before."""
    old = tmp_path / "old.duckdb"
    shutil.copy(small_warehouse, old)
    con = duck.connect(old)
    con.execute("DROP TABLE gpu_pending")
    con.execute("DROP TABLE gpu_free")
    con.close()
    r = report(old)
    text = render.markdown(r)
    assert r.frame("waits").empty and r.frame("stranded").empty
    assert "## Why jobs waited" in text and "predates them" in text
    act = r.frame("actions").set_index("action")
    # its L4 pool sat free while an L4 Job waited 12 h for Kueue: not a saving, a thing to fix
    assert "do not remove this capacity" in act.loc["let the waiting pods use this pool", "why"]
    assert text == render.markdown(report(small_warehouse))


def test_a_team_that_waited_for_nothing_is_told_so(waits_warehouse: Path) -> None:
    r = report(waits_warehouse, team=HOSTILE)
    assert r.frame("waits").empty
    assert f"No pod of team {render.md(HOSTILE)} waited for a GPU this week." in \
        render.markdown(r)
    page = render.html_page(r, {k: f"{k}.png" for k in CHARTS})
    assert HOSTILE not in page and "waited for a GPU this week." in page


def test_a_workload_still_waiting_shows_when_the_forecast_expects_it(tmp_path: Path) -> None:
    """The stuck table's expected start is the latest forecast of a workload waiting at the
    data's last interval; one that stopped waiting earlier shows none, whatever its rows
    said then."""
    from analytics.figures.waits import stuck_workloads
    from analytics.queries import STUCK
    from tests.analytics.conftest import add_rows, at, build_warehouse
    from tests.analytics.conftest import pending as rows_of

    path = build_warehouse(tmp_path / "w.duckdb")
    expected = at(6, 9)
    add_rows(path, GPU_PENDING, [
        *rows_of("uid-done", at(5, 0), 3, "no_capacity", workload="done",
                 expected_start=datetime.fromtimestamp(at(5, 4), UTC)),
        *rows_of("uid-late", at(5, 0), 6, "no_capacity", workload="late",
                 expected_start=datetime.fromtimestamp(expected, UTC)),
    ])
    store = DuckDBStore(path)
    try:
        found = stuck_workloads(store.query(STUCK, {
            "start": W47.start, "end": W47.end, "cluster": None, "team": None}))
    finally:
        store.close()
    starts = dict(zip(found.workload, found.expected_start, strict=True))
    assert starts["late"] == pd.Timestamp(expected, unit="s", tz="UTC")
    assert pd.isna(starts["done"])
