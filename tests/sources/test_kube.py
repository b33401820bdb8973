"""KubeSource keeps the cluster's state through watch ends, 410s, hangs and outages."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.backoff import Backoff
from exporter.errors import SourceDataError
from exporter.sources.kube import (
    DELETED,
    KubeSource,
    deleted_pod,
    list_body,
    node_info,
    pod_info,
    rbac_hint,
    watch_event,
)
from exporter.sources.kube_client import load_kubeconfig
from simulator.kubeapi import status_error
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.timing import limit

KINDS = ("namespaces", "nodes", "pods")
"""The kinds the view stands on (events are watched too where the API serves them)."""


def view_up(source: KubeSource) -> dict[str, bool]:
    return {k: source.up[k] for k in KINDS}


@contextlib.asynccontextmanager
async def open_source(sim: SimulatorServer, tmp_path: Path,
                      request_timeout: float = 5) -> AsyncIterator[KubeSource]:
    kubeconfig = sim.write_outputs(tmp_path).kubeconfig
    api = await load_kubeconfig(kubeconfig)
    src = KubeSource(api, watch_timeout=5, watchdog=1.0, request_timeout=request_timeout,
                     backoff=lambda: Backoff(base=0.05, cap=0.2))
    src.start()
    async with asyncio.timeout(limit(10)):
        await src.wait_synced()
    try:
        yield src
    finally:
        await src.stop()
        await api.close()


@pytest.fixture
async def source(sim: SimulatorServer, tmp_path: Path) -> AsyncIterator[KubeSource]:
    async with open_source(sim, tmp_path) as src:
        yield src


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
    assert deleted[pod.uid].scheduled_unix == pod.scheduled_at
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
    assert (gone.phase, gone.deleted_unix) == ("Running", asked + grace if stamped else None)
    noticed = sim.cluster.now + 30
    last = deleted_pod(gone, noticed)
    assert (last.phase, last.finished_unix, last.scheduled_unix) == (
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
    from simulator.cluster import Cluster

    c = Cluster(make_scenario(workloads=[
        *make_scenario().model_dump()["workloads"],
        {"name": "web", "kind": "serving", "namespace": "team-a", "accelerator": "nvidia-l4",
         "sharing": "time-sharing", "replicas": 1,
         "annotations": {"billing.example.com/cost-center": "cc-7", "other": "x" * 5000}}]))
    c.advance(30)
    objs = {o["metadata"]["name"]: o for o in c.store.list_objects("Pod")}
    web_obj = next(o for n, o in objs.items() if n.startswith("web-"))
    web = pod_info(web_obj)
    assert (web.workload, web.owner_kind, web.gpus, web.phase) == ("web", "Deployment", 1,
                                                                   "Running")
    assert web.annotations == {}   # annotations are kept only when named
    assert pod_info(web_obj, ["billing.example.com/cost-center", "absent"]).annotations == {
        "billing.example.com/cost-center": "cc-7"}
    assert web.scheduled_unix == web.created_unix == c.start + 30 or web.scheduled_unix == c.start
    dcgm = pod_info(next(o for n, o in objs.items() if n.startswith("dcgm-exporter")))
    assert dcgm.gpus == 0 and dcgm.container_ports == {"metrics": 9400}
    node = node_info(c.store.list_objects("Node")[0])
    assert node.ready and node.address.startswith("127.1.")


async def until(condition: Callable[[], bool], limit: float = 15) -> None:
    async with asyncio.timeout(limit):
        while not condition():  # noqa: ASYNC110 - polling the state of another party
            await asyncio.sleep(0.02)


async def api_fault(sim: SimulatorServer, fault: str, on: bool) -> None:
    """Start (and end every open watch, so that each kind meets it) or stop a fault."""
    seconds = 3600.0 if on else 0.0
    if fault == "refused":
        await sim.refuse_api(seconds)
        return
    if fault == "hang":
        sim.api.stall(seconds)
    else:
        sim.api.set_down(seconds, status=int(fault))
    if on:
        sim.api.end_watches()


def kube_logs(caplog: pytest.LogCaptureFixture, level: int,
              event: str) -> dict[str, list[dict[str, Any]]]:
    """The context of each ``event`` line at ``level``, by resource."""
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for r in caplog.records:
        if r.name == "exporter.sources.kube" and r.levelno == level and \
                r.getMessage() == event:
            fields: dict[str, Any] = r.ctx  # type: ignore[attr-defined]
            out.setdefault(fields["resource"], []).append(fields)
    return out


@pytest.mark.parametrize(("fault", "reason"), [
    ("503", "http_503"),
    ("403", "http_403"),
    ("429", "http_429"),
    ("refused", "refused"),
    ("hang", "timeout"),
])
async def test_an_api_fault_keeps_the_last_good_view(
        fault: str, reason: str, sim: SimulatorServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """During the fault every kind is down, counts its failed attempts by reason and keeps
    its last good nodes, pods and namespace labels; after it every kind is up again with
    the server's state, and the outage made one log line when it began, one when it ended."""
    caplog.set_level(logging.DEBUG, logger="exporter.sources.kube")
    async with open_source(sim, tmp_path, request_timeout=1.0) as source:
        sim.cluster.submit("train", run_seconds=3600)
        await converge(source, sim)
        before = (dict(source.nodes), dict(source.pods), dict(source.namespace_labels))
        source.take_deleted_pods()
        await api_fault(sim, fault, on=True)
        await until(lambda: all(source.stats[k].reasons.get(reason, 0) >= 2 for k in KINDS))

        assert view_up(source) == dict.fromkeys(KINDS, False)
        assert (source.nodes, source.pods, source.namespace_labels) == before
        assert source.take_deleted_pods() == []

        await api_fault(sim, fault, on=False)
        await until(lambda: all(view_up(source).values()))
        await converge(source, sim)
        assert (source.nodes, source.pods, source.namespace_labels) == before
        assert source.take_deleted_pods() == []
    began = kube_logs(caplog, logging.WARNING, "kubernetes request failed")
    ended = kube_logs(caplog, logging.INFO, "kubernetes recovered")
    for kind in KINDS:
        assert len(began[kind]) == 1 and len(ended[kind]) == 1, kind
        assert ended[kind][0]["failed_attempts"] == sum(source.stats[kind].reasons.values())
        assert ended[kind][0]["outage_seconds"] > 0
    if fault == "403":
        assert began["pods"][0]["status"] == 403
        assert began["pods"][0]["rbac"] == rbac_hint("pods", began["pods"][0]["verb"])
        assert "pods at the cluster scope: grant get/list/watch on pods" in \
            began["pods"][0]["rbac"]


async def test_a_watch_error_event_is_an_error_not_data(
        sim: SimulatorServer, source: KubeSource) -> None:
    """An ERROR event with a Status other than 410 is counted by its code; the view stays,
    and the watch starts again from a fresh list."""
    await converge(source, sim)
    before = (dict(source.nodes), dict(source.pods), dict(source.namespace_labels))
    source.take_deleted_pods()
    listed = [k for k in source.stats if source.synced[k].is_set()]
    await until(lambda: sim.api.watches_served >= len(listed))
    sim.api.end_watches(status_error(500, "InternalError", "etcd leader changed"))
    await until(lambda: all(source.stats[k].reasons.get("http_500") == 1 for k in KINDS))
    await until(lambda: all(view_up(source).values()))
    assert (source.nodes, source.pods, source.namespace_labels) == before
    assert source.take_deleted_pods() == []
    assert all(source.stats[k].expired == 0 for k in KINDS)


@pytest.mark.parametrize("raw", [
    b"<html>503 Service Unavailable</html>",
    b'{"kind": "Status", "code": 503, "metadata": {}}',
    b'{"kind": "PodList", "items": []}',
    b'{"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": {}}',
    b"[]",
], ids=["html", "status", "no resourceVersion", "items not a list", "not an object"])
def test_an_answer_that_is_not_a_list_is_refused(raw: bytes) -> None:
    with pytest.raises(SourceDataError):
        list_body("pods", raw)


def test_a_list_answer_gives_its_items_and_version() -> None:
    assert list_body("pods", b'{"kind": "PodList", "metadata": {"resourceVersion": "7"}, '
                             b'"items": [{"metadata": {"name": "a"}}]}') == (
        [{"metadata": {"name": "a"}}], "7")
    assert list_body("pods", b'{"metadata": {"resourceVersion": "8"}, "items": null}') == (
        [], "8")


def test_a_watch_line_gives_its_event_or_is_refused() -> None:
    assert watch_event("pods", b'{"type": "ADDED", "object": {"metadata": {}}}\n') == (
        "ADDED", {"metadata": {}})
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    assert watch_event("pods", json.dumps(status).encode()) == ("ERROR", status)
    for line in (b"<html>", b'{"type": "ADDED"}', b"[]"):
        with pytest.raises(SourceDataError, match="watch line is not an event"):
            watch_event("pods", line)
