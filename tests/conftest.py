"""Shared fixtures: small scenarios built from a base, and the simulator served on loopback."""

from __future__ import annotations

import asyncio
import copy
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from simulator.scenario import Scenario, parse_scenario
from simulator.server import SimulatorServer
from tests.cloud_monitoring_fake import FakeMetricService
from tests.timing import limit

FIXTURES = Path(__file__).parent / "fixtures"

HEAVY_FIRST = (
    "test_pending_end_to_end.py", "test_whatif_end_to_end.py", "test_whatif_report.py",
    "test_benchmarks.py",
    "bigquery/test_exporter_to_bigquery.py", "test_dashboards_alerts.py",
    "test_package.py", "test_end_to_end.py", "test_kueue_end_to_end.py", "test_demo_serve.py",
    "test_scrape_labels.py", "exporter/test_warehouse_faults.py", "bigquery/test_sink.py",
    "test_cardinality.py", "test_live_prometheus.py", "bigquery/test_reconcile.py",
    "analytics/test_scheduled_report.py", "analytics/test_clusters.py",
    "simulator/test_billing_export.py", "analytics/test_mail.py", "test_regional_prices.py",
    "test_energy_end_to_end.py",
)
"""The test files that take longest, collected first: ``make test`` hands whole files to its
workers in collection order, so that the light files fill in around these rather than
leaving one worker alone with a heavy file at the end."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        name = item.path.relative_to(here).as_posix()
        return HEAVY_FIRST.index(name) if name in HEAVY_FIRST else len(HEAVY_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order
    if not items:
        return
    default = float(items[0].config.getini("timeout") or 0)
    for item in items:  # a hang's limit follows the machine's load (tests/timing.py)
        mark = item.get_closest_marker("timeout")
        seconds = float(mark.args[0]) if mark is not None and mark.args else default
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(limit(seconds)), append=False)

BASE: dict[str, Any] = {
    "cluster": "test",
    "seed": 3,
    "start": "2026-11-16T00:00:00Z",
    "step": 30,
    "priority_classes": {"high": 1000, "low": 10},
    "namespaces": [{"name": "team-a", "team": "alpha"}, {"name": "team-b"}],
    "pools": [
        {"name": "h100", "accelerator": "nvidia-h100-80gb", "gpus_per_node": 8, "nodes": 1},
        {"name": "l4", "accelerator": "nvidia-l4", "gpus_per_node": 4, "nodes": 1,
         "sharing": {"max_shared_clients_per_gpu": 2}},
        {"name": "mig", "accelerator": "nvidia-tesla-a100", "gpus_per_node": 1, "nodes": 1,
         "mig_partition_size": "1g.5gb"},
        {"name": "t4-spot", "accelerator": "nvidia-tesla-t4", "gpus_per_node": 4, "nodes": 1,
         "spot": True, "recreate_delay": "5m"},
    ],
    "workloads": [
        {"name": "train", "kind": "pretraining", "namespace": "team-a",
         "accelerator": "nvidia-h100-80gb", "gpus_per_pod": 8, "arrivals_per_day": 0,
         "priority_class": "low"},
        {"name": "urgent", "kind": "finetuning", "namespace": "team-b",
         "accelerator": "nvidia-h100-80gb", "gpus_per_pod": 8, "arrivals_per_day": 0,
         "priority_class": "high"},
        {"name": "half", "kind": "finetuning", "namespace": "team-b",
         "accelerator": "nvidia-h100-80gb", "gpus_per_pod": 4, "arrivals_per_day": 0,
         "priority_class": "low"},
        {"name": "shared", "kind": "batch_inference", "namespace": "team-a",
         "accelerator": "nvidia-l4", "sharing": "time-sharing", "arrivals_per_day": 0},
        {"name": "slice", "kind": "batch_inference", "namespace": "team-a",
         "accelerator": "nvidia-tesla-a100", "mig_partition_size": "1g.5gb",
         "arrivals_per_day": 0},
        {"name": "spotjob", "kind": "finetuning", "namespace": "team-b",
         "accelerator": "nvidia-tesla-t4", "spot": True, "gpus_per_pod": 2,
         "arrivals_per_day": 0},
    ],
}


def scenario_data(**overrides: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data.update(copy.deepcopy(overrides))
    return data


@pytest.fixture
def make_scenario() -> Callable[..., Scenario]:
    """Factory: the small test cluster, with top-level fields overridden."""

    def make(**overrides: Any) -> Scenario:
        return parse_scenario(scenario_data(**overrides), "test")

    return make


@pytest.fixture
async def sim(make_server: Callable[..., Any],
              make_scenario: Callable[..., Scenario]) -> SimulatorServer:
    """The small test cluster, served with a manual clock and frequent watch bookmarks."""
    server: SimulatorServer = await make_server(make_scenario(), bookmark_interval=0.2)
    return server


@pytest.fixture
async def make_server() -> AsyncIterator[Callable[..., Any]]:
    """Factory: a started SimulatorServer (manual clock) for a scenario; stopped afterwards."""
    servers: list[SimulatorServer] = []

    async def make(scenario: Scenario, **kwargs: Any) -> SimulatorServer:
        server = SimulatorServer(scenario, **kwargs)
        await server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()


def exporter_env(kubeconfig: Path, warehouse: Path, **settings: str) -> dict[str, str]:
    """The environment of a child ``gke-gpu-exporter run`` on loopback, a cycle a second,
    against a kubeconfig and a warehouse file; ``settings`` add or override
    ``GKE_GPU_EXPORTER_<NAME>`` variables (``WAREHOUSE__INTERVAL="60"``)."""
    return os.environ | {
        "GKE_GPU_EXPORTER_INTERVAL": "1", "GKE_GPU_EXPORTER_PORT": "0",
        "GKE_GPU_EXPORTER_LISTEN_ADDRESS": "127.0.0.1", "GKE_GPU_EXPORTER_DCGM__TIMEOUT": "0.5",
        "GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(kubeconfig),
        "GKE_GPU_EXPORTER_WAREHOUSE__PATH": str(warehouse),
        "GKE_GPU_EXPORTER_WAREHOUSE__INTERVAL": "1",
        "GKE_GPU_EXPORTER_WAREHOUSE__FLUSH_INTERVAL": "1",
    } | {f"GKE_GPU_EXPORTER_{k}": v for k, v in settings.items()}


async def start_exporter(env: dict[str, str]) -> tuple[asyncio.subprocess.Process, int]:
    """``gke-gpu-exporter run`` in a child process; returns it and its /metrics port."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter", "run", env=env, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    async with asyncio.timeout(limit(60)):
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, "the exporter exited before serving"
            if m := re.search(r'"event": "serving".*"port": (\d+)', line):
                return proc, int(m.group(1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_kubeconfig(directory: Path, server: str = "https://127.0.0.1:6443") -> Path:
    """A kubeconfig whose current context names one cluster (never called here)."""
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return path


async def start_prometheus(tmp: Path, config: dict[str, Any], *flags: str,
                           port: int | None = None) -> tuple[asyncio.subprocess.Process, str]:
    """Debian's Prometheus server on loopback with ``config``; returns it once ready."""
    port = port or free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    proc = await asyncio.create_subprocess_exec(
        "prometheus", f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
        *flags, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as s, asyncio.timeout(limit(60)):
        while True:
            try:
                async with s.get(f"{url}/-/ready") as r:
                    if r.status == 200:
                        return proc, url
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)


@pytest.fixture
async def metric_service() -> AsyncIterator[tuple[FakeMetricService, str]]:
    """A Cloud Monitoring MetricService on loopback gRPC, and its ``host:port``."""
    service = FakeMetricService()
    server, address = await service.start()
    yield service, address
    await server.stop(None)


LIVE_FAULTS = ({"kind": "xid", "node": "a100-ondemand/0", "gpu": 0, "code": 48, "duration": "6h"},
               {"kind": "spot_preemption", "pool": "h100-spot"})
"""Faults for a live run of the demo cluster: an XID on a GPU, a spot preemption."""


async def post_faults(session: aiohttp.ClientSession, api_url: str,
                      faults: Iterable[dict[str, Any]] = LIVE_FAULTS) -> None:
    """Inject faults through the simulator's control API."""
    for fault in faults:
        async with session.post(f"{api_url}/sim/faults", json=fault) as r:
            assert r.status < 300, await r.text()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Factory: serve a handler as ``/metrics`` on loopback; returns its URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"

    yield start
    for r in runners:
        await r.cleanup()

