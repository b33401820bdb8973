"""A day of churn (jobs coming and going, spot VMs replaced, XIDs) leaves /metrics the size
it had after eight hours, once every kind of job has run: series of finished pods, deleted
nodes and retired GPUs go."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from exporter.demo import demo_config, step_both
from exporter.model.totals import KEEP_ENDED_PODS, Totals
from exporter.runtime.app import open_exporter
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.timing import limit

STEP = 300.0
HOUR = 3600.0


def churn(make_scenario: Callable[..., Scenario]) -> Scenario:
    faults: list[dict[str, Any]] = [
        {"at": f"{h}h", "kind": "spot_preemption", "pool": "t4-spot"} for h in range(1, 24, 2)]
    faults += [{"at": f"{h}h30m", "kind": "xid", "node": "h100/0", "gpu": h % 8, "code": 79,
                "duration": "20m"} for h in range(0, 24, 3)]
    rates = {"train": 4, "urgent": 2, "half": 8, "shared": 60, "slice": 60, "spotjob": 24}
    base = make_scenario()
    workloads = [w.model_dump(mode="json", exclude_none=True) | {
        "arrivals_per_day": rates[w.name], "duration": ["20m", "2h"]}
        for w in base.workloads]
    return make_scenario(step=STEP, faults=faults, workloads=workloads)


def series(text: bytes) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    return [(s.name, tuple(sorted(s.labels.items())))
            for fam in text_string_to_metric_families(text.decode()) for s in fam.samples]


async def test_a_day_of_churn_keeps_metrics_bounded(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(churn(make_scenario))
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(30)):
            await exporter.kube.wait_synced()
        counts: dict[float, int] = {}
        for hour in range(1, 25):
            await step_both(sim, exporter, round(HOUR / STEP))
            counts[hour] = len(series(exporter.metrics.text))
        got = series(exporter.metrics.text)
        live_pods = {p.name for p in exporter.kube.pods.values()}
        live_nodes = set(exporter.kube.nodes)
        live_gpus = {d.gpu_uuid for d in exporter.states} | {
            i.gpu_uuid for devs in exporter.inventory.devices.values() for i in devs.values()}
        replaced = len(exporter.totals.interruptions) and sum(
            exporter.totals.interruptions.values())
    assert replaced >= 6, "spot VMs were replaced over the day"
    assert {dict(labels)["pod"] for _, labels in got if "pod" in dict(labels)} <= live_pods
    assert {dict(labels)["node"] for _, labels in got if "node" in dict(labels)} <= live_nodes
    assert {dict(labels)["uuid"] for _, labels in got if "uuid" in dict(labels)} <= live_gpus
    assert counts[24] <= counts[8] * 1.05, counts


def test_per_pod_sums_are_kept_for_the_last_pods_gone_only() -> None:
    totals = Totals()
    for n in range(KEEP_ENDED_PODS + 5):
        totals.pod_seconds[f"uid-{n}"] = 30.0
        totals.pod_ended(f"uid-{n}")
    assert len(totals.pod_seconds) == KEEP_ENDED_PODS
    assert "uid-4" not in totals.pod_seconds and f"uid-{KEEP_ENDED_PODS + 4}" in \
        totals.pod_seconds
