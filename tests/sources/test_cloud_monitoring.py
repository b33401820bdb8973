"""DCGM from Cloud Monitoring, over gRPC to a MetricService that answers as Google documents
(tests/cloud_monitoring_fake.py): GMP's DCGM series read like dcgm-exporter's, GKE's system
metrics are the fallback, and a simulated cluster read this way gives the same GPUs as
scraping it."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.cloud.monitoring_v3 import TimeSeries

from exporter.demo import demo_config
from exporter.errors import SourceDataError, SourceUnavailable
from exporter.google.monitoring import metric_client
from exporter.model import compute
from exporter.model.records import PodOnDevice, TargetScrape
from exporter.runtime.app import open_exporter
from exporter.sources.cloud_monitoring import CloudMonitoringSource
from simulator.exposition import render_node
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.cloud_monitoring_fake import FakeMetricService, series_from_json
from tests.conftest import FIXTURES
from tests.simulator.dcgm_text import samples

CM = FIXTURES / "cloud_monitoring"
NOW = datetime(2026, 11, 23, 10, 0, 35, tzinfo=UTC).timestamp()
FIELDS = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"]
A, B = "GPU-5a2a1c2e-9d8b-4f59-a0f3-3f6b1c7d9e01", "GPU-0b7e4d21-6c3a-4e8f-9a15-2d4c6e8f1a22"
C = "GPU-7c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"


def source(address: str, **kw: Any) -> CloudMonitoringSource:
    args: dict[str, Any] = {"timeout_seconds": 10.0, "lookback_seconds": 180.0,
                            "exporter_namespace": "gke-managed-system", "clock": lambda: NOW}
    args.update(kw)
    return CloudMonitoringSource(metric_client(address, anonymous=True), "gpu-prod-1", "prod",
                                 FIELDS, **args)


async def test_gmp_dcgm_series_read_like_dcgm_exporter(
        metric_service: tuple[FakeMetricService, str]) -> None:
    service, address = metric_service
    service.add(series_from_json(CM / "gmp_dcgm.json"))
    src = source(address)
    (res,) = await src.fetch([src.target])
    assert isinstance(res, TargetScrape) and res.complete
    got = {d.uuid: d for d in res.result.devices}
    # the newest point of each series; the workload's namespace from the resource
    assert got[A].fields == {"DCGM_FI_DEV_GPU_UTIL": 97.0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.62,
                             "DCGM_FI_DEV_FB_USED": 61234.0}
    assert got[A].pods == [PodOnDevice("ml", "train-0", "main")]
    assert got[A].hostname == "gke-prod-h100-a" and got[A].model_name == "NVIDIA H100 80GB HBM3"
    assert got[B].pods == [] and got[B].fields["DCGM_FI_DEV_GPU_UTIL"] == 0.0  # idle, known
    # exported_* (pod metadata on the scrape) name the workload, not the dcgm-exporter pod
    assert got[C].pods == [PodOnDevice("web", "serve-1", "infer")]
    assert got[C].fields == {"DCGM_FI_DEV_GPU_UTIL": 55.0, "DCGM_FI_DEV_FB_USED": 9000.0}
    assert res.result.rejected == {"blank": 1}
    # one metric type per request, the cluster and resource type in each filter
    assert sorted(service.lists) == sorted(
        f'metric.type = "prometheus.googleapis.com/{f}/gauge" AND resource.type = '
        f'"prometheus_target" AND resource.labels.cluster = "prod"' for f in FIELDS)


async def test_pages_are_followed(metric_service: tuple[FakeMetricService, str]) -> None:
    service, address = metric_service
    service.add(series_from_json(CM / "gmp_dcgm.json"))
    service.page_points = 1
    src = source(address)
    (res,) = await src.fetch([src.target])
    assert isinstance(res, TargetScrape) and len(res.result.devices) == 3
    assert len(service.lists) > len(FIELDS)


async def test_without_dcgm_the_gke_system_metrics_are_read(
        metric_service: tuple[FakeMetricService, str]) -> None:
    service, address = metric_service
    service.add(series_from_json(CM / "gke_system_accelerator.json"))
    src = source(address)
    (res,) = await src.fetch([src.target])
    assert isinstance(res, TargetScrape) and not res.complete  # per container: idle GPUs unseen
    (d,) = res.result.devices
    assert (d.uuid, d.model_name, d.hostname) == (A, "NVIDIA H100 80GB HBM3", "")
    assert d.pods == [PodOnDevice("ml", "train-0", "main")]
    assert d.fields == {compute.DUTY_CYCLE: 97.0, compute.ACCELERATOR_MEMORY_USED: 64209010688.0,
                        compute.ACCELERATOR_MEMORY_TOTAL: 85520809984.0}
    assert compute.utilization(d.fields) == (0.97, "duty_cycle")
    assert any('resource.type = "k8s_container" AND resource.labels.cluster_name = "prod"' in f
               for f in service.lists)
    (off,) = await source(address, fallback=False).fetch([src.target])
    assert isinstance(off, SourceDataError)


@pytest.mark.parametrize(("code", "says"), [
    (grpc.StatusCode.PERMISSION_DENIED, "roles/monitoring.viewer"),
    (grpc.StatusCode.INVALID_ARGUMENT, "InvalidArgument"),
])
async def test_a_failed_query_is_the_source_down(metric_service: tuple[FakeMetricService, str],
                                                 code: grpc.StatusCode, says: str) -> None:
    service, address = metric_service
    service.add(series_from_json(CM / "gmp_dcgm.json"))
    service.list_errors = [code]
    src = source(address)
    (res,) = await src.fetch([src.target])
    assert isinstance(res, SourceUnavailable) and says in res.reason
    (again,) = await src.fetch([src.target])   # the next interval reads again
    assert isinstance(again, TargetScrape)


def test_a_cluster_name_that_would_break_the_filter_is_refused() -> None:
    with pytest.raises(ValueError, match="filter"):
        CloudMonitoringSource(object(), "gpu-prod-1", 'prod" OR metric.type = "x',  # type: ignore[arg-type]
                              FIELDS, 10.0, 180.0)


# ---------------------------------------------------------------------------- end to end


def gmp_series(text: str, now: float, cluster: str) -> list[Any]:
    """A node's dcgm-exporter text as GMP stores it (node a's layout in gmp_dcgm.json)."""
    out = []
    for s in samples(text):
        labels = {k: v for k, v in s.labels.items() if v}   # empty labels are no labels
        namespace = labels.pop("namespace", "gke-managed-system")
        ts = TimeSeries.pb()()
        ts.metric.type = f"prometheus.googleapis.com/{s.name}/gauge"
        ts.metric.labels.update(labels)
        ts.resource.type = "prometheus_target"
        ts.resource.labels.update({"project_id": "gpu-prod-1", "location": "us-central1",
                                   "cluster": cluster, "namespace": namespace,
                                   "job": "gke-managed-dcgm-exporter",
                                   "instance": f"{labels.get('Hostname', '')}:9400"})
        p = ts.points.add()
        p.interval.end_time.FromNanoseconds(int(now * 1e9))
        p.value.double_value = s.value
        out.append(ts)
    return out


def system_series(text: str, now: float, cluster: str) -> list[Any]:
    """What GKE's system metrics hold for the same GPUs: per container, GPUs in use only."""
    out = []
    for s in samples(text):
        lab = s.labels
        if not lab.get("pod") or s.name not in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
            continue
        metric = "duty_cycle" if s.name == "DCGM_FI_DEV_GPU_UTIL" else "memory_used"
        ts = TimeSeries.pb()()
        ts.metric.type = f"kubernetes.io/container/accelerator/{metric}"
        ts.metric.labels.update({"make": "nvidia", "model": lab["modelName"],
                                 "accelerator_id": lab["UUID"]})
        ts.resource.type = "k8s_container"
        ts.resource.labels.update({"project_id": "gpu-prod-1", "location": "us-central1",
                                   "cluster_name": cluster, "namespace_name": lab["namespace"],
                                   "pod_name": lab["pod"], "container_name": lab["container"]})
        p = ts.points.add()
        p.interval.end_time.FromNanoseconds(int(now * 1e9))
        p.value.int64_value = int(s.value if metric == "duty_cycle" else s.value * 1024 * 1024)
        out.append(ts)
    return out


async def _states(sim: SimulatorServer, tmp_path: Path, address: str | None
                  ) -> dict[str, tuple[Any, ...]]:
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path / "w")
    cfg = cfg.model_copy(update={"warehouse": cfg.warehouse.model_copy(
        update={"enabled": False})})
    if address:
        cfg = cfg.model_copy(update={"dcgm": cfg.dcgm.model_copy(update={
            "cloud_monitoring": cfg.dcgm.cloud_monitoring.model_copy(update={
                "project": "gpu-prod-1", "endpoint": address, "anonymous": True})})})
    async with open_exporter(cfg) as exporter:
        await exporter.kube.wait_synced()
        await exporter.cycle(sim.cluster.now)
        if address:
            assert list(exporter.health.up.values()) == [True]
        return {d.device_id: (d.state, d.utilization, d.utilization_source, d.node,
                              sorted(o.name for o in d.owners)) for d in exporter.states}


async def test_a_simulated_cluster_through_cloud_monitoring_matches_scraping_it(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        metric_service: tuple[FakeMetricService, str], tmp_path: Path) -> None:
    service, address = metric_service
    sim: SimulatorServer = await make_server(make_scenario())
    for workload in ("train", "shared", "shared", "slice"):   # whole, time-shared, MIG
        sim.cluster.submit(workload, run_seconds=3600)
    await sim.advance(600)
    cluster = sim.scenario.cluster
    for node in sim.cluster.live_nodes():
        service.add(gmp_series(render_node(sim.cluster, node), time.time() - 20, cluster))
    direct = await _states(sim, tmp_path / "a", None)
    via = await _states(sim, tmp_path / "b", address)
    assert via == direct and len(direct) > 10
    assert any(owners for *_, owners in via.values())


async def test_gke_system_metrics_give_the_gpus_in_use(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        metric_service: tuple[FakeMetricService, str], tmp_path: Path) -> None:
    service, address = metric_service
    sim: SimulatorServer = await make_server(make_scenario())
    for workload in ("train", "shared"):
        sim.cluster.submit(workload, run_seconds=3600)
    await sim.advance(600)
    for node in sim.cluster.live_nodes():
        service.add(system_series(render_node(sim.cluster, node), time.time() - 20,
                                  sim.scenario.cluster))
    direct = await _states(sim, tmp_path / "a", None)
    via = await _states(sim, tmp_path / "b", address)
    held = {k: v for k, v in direct.items() if v[0] == "allocated"}
    seen = {k: v for k, v in via.items() if "/k8s-" not in k}
    assert held and set(seen) == set(held)
    for device, (state, _, _, node, owners) in seen.items():
        assert (state, node, owners) == (held[device][0], held[device][3], held[device][4])
        assert via[device][2] == "duty_cycle"
    # idle GPUs, never in a container's readings, are the ones Kubernetes counts: idle
    assert {v[0] for k, v in via.items() if k not in seen} == {"unallocated"}
    assert Counter(v[3] for v in via.values()) == Counter(v[3] for v in direct.values())
