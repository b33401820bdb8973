"""The dashboards' GPU counts read the truth at any scrape interval: the exporter cycles
every 30 s (its default) on the simulator; what Prometheus would have scraped from it every
15 s and every 30 s is backfilled into a real Prometheus (``promtool tsdb
create-blocks-from openmetrics``), whose query API answers each panel at many instants.
A rate of the 30 s-step GPU-seconds counter over four 15 s scrapes, as the panels once
read, swings between 2/3 and 4/3 of the truth there."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.demo import caught_up, demo_config, step_both
from exporter.runtime.app import open_exporter
from simulator.scenario import Scenario, load_scenario
from simulator.server import SimulatorServer
from tests.conftest import start_prometheus
from tests.test_dashboards_alerts import BOARDS, grafana_expr
from tests.timing import limit

CYCLE = 30
"""The exporter's default interval, seconds: the simulator's step."""
SCRAPES = (15, 30)
CYCLES = 24
KEPT = ("gke_gpu_state_gpus", "gke_gpu_utilized_gpus", "gke_gpu_gpu_seconds_total",
        "gke_gpu_cluster_available_gpus")
"""The series the GPU-count panels (and the rate they once were) read."""
OLD_ALLOCATED = 'sum(rate(gke_gpu_gpu_seconds_total{cluster=~"$cluster", ' \
    'state="allocated"}[$__rate_interval]))'
""""Allocated GPUs" as it was: GPU-seconds per second over Grafana's rate interval."""


@dataclass(frozen=True, slots=True)
class Cycle:
    at: float
    text: str
    truth: dict[str, float]
    """The simulator's physical GPUs by state the cycle saw."""


async def _cycles(scenario: Scenario, tmp: Path) -> list[Cycle]:
    """The exporter's exposition after each cycle on the simulator, with the truth."""
    out = []
    async with SimulatorServer(scenario) as sim:
        cfg = demo_config(scenario, sim.write_outputs(tmp).kubeconfig, tmp)
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(limit(30)):
                await exporter.kube.wait_synced()
            await sim.advance(1800)  # half an hour of arrivals: pods on most pools
            await caught_up(sim, exporter)
            await exporter.cycle(sim.cluster.now)
            for _ in range(CYCLES):
                await step_both(sim, exporter, 1)
                out.append(Cycle(sim.cluster.now, exporter.metrics.text.decode(),
                                 sim.cluster.gpus_by_state()))
    return out


def _openmetrics(cycles: list[Cycle], scrape: int, cluster: str) -> str:
    """What a Prometheus scraping every ``scrape`` s (7 s after a cycle) would hold, as
    OpenMetrics: at each scrape, the last cycle's series, stamped with the scrape's time."""
    series: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]] = {
        name: {} for name in KEPT}
    parsed = [{(s.name, tuple(sorted((dict(s.labels) | {"cluster": cluster}).items()))): s.value
               for fam in text_string_to_metric_families(c.text) for s in fam.samples
               if s.name in KEPT} for c in cycles]
    at = cycles[0].at + 7
    while at < cycles[-1].at + CYCLE:
        last = max(i for i, c in enumerate(cycles) if c.at <= at)
        for (name, labels), value in parsed[last].items():
            series[name].setdefault(labels, []).append((at, value))
        at += scrape
    lines = []
    for name, by_labels in series.items():
        lines.append(f"# TYPE {name} gauge")
        for labels, points in by_labels.items():
            sel = ",".join(f'{k}="{v}"' for k, v in labels)
            lines += [f"{name}{{{sel}}} {v!r} {t:.3f}" for t, v in points]
    return "\n".join([*lines, "# EOF"]) + "\n"


def _truth_at(cycles: list[Cycle], scrape: int, at: float) -> dict[str, float]:
    """The truth of the cycle whose series the last scrape before ``at`` found."""
    scraped = cycles[0].at + 7 + (at - cycles[0].at - 7) // scrape * scrape
    return max((c for c in cycles if c.at <= scraped), key=lambda c: c.at).truth


async def _values(s: aiohttp.ClientSession, url: str, expr: str, at: float
                  ) -> dict[str, float]:
    async with s.get(f"{url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}) as r:
        body: dict[str, Any] = await r.json()
    assert body["status"] == "success", (expr, body)
    return {r["metric"].get("state", ""): float(r["value"][1]) for r in body["data"]["result"]}


def _panel(board: str, title: str) -> str:
    (p,) = [p for p in BOARDS[board]["panels"] if p["title"] == title]
    return str(p["targets"][0]["expr"])


PANELS: dict[str, Callable[[dict[str, float]], dict[str, float]]] = {
    "Allocated GPUs": lambda t: {"": t["allocated"]},
    "Unavailable GPUs": lambda t: {"": t["unavailable"]},
    "GPUs by state": lambda t: {k: v for k, v in t.items() if v},
    "Available GPUs": lambda t: {"": t["allocated"] + t["unallocated"]},  # none is down
}
"""Each overview panel's value (by state) from the truth."""


@pytest.mark.timeout(240)
async def test_gpu_count_panels_read_the_truth_at_15s_and_30s_scrapes(tmp_path: Path) -> None:
    now = time.time()
    start = now - now % CYCLE - 3 * 3600   # within the retention, before the head
    scenario = load_scenario("default")    # the demo's cluster, 30 s steps
    assert scenario.step == CYCLE
    cycles = await _cycles(scenario.model_copy(
        update={"start": datetime.fromtimestamp(start, UTC)}), tmp_path)
    assert all(c.truth["allocated"] > 0 and c.truth["unavailable"] == 0 for c in cycles)
    assert len({c.truth["allocated"] for c in cycles}) > 1  # the allocation changes
    data = tmp_path / "openmetrics.txt"
    data.write_text("".join(_openmetrics(cycles, s, f"s{s}")[:-len("# EOF\n")]
                            for s in SCRAPES) + "# EOF\n")
    proc = await asyncio.to_thread(
        subprocess.run, ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q",
                         str(data), str(tmp_path / "tsdb")], capture_output=True, text=True,
        timeout=limit(120), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    prometheus, url = await start_prometheus(tmp_path, {"scrape_configs": []})
    try:
        async with aiohttp.ClientSession() as s:
            for scrape in SCRAPES:
                window = f"{4 * scrape}s"  # Grafana's $__rate_interval: four scrapes
                old = []
                # every 7 s from the fifth scrape to the end: every phase of both cadences
                for at in range(int(cycles[0].at) + 5 * scrape, int(cycles[-1].at), 7):
                    truth = _truth_at(cycles, scrape, at)
                    for title, expected in PANELS.items():
                        expr = grafana_expr(_panel("overview.json", title),
                                            cluster=f"s{scrape}")
                        assert await _values(s, url, expr, at) == pytest.approx(
                            expected(truth)), (scrape, title, at)
                    expr = grafana_expr(OLD_ALLOCATED, cluster=f"s{scrape}").replace(
                        "[1m]", f"[{window}]")
                    old.append((await _values(s, url, expr, at))[""] / truth["allocated"])
                if scrape == 15:  # the counters move every other scrape: the rate aliases
                    assert min(old) < 0.75 and max(old) > 1.25, old
    finally:
        prometheus.terminate()
        await prometheus.wait()
