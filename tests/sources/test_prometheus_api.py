"""DCGM through a Prometheus HTTP API: the vector's labels read like dcgm-exporter's, and a
real Prometheus scraping the simulated cluster gives the exporter the same GPUs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from exporter.demo import demo_config
from exporter.model.records import PodOnDevice
from exporter.runtime.app import open_exporter
from exporter.sources.prometheus_api import readings
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.conftest import start_prometheus
from tests.timing import limit

U = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"


def sample(name: str, value: str, **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": name, "UUID": U, "gpu": "0", "Hostname": "node-a",
                       "modelName": "NVIDIA L4", **labels}, "value": [1700000000.0, value]}


def test_vector_labels_read_like_dcgm_exporter() -> None:
    result = readings([
        # a ServiceMonitor without honorLabels: the GPU's pod is in exported_*
        sample("DCGM_FI_DEV_GPU_UTIL", "42", exported_pod="train-0",
               exported_namespace="ml", exported_container="main",
               pod="dcgm-exporter-abc", namespace="gke-managed-system",
               instance="10.0.0.1:9400", job="dcgm"),
        sample("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.5", exported_pod="train-0",
               exported_namespace="ml", exported_container="main"),
        sample("DCGM_FI_PROF_SM_ACTIVE", "9223372036854775794"),   # blank sentinel
        sample("DCGM_FI_DEV_FB_USED", "NaN"),
        sample("DCGM_FI_DEV_FB_FREE", "not-a-number"),
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "1"}, "value": [0, "1"]},
        # a GPU no pod holds: only the dcgm-exporter pod's own labels are there
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-free", "gpu": "1",
                    "pod": "dcgm-exporter-abc", "namespace": "gke-managed-system"},
         "value": [0, "0"]},
    ], max_devices=16, exporter_namespace="gke-managed-system")
    d, free = result.devices
    assert free.uuid == "GPU-free" and free.pods == []
    assert d.fields == {"DCGM_FI_DEV_GPU_UTIL": 42.0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.5}
    assert d.pods == [PodOnDevice("ml", "train-0", "main")] and d.hostname == "node-a"
    assert result.rejected == {"blank": 1, "not_finite": 1, "malformed": 1, "no_gpu_uuid": 1}


async def test_exporter_reads_the_cluster_through_a_real_prometheus(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(make_scenario())
    for workload in ("train", "shared", "shared", "slice"):   # whole, time-shared, MIG
        sim.cluster.submit(workload, run_seconds=3600)
    await sim.advance(600)
    outputs = sim.write_outputs(tmp_path)
    targets = [t.removeprefix("http://").removesuffix("/metrics")
               for t in outputs.targets.read_text().split() if t.startswith("http")]
    # target labels pod/namespace, as a ServiceMonitor adds: the scraped ones become exported_*
    prometheus, url = await start_prometheus(tmp_path, {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "dcgm", "static_configs": [
            {"targets": targets, "labels": {"pod": "dcgm-exporter-x",
                                            "namespace": "gke-managed-system"}}]}]})
    try:
        async with aiohttp.ClientSession() as s, asyncio.timeout(limit(60)):
            while True:  # every target scraped at least once
                try:
                    async with s.get(f"{url}/api/v1/query",
                                     params={"query": 'count(up{job="dcgm"} == 1)'}) as r:
                        result = (await r.json())["data"]["result"]
                        if result and int(result[0]["value"][1]) == len(targets):
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.3)
        direct = demo_config(sim.scenario, outputs.kubeconfig, tmp_path / "a")
        via = direct.model_copy(update={"dcgm": direct.dcgm.model_copy(update={
            "prometheus": direct.dcgm.prometheus.model_copy(update={"url": url})})})
        states = []
        for base in (direct, via):
            cfg = base.model_copy(update={"warehouse": base.warehouse.model_copy(
                update={"enabled": False})})
            async with open_exporter(cfg) as exporter:
                await exporter.kube.wait_synced()
                await exporter.cycle(sim.cluster.now)
                states.append({d.device_id: (d.state, d.utilization, d.node,
                                             sorted(o.name for o in d.owners))
                               for d in exporter.states})
                if base is via:
                    assert exporter.health.up == {("dcgm", url): True}
        assert states[0] == states[1] and len(states[0]) > 10
        assert any(owners for _, _, _, owners in states[1].values())
    finally:
        prometheus.terminate()
        await prometheus.wait()
