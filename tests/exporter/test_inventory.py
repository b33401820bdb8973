"""The device inventory heals itself: a GPU that came back under a new UUID is never
billed twice, and the old UUID is retired after ``dcgm.retire_after``, series, incident
and saved inventory alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from exporter.demo import demo_config, step_both
from exporter.runtime.app import open_exporter
from simulator.server import SimulatorServer
from tests.conftest import Handler

RETIRE_AFTER = 300.0


async def test_a_gpu_back_under_a_new_uuid_retires_the_old_one(
        sim: SimulatorServer, tmp_path: Path,
        serve: Callable[[Handler], Awaitable[str]]) -> None:
    """GPU 3 of the 8-GPU node drops out of its exporter's answer (missing: an incident
    opens), then comes back under a new UUID: the node has 8 GPUs at 8 GPUs' price, the
    incident ends, and ``retire_after`` later the old UUID is gone from the inventory,
    /metrics and the saved state."""
    (h100,) = [n for n in sim.cluster.live_nodes() if n.pool.name == "h100"]
    old = h100.gpus[3].uuid
    mode = "whole"

    async def proxy(_: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as s, s.get(sim.endpoint_url(h100)) as r:
            body = await r.text()
        if mode == "missing":
            body = "".join(line for line in body.splitlines(keepends=True) if old not in line)
        elif mode == "renamed":
            body = body.replace(old, "GPU-renewed-3")
        return web.Response(text=body)

    targets = [await serve(proxy)] + [sim.endpoint_url(n) for n in sim.cluster.live_nodes()
                                      if n is not h100]
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    cfg = cfg.model_copy(update={"dcgm": cfg.dcgm.model_copy(update={
        "targets": targets, "retire_after": RETIRE_AFTER})})

    def on_node() -> dict[str, tuple[str, str | None, float | None]]:
        return {d.gpu_uuid: (d.state, d.reason, d.price_usd_per_hour)
                for d in exporter.states if d.node == h100.name}

    async with open_exporter(cfg) as exporter:
        await exporter.kube.wait_synced()
        await step_both(sim, exporter, 2)
        price = sum(p or 0.0 for _, _, p in on_node().values())

        mode = "missing"
        await step_both(sim, exporter, 2)
        assert on_node()[old][:2] == ("unavailable", "gpu_missing")
        assert (old, "gpu_missing") in exporter.incidents.open

        mode = "renamed"
        await step_both(sim, exporter, 1)
        assert old not in on_node() and len(on_node()) == 8
        assert sum(p or 0.0 for _, _, p in on_node().values()) == pytest.approx(price)
        assert (old, "gpu_missing") not in exporter.incidents.open
        assert old in exporter.inventory.devices[h100.name]     # remembered until retired
        assert f'uuid="{old}"'.encode() in exporter.metrics.text  # its downtime so far

        await step_both(sim, exporter, round(RETIRE_AFTER / sim.cluster.step))
        assert old not in exporter.inventory.devices[h100.name]
        assert len(exporter.inventory.devices[h100.name]) == 8
        assert old.encode() not in exporter.metrics.text
        wh = exporter.warehouse
        assert wh is not None
        inventory, _ = wh.resume.load()
        assert old not in inventory[h100.name] and "GPU-renewed-3" in inventory[h100.name]
        wh.flush(sim.cluster.now, partial=True)
        events = wh.con.execute("SELECT reason, epoch(end_time) - epoch(start_time) FROM "
                                "availability_events WHERE gpu_uuid = ?", [old]).fetchall()
    assert [(r, round(s)) for r, s in events] == [("gpu_missing", 2 * sim.cluster.step)]
