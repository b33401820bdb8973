"""The dcgm-exporters' pages (``simulator.dcgm_pages``): with a ``dcgm_collect_interval``,
a page shows what its exporter collected last, whole, as a real one does between
collections; without, the cluster as it is at each step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from simulator.scenario import Scenario, ScenarioError, parse_scenario
from simulator.server import SimulatorServer
from tests.conftest import scenario_data
from tests.simulator.dcgm_text import by_gpu

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
POWER = "DCGM_FI_DEV_POWER_USAGE"


async def page(server: SimulatorServer, pool: str) -> tuple[bytes, dict[str, float]]:
    """The page of the pool's first node as its dcgm-exporter answers now: the body, and
    each GPU's energy counter on it."""
    node = next(n for n in server.cluster.live_nodes() if n.pool.name == pool)
    async with aiohttp.ClientSession() as s, s.get(server.endpoint_url(node)) as r:
        body = await r.read()
    return body, {k: v[ENERGY] for k, v in by_gpu(body.decode()).items()}


def counters(server: SimulatorServer, pool: str) -> dict[str, float]:
    """The pool's first node's GPUs' energy counters in the cluster now (mJ)."""
    node = next(n for n in server.cluster.live_nodes() if n.pool.name == pool)
    return {g.uuid: server.cluster.gpu_energy_mj(g) for g in node.gpus}


async def test_a_page_shows_the_last_collection_until_the_next(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario]) -> None:
    """Collecting every 5 minutes while the cluster steps every 30 s: the page is the same
    byte for byte between collections, and its counters are the cluster's at the last
    collection; at the next one they move on."""
    server: SimulatorServer = await make_server(make_scenario(dcgm_collect_interval="5m"))
    server.cluster.submit("train", run_seconds=7200)
    await server.advance(300)
    collected = counters(server, "h100")
    first, shown = await page(server, "h100")
    assert shown == pytest.approx(collected)
    for _ in range(9):
        await server.advance(30)
        assert (await page(server, "h100"))[0] == first
    assert counters(server, "h100") != collected  # the cluster went on meanwhile
    await server.advance(30)
    _, shown = await page(server, "h100")
    assert shown == pytest.approx(counters(server, "h100"))
    assert all(shown[u] > collected[u] for u in shown)


async def test_without_a_collection_interval_each_step_is_collected(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario]) -> None:
    server: SimulatorServer = await make_server(make_scenario())
    server.cluster.submit("train", run_seconds=7200)
    for _ in range(3):
        await server.advance(30)
        assert (await page(server, "h100"))[1] == pytest.approx(counters(server, "h100"))


async def test_a_driver_reload_shows_at_the_next_collection(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario]) -> None:
    """The driver reloads a minute after a collection: the page goes on showing the old
    counters till the next one, which shows what they counted since the reload."""
    server: SimulatorServer = await make_server(make_scenario(
        dcgm_collect_interval="5m",
        faults=[{"at": "6m", "kind": "driver_reload", "node": "h100/0"}]))
    server.cluster.submit("train", run_seconds=7200)
    await server.advance(300)
    _, old = await page(server, "h100")
    await server.advance(120)
    assert all(c < old[u] for u, c in counters(server, "h100").items())  # reloaded
    assert (await page(server, "h100"))[1] == old  # not yet collected
    await server.advance(180)
    _, shown = await page(server, "h100")
    assert all(0 < shown[u] < old[u] for u in shown)
    assert shown == pytest.approx(counters(server, "h100"))


async def test_an_exporter_that_starts_again_collects_at_once(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario]) -> None:
    """A node back from NotReady between collections: its exporter's first page is the
    cluster's now (the counters restarted at boot), not the page from before."""
    server: SimulatorServer = await make_server(make_scenario(
        dcgm_collect_interval="5m",
        faults=[{"at": "6m", "kind": "node_not_ready", "node": "l4/0", "duration": "2m"}]))
    await server.advance(300)
    _, old = await page(server, "l4")
    await server.advance(240)  # Ready again at 8 minutes, the next collection at 10
    _, shown = await page(server, "l4")
    assert shown == pytest.approx(counters(server, "l4"))
    assert all(shown[u] < old[u] for u in shown)


@pytest.mark.parametrize("every", ["45s", "10s", "0s"])
def test_a_collection_interval_is_a_whole_number_of_steps(every: str) -> None:
    with pytest.raises(ScenarioError, match="dcgm_collect_interval"):
        parse_scenario(scenario_data(dcgm_collect_interval=every), "test")


def test_a_collection_interval_of_whole_steps_is_taken() -> None:
    s = parse_scenario(scenario_data(dcgm_collect_interval="5m"), "test")
    assert s.dcgm_collect_interval == 300.0
