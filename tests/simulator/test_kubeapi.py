"""The real kubernetes_asyncio client lists and watches the simulated API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from simulator.server import SimulatorServer
from tests.timing import limit


@pytest.fixture
async def v1(sim: SimulatorServer, tmp_path: Path) -> AsyncIterator[client.CoreV1Api]:
    outputs = sim.write_outputs(tmp_path)
    api = await config.new_client_from_config(config_file=str(outputs.kubeconfig))
    async with api:
        yield client.CoreV1Api(api)


async def test_list_nodes_with_gke_labels(sim: SimulatorServer, v1: client.CoreV1Api) -> None:
    nodes = await v1.list_node()
    assert len(nodes.items) == 4
    h100 = next(n for n in nodes.items
                if n.metadata.labels["cloud.google.com/gke-nodepool"] == "h100")
    labels = h100.metadata.labels
    assert labels["cloud.google.com/gke-accelerator"] == "nvidia-h100-80gb"
    assert labels["node.kubernetes.io/instance-type"] == "a3-highgpu-8g"
    assert labels["topology.kubernetes.io/zone"] == "us-central1-a"
    assert h100.status.allocatable["nvidia.com/gpu"] == "8"
    spot = await v1.list_node(label_selector="cloud.google.com/gke-spot=true")
    assert [n.metadata.labels["cloud.google.com/gke-nodepool"] for n in spot.items] == ["t4-spot"]
    mig = await v1.list_node(label_selector="cloud.google.com/gke-gpu-partition-size")
    assert mig.items[0].status.allocatable["nvidia.com/gpu"] == "7"


async def test_list_pods_and_selectors(sim: SimulatorServer, v1: client.CoreV1Api) -> None:
    pod = sim.cluster.submit("train", run_seconds=3600)[0]
    sim.cluster.submit("train")
    pods = await v1.list_pod_for_all_namespaces(label_selector="team=alpha")
    assert {p.metadata.name for p in pods.items} == \
        {p.name for p in sim.cluster.pods.values() if p.team == "alpha"}
    running = await v1.list_namespaced_pod("team-a", field_selector="status.phase=Running")
    assert [p.metadata.name for p in running.items] == [pod.name]
    got = running.items[0]
    assert got.spec.containers[0].resources.requests["nvidia.com/gpu"] == "8"
    assert got.metadata.owner_references[0].kind == "Job"
    assert got.spec.node_selector["cloud.google.com/gke-accelerator"] == "nvidia-h100-80gb"
    sched = next(c for c in got.status.conditions if c.type == "PodScheduled")
    assert sched.status == "True"
    on_node = await v1.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={got.spec.node_name}")
    assert {p.metadata.namespace for p in on_node.items} == {"team-a", "gke-managed-system"}
    dcgm = await v1.list_namespaced_pod(
        "gke-managed-system",
        label_selector="app.kubernetes.io/name in (gke-managed-dcgm-exporter)")
    assert len(dcgm.items) == 4
    assert {p.status.pod_ip for p in dcgm.items} == \
        {n.address for n in sim.cluster.live_nodes()}
    assert dcgm.items[0].spec.containers[0].ports[0].container_port == sim.dcgm_port


async def test_pagination(sim: SimulatorServer, v1: client.CoreV1Api) -> None:
    for _ in range(5):
        sim.cluster.submit("shared")
    names: list[str] = []
    token = None
    while True:
        page = await v1.list_pod_for_all_namespaces(limit=3, _continue=token)
        names += [p.metadata.name for p in page.items]
        token = page.metadata._continue
        if not token:
            break
    everything = await v1.list_pod_for_all_namespaces()
    assert names == [p.metadata.name for p in everything.items]


async def test_errors_are_kubernetes_status(sim: SimulatorServer, v1: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as err:
        await v1.read_node("no-such-node")
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        await v1.list_pod_for_all_namespaces(label_selector="a in b")
    assert err.value.status == 400
    async with aiohttp.ClientSession() as s:
        async with s.get(sim.api_url + "/apis/apps/v1/deployments") as resp:
            body = await resp.json()
            assert resp.status == 404 and body["kind"] == "Status" and body["code"] == 404
        async with s.delete(sim.api_url + "/api/v1/nodes/x") as resp:
            assert resp.status == 405 and (await resp.json())["reason"] == "MethodNotAllowed"


async def test_watch_streams_changes(sim: SimulatorServer, v1: client.CoreV1Api) -> None:
    listed = await v1.list_namespaced_pod("team-a")
    rv = listed.metadata.resource_version
    pod = sim.cluster.submit("train", run_seconds=60)[0]
    await sim.advance(60 + sim.scenario.completed_pod_ttl)
    events = []
    w = watch.Watch()
    async with w:
        async for e in w.stream(v1.list_namespaced_pod, "team-a", resource_version=rv,
                                timeout_seconds=1):
            events.append((e["type"], e["object"].metadata.name, e["object"].status.phase))
    assert events[0] == ("ADDED", pod.name, "Running")
    assert ("MODIFIED", pod.name, "Succeeded") in events
    assert events[-1][:2] == ("DELETED", pod.name)


async def test_watch_bookmarks(sim: SimulatorServer, v1: client.CoreV1Api) -> None:
    listed = await v1.list_node()
    types = []
    w = watch.Watch()
    async with w:
        async for e in w.stream(v1.list_node, resource_version=listed.metadata.resource_version,
                                allow_watch_bookmarks=True, timeout_seconds=1):
            types.append(e["type"])
    assert types and set(types) == {"BOOKMARK"}


async def test_watch_from_compacted_version_is_410_then_relist_converges(
        sim: SimulatorServer, v1: client.CoreV1Api) -> None:
    """An informer's loop: list, watch; on 410 relist. It ends equal to the server."""
    listed = await v1.list_pod_for_all_namespaces()
    store = {(p.metadata.namespace, p.metadata.name): p.metadata.uid for p in listed.items}
    rv = listed.metadata.resource_version
    for w_name in ("train", "shared", "slice"):
        sim.cluster.submit(w_name, run_seconds=60)
    await sim.advance(60 + sim.scenario.completed_pod_ttl)  # created, finished, deleted
    sim.api.compact()
    w = watch.Watch()
    stream = w.stream(v1.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=1)
    async with w:
        with pytest.raises(ApiException) as err:
            await stream.next()
    assert err.value.status == 410
    relisted = await v1.list_pod_for_all_namespaces()
    store = {(p.metadata.namespace, p.metadata.name): p.metadata.uid for p in relisted.items}
    sim.cluster.submit("half", run_seconds=3600)
    w = watch.Watch()
    async with w:
        async for e in w.stream(v1.list_pod_for_all_namespaces,
                                resource_version=relisted.metadata.resource_version,
                                timeout_seconds=1):
            key = (e["object"].metadata.namespace, e["object"].metadata.name)
            if e["type"] == "DELETED":
                store.pop(key, None)
            else:
                store[key] = e["object"].metadata.uid
    truth = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["uid"]
             for o in sim.store.list_objects("Pod")}
    assert store == truth


async def test_watch_without_version_starts_with_the_current_state(
        sim: SimulatorServer, v1: client.CoreV1Api) -> None:
    w = watch.Watch()
    seen = []
    async with w:
        async for e in w.stream(v1.list_namespace, timeout_seconds=1):
            seen.append((e["type"], e["object"].metadata.name))
    assert seen == [("ADDED", "team-a"), ("ADDED", "team-b")]


async def test_api_down_answers_503(sim: SimulatorServer, v1: client.CoreV1Api) -> None:
    sim.api.set_down(30)
    with pytest.raises(ApiException) as err:
        await v1.list_node()
    assert err.value.status == 503
    sim.api.set_down(0)
    assert len((await v1.list_node()).items) == 4


@pytest.mark.parametrize(("fault", "plural", "status", "says"), [
    ({"action": "down", "seconds": 30}, "nodes", 503, "unable to handle the request"),
    ({"action": "down", "seconds": 30, "status": 403, "resource": "pods"}, "pods", 403,
     'cannot list resource "pods" in API group "" at the cluster scope'),
    ({"action": "down", "seconds": 30, "status": 403, "resource": "pods"}, "nodes", 200, ""),
    ({"action": "down", "seconds": 30, "status": 429}, "namespaces", 429, "too many requests"),
], ids=["503", "403 on pods", "403 on pods, not on nodes", "429"])
async def test_api_faults_answer_as_kubernetes_does(
        sim: SimulatorServer, fault: dict[str, object], plural: str, status: int,
        says: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{sim.api_url}/sim/api-faults", json=fault) as r:
            assert r.status == 200
        async with s.get(f"{sim.api_url}/api/v1/{plural}") as r:
            body = await r.json()
            assert r.status == status
            if status != 200:
                assert (body["kind"], body["code"]) == ("Status", status)
                assert says in body["message"]
            if status == 429:
                assert r.headers["Retry-After"] == "1"


async def test_forbidden_resources_answer_403_each_for_its_own_while(
        sim: SimulatorServer) -> None:
    """Two resources forbidden at once, for different times; the rest served."""
    async with aiohttp.ClientSession() as s:
        for resource, seconds in (("namespaces", 60), ("pods", 0.3)):
            async with s.post(f"{sim.api_url}/sim/api-faults", json={
                    "action": "forbid", "resource": resource, "seconds": seconds}) as r:
                assert r.status == 200
        for plural, status in (("namespaces", 403), ("pods", 403), ("nodes", 200)):
            async with s.get(f"{sim.api_url}/api/v1/{plural}") as r:
                assert r.status == status, plural
                if status == 403:
                    body = await r.json()
                    assert f'cannot list resource "{plural}" in API group ""' in body["message"]
        await asyncio.sleep(0.4)
        async with s.get(f"{sim.api_url}/api/v1/pods") as r:
            assert r.status == 200, "the pods' window is over"
        async with s.get(f"{sim.api_url}/api/v1/namespaces", params={"watch": "1"}) as r:
            assert r.status == 403
            assert 'cannot watch resource "namespaces"' in (await r.json())["message"]
        sim.api.forbid("namespaces", 0)
        async with s.get(f"{sim.api_url}/api/v1/namespaces") as r:
            assert r.status == 200


async def test_a_forbidden_api_group_refuses_its_discovery(sim: SimulatorServer) -> None:
    sim.api.kueue = True  # its CRDs installed
    async with aiohttp.ClientSession() as s, \
            s.get(f"{sim.api_url}/apis/kueue.x-k8s.io/v1beta2") as r:
        assert r.status == 200
    sim.api.forbid("kueue.x-k8s.io", 60)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{sim.api_url}/apis/kueue.x-k8s.io/v1beta2") as r:
            assert r.status == 403
            assert 'cannot get path "/apis/kueue.x-k8s.io/v1beta2"' in \
                (await r.json())["message"]
        async with s.get(f"{sim.api_url}/api/v1/nodes") as r:
            assert r.status == 200


async def test_a_refused_api_comes_back(sim: SimulatorServer) -> None:
    async with aiohttp.ClientSession() as s, s.post(
            f"{sim.api_url}/sim/api-faults", json={"action": "refuse", "seconds": 2}) as r:
        assert r.status == 200
    await asyncio.sleep(0.3)
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientConnectorError):
            await s.get(f"{sim.api_url}/api/v1/nodes")
    async with asyncio.timeout(limit(10)):
        while True:
            try:
                async with aiohttp.ClientSession() as s, \
                        s.get(f"{sim.api_url}/api/v1/nodes") as r:
                    assert r.status == 200
                    return
            except aiohttp.ClientConnectorError:
                await asyncio.sleep(0.1)


async def test_an_unknown_fault_status_is_refused(sim: SimulatorServer) -> None:
    async with aiohttp.ClientSession() as s, s.post(
            f"{sim.api_url}/sim/api-faults",
            json={"action": "down", "seconds": 30, "status": 418}) as r:
        assert r.status == 400


async def test_events_are_listed_and_watched_by_the_pods_field_selector(
        sim: SimulatorServer, v1: client.CoreV1Api) -> None:
    """A pod that cannot be placed gets the scheduler's FailedScheduling, delivered to a
    watch from the list's version; retried five minutes on, the event becomes a series."""
    listed = await v1.list_event_for_all_namespaces(field_selector="involvedObject.kind=Pod")
    sim.cluster.submit("train", run_seconds=3600)
    waiting = sim.cluster.submit("train")[0]
    seen = []
    w = watch.Watch()
    async with w:
        async for e in w.stream(v1.list_namespaced_event, "team-a",
                                field_selector="involvedObject.kind=Pod",
                                resource_version=listed.metadata.resource_version,
                                timeout_seconds=1):
            seen.append((e["type"], e["object"].reason, e["object"].involved_object.name))
    assert ("ADDED", "FailedScheduling", waiting.name) in seen
    assert ("ADDED", "Scheduled", waiting.name) not in seen
    await sim.advance(300)
    events = await v1.list_namespaced_event(
        "team-a", field_selector=f"involvedObject.uid={waiting.uid},reason=FailedScheduling")
    (failed,) = events.items
    assert failed.type == "Warning" and failed.reporting_component == "default-scheduler"
    assert failed.series.count == 2 and failed.event_time is not None
    assert failed.message.startswith("0/4 nodes are available: 1 Insufficient nvidia.com/gpu")
    with pytest.raises(ApiException) as err:
        await v1.list_event_for_all_namespaces(field_selector="spec.nodeName=x")
    assert err.value.status == 400


async def test_the_exporters_client_reads_the_events(sim: SimulatorServer,
                                                     tmp_path: Path) -> None:
    from exporter.sources.kube_client import load_kubeconfig

    sim.cluster.submit("train", run_seconds=3600)
    sim.cluster.submit("train")
    api = await load_kubeconfig(sim.write_outputs(tmp_path).kubeconfig)
    try:
        resp = await api.get("/api/v1/events", {"fieldSelector": "involvedObject.kind=Pod"})
        body = await resp.json()
        resp.release()
    finally:
        await api.close()
    assert body["kind"] == "EventList" and body["metadata"]["resourceVersion"]
    assert {e["reason"] for e in body["items"]} == {"Scheduled", "FailedScheduling"}
