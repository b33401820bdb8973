"""The dcgm-exporter Service: one URL in front of several nodes' dcgm-exporters, each
request answered by the next reachable one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp

from simulator.scenario import Fault, Scenario
from simulator.server import SimulatorServer
from tests.simulator.dcgm_text import samples
from tests.simulator.test_faults import get


async def _answers(s: aiohttp.ClientSession, server: SimulatorServer,
                   n: int) -> list[tuple[int, set[str]]]:
    """Status and the GPU UUIDs of ``n`` requests to the Service."""
    out = []
    for _ in range(n):
        status, text = await get(s, server.service_url)
        out.append((status, {x.labels["UUID"] for x in samples(text)} if status == 200
                    else set()))
    return out


def _uuids(server: SimulatorServer, name: str) -> set[str]:
    return {g.uuid for g in server.cluster.nodes[name].gpus}


async def test_round_robin_over_the_pools_nodes(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario]) -> None:
    server: SimulatorServer = await make_server(make_scenario(
        dcgm_service={"pools": ["l4", "t4-spot"]}))
    nodes = [n.name for n in server.service_nodes()]
    assert sorted(n.pool.name for n in server.service_nodes()) == ["l4", "t4-spot"]
    async with aiohttp.ClientSession() as s:
        got = await _answers(s, server, 4)
        assert got == [(200, _uuids(server, nodes[i % 2])) for i in range(4)]
        assert [n for _, n in server.service_answers] == [nodes[i % 2] for i in range(4)]

        # a NotReady node leaves the rotation; one failing answers for it when its turn comes
        await server.inject(Fault(at=0, kind="node_not_ready", node="l4/0", duration=600))
        got = await _answers(s, server, 2)
        t4 = next(n for n in nodes if "t4" in n)
        assert got == [(200, _uuids(server, t4))] * 2
        await server.inject(Fault(at=0, kind="endpoint", node="t4-spot/0", mode="error",
                                  duration=600))
        assert (await _answers(s, server, 1))[0][0] == 500
        await server.inject(Fault(at=0, kind="endpoint", node="t4-spot/0", mode="refuse",
                                  duration=600))
        assert (await _answers(s, server, 1))[0][0] == 503  # no endpoint left
        await server.advance(600)
        got = await _answers(s, server, 2)
        assert sorted(tuple(sorted(u)) for _, u in got) == sorted(
            tuple(sorted(_uuids(server, n))) for n in nodes)


async def test_without_pools_it_fronts_every_node(sim: SimulatorServer) -> None:
    everyone = {n.name for n in sim.cluster.live_nodes()}
    assert {n.name for n in sim.service_nodes()} == everyone
    async with aiohttp.ClientSession() as s:
        await _answers(s, sim, len(everyone))
    assert {n for _, n in sim.service_answers} == everyone
