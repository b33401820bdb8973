"""Readiness and staleness: ``/readyz`` says ready only on a listed, fresh Kubernetes view
and a cycle run on it, says why not in one line, and /metrics shows when each source last
answered; figures that stand on the Kubernetes view are absent while there is none."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from exporter.config import Config
from exporter.demo import caught_up, demo_config, step_both
from exporter.runtime.app import http_app, open_exporter
from exporter.runtime.service import Exporter
from simulator.scenario import Fault, Scenario
from simulator.server import SimulatorServer
from tests.conftest import free_port, write_kubeconfig
from tests.exporter.test_exporter import families
from tests.exporter.test_warehouse_faults import staging_broken
from tests.timing import limit

LAST_SUCCESS = "gke_gpu_exporter_source_last_success_timestamp_seconds"


def with_kubernetes(cfg: Config, **settings: float) -> Config:
    return cfg.model_copy(update={"kubernetes": cfg.kubernetes.model_copy(update=settings)})


@asynccontextmanager
async def serving(cfg: Config) -> AsyncIterator[tuple[Exporter, TestClient[Any, Any]]]:
    async with open_exporter(cfg) as exporter, \
            TestClient(TestServer(http_app(exporter))) as client:
        yield exporter, client


async def readyz(client: TestClient[Any, Any]) -> tuple[int, str]:
    resp = await client.get("/readyz")
    return resp.status, await resp.text()


async def until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110 - the watches run in this loop
            await asyncio.sleep(0.05)


async def test_api_refusing_connections_is_never_ready_and_no_capacity_is_shown(
        tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    cfg = demo_config(Scenario.model_construct(cluster="c", region="us-central1", step=30.0),
                      write_kubeconfig(tmp_path, closed), tmp_path)
    async with serving(cfg) as (exporter, client):
        await until(lambda: exporter.kube.stats["nodes"].errors > 0)
        await exporter.cycle(time.time())
        await exporter.cycle(time.time() + 30)
        status, body = await readyz(client)
        assert status == 503
        assert body.startswith("no list of nodes, pods and namespaces from the Kubernetes API "
                               "yet "
                               "(last error: ")
        assert body.count("\n") == 1
        fams = families(exporter.metrics.text)
        assert "gke_gpu_cluster_available_gpus" not in fams, "unknown, not 0"
        assert not any(lbl["source"] == "kubernetes" for lbl, _ in fams.get(LAST_SUCCESS, []))
        nodes = {"cluster": exporter.config.cluster, "source": "kubernetes", "target": "nodes"}
        assert (nodes, 0.0) in fams["gke_gpu_exporter_source_up"]


async def test_forbidden_api_is_not_ready_until_listed_and_a_cycle_ran(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(make_scenario())
    sim.api.set_down(60, 403)
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with serving(cfg) as (exporter, client):
        await until(lambda: exporter.kube.stats["pods"].errors > 0 and
                    exporter.kube.stats["nodes"].errors > 0)
        await exporter.cycle(sim.cluster.now)
        status, body = await readyz(client)
        assert status == 503 and "403" in body
        assert "no list of nodes, pods and namespaces" in body
        assert "gke_gpu_cluster_available_gpus" not in families(exporter.metrics.text)
        sim.api.set_down(0)
        async with asyncio.timeout(limit(60)):  # past the retry's backoff (capped at 30 s)
            await exporter.kube.wait_synced()
        await until(lambda: all(exporter.kube.discovery_up.values()), 60)  # Kueue's, too
        assert await readyz(client) == (503, "waiting for the first full cycle\n")
        await exporter.cycle(sim.cluster.now)
        assert await readyz(client) == (200, "ready\n")
        (avail,) = families(exporter.metrics.text)["gke_gpu_cluster_available_gpus"]
        assert avail[1] > 0


async def test_a_frozen_api_makes_the_view_stale_then_ready_again(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """Watches that deliver nothing and lists that never answer: after
    ``kubernetes.max_staleness`` /readyz says how old the view is, and recovers with it."""
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = with_kubernetes(
        demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path),
        watchdog=0.5, request_timeout=0.5, max_staleness=2.0)
    async with serving(cfg) as (exporter, client):
        await exporter.kube.wait_synced()
        await exporter.cycle(sim.cluster.now)
        assert await readyz(client) == (200, "ready\n")
        sim.api.stall(60)
        sim.api.hang_watches(60)
        frozen = time.time()
        await until(lambda: (exporter.kube.age("nodes") or 0) > 2.0)
        await exporter.cycle(sim.cluster.now)
        status, body = await readyz(client)
        assert status == 503
        assert "the Kubernetes view is" in body and "kubernetes.max_staleness 2 s" in body
        stamps = {lbl["target"]: v for lbl, v in families(exporter.metrics.text)[LAST_SUCCESS]
                  if lbl["source"] == "kubernetes"}
        assert stamps.keys() - {"events"} == {"nodes", "pods", "namespaces"}
        assert all(v <= frozen for v in stamps.values()), "stamped before the freeze"
        assert kube_up(exporter) == {"nodes": 0, "pods": 0}, "a silent view is not up"
        sim.api.stall(0)
        sim.api.hang_watches(0)
        kinds = exporter.readiness.needed_kinds()
        await until(lambda: max(exporter.kube.age(k) or 99 for k in kinds) < 1)
        assert await readyz(client) == (200, "ready\n")
        await exporter.cycle(sim.cluster.now)
        assert kube_up(exporter) == {"nodes": 1, "pods": 1}


def kube_up(exporter: Exporter) -> dict[str, float]:
    """``source_up`` of the Kubernetes node and pod views."""
    return {lbl["target"]: v for lbl, v in families(exporter.metrics.text)[
        "gke_gpu_exporter_source_up"] if lbl["source"] == "kubernetes"
        and lbl["target"] in ("nodes", "pods")}


async def test_a_failing_target_keeps_the_time_of_its_last_answer(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        await exporter.kube.wait_synced()
        await caught_up(sim, exporter)
        await step_both(sim, exporter, 1)
        answered = sim.cluster.now
        node = next(n for n in sim.cluster.live_nodes() if n.pool.name == "h100")
        await sim.inject(Fault(at=0, kind="endpoint", node="h100/0", mode="error",
                               duration=600))
        await step_both(sim, exporter, 2)
        stamps = {lbl["target"]: v for lbl, v in families(exporter.metrics.text)[LAST_SUCCESS]
                  if lbl["source"] == "dcgm"}
        assert stamps.pop(sim.endpoint_url(node)) == answered
        assert set(stamps.values()) == {sim.cluster.now}


async def test_a_failing_warehouse_is_not_ready_until_it_writes_again(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with serving(cfg) as (exporter, client):
        await exporter.kube.wait_synced()
        await step_both(sim, exporter, 2)
        assert await readyz(client) == (200, "ready\n")
        assert exporter.warehouse is not None
        with staging_broken(exporter.warehouse):
            await step_both(sim, exporter, 1)
            status, body = await readyz(client)
            assert status == 503 and body.startswith("the warehouse fails: ")
            assert body.count("\n") == 1
        await step_both(sim, exporter, 1)
        assert await readyz(client) == (200, "ready\n")
