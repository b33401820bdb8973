"""KubeSource keeps the cluster's state through watch ends, 410s, hangs and outages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from kubernetes_asyncio import config

from exporter.backoff import Backoff
from exporter.simulator.scenario import Scenario
from exporter.simulator.server import SimulatorServer
from exporter.sources.kube import DELETED, KubeSource, deleted_pod, node_info, pod_info


@pytest.fixture
async def source(sim: SimulatorServer, tmp_path: Path) -> AsyncIterator[KubeSource]:
    kubeconfig = sim.write_outputs(tmp_path).kubeconfig
    api = await config.new_client_from_config(config_file=str(kubeconfig))
    src = KubeSource(api, watch_timeout=5, watchdog=1.0, request_timeout=5,
                     backoff=lambda: Backoff(base=0.05, cap=0.2))
    src.start()
    async with asyncio.timeout(10):
        await src.wait_synced()
    yield src
    await src.stop()
    await api.close()


def server_pods(sim: SimulatorServer) -> dict[str, str]:
    return {o["metadata"]["uid"]: o["status"]["phase"] for o in sim.store.list_objects("Pod")}


async def converge(source: KubeSource, sim: SimulatorServer, limit: float = 10) -> None:
    def converged() -> bool:
        nodes = {o["metadata"]["name"] for o in sim.store.list_objects("Node")}
        return {u: p.phase for u, p in source.pods.items()} == server_pods(sim) and \
            set(source.nodes) == nodes

    async with asyncio.timeout(limit):
        while not converged():  # noqa: ASYNC110 - polling the state of another party
            await asyncio.sleep(0.05)


async def test_initial_list(sim: SimulatorServer, source: KubeSource) -> None:
    await converge(source, sim)
    node = next(n for n in source.nodes.values() if n.pool == "l4")
    assert (node.accelerator, node.clients_per_gpu, node.allocatable_gpus) == (
        "nvidia-l4", 2, 8)
    assert source.namespace_labels["team-a"]["team"] == "alpha"


async def test_watch_follows_changes_and_remembers_deleted_pods(
        sim: SimulatorServer, source: KubeSource) -> None:
    pod = sim.cluster.submit("train", run_seconds=60)[0]
    await converge(source, sim)
    assert source.pods[pod.uid].phase == "Running"
    await sim.advance(60 + sim.scenario.completed_pod_ttl)
    await converge(source, sim)
    deleted = {p.uid: p for p in source.take_deleted_pods()}
    assert deleted[pod.uid].phase == "Succeeded"
    assert deleted[pod.uid].scheduled == pod.scheduled_at
    assert source.take_deleted_pods() == []


@pytest.mark.parametrize(("grace", "stamped"), [(30, True), (0, False)],
                         ids=["graceful", "forced"])
async def test_deleted_running_pod_ends_when_deleted(
        grace: int, stamped: bool, sim: SimulatorServer, source: KubeSource) -> None:
    """The DELETED event's deletionTimestamp is its end; a forced deletion has none, and the
    pod ends when it is noticed gone."""
    pod = sim.cluster.submit("train", run_seconds=3600)[0]
    await converge(source, sim)
    asked = sim.cluster.now
    await sim.delete_pod(pod, grace_seconds=grace)
    await sim.advance(grace)
    await converge(source, sim)
    (gone,) = [p for p in source.take_deleted_pods() if p.uid == pod.uid]
    assert (gone.phase, gone.deleted) == ("Running", asked + grace if stamped else None)
    noticed = sim.cluster.now + 30
    last = deleted_pod(gone, noticed)
    assert (last.phase, last.finished, last.scheduled) == (
        DELETED, asked + grace if stamped else noticed, pod.scheduled_at)


@pytest.mark.parametrize("fault", ["end-watches", "compact", "hang-watches", "down"])
async def test_recovers_from_api_faults(fault: str, sim: SimulatorServer,
                                        source: KubeSource) -> None:
    """After the fault, the store equals the server's state, deletions during it included."""
    victim = sim.cluster.submit("half", run_seconds=30)[0]
    await converge(source, sim)
    if fault == "end-watches":
        sim.api.end_watches()
    elif fault == "hang-watches":
        sim.api.hang_watches(3)
    elif fault == "down":
        sim.api.set_down(2)
        sim.api.end_watches()
    else:  # the client falls behind, history is compacted, its resume gets 410
        sim.api.hang_watches(2)
    await sim.advance(30 + sim.scenario.completed_pod_ttl)  # victim ends and is deleted
    if fault == "compact":
        sim.api.compact()
        sim.api.end_watches()
    fresh = sim.cluster.submit("shared", run_seconds=3600)[0]
    await converge(source, sim, limit=15)
    assert victim.uid not in source.pods and fresh.uid in source.pods
    assert victim.uid in {p.uid for p in source.take_deleted_pods()}
    stats = source.stats["pods"]
    if fault == "compact":
        assert stats.expired >= 1
    if fault == "hang-watches":
        assert stats.watchdog_relists >= 1
    if fault == "down":
        assert stats.errors >= 1 and source.up["pods"]


def test_pod_info_from_api_objects(make_scenario: Callable[..., Scenario]) -> None:
    from exporter.simulator.cluster import Cluster

    c = Cluster(make_scenario(workloads=[
        *make_scenario().model_dump()["workloads"],
        {"name": "web", "kind": "serving", "namespace": "team-a", "accelerator": "nvidia-l4",
         "sharing": "time-sharing", "replicas": 1}]))
    c.advance(30)
    objs = {o["metadata"]["name"]: o for o in c.store.list_objects("Pod")}
    web = pod_info(next(o for n, o in objs.items() if n.startswith("web-")))
    assert (web.workload, web.owner_kind, web.gpus, web.phase) == ("web", "Deployment", 1,
                                                                   "Running")
    assert web.scheduled == web.created == c.start + 30 or web.scheduled == c.start
    dcgm = pod_info(next(o for n, o in objs.items() if n.startswith("dcgm-exporter")))
    assert dcgm.gpus == 0 and dcgm.container_ports == {"metrics": 9400}
    node = node_info(c.store.list_objects("Node")[0])
    assert node.ready and node.address.startswith("127.1.")
