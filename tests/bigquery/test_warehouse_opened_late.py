"""A warehouse that could not be opened at start sends its rows to BigQuery once it opens."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from google.cloud import bigquery

from exporter.demo import demo_config, step_both
from exporter.google.bigquery_emulator import Emulator
from exporter.runtime.app import open_exporter
from exporter.sinks.schema import GPU_USAGE
from simulator.scenario import load_scenario
from simulator.server import SimulatorServer
from tests.bigquery.conftest import duck_rows, rows_of
from tests.timing import limit


async def test_bigquery_starts_once_the_warehouse_opens(emulator: Emulator,
                                                        bq: bigquery.Client,
                                                        tmp_path: Path) -> None:
    scenario = load_scenario("default").model_copy(update={"step": 300.0})
    async with SimulatorServer(scenario) as sim:
        cfg = demo_config(scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path,
                          emulator.url)
        bq_cfg = cfg.warehouse.bigquery.model_copy(
            update={"dataset": f"late_{uuid.uuid4().hex[:8]}"})
        cfg = cfg.model_copy(update={"warehouse": cfg.warehouse.model_copy(update={
            "bigquery": bq_cfg, "flush_interval": 600.0})})
        path = cfg.warehouse.path
        path.write_bytes(b"\x00not a DuckDB file\n" * 4096)
        async with open_exporter(cfg) as exporter:
            opening = exporter.warehouse_opening
            assert opening is not None and exporter.bigquery is None
            opening.retry_seconds = scenario.step
            async with asyncio.timeout(limit(30)):
                await exporter.kube.wait_synced()
            await step_both(sim, exporter, 3)
            assert exporter.warehouse is None and exporter.bigquery is None
            path.rename(path.with_name(path.name + ".damaged"))
            await step_both(sim, exporter, 6)
            wh, sink = exporter.warehouse, exporter.bigquery
            assert wh is not None and sink is not None
            wh.flush(sim.cluster.now, partial=True)
            assert await asyncio.to_thread(sink.drain)
            local = duck_rows(wh.con, GPU_USAGE.name)
    assert local
    remote = await asyncio.to_thread(rows_of, bq, sink.cfg, GPU_USAGE.name,
                                     GPU_USAGE.partition_by)
    assert remote == local
