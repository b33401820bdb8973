"""A stop ends within ``shutdown_timeout``: whatever is left then is dropped, with a warning."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest
from aiohttp import web

from exporter.runtime.app import Shutdown, _in_daemon_thread
from simulator.server import SimulatorServer
from tests.conftest import start_exporter
from tests.timing import limit


async def test_a_cycle_hanging_at_sigterm_is_left_at_the_shutdown_timeout(
        sim: SimulatorServer, tmp_path: Path) -> None:
    """A dcgm-exporter that never answers holds the cycle in flight (its scrape timeout is
    a minute): SIGTERM then ends the process after ``shutdown_timeout`` (1 s), exit 0,
    with a warning naming the cycle; without the bound it would wait a minute."""
    asked = asyncio.Event()

    async def hang(_: web.Request) -> web.Response:
        asked.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_get("/metrics", hang)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    target = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    env = os.environ | {
        "GKE_GPU_EXPORTER_INTERVAL": "90", "GKE_GPU_EXPORTER_PORT": "0",
        "GKE_GPU_EXPORTER_WAREHOUSE__INTERVAL": "90",
        "GKE_GPU_EXPORTER_WAREHOUSE__FLUSH_INTERVAL": "90",
        "GKE_GPU_EXPORTER_LISTEN_ADDRESS": "127.0.0.1", "GKE_GPU_EXPORTER_LOG_FORMAT": "json",
        "GKE_GPU_EXPORTER_DCGM__TIMEOUT": "60", "GKE_GPU_EXPORTER_SHUTDOWN_TIMEOUT": "1",
        "GKE_GPU_EXPORTER_DCGM__TARGETS": json.dumps([target]),
        "GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(sim.write_outputs(tmp_path).kubeconfig),
        "GKE_GPU_EXPORTER_WAREHOUSE__PATH": str(tmp_path / "w.duckdb")}
    try:
        proc, _ = await start_exporter(env)
        async with asyncio.timeout(limit(30)):
            await asyncio.wait_for(asked.wait(), limit(30))  # the cycle is in flight
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(limit(30)):
            assert await proc.wait() == 0
        took = time.monotonic() - began
        assert proc.stderr is not None
        events = [json.loads(line) for line in (await proc.stderr.read()).splitlines()
                  if line.startswith(b"{")]
    finally:
        await runner.cleanup()
    assert 1.0 <= took < 20.0, f"stopped {took:.1f} s after SIGTERM (not the 60 s scrape timeout)"
    left = [e for e in events if e["event"] == "shutdown timeout"]
    assert left and left[0]["step"] == "cycle" and left[0]["severity"] == "WARNING"
    # the cycle took the whole second: the final flush had none left, and was left too
    assert {e["step"] for e in left[1:]} <= {"final flush"}
    assert events[-1]["event"] == "stopped"


async def test_work_past_the_deadline_is_left_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """A final flush still running at the deadline is left, in a thread the exit does not
    wait for; work that ends in time is awaited."""
    shutdown = Shutdown(0.3)
    assert await shutdown.within("cycle", asyncio.sleep(0.1))
    began = time.monotonic()
    assert not await shutdown.within("final flush", _in_daemon_thread(time.sleep, 30))
    assert time.monotonic() - began < 10  # not the 30 s the work takes
    warned = [r for r in caplog.records if r.getMessage() == "shutdown timeout"]
    assert [(r.levelno, r.ctx["step"]) for r in warned] == [(logging.WARNING, "final flush")]  # type: ignore[attr-defined]


async def test_an_error_in_the_thread_reaches_the_caller() -> None:
    def fail() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        await Shutdown(5).within("final flush", _in_daemon_thread(fail))
