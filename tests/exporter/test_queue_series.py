"""Queue series on the simulator: the GPU model of each wait, and the histogram's buckets."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.demo import caught_up, demo_config, step_both
from exporter.model.durations import parse_duration
from exporter.model.totals import QUEUE_BUCKETS
from exporter.runtime.app import open_exporter
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.conftest import scenario_data
from tests.exporter.test_exporter import families
from tests.timing import limit

METRICS_DOC = Path(__file__).parents[2] / "docs" / "metrics.md"
QUEUE_FAMILIES = ("gke_gpu_queue_wait_seconds_count", "gke_gpu_pending_pods")


async def test_model_comes_from_the_selector_else_the_node(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    plain = {"name": "plain", "kind": "finetuning", "namespace": "team-b",
             "accelerator": "nvidia-h100-80gb", "gpus_per_pod": 8, "arrivals_per_day": 0,
             "accelerator_selector": False}
    sim: SimulatorServer = await make_server(make_scenario(
        workloads=[*scenario_data()["workloads"], plain]))
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        sim.cluster.submit("plain", run_seconds=3600)   # takes the one H100 node
        sim.cluster.submit("plain", run_seconds=3600)   # so this one waits
        sim.cluster.submit("shared", run_seconds=3600)
        await caught_up(sim, exporter)
        await exporter.cycle(sim.cluster.now)
        await step_both(sim, exporter, 1)
        fams = families(exporter.metrics.text)
        assert exporter.warehouse is not None
        exporter.warehouse.flush(sim.cluster.now)
        stored = exporter.warehouse.con.execute(
            "SELECT scheduled IS NOT NULL, gpu_model FROM gpu_pods_current "
            "WHERE namespace = 'team-b' ORDER BY ALL").fetchall()
    assert stored == [(False, None), (True, "nvidia-h100-80gb")]   # the warehouse alike
    got = {(name, labels["namespace"], labels["model"]): value
           for name in QUEUE_FAMILIES for labels, value in fams.get(name, [])}
    assert got == {
        # (family, namespace, model): value
        ("gke_gpu_queue_wait_seconds_count", "team-b", "nvidia-h100-80gb"): 1,  # its node's
        ("gke_gpu_queue_wait_seconds_count", "team-a", "nvidia-l4"): 1,  # its selector's
        ("gke_gpu_pending_pods", "team-b", ""): 1,  # no selector, no node yet: no model
    }


def test_metrics_page_lists_the_queue_wait_buckets() -> None:
    row = next(ln for ln in METRICS_DOC.read_text().splitlines()
               if ln.startswith("| `queue_wait_seconds` |"))
    listed = re.search(r"buckets \(`le`\): ([^|]+)", row)
    assert listed is not None, row
    assert tuple(parse_duration(b) for b in listed[1].strip().split(", ")) == QUEUE_BUCKETS
