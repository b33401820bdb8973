"""A Kubernetes API outage costs no figure: the exporter goes on with its last good view."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exporter.demo import caught_up, demo_config, step_both
from exporter.runtime.app import open_exporter
from exporter.runtime.readiness import VIEW_KINDS
from exporter.runtime.service import Exporter
from simulator.scenario import Scenario
from tests.exporter.test_exporter import families
from tests.timing import limit

BEFORE, OUTAGE, AFTER = 3, 2, 3
"""Cycles (one per 30 s step) before, during and after the outage: it lasts a minute."""
JOBS = ("train", "shared", "slice", "spotjob")


@dataclass
class Run:
    cost_usd: dict[Any, float]
    gpu_seconds: dict[Any, float]
    queue_waits: float
    states: list[list[tuple[str, str, tuple[str, ...]]]]
    """Each cycle's GPU states during the outage's cycles: (device, state, pods)."""
    kube_up: list[set[float]]
    kube_errors: dict[str, float]


def states(exporter: Exporter) -> list[tuple[str, str, tuple[str, ...]]]:
    return sorted((d.device_id, d.state, tuple(sorted(o.uid for o in d.owners)))
                  for d in exporter.states)


async def failed_again(exporter: Exporter) -> None:
    """Wait until every kind of the view has failed once more, a list among its failures."""
    stats = {k: exporter.kube.stats[k] for k in VIEW_KINDS}
    seen = {k: st.errors for k, st in stats.items()}
    async with asyncio.timeout(limit(20)):
        while any(st.errors < 2 or st.errors == seen[k]  # noqa: ASYNC110 - the watches'
                  for k, st in stats.items()):
            await asyncio.sleep(0.01)


async def run(make_server: Callable[..., Any], scenario: Scenario, out: Path,
              status: int | None) -> Run:
    """Jobs running, a minute in which the API answers ``status`` (None: no fault)."""
    sim = await make_server(scenario)
    for job in JOBS:
        sim.cluster.submit(job, run_seconds=3600)
    cfg = demo_config(sim.scenario, sim.write_outputs(out).kubeconfig, out)
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        await exporter.cycle(sim.cluster.now)
        await step_both(sim, exporter, BEFORE)
        if status is not None:
            sim.api.set_down(3600, status=status)
            sim.api.end_watches()
        during, up = [], []
        for _ in range(OUTAGE):
            if status is not None:  # each kind has failed to list again since the last cycle
                await failed_again(exporter)
            await sim.advance(sim.cluster.step)
            if status is None:
                await caught_up(sim, exporter)
            await exporter.cycle(sim.cluster.now)
            during.append(states(exporter))
            up.append({v for lbl, v in families(exporter.metrics.text)[
                "gke_gpu_exporter_source_up"] if lbl["source"] == "kubernetes"
                and lbl["target"] in VIEW_KINDS})
        sim.api.set_down(0)
        async with asyncio.timeout(limit(60)):
            while not all(exporter.kube.up[k]  # noqa: ASYNC110 - the watches' state
                          for k in VIEW_KINDS):
                await asyncio.sleep(0.01)
            await step_both(sim, exporter, AFTER)
        errors = {lbl["target"]: v for lbl, v in families(exporter.metrics.text)[
            "gke_gpu_exporter_errors_total"] if lbl.get("reason") == f"http_{status}"
            and lbl["target"] in VIEW_KINDS}
        t = exporter.totals
        return Run(dict(t.cost_usd), dict(t.gpu_seconds),
                   sum(h.count for h in t.queue_hist.values()), during, up, errors)


async def test_a_minute_of_503s_changes_no_figure(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """The same cost, GPU-seconds, queue waits (no pod seen twice) and GPU states as a run
    without the outage; during it, Kubernetes is down, each failure counted as http_503."""
    calm = await run(make_server, make_scenario(), tmp_path / "calm", None)
    outage = await run(make_server, make_scenario(), tmp_path / "outage", 503)
    assert calm.queue_waits == len(JOBS)
    assert outage.queue_waits == calm.queue_waits
    assert outage.gpu_seconds == pytest.approx(calm.gpu_seconds)
    assert outage.cost_usd == pytest.approx(calm.cost_usd)
    assert sum(calm.cost_usd.values()) > 0
    assert outage.states == calm.states
    assert calm.kube_up == [{1.0}] * OUTAGE and outage.kube_up == [{0.0}] * OUTAGE
    assert set(outage.kube_errors) == {"namespaces", "nodes", "pods"}
    assert all(n >= 1 for n in outage.kube_errors.values())
