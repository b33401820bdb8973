"""The exporter writing BigQuery: a simulated day equals the DuckDB warehouse row for row,
and the report and a what-if read the same from both; a SIGKILLed exporter's spooled rows
arrive after it restarts."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import signal
import subprocess
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pandas as pd
import pytest
from google.cloud import bigquery

from analytics import headline_text
from analytics.figures.headline import Pricing
from analytics.report import build
from analytics.store import BigQueryStore, DuckDBStore
from analytics.week import Week, week_containing
from analytics.whatif import layout as whatif_layout
from analytics.whatif import measure as whatif_measure
from analytics.whatif import trace as whatif_trace
from exporter import duck
from exporter.demo import demo_config, step_both
from exporter.google.bigquery_emulator import PROJECT, Emulator
from exporter.model.prices import load_price_book
from exporter.runtime.app import open_exporter
from exporter.sinks.schema import TABLES
from simulator.scenario import Scenario, load_scenario
from simulator.server import SimulatorServer
from tests.bigquery.conftest import client_for, duck_rows, rows_of
from tests.conftest import exporter_env, start_exporter
from tests.timing import limit

DAY = 86400.0


async def test_a_simulated_day_in_bigquery_equals_duckdb(emulator: Emulator,
                                                         bq: bigquery.Client,
                                                         tmp_path: Path) -> None:
    scenario = load_scenario("default").model_copy(update={"step": 300.0})
    async with SimulatorServer(scenario) as sim:
        cfg = demo_config(scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path,
                          emulator.url)
        dataset = f"day_{uuid.uuid4().hex[:8]}"
        cfg = cfg.model_copy(update={"warehouse": cfg.warehouse.model_copy(update={
            "bigquery": cfg.warehouse.bigquery.model_copy(update={"dataset": dataset})})})
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(limit(30)):
                await exporter.kube.wait_synced()
            await exporter.cycle(sim.cluster.now)
            await step_both(sim, exporter, round(DAY / scenario.step))
            text = exporter.metrics.text
            c = cfg.cluster.encode()
            assert b'gke_gpu_exporter_source_up{cluster="%s",source="bigquery",target="' % c \
                in text
            assert b'gke_gpu_exporter_spool_rows{cluster="%s",sink="bigquery"}' % c in text
            check = await asyncio.to_thread(subprocess.run, ["promtool", "check", "metrics"],
                                            input=text, capture_output=True)
            assert check.returncode == 0, check.stdout + check.stderr
            wh, sink = exporter.warehouse, exporter.bigquery
            assert wh is not None and sink is not None
            wh.flush(sim.cluster.now, partial=True)
            assert await asyncio.to_thread(sink.drain)
            local = {t.name: duck_rows(wh.con, t.name) for t in TABLES}
            assert sink.stats.rows_rejected == {}

    for table in TABLES:
        remote = await asyncio.to_thread(rows_of, bq, sink.cfg, table.name, table.partition_by)
        assert len(remote) == len(local[table.name]), table.name
        assert remote == local[table.name], table.name
    usage = local["gpu_usage"]
    assert len(usage) > 10_000 and len(local["gpu_pods"]) > 100
    (cost, secs), = bq.query_and_wait(
        f"SELECT sum(cost_usd), sum(gpu_seconds) FROM `{sink.ref('gpu_usage')}` "
        "WHERE time IS NOT NULL")
    assert cost == pytest.approx(sum(r["cost_usd"] or 0 for r in usage), abs=1e-6)
    assert secs == pytest.approx(sum(r["gpu_seconds"] for r in usage), abs=1e-6)
    # the weekly report reads the same from either warehouse
    week = week_containing(scenario.start)
    prices = Pricing.of(load_price_book(None, "us-central1"))
    local_store = DuckDBStore(tmp_path / "warehouse.duckdb")
    local = build(local_store, week, prices, 0.995, "demo")
    local_store.close()
    big = build(BigQueryStore(bq, sink.dataset_ref), week, prices, 0.995, "demo")
    assert big.headline == pytest.approx(local.headline)
    assert big.basis is not None and local.basis is not None
    assert headline_text.price_basis(big.basis) == headline_text.price_basis(local.basis)
    assert local.basis.off_list_usd == 0.0   # priced at the book's list prices
    for name, table in local.tables.items():
        other = big.tables[name]
        assert list(other.columns) == list(table.columns), name
        assert len(other) == len(table), name
        if name in ("cost_by_team", "cost_by_node_pool", "availability", "queue",
                    "bottleneck_summary", "savings"):
            pd.testing.assert_frame_equal(other.reset_index(drop=True),
                                          table.reset_index(drop=True), check_dtype=False,
                                          rtol=1e-9)
    # and a what-if reads the same day, its jobs and its layout, from either
    day = Week(scenario.start, scenario.start + timedelta(days=1))
    local_store = DuckDBStore(tmp_path / "warehouse.duckdb")
    big_store = BigQueryStore(bq, sink.dataset_ref)
    jobs = whatif_trace.of_week(local_store, day)
    far_jobs = whatif_trace.of_week(big_store, day)
    assert len(jobs) > 100 and len(far_jobs) == len(jobs)
    for near_job, far_job in zip(jobs, far_jobs, strict=True):
        assert _sums(far_job) == pytest.approx(_sums(near_job), rel=1e-9, abs=1e-9)
        assert dataclasses.replace(far_job, **_sums(near_job)) == near_job
    assert whatif_layout.of_week(big_store, day, None, "demo", "us-central1", 300.0) == \
        whatif_layout.of_week(local_store, day, None, "demo", "us-central1", 300.0)
    near, far = whatif_measure.measure(local_store, day), whatif_measure.measure(big_store, day)
    local_store.close()
    assert far.headline == pytest.approx(near.headline)
    pd.testing.assert_frame_equal(far.teams, near.teams, check_dtype=False, rtol=1e-9)


def _sums(job: whatif_trace.Job) -> dict[str, float]:
    """A job's figures summed over its rows, which the two engines add in their own order
    (those it has)."""
    return {f: v for f in ("utilization", "memory_gib", "run_seconds", "startup_seconds")
            if (v := getattr(job, f)) is not None}


async def _metrics(port: int) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        return await r.text()


def _value(text: str, series: str) -> float:
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def _until(port: int, ok: Callable[[str], bool]) -> str:
    async with asyncio.timeout(limit(60)):
        while True:
            text = await _metrics(port)
            if ok(text):
                return text
            await asyncio.sleep(0.3)


SPOOL = 'gke_gpu_exporter_spool_rows{cluster="default",sink="bigquery"}'
SENT = 'gke_gpu_exporter_rows_written_total{cluster="default",sink="bigquery",table="gpu_usage"}'


async def test_sigkilled_exporter_replays_its_spool_after_restart(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(make_scenario())
    kubeconfig = sim.write_outputs(tmp_path).kubeconfig
    em = Emulator(tmp_path / "bq")                     # not started: BigQuery is down
    path = tmp_path / "w.duckdb"
    env = exporter_env(kubeconfig, path, **{
        "WAREHOUSE__BIGQUERY__ENABLED": "true", "WAREHOUSE__BIGQUERY__PROJECT": PROJECT,
        "WAREHOUSE__BIGQUERY__DATASET": "spool", "WAREHOUSE__BIGQUERY__ENDPOINT": em.url,
        "WAREHOUSE__BIGQUERY__ANONYMOUS": "true", "WAREHOUSE__BIGQUERY__FLUSH_INTERVAL": "0.5",
        "WAREHOUSE__BIGQUERY__DEADLINE": "1", "WAREHOUSE__BIGQUERY__REQUEST_TIMEOUT": "1"})
    proc, port = await start_exporter(env)
    text = await _until(port, lambda t: _value(t, SPOOL) >= 20)
    assert _value(text, SENT) == 0
    proc.send_signal(signal.SIGKILL)                  # no shutdown, no last flush
    await proc.wait()
    await asyncio.to_thread(em.start)                 # BigQuery is back
    try:
        proc, port = await start_exporter(env)
        await _until(port, lambda t: _value(t, SENT) >= 20 and _value(t, SPOOL) == 0)
        proc.terminate()
        async with asyncio.timeout(limit(30)):
            assert await proc.wait() == 0
        con = duck.connect(path, read_only=True)
        local = duck_rows(con, "gpu_usage")
        assert con.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
        con.close()
        cfg = demo_config(make_scenario(), kubeconfig, tmp_path, em.url)
        client = client_for(em)
        remote = rows_of(client, cfg.warehouse.bigquery.model_copy(
            update={"dataset": "spool"}), "gpu_usage", "time")
        assert remote == local and len(local) >= 20
    finally:
        if proc.returncode is None:
            proc.kill()
        await asyncio.to_thread(em.stop)
