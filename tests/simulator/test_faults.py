"""Faults show on the wire as they do on real clusters, and in the ground truth."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from simulator.cluster import Node
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.simulator.dcgm_text import by_gpu, samples

FAULTS = [
    {"at": "10m", "kind": "xid", "node": "h100/0", "gpu": 3, "code": 79, "duration": "1h"},
    {"at": "10m", "kind": "xid", "node": "l4/0", "gpu": 1, "code": 48, "duration": "30m"},
    {"at": "10m", "kind": "xid", "node": "h100/0", "gpu": 5, "code": 63, "duration": "30m"},
    {"at": "10m", "kind": "node_not_ready", "node": "mig/0", "duration": "20m"},
    {"at": "10m", "kind": "spot_preemption", "pool": "t4-spot"},
]


def node_of(server: SimulatorServer, pool: str) -> Node:
    return next(n for n in server.cluster.live_nodes() if n.pool.name == pool)


async def get(session: aiohttp.ClientSession, url: str, limit: float = 5) -> tuple[int, str]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=limit)) as resp:
        return resp.status, await resp.text()


async def api(session: aiohttp.ClientSession, server: SimulatorServer, path: str) -> Any:
    async with session.get(server.api_url + path) as resp:
        return resp.status, await resp.json()


@pytest.fixture
async def faulty(make_server: Callable[..., Any],
                 make_scenario: Callable[..., Scenario]) -> SimulatorServer:
    server: SimulatorServer = await make_server(make_scenario(faults=FAULTS))
    return server


async def test_xid_79_gpu_falls_off_the_bus(faulty: SimulatorServer) -> None:
    c = faulty.cluster
    pod = c.submit("train", run_seconds=7200)[0]
    node = node_of(faulty, "h100")
    lost = node.gpus[3].uuid
    await faulty.advance(600)
    async with aiohttp.ClientSession() as s:
        status, text = await get(s, faulty.endpoint_url(node))
        assert status == 200
        uuids = {x.labels["UUID"] for x in samples(text)}
        assert lost not in uuids and len(uuids) == 7
        _, obj = await api(s, faulty, f"/api/v1/nodes/{node.name}")
        assert obj["status"]["allocatable"]["nvidia.com/gpu"] == "7"
        assert obj["status"]["capacity"]["nvidia.com/gpu"] == "8"
        _, dead = await api(s, faulty, f"/api/v1/namespaces/team-a/pods/{pod.name}")
        term = dead["status"]["containerStatuses"][0]["state"]["terminated"]
        assert dead["status"]["phase"] == "Failed" and "Xid 79" in term["message"]
        # The Job controller made a replacement, which waits: only 7 GPUs are left.
        replacement = next(p for p in c.pods.values()
                           if p.job is pod.job and p is not pod)
        assert replacement.phase == "Pending"
        await faulty.advance(3600)
        _, text = await get(s, faulty.endpoint_url(node))
        assert lost in {x.labels["UUID"] for x in samples(text)}
        assert replacement.phase == "Running"
    incident = next(i for i in c.truth.incidents if i.gpu_uuid == lost)
    assert (incident.reason, incident.xid) == ("gpu_missing", 79)
    assert incident.end is not None and incident.end - incident.start == 3600


async def test_fatal_xid_shows_the_code_and_takes_the_gpu_away(faulty: SimulatorServer) -> None:
    node = node_of(faulty, "l4")
    await faulty.advance(600)
    async with aiohttp.ClientSession() as s:
        _, text = await get(s, faulty.endpoint_url(node))
        gpus = by_gpu(text)
        assert gpus[node.gpus[1].uuid]["DCGM_FI_DEV_XID_ERRORS"] == 48
        assert gpus[node.gpus[0].uuid]["DCGM_FI_DEV_XID_ERRORS"] == 0
        _, obj = await api(s, faulty, f"/api/v1/nodes/{node.name}")
        assert obj["status"]["allocatable"]["nvidia.com/gpu"] == "6"  # 2 clients per GPU
        await faulty.advance(1800)
        _, text = await get(s, faulty.endpoint_url(node))
        assert by_gpu(text)[node.gpus[1].uuid]["DCGM_FI_DEV_XID_ERRORS"] == 0
    incident = next(i for i in faulty.cluster.truth.incidents if i.xid == 48)
    assert incident.reason == "xid" and incident.end == incident.start + 1800


async def test_non_fatal_xid_is_shown_without_downtime(faulty: SimulatorServer) -> None:
    node = node_of(faulty, "h100")
    await faulty.advance(600)
    async with aiohttp.ClientSession() as s:
        _, text = await get(s, faulty.endpoint_url(node))
    assert by_gpu(text)[node.gpus[5].uuid]["DCGM_FI_DEV_XID_ERRORS"] == 63
    assert not any(i.xid == 63 for i in faulty.cluster.truth.incidents)


async def test_node_not_ready(faulty: SimulatorServer) -> None:
    c = faulty.cluster
    pod = c.submit("slice", run_seconds=7200)[0]
    node = node_of(faulty, "mig")
    await faulty.advance(600)
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientConnectorError):
            await get(s, faulty.endpoint_url(node))
        _, obj = await api(s, faulty, f"/api/v1/nodes/{node.name}")
        ready = next(x for x in obj["status"]["conditions"] if x["type"] == "Ready")
        assert ready["status"] == "Unknown"
        assert any(t["key"] == "node.kubernetes.io/unreachable" for t in obj["spec"]["taints"])
        assert pod.phase == "Running"  # pods stay bound until the eviction timeout
        await faulty.advance(300)
        assert pod.phase == "Failed" and pod.reason == "NodeLost"
        await faulty.advance(900)
        status, _ = await get(s, faulty.endpoint_url(node))
        assert status == 200
    down = [i for i in c.truth.incidents if i.reason == "node_not_ready"]
    assert len(down) == 1 and down[0].end == down[0].start + 1200


async def test_spot_preemption(faulty: SimulatorServer) -> None:
    c = faulty.cluster
    pod = c.submit("spotjob", run_seconds=7200)[0]
    node = node_of(faulty, "t4-spot")
    await faulty.advance(600)
    async with aiohttp.ClientSession() as s:
        status, _ = await api(s, faulty, f"/api/v1/nodes/{node.name}")
        assert status == 404
        _, obj = await api(s, faulty, f"/api/v1/namespaces/team-b/pods/{pod.name}")
        assert obj["status"]["phase"] == "Failed" and obj["status"]["reason"] == "Terminated"
        assert any(x["type"] == "DisruptionTarget" for x in obj["status"]["conditions"])
        with pytest.raises(aiohttp.ClientConnectorError):
            await get(s, faulty.endpoint_url(node))
    assert [i.pod_uids for i in c.truth.interruptions] == [(pod.uid,)]
    await faulty.advance(300)  # the managed instance group brings a new VM
    fresh = node_of(faulty, "t4-spot")
    assert fresh.name != node.name
    replacement = next(p for p in c.pods.values() if p.job is pod.job and p is not pod)
    assert replacement.phase == "Running" and replacement.node is fresh


@pytest.mark.parametrize("mode", ["error", "hang", "refuse"])
async def test_endpoint_faults_on_demand(mode: str, make_server: Callable[..., Any],
                                         make_scenario: Callable[..., Scenario]) -> None:
    server: SimulatorServer = await make_server(make_scenario())
    node = node_of(server, "h100")
    other = node_of(server, "l4")
    async with aiohttp.ClientSession() as s:
        async with s.post(server.api_url + "/sim/faults",
                          json={"kind": "endpoint", "node": "h100/0", "mode": mode,
                                "duration": "10m"}) as resp:
            assert resp.status == 200
        if mode == "error":
            status, _ = await get(s, server.endpoint_url(node))
            assert status == 500
        elif mode == "hang":
            with pytest.raises(asyncio.TimeoutError):
                await get(s, server.endpoint_url(node), limit=0.5)
        else:
            with pytest.raises(aiohttp.ClientConnectorError):
                await get(s, server.endpoint_url(node))
        assert (await get(s, server.endpoint_url(other)))[0] == 200  # others unaffected
        async with s.post(server.api_url + "/sim/advance?seconds=600") as resp:
            assert resp.status == 200
        assert (await get(s, server.endpoint_url(node)))[0] == 200


async def test_bad_fault_request_is_rejected(make_server: Callable[..., Any],
                                             make_scenario: Callable[..., Scenario]) -> None:
    server: SimulatorServer = await make_server(make_scenario())
    async with aiohttp.ClientSession() as s:
        for body in ({"kind": "xid", "node": "h100/0", "code": 12},
                     {"kind": "endpoint", "node": "nopool/0", "mode": "error"}):
            async with s.post(server.api_url + "/sim/faults", json=body) as resp:
                assert resp.status == 400


async def test_faults_at_offset_zero_hold_from_the_start(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario]) -> None:
    """A scenario that starts in an outage: the first scrape and the first objects show it,
    and the truth's incidents start at the scenario's start."""
    server: SimulatorServer = await make_server(make_scenario(faults=[
        {"at": 0, "kind": "xid", "node": "h100/0", "gpu": 2, "code": 79, "duration": "1h"},
        {"at": 0, "kind": "node_not_ready", "node": "l4/0", "duration": "1h"},
    ]))
    c = server.cluster
    h100, l4 = node_of(server, "h100"), node_of(server, "l4")
    async with aiohttp.ClientSession() as s:
        status, text = await get(s, server.endpoint_url(h100))
        assert status == 200
        assert {x.labels["gpu"] for x in samples(text)} == {str(g) for g in range(8)} - {"2"}
        _, obj = await api(s, server, f"/api/v1/nodes/{h100.name}")
        assert obj["status"]["allocatable"]["nvidia.com/gpu"] == "7"
        _, obj = await api(s, server, f"/api/v1/nodes/{l4.name}")
        ready = next(x for x in obj["status"]["conditions"] if x["type"] == "Ready")
        assert ready["status"] == "Unknown"
        with pytest.raises(aiohttp.ClientConnectorError):
            await get(s, server.endpoint_url(l4))
    assert sorted((i.node, i.reason, i.start) for i in c.truth.incidents) == \
        sorted([(h100.name, "gpu_missing", c.start)]
               + [(l4.name, "node_not_ready", c.start)] * 4)
    await server.advance(3600)
    assert all(i.end == c.start + 3600 for i in c.truth.incidents)
