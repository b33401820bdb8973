"""What ``gke-gpu-exporter run`` loads: the service, never the simulator it is tested on."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.conftest import exporter_env
from tests.timing import limit

IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|( *)(\S+)$")
"""A line of ``PYTHONPROFILEIMPORTTIME``: the module's name, indented by its depth."""


async def test_run_loads_no_simulator_module(make_server: Callable[..., Any],
                                             make_scenario: Callable[..., Scenario],
                                             tmp_path: Path) -> None:
    """``run`` against a simulated cluster, through start-up, cycles, warehouse flushes and
    a stop: every module it imported is named on its standard error, none is the
    simulator's."""
    sim: SimulatorServer = await make_server(make_scenario())
    env = exporter_env(sim.write_outputs(tmp_path).kubeconfig, tmp_path / "w.duckdb") \
        | {"PYTHONPROFILEIMPORTTIME": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter", "run", env=env, stderr=asyncio.subprocess.PIPE,
        cwd=os.fspath(tmp_path))
    assert proc.stderr is not None
    imported: list[str] = []
    port = None
    async with asyncio.timeout(limit(60)):
        while port is None:
            line = (await proc.stderr.readline()).decode()
            assert line, "the exporter exited before serving"
            if m := IMPORTED.match(line.rstrip("\n")):
                imported.append(m.group(2))
            elif m := re.search(r'"event": "serving".*"port": (\d+)', line):
                port = int(m.group(1))
    async with aiohttp.ClientSession() as s, asyncio.timeout(limit(60)):
        while True:  # ready, then a few cycles and flushes (a cycle and a flush a second)
            async with s.get(f"http://127.0.0.1:{port}/readyz") as resp:
                if resp.status == 200:
                    break
            await asyncio.sleep(0.2)
        await asyncio.sleep(3)
    proc.terminate()
    async with asyncio.timeout(limit(30)):
        rest, _ = await proc.communicate()
        assert proc.returncode == 0
    imported += [m.group(2) for line in (rest or b"").decode().splitlines()
                 if (m := IMPORTED.match(line))]
    assert "exporter.runtime.service" in imported and "duckdb" in imported  # the lines were read
    assert [m for m in imported if m.split(".")[0] == "simulator"] == []
