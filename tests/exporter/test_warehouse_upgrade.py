"""A warehouse file of every earlier layout opens with this release: every row kept, none
twice, the file brought to today's tables and columns, written to, reported on, and the
exporter runs on it. The files are made by each release's own code
(tests/fixtures/warehouse: README.md, generate.py, manifest.json)."""

from __future__ import annotations

import asyncio
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporter import duck
from exporter.cli import main
from exporter.sinks.schema import TABLES
from exporter.sinks.warehouse import MIGRATIONS, Warehouse
from simulator.scenario import Scenario
from tests.conftest import exporter_env, start_exporter
from tests.exporter.test_compute import pod
from tests.exporter.test_warehouse import rows
from tests.fixtures.warehouse.generate import LAYOUTS, STAGED_AT, digest
from tests.timing import limit

FIXTURES = Path(__file__).parents[1] / "fixtures" / "warehouse"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text())
WEEK = "2026-W47"
"""The week the demo's simulated hour falls in."""

MOVED = f"usage-{STAGED_AT!r}-table.parquet"
"""The file the rows staged in ``usage_staging`` move to."""
ENERGY = ("energy_joules", "energy_basis", "co2e_grams", "idle_energy_joules")
"""The ``gpu_usage`` columns added for energy and carbon."""


def energy(table: str) -> list[str]:
    return [f"{table}.{c}" for c in ENERGY]


KEYED = {"unkeyed": ["availability_events", "gpu_pods", "gpu_usage"],
         "daily_tables": ["gpu_usage"],
         "columns": ["gpu_pods.allocation", "gpu_pods.queued",
                     "gpu_pods.admission_wait_seconds", "gpu_pods.cluster_queue",
                     "gpu_usage_hourly.allocation", *energy("gpu_usage_hourly")],
         "staging_files": [MOVED, "usage_staging"],
         "staged_columns": [MOVED]}
"""What the chain does to a file of 0.1.0's layout: the keys dropped from the tables as
they were, gpu_usage renamed, the later columns added, the staged rows moved to a file,
which gains the staged columns added since (allocation)."""
DAILY = [*KEYED["columns"], "gpu_usage_raw_20261116.allocation",
         *energy("gpu_usage_raw_20261116")]
"""... and the day's table of the demo's hour, in a file of the daily tables."""


def staged(name: str) -> list[str]:
    """The staged files of a fixture's file."""
    return list(MANIFEST["files"][name]["staged"]["files"])


STAGED_FILES = staged("staging-files")

CASES = [
    # (fixture, what each migration step changed as it opened)
    ("v0.1.0", KEYED),
    ("report-runs", KEYED),
    ("device-state", KEYED),
    ("unkeyed", {k: v for k, v in KEYED.items() if k != "unkeyed"}),
    ("daily-tables", {"columns": DAILY, "staging_files": [MOVED, "usage_staging"],
                      "staged_columns": [MOVED]}),
    ("staging-files", {"columns": DAILY, "staged_columns": STAGED_FILES}),
    ("allocation", {"columns": ["gpu_pods.queued", "gpu_pods.admission_wait_seconds",
                                "gpu_pods.cluster_queue", *energy("gpu_usage_hourly"),
                                *energy("gpu_usage_raw_20261116")],
                    "staged_columns": staged("allocation")}),
    ("kueue-quotas", {"columns": [*energy("gpu_usage_hourly"),
                                  *energy("gpu_usage_raw_20261116")],
                      "staged_columns": staged("kueue-quotas")}),
    ("kueue-workloads", {"columns": [*energy("gpu_usage_hourly"),
                                     *energy("gpu_usage_raw_20261116")],
                         "staged_columns": staged("kueue-workloads")}),
]


def test_every_layout_has_a_case_and_a_file() -> None:
    assert [name for name, _ in CASES] == [x.name for x in LAYOUTS] == list(MANIFEST["files"])
    for layout in LAYOUTS:
        assert MANIFEST["files"][layout.name]["commit"] == layout.commit
        assert (FIXTURES / f"{layout.name}.tar.gz").stat().st_size < 200_000
    assert [m.name for m in MIGRATIONS] == ["unkeyed", "daily_tables", "columns",
                                            "staging_files", "staged_columns"]


def unpack(name: str, directory: Path) -> Path:
    """The fixture's warehouse file (and its staging directory) in ``directory``."""
    with tarfile.open(FIXTURES / f"{name}.tar.gz") as tar:
        tar.extractall(directory, filter="data")
    return directory / "warehouse.duckdb"


@pytest.mark.parametrize(("name", "migrated"), CASES, ids=[c[0] for c in CASES])
def test_a_file_of_an_earlier_layout_opens_with_every_row(
        name: str, migrated: dict[str, list[str]], tmp_path: Path) -> None:
    recorded = MANIFEST["files"][name]["tables"]
    path = unpack(name, tmp_path)
    wh = Warehouse(path, "demo", interval=60.0)
    assert wh.migrated == migrated

    # every row the release wrote, as it wrote it, and none twice; its staged rows in files
    staged = MANIFEST["files"][name]["staged"]
    assert staged["rows"] > 0 and staged["intervals"] == [STAGED_AT]
    staging = path.with_name(path.name + ".staging")
    files = sorted(str(f) for f in staging.glob("*.parquet"))
    assert wh.con.execute(f"SELECT count(*), sum(gpu_seconds) FROM read_parquet({files!r}, "
                          "union_by_name = true)").fetchone() == (
        staged["rows"], staged["gpu_seconds"])
    for table, want in recorded.items():
        if table == "usage_staging":           # those staged rows, checked above
            continue
        assert digest(wh.con, table, want["columns"]) == (want["rows"], want["digest"]), table
    assert recorded["gpu_usage"]["rows"] > 0 and recorded["gpu_pods"]["rows"] > 0
    for table in TABLES:
        n, ids = wh.con.execute(f"SELECT count(*), count(DISTINCT id) FROM {table.name}"
                                ).fetchone() or (0, 0)
        assert n == ids, table.name
    # today's tables and columns
    columns = duck.held_columns(wh.con)
    for table in TABLES:
        assert columns[table.name] == table.names, table.name
    assert "usage_staging" not in columns and not wh.con.execute(
        "SELECT * FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY' "
        "AND table_name <> 'report_runs'").fetchall()

    # the staged interval is written as it completes, new rows beside the old ones
    start = STAGED_AT + 60.0
    wh.add_usage(rows(start))
    wh.add_usage(rows(start + 30.0))
    wh.add_pods([pod()], start + 30.0, lambda p: "team-x")
    wh.add_event("n1", "pool", "GPU-1", "xid", start, start + 50.0)
    wh.flush(start + 60.0)
    assert dict(wh.rows_written) == {"gpu_usage": 2, "gpu_pods": 1,
                                     "availability_events": 1}
    assert wh.con.execute("SELECT count(*) FROM gpu_usage").fetchone() == (
        recorded["gpu_usage"]["rows"] + 2,)
    assert wh.con.execute(f"SELECT epoch(time), gpu_seconds FROM gpu_usage WHERE time >= "
                          f"to_timestamp({STAGED_AT}) ORDER BY time").fetchall() == [
        (STAGED_AT, staged["gpu_seconds"]), (start, 60.0)]
    assert not any(staging.glob("*.parquet"))
    week_cost, week_hours = wh.con.execute(
        "SELECT sum(cost_usd), sum(gpu_seconds) / 3600 FROM gpu_usage WHERE cluster = 'demo'"
    ).fetchone() or (0.0, 0.0)
    wh.close()

    # opened again, nothing is left to migrate and nothing changes
    again = Warehouse(path, "demo", interval=60.0)
    assert again.migrated == {}
    assert again.con.execute("SELECT count(*) FROM gpu_usage").fetchone() == (
        recorded["gpu_usage"]["rows"] + 2,)
    again.close()

    # the weekly report reads it: its headline is the file's rows
    out = tmp_path / "report"
    assert main(["report", "weekly", "--week", WEEK, "--force", "--cluster", "demo",
                 "--store", f"duckdb:{path}", "--out", str(out)]) == 0
    headline = json.loads((out / "report.json").read_text())["headline"]
    assert headline["cost_usd"] == pytest.approx(week_cost)
    assert headline["gpu_hours"] == pytest.approx(week_hours)


def test_a_staged_file_that_does_not_read_leaves_the_upgrade_going(tmp_path: Path) -> None:
    """A damaged staged file beside a 0.1.0 file: the others are upgraded, the file opens,
    and the damaged one is left as it was, for the flush to set aside."""
    path = unpack("v0.1.0", tmp_path)
    staging = tmp_path / "warehouse.duckdb.staging"
    staging.mkdir()
    damaged = {"usage-60.0-garbage.parquet": b"not parquet",
               "usage-120.0-cut.parquet": b"PAR1" + bytes(60)}
    for name, data in damaged.items():
        (staging / name).write_bytes(data)
    wh = Warehouse(path, "demo", interval=60.0)
    assert wh.migrated["staged_columns"] == [MOVED]
    for name, data in damaged.items():
        assert (staging / name).read_bytes() == data
    assert not any(staging.glob("*.part"))
    wh.flush(STAGED_AT + 60.0)
    assert wh.rows_written["gpu_usage"] == 1
    assert sorted(f.name for f in (staging / "quarantine").iterdir()) == sorted(damaged)
    wh.close()


async def _get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


async def test_the_exporter_runs_on_a_file_of_release_0_1_0(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """The upgrade from 0.1.0 as an operator makes it: ``run`` on the old file serves
    /metrics, writes the new cluster's rows beside the old ones and stops cleanly."""
    recorded = MANIFEST["files"]["v0.1.0"]["tables"]
    path = unpack("v0.1.0", tmp_path)
    sim = await make_server(make_scenario())
    await sim.advance(60)
    env = exporter_env(sim.write_outputs(tmp_path).kubeconfig, path)
    proc, port = await start_exporter(env)
    try:
        async with asyncio.timeout(limit(60)):    # ready: listed, a cycle done
            while (await _get(port, "/readyz"))[0] != 200:  # noqa: ASYNC110
                await asyncio.sleep(0.3)
        for _ in range(4):                 # a few cycles and warehouse intervals
            await sim.advance(1)
            await asyncio.sleep(1)
        status, metrics = await _get(port, "/metrics")
        assert status == 200 and "gke_gpu_cost_usd_total{" in metrics
    finally:
        proc.terminate()
        async with asyncio.timeout(limit(30)):
            rc = await proc.wait()
        assert proc.stderr is not None
        log = (await proc.stderr.read()).decode()
    assert rc == 0, log[-3000:]
    with duck.connect(path, read_only=True) as con:
        for table, want in recorded.items():   # the old cluster's rows, as they were
            if table in {"usage_staging", "report_runs"}:
                continue
            old = f"(SELECT * FROM {table} WHERE cluster = 'demo')"
            assert digest(con, old, want["columns"]) == (want["rows"], want["digest"]), table
        (new,) = con.execute("SELECT count(*) FROM gpu_usage WHERE cluster = 'default'"
                             ).fetchone() or (0,)
        assert new > 0
        for table in TABLES:
            n, ids = con.execute(f"SELECT count(*), count(DISTINCT id) FROM {table.name}"
                                 ).fetchone() or (0, 0)
            assert n == ids, table.name
