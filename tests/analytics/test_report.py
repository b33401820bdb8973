"""The weekly report end to end on a small warehouse: golden Markdown, escaping, files."""

from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path

import pandas as pd
import pytest
from markupsafe import escape

from analytics import headline_text, queries, render
from analytics.charts import CHARTS
from analytics.figures.bottlenecks import classify_arrow
from analytics.figures.headline import Pricing, price_basis
from analytics.figures.queue import kueue
from analytics.figures.rightsizing import prepare
from analytics.report import WeeklyReport, build
from analytics.store import DuckDBStore, duckdb_sql
from analytics.week import parse_week
from analytics.weekly import team_dir
from analytics.workspace import Table, Workspace
from exporter import duck
from exporter.config import load_config
from exporter.model.prices import load_price_book
from exporter.sinks.schema import BY_NAME, KUEUE_QUOTAS
from tests.analytics.conftest import HOSTILE

GOLDEN = Path(__file__).parents[1] / "golden" / "report.md"
BOOK = load_price_book(None, "us-central1")
PRICES = BOOK.prices


def report(path: Path, team: str | None = None) -> WeeklyReport:
    store = DuckDBStore(path)
    try:
        return build(store, parse_week("2026-W47"), Pricing.of(BOOK), 0.995, "c",
                     team=team)
    finally:
        store.close()


def test_markdown_matches_the_golden_file(small_warehouse: Path) -> None:
    text = render.markdown(report(small_warehouse))
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_the_figures_of_the_small_week(small_warehouse: Path) -> None:
    r = report(small_warehouse)
    teams = r.tables["cost_by_team"].set_index("team")
    assert teams.loc["alpha", "cost_usd"] == pytest.approx(7 * 24 * 0.7)   # one L4, a week
    assert teams.loc["alpha", "change"] == pytest.approx(0.0)
    assert teams.loc["alpha", "utilization_of_allocated"] == pytest.approx(0.6)
    assert teams.cost_usd.sum() == pytest.approx(r.headline["cost_usd"])
    assert r.headline["cost_usd"] == pytest.approx(3 * 7 * 24 * 0.7)  # two held, one free
    classes = dict(zip(r.tables["bottlenecks"].workload, r.tables["bottlenecks"].bottleneck,
                       strict=True))
    assert classes == {"train": "healthy", HOSTILE: "idle"}
    assert list(r.tables["incidents"].kind) == ["xid"]


def test_a_cluster_queue_holding_jobs_back_has_a_row_though_it_ran_none(
        small_warehouse: Path) -> None:
    """Kueue queues: the Jobs each ClusterQueue holds back at the week's end, also for one
    none of whose Jobs ran in the week."""
    week = parse_week("2026-W47")
    store = DuckDBStore(small_warehouse)
    f = queries.fetch(store, week)
    ws = Workspace()
    prepare(ws, {})
    queries.load(store, week, ws, None, classify_arrow)
    waiting = f["awaiting_admission"]
    assert list(waiting.owner_name) == ["eval"]
    more = pd.concat([waiting, waiting.assign(workload_uid="wl-2", cluster_queue="batch",
                                              gpus=4)], ignore_index=True)
    t = kueue(ws, week, f["quotas"], more).set_index("cluster_queue")
    assert t[["workloads", "awaiting_workloads", "awaiting_gpus"]].to_dict("index") == {
        "research": {"workloads": 1, "awaiting_workloads": 1, "awaiting_gpus": 1},
        "batch": {"workloads": 0, "awaiting_workloads": 1, "awaiting_gpus": 4}}
    ws.close()
    store.close()


def test_the_per_pod_tables_stay_in_the_workspace(small_warehouse: Path) -> None:
    r = report(small_warehouse)
    for name in ("bottlenecks", "rightsizing", "spot"):
        assert isinstance(r.tables[name], Table), name
    assert isinstance(r.pods, Table) and len(r.pods) == 2
    assert set(r.pods.bottleneck) == {"healthy", "idle"}
    assert list(r.pods.frame().evidence.map(type)) == [dict, dict]
    assert r.tables["bottlenecks"].evidence.map(bool).all()


def test_hostile_names_are_escaped_everywhere(small_warehouse: Path) -> None:
    r = report(small_warehouse)
    html = render.html_page(r, {k: f"{k}.png" for k in CHARTS})
    md = render.markdown(r)
    assert HOSTILE not in html and "&lt;script&gt;" in html
    assert HOSTILE not in md and "&lt;script&gt;" in md
    assert team_dir(HOSTILE).startswith("script_alert_1_script-")


def test_a_team_slice_holds_only_that_team(small_warehouse: Path) -> None:
    r = report(small_warehouse, team="alpha")
    assert list(r.tables["cost_by_team"].team) == ["alpha"]
    assert "availability" not in r.tables and HOSTILE not in render.markdown(r)
    assert r.headline["cost_usd"] == pytest.approx(7 * 24 * 0.7)


def test_a_team_slice_translates_no_query_the_platform_report_did(
        small_warehouse: Path) -> None:
    report(small_warehouse)
    translated = duckdb_sql.cache_info().misses
    slice_ = report(small_warehouse, team="alpha")
    assert duckdb_sql.cache_info().misses == translated
    assert list(slice_.tables["cost_by_team"].team) == ["alpha"]


def test_the_price_basis_is_one_line_under_the_headline(small_warehouse: Path,
                                                       tmp_path: Path) -> None:
    """Markdown, HTML and JSON say what the costs are priced on, right after the headline;
    the small warehouse priced its L4s above the book's list price, and the line says so."""
    r = report(small_warehouse)
    line = headline_text.basis_line(r)
    assert line == (
        "Prices: GPU component only, at list prices of us-central1 from the price book of "
        f"{BOOK.as_of}, no discount configured, though the week's costs differ from them by "
        "+$70.54 (priced at other list prices: another book, or the catalogue); the machines "
        "the GPUs run in are not included ($73.98 to $591.87 more at list price by machine "
        "type, 17.3% to 62.7% of the total); no spot GPUs.")
    assert r.basis is not None and r.basis.off_list_usd == pytest.approx(
        round(3 * 7 * 24 * (BOOK.prices["nvidia-l4", "on-demand"] - 0.7), 2))
    render.write(r, tmp_path)
    md = (tmp_path / "report.md").read_text().splitlines()
    bullets = [i for i, text in enumerate(md) if text.startswith("- **")]
    assert md[bullets[-1] + 1: bullets[-1] + 3] == ["", render.md(line)]
    page = (tmp_path / "report.html").read_text()
    assert page.index("Unallocated capacity") < page.index(escape(line)) < \
        page.index("<h2")
    assert json.loads((tmp_path / "report.json").read_text())["price_basis"]["line"] == line


LINES = {
    "a negotiated discount took 10 %":
        "at list prices of us-central1 from the price book of 2026-02-24 less negotiated "
        "discounts (\N{MINUS SIGN}$10.00, 10.0% off list); the machines the GPUs run in are "
        "not included (about $12.00 more at list price, 11.8% of the total); no spot GPUs.",
    "a discount configured that took nothing off":
        "less negotiated discounts (none applied this week); the machines the GPUs run in are "
        "not included, nor known (the book gives no machine share for nvidia-tesla-t4, 100.0% "
        "of GPU-hours); no spot GPUs.",
    "spot: its share of GPU-hours and of cost":
        "(about $21.00 more at list price, 11.6% of the total); spot GPUs 75.0% of GPU-hours, "
        "37.5% of cost.",
    "the machine share known for some models only":
        "(about $12.00 more at list price, 10.7% of the total of nvidia-h100-80gb; not known "
        "for nvidia-tesla-t4, 75.0% of GPU-hours, for which the book gives no machine share)",
    "unpriced GPU-hours: no cost, no list cost, no machine":
        "; spot GPUs 33.3% of GPU-hours, 0.0% of cost; 5.0 GPU-hours unpriced, not in the "
        "cost.",
    "the dates of the prices the week used":
        "from the price book (prices of 2026-02-24 to 2026-03-20) (nvidia-h100-80gb spot: "
        "estimated, not Google's), no discount configured;",
}


@pytest.mark.parametrize("case", LINES)
def test_the_price_basis_line_says_what_the_figure_holds(case: str) -> None:
    from tests.analytics.figures.test_headline import BASES

    (usage_rows, given), = [(u, p) for name, u, p, _ in BASES if name == case]
    line = headline_text.price_basis(price_basis(usage_rows, given))
    assert line.startswith("Prices: GPU component only, at list prices of us-central1 from ")
    assert LINES[case] in line


def test_the_price_basis_line_of_the_catalogue_says_the_warehouse_cannot_tell() -> None:
    from tests.analytics.figures.test_headline import BASES

    usage_rows, given = BASES[0][1], BASES[0][2]
    line = headline_text.price_basis(price_basis(
        usage_rows, dataclasses.replace(given, catalog=True)))
    assert "from Google's Cloud Billing catalogue where the exporter read it, else from the " \
           "price book of 2026-02-24 (the warehouse does not record which)" in line
    other = headline_text.price_basis(price_basis(
        usage_rows, dataclasses.replace(given, basis="gpu-and-machine")))
    assert other.startswith("Prices: the book's basis 'gpu-and-machine', at list prices")
    assert "machines" not in other


def test_every_format_is_written(small_warehouse: Path, tmp_path: Path) -> None:
    r = report(small_warehouse)
    render.write(r, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["week"] == "2026-W47" and set(data["tables"]) == set(r.tables)
    for name in r.tables:
        assert (tmp_path / f"{name}.csv").exists()
    for chart in ("daily_cost", "utilization", "queue_wait", "waits"):
        assert (tmp_path / f"{chart}.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "report.html").read_text().count('<img src="') == len(CHARTS) == 4


def test_a_first_week_says_n_a_for_the_week_before(small_warehouse: Path) -> None:
    """2026-W46 is the warehouse's first week: last week's cost is unknown, not $0."""
    store = DuckDBStore(small_warehouse)
    try:
        r = build(store, parse_week("2026-W46"), PRICES, 0.995, "c")
    finally:
        store.close()
    assert r.headline["coverage"] == 1.0 and r.headline["previous_coverage"] == 0.0
    assert r.headline["previous_cost_usd"] is None and r.headline["cost_change"] is None
    assert "week over week: n/a, no data for the week before" in render.markdown(r)
    teams = r.frame("cost_by_team")
    assert len(teams) and teams.previous_cost_usd.isna().all() and teams.change.isna().all()


@pytest.mark.parametrize(("week", "force", "code"), [
    ("2026-W47", False, 0), ("2026-W49", False, 1), ("2026-W49", True, 0)],
    ids=["covered", "empty, refused", "empty, forced"])
def test_a_week_without_data_is_refused_unless_forced(small_warehouse: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      week: str, force: bool, code: int
                                                      ) -> None:
    from exporter.cli import main

    out = tmp_path / "out"
    args = ["report", "weekly", "--week", week, "--store", f"duckdb:{small_warehouse}",
            "--out", str(out)]
    assert main(args + (["--force"] if force else [])) == code
    if code:
        assert capsys.readouterr().err == (
            "error: no data in 2026-W49; the warehouse has data for 2026-W46, 2026-W47; "
            "--force writes the report anyway\n")
        assert not out.exists()
    else:
        assert (out / "report.md").exists()


def test_csvs_concatenate_across_weeks_and_clusters(small_warehouse: Path,
                                                   tmp_path: Path) -> None:
    """Each row says its week and cluster; money is to the cent; the evidence is JSON."""
    import csv

    weeks = {}
    for label in ("2026-W46", "2026-W47"):
        store = DuckDBStore(small_warehouse)
        try:
            r = build(store, parse_week(label), PRICES, 0.995, "c")
        finally:
            store.close()
        render.write(r, tmp_path / label)
        weeks[label] = r
    # the Kueue table only where a week has pods Kueue admitted (the second one here)
    assert weeks["2026-W47"].tables.keys() - weeks["2026-W46"].tables.keys() == {"kueue"}
    for name in weeks["2026-W46"].tables:
        files = [(tmp_path / label / f"{name}.csv").read_text() for label in weeks]
        headers = {f.splitlines()[0] for f in files}
        assert len(headers) == 1 and headers.pop().startswith("week,cluster,")
        for label, text in zip(weeks, files, strict=True):
            rows = list(csv.DictReader(io.StringIO(text)))
            assert all(row["week"] == label and row["cluster"] == "c" for row in rows)
            for row in rows:
                for column, value in row.items():
                    if render.is_money(column) and value:
                        assert value == str(round(float(value), 2)), (name, column, value)
                if "evidence" in row:
                    assert isinstance(json.loads(row["evidence"]), dict)
    bottlenecks = (tmp_path / "2026-W47" / "bottlenecks.csv").read_text()
    assert bottlenecks.count("\n") > 1 and "{'" not in bottlenecks


def test_the_json_holds_every_row_as_json_dumps_writes_it(small_warehouse: Path) -> None:
    r = report(small_warehouse)
    tables = {}
    for name in r.tables:
        t = r.frame(name)
        t = t.reset_index() if name == "daily_cost_by_team" else t
        tables[name] = [{str(k): render._jsonable(v) for k, v in row.items()}
                        for row in t.to_dict(orient="records")]
    assert r.basis is not None
    tables["bottlenecks"][0]["evidence"] |= {"inf": float("inf")}
    r.tables["bottlenecks"] = r.frame("bottlenecks").assign(
        evidence=[row["evidence"] for row in tables["bottlenecks"]])
    assert render.as_json(r) == json.dumps(
        {"schema_version": 1, "week": r.week.label, "cluster": r.cluster, "team": r.team,
         "sla_target": r.sla_target, "headline": r.headline,
         "price_basis": dataclasses.asdict(r.basis) | {"line": headline_text.basis_line(r)},
         "carbon_basis": r.carbon, "tables": tables},
        indent=1, default=render._jsonable)


def test_report_command_writes_platform_and_team_reports(small_warehouse: Path,
                                                         tmp_path: Path) -> None:
    from exporter.cli import main

    out = tmp_path / "out"
    assert main(["report", "weekly", "--week", "2026-W47", "--store",
                 f"duckdb:{small_warehouse}", "--out", str(out)]) == 0
    assert (out / "report.md").exists()
    assert sorted(p.name.split("-")[0] for p in (out / "teams").iterdir()) == [
        "alpha", "script_alert_1_script"]
    assert main(["report", "weekly", "--week", "2026-W99", "--store",
                 f"duckdb:{small_warehouse}"]) == 2
    assert main(["report", "weekly", "--store", f"duckdb:{tmp_path / 'nope.duckdb'}"]) == 2


def test_config_rejects_line_breaks_in_headers() -> None:
    from exporter.errors import ConfigError

    for bad in ({"subject": "weekly\r\nBcc: x@example.com"},
                {"platform_recipients": ["a@example.com\r\nBcc: x@example.com"]},
                {"team_recipients": {"alpha": ["not-an-address"]}}):
        with pytest.raises(ConfigError):
            load_config(None, {"report": bad})


EARLIER_RELEASE = {"gpu_usage": ("allocation",),
                   "gpu_pods": ("allocation", "queued", "admission_wait_seconds",
                                "cluster_queue"),
                   "availability_events": ()}
"""The tables of a warehouse file written before Kueue and allocation, less what it lacked."""


def test_a_file_of_an_earlier_release_reports_as_if_its_new_columns_were_null(
        small_warehouse: Path, tmp_path: Path) -> None:
    old, nulled = tmp_path / "old.duckdb", tmp_path / "nulled.duckdb"
    for path, earlier in ((old, True), (nulled, False)):
        con = duck.connect(path)
        con.execute(f"ATTACH '{small_warehouse}' AS present (READ_ONLY)")
        for table, lacked in EARLIER_RELEASE.items():
            types = BY_NAME[table].duckdb_types
            cols = ", ".join(f"NULL::{types[c]} AS {c}" for c in lacked)
            change = (f" EXCLUDE ({', '.join(lacked)})" if earlier else f" REPLACE ({cols})"
                      ) if lacked else ""
            con.execute(f"CREATE TABLE {table} AS SELECT *{change} FROM present.{table}")
        if not earlier:
            con.execute(KUEUE_QUOTAS.duckdb_ddl())
        con.close()
    text = render.markdown(report(old))
    assert text == render.markdown(report(nulled))
    assert text != render.markdown(report(small_warehouse))  # what the earlier one lacked
