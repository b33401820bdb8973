"""The exporter's figures written to Cloud Monitoring as custom metrics, over gRPC to a
MetricService that enforces Google's write rules (tests/cloud_monitoring_fake.py)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from exporter.backoff import Backoff
from exporter.google.monitoring import metric_client
from exporter.metrics.families import MetricsView
from exporter.sinks.cloud_monitoring import CloudMonitoringWriter
from simulator.exposition import render_node
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.cloud_monitoring_fake import FakeMetricService
from tests.conftest import start_exporter
from tests.exporter.views import gpus_up, view_of
from tests.sources.test_cloud_monitoring import gmp_series
from tests.timing import limit

T0 = 1_800_000_000.0
STARTED = T0 - 3600


def snapshot(gpus: int, cost: float = 1.0) -> MetricsView:
    """A cycle with ``gpus`` up-time series (a counter each) and one owner's cost."""
    return view_of(gpus_up(gpus, cost))


def writer(address: str, **kw: Any) -> CloudMonitoringWriter:
    args: dict[str, Any] = {"families": ["up_seconds", "cost_usd"],
                            "started": STARTED, "interval": 60.0, "requests_per_second": 1000.0,
                            "backoff": Backoff(base=0.01, cap=0.05)}
    args.update(kw)
    return CloudMonitoringWriter(metric_client(address, anonymous=True), "gpu-prod-1",
                                 "us-central1", "prod", **args)


async def drain(w: CloudMonitoringWriter, until: Any, seconds: float = 10.0) -> None:
    task = asyncio.create_task(w.run())
    try:
        async with asyncio.timeout(seconds):
            while True:
                if until():
                    break
                await asyncio.sleep(0.01)
    finally:
        task.cancel()


async def test_a_snapshot_is_written_in_batches_of_at_most_200(
        metric_service: tuple[FakeMetricService, str]) -> None:
    service, address = metric_service
    w = writer(address)
    w.add_cycle(snapshot(450), T0)
    await drain(w, lambda: w.stats.points_written == 451)
    assert [n for _, n in service.creates] == [200, 200, 51]
    key = next(k for k in service.written if k[0] == "custom.googleapis.com/gke_gpu/cost_usd")
    (point,) = service.written[key]
    assert point.interval.start_time.seconds == STARTED and point.interval.end_time.seconds == T0
    assert dict(key[3]) == {"project_id": "gpu-prod-1", "location": "us-central1",
                            "cluster_name": "prod"} and key[2] == "k8s_cluster"
    assert dict(key[1]) == {"state": "allocated", "namespace": "ml", "team": "ml",
                            "pool": "a100", "model": "nvidia-tesla-a100",
                            "provisioning": "on-demand"}
    # the next interval's snapshot; one offered before the interval is over is not taken
    w.add_cycle(snapshot(450, cost=2.0), T0 + 30)
    w.add_cycle(snapshot(450, cost=3.0), T0 + 60)
    await drain(w, lambda: w.stats.points_written == 902)
    assert [p.value.double_value for p in service.written[key]] == [1.0, 3.0]
    assert w.stats.points_refused == 0 and w.stats.points_dropped == 0


async def test_requests_are_paced(metric_service: tuple[FakeMetricService, str]) -> None:
    """Five requests at 50 a second are sent at least four gaps of 20 ms apart. The server
    sees each when it arrives, and a loaded machine may delay any of them on the way, so
    gaps between arrivals prove nothing; what cannot be delayed is the start. The last
    request cannot arrive before four gaps after the writer began, however late the first
    one landed; unpaced, all five arrive within a few milliseconds."""
    service, address = metric_service
    w = writer(address, batch_size=10, requests_per_second=50.0)
    w.add_cycle(snapshot(49), T0)
    began = time.monotonic()
    await drain(w, lambda: w.stats.points_written == 50)
    times = [t for t, _ in service.creates]
    assert len(times) == 5 and times[-1] - began >= 4 * 0.02 - 0.001  # clock resolution


async def test_failures_that_may_pass_are_retried(
        metric_service: tuple[FakeMetricService, str]) -> None:
    service, address = metric_service
    service.create_errors = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED]
    w = writer(address)
    w.add_cycle(snapshot(3), T0)
    await drain(w, lambda: w.stats.points_written == 4)
    assert w.stats.retries == 2 and w.stats.up and len(service.written) == 4


async def test_refused_series_are_counted_and_never_retried(
        metric_service: tuple[FakeMetricService, str]) -> None:
    service, address = metric_service
    service.refuse = {"custom.googleapis.com/gke_gpu/cost_usd"}
    w = writer(address)
    w.add_cycle(snapshot(3), T0)
    await drain(w, lambda: w.stats.points_written + w.stats.points_refused == 4)
    await asyncio.sleep(0.1)
    assert (w.stats.points_written, w.stats.points_refused, w.stats.retries) == (3, 1, 0)
    assert len(service.creates) == 1   # partial success: the summary said which were written


async def _until(ok: Callable[[], bool]) -> None:
    async with asyncio.timeout(limit(10)):
        while True:
            if ok():
                return
            await asyncio.sleep(0.01)


async def test_a_newer_snapshot_supersedes_one_that_cannot_be_written(
        metric_service: tuple[FakeMetricService, str]) -> None:
    service, address = metric_service
    service.create_errors = [grpc.StatusCode.UNAVAILABLE] * 1000
    w = writer(address)
    task = asyncio.create_task(w.run())
    try:
        w.add_cycle(snapshot(3), T0)
        await asyncio.sleep(0.3)
        assert not w.stats.up and w.stats.retries > 0
        w.add_cycle(snapshot(3, cost=9.0), T0 + 60)
        await _until(lambda: w.stats.points_dropped >= 4)  # the old one gives way
        service.create_errors.clear()
        await _until(lambda: w.stats.points_written >= 4)
    finally:
        task.cancel()
    assert w.stats.points_dropped == 4 and w.stats.up
    (cost,) = [v for k, v in service.written.items() if k[0].endswith("/cost_usd")]
    assert [p.value.double_value for p in cost] == [9.0]   # only the newer point


async def test_the_service_reads_dcgm_from_and_writes_figures_to_cloud_monitoring(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        metric_service: tuple[FakeMetricService, str], tmp_path: Path) -> None:
    service, address = metric_service
    sim: SimulatorServer = await make_server(make_scenario())
    sim.cluster.submit("train", run_seconds=3600)
    await sim.advance(300)
    for node in sim.cluster.live_nodes():
        service.add(gmp_series(render_node(sim.cluster, node), time.time() - 20,
                               sim.scenario.cluster))
    env = os.environ | {
        "GKE_GPU_EXPORTER_INTERVAL": "2", "GKE_GPU_EXPORTER_PORT": "0",
        "GKE_GPU_EXPORTER_LISTEN_ADDRESS": "127.0.0.1",
        "GKE_GPU_EXPORTER_CLUSTER": sim.scenario.cluster,
        "GKE_GPU_EXPORTER_DCGM__TIMEOUT": "1", "GKE_GPU_EXPORTER_WAREHOUSE__ENABLED": "false",
        "GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(sim.write_outputs(tmp_path).kubeconfig),
        "GKE_GPU_EXPORTER_DCGM__CLOUD_MONITORING__PROJECT": "gpu-prod-1",
        "GKE_GPU_EXPORTER_DCGM__CLOUD_MONITORING__ENDPOINT": address,
        "GKE_GPU_EXPORTER_DCGM__CLOUD_MONITORING__ANONYMOUS": "true",
        "GKE_GPU_EXPORTER_CLOUD_MONITORING__ENABLED": "true",
        "GKE_GPU_EXPORTER_CLOUD_MONITORING__PROJECT": "gpu-prod-1",
        "GKE_GPU_EXPORTER_CLOUD_MONITORING__LOCATION": "us-central1",
        "GKE_GPU_EXPORTER_CLOUD_MONITORING__ENDPOINT": address,
        "GKE_GPU_EXPORTER_CLOUD_MONITORING__ANONYMOUS": "true",
        "GKE_GPU_EXPORTER_CLOUD_MONITORING__INTERVAL": "10"}
    proc, port = await start_exporter(env)
    try:
        async with aiohttp.ClientSession() as s, asyncio.timeout(limit(60)):
            while True:
                async with s.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    body = await resp.text()
                if any(k[0].endswith("/gpu_seconds") for k in service.written):
                    break  # the second snapshot: counters integrate from the first cycle on
                await asyncio.sleep(0.3)
        assert 'source="dcgm",target="monitoring.googleapis.com/projects/gpu-prod-1"} 1' in body
        assert 'source="cloud_monitoring",target="projects/gpu-prod-1"} 1' in body
        assert re.search(r'cloud_monitoring_points_total\{cluster="\w+",outcome="written"\} '
                         r'[1-9]', body)
        written = {k[0] for k in service.written}
        assert "custom.googleapis.com/gke_gpu/gpu_seconds" in written
        assert "custom.googleapis.com/gke_gpu/cluster_available_gpus" in written
    finally:
        proc.terminate()
        async with asyncio.timeout(limit(30)):
            assert await proc.wait() == 0
