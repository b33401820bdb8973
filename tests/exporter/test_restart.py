"""GPUs Kubernetes knows count from the first cycle, and an outage outlives the exporter:
a node NotReady with its dcgm-exporter failing from before the exporter starts, the
exporter SIGKILLed mid-outage and started again."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from exporter import duck
from simulator.scenario import Fault, Scenario
from simulator.server import SimulatorServer
from tests.conftest import exporter_env, start_exporter
from tests.timing import limit

DOWN = re.compile(r'^gke_gpu_available\{[^}]*node="(?P<node>[^"]+)"[^}]*'
                  r'uuid="(?P<uuid>[^"]+)"[^}]*\} 0$', re.M)


async def _metrics(port: int) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        return await r.text()


async def _down(port: int, want: Callable[[set[tuple[str, str]]], bool]) -> set[tuple[str, str]]:
    """The (node, uuid) of every unavailable GPU, once ``want`` holds."""
    async with asyncio.timeout(limit(60)):
        while True:
            down = {(m["node"], m["uuid"]) for m in DOWN.finditer(await _metrics(port))}
            if want(down):
                return down
            await asyncio.sleep(0.3)


async def test_an_outage_from_before_the_start_survives_a_sigkill(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(make_scenario())
    for kind, mode in (("node_not_ready", None), ("endpoint", "error")):
        await sim.inject(Fault(at=0, kind=kind, node="l4/0", mode=mode, duration=86400))
    await sim.advance(60)
    node = next(n.name for n in sim.cluster.live_nodes() if n.pool.name == "l4")
    path = tmp_path / "w.duckdb"
    env = exporter_env(sim.write_outputs(tmp_path).kubeconfig, path)

    proc, port = await start_exporter(env)
    # Never shown by DCGM, its exporter answering 500: Kubernetes' four GPUs are down.
    first = await _down(port, lambda d: len({u for n, u in d if n == node}) == 4)
    assert {u for n, u in first if n == node} == {f"{node}/k8s-{i}" for i in range(4)}
    await asyncio.sleep(1.5)                          # the state is saved with the cycle
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    with duck.connect(path, read_only=True) as con:
        (started,) = con.execute("SELECT min(start_time) FROM open_incidents").fetchone() \
            or (None,)
    assert started is not None

    proc, port = await start_exporter(env)
    try:
        again = await _down(port, lambda d: len({u for n, u in d if n == node}) == 4)
        assert {u for n, u in again if n == node} == {u for n, u in first if n == node}
        await sim.advance(86400)                      # the node is back, its exporter too
        await _down(port, lambda d: not any(n == node for n, _ in d))
        await asyncio.sleep(1.5)
    finally:
        proc.terminate()
        async with asyncio.timeout(limit(30)):
            assert await proc.wait() == 0
    with duck.connect(path, read_only=True) as con:
        events = con.execute("SELECT gpu_uuid, reason, epoch(start_time) FROM "
                             "availability_events WHERE node = ? ORDER BY gpu_uuid",
                             [node]).fetchall()
        still_open = con.execute("SELECT count(*) FROM open_incidents").fetchone()
    # one incident per GPU, from before the kill to the recovery: not ended, not lost
    assert [(u, r) for u, r, _ in events] == [(f"{node}/k8s-{i}", "node_not_ready")
                                             for i in range(4)]
    assert all(abs(start - started) < 1e-3 for _, _, start in events)
    assert still_open == (0,)
