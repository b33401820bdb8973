"""A warehouse that cannot be opened at start leaves the exporter serving /metrics without
history (not ready, saying why, ``warehouse_up`` 0) and opens once it can; a stop after
warehouse errors exits 0 without a traceback."""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporter.demo import demo_config, step_both
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.conftest import exporter_env, start_exporter
from tests.exporter.test_exporter import families
from tests.exporter.test_readiness import readyz, serving
from tests.exporter.test_warehouse_faults import gpu_seconds, stored_gpu_seconds

UP = "gke_gpu_exporter_warehouse_up"


def _staging(path: Path) -> Path:
    return path.with_name(path.name + ".staging")


def _damaged_file(path: Path) -> None:
    path.write_bytes(b"\x00not a DuckDB file\n" * 4096)


def _move_it_away(path: Path) -> None:
    path.rename(path.with_name(path.name + ".damaged"))


def _staging_taken(path: Path) -> None:
    """The staging folder's name taken by a file: the file opens, the folder cannot be made
    (as on a full or read-only disk)."""
    _staging(path).write_bytes(b"")


def _free_staging(path: Path) -> None:
    _staging(path).unlink()


UNOPENABLE: dict[str, tuple[Callable[[Path], None], Callable[[Path], None]]] = {
    "a damaged file": (_damaged_file, _move_it_away),
    "a folder that cannot be made": (_staging_taken, _free_staging),
}
"""How the warehouse cannot be opened, and how the operator repairs it."""


def warehouse_up(text: bytes) -> list[float]:
    return [v for _, v in families(text).get(UP, [])]


@pytest.mark.parametrize("case", UNOPENABLE)
async def test_a_warehouse_that_cannot_be_opened_leaves_metrics_served_and_heals(
        case: str, make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    damage, repair = UNOPENABLE[case]
    caplog.set_level(logging.INFO, logger="exporter")
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    path = cfg.warehouse.path
    damage(path)
    async with serving(cfg) as (exporter, client):
        opening = exporter.warehouse_opening
        assert exporter.warehouse is None and opening is not None
        opening.retry_seconds = 2 * sim.cluster.step
        await step_both(sim, exporter, 4)
        # during: the figures are served, readiness and warehouse_up say the history is not
        assert exporter.warehouse is None
        assert gpu_seconds(exporter.metrics.text) > 0
        assert warehouse_up(exporter.metrics.text) == [0.0]
        status, reason = await readyz(client)
        assert status == 503 and "the warehouse cannot be opened" in reason
        assert str(path) in reason
        unavailable = [r for r in caplog.records if r.getMessage() == "warehouse unavailable"]
        assert len(unavailable) == 1 and "Traceback" not in caplog.text
        # after: repaired, the next try opens it, and the cycles from then are written
        repair(path)
        await step_both(sim, exporter, 3)
        warehouse = exporter.warehouse
        assert warehouse is not None and exporter.warehouse_opening is None
        assert warehouse_up(exporter.metrics.text) == [1.0]
        assert (await readyz(client))[0] == 200
        assert [r.getMessage() for r in caplog.records].count("warehouse opened") == 1
        warehouse.flush(exporter.last_cycle_time, partial=True)
        assert warehouse.rows_written["gpu_usage"] > 0
    assert stored_gpu_seconds(path) > 0


def _stderr_lines(text: bytes) -> list[str]:
    return text.decode().splitlines()


async def _get(port: int, route: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{route}") as r:
        return r.status, await r.read()


async def test_a_damaged_warehouse_at_start_is_no_crash_loop(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """``gke-gpu-exporter run`` on a damaged file: one line saying so, /metrics served, not
    ready, and SIGTERM exits 0."""
    sim: SimulatorServer = await make_server(make_scenario())
    path = tmp_path / "w.duckdb"
    _damaged_file(path)
    proc, port = await start_exporter(exporter_env(sim.write_outputs(tmp_path).kubeconfig,
                                                   path))
    try:
        for _ in range(100):
            status, text = await _get(port, "/metrics")
            if gpu_seconds(text) > 0:
                break
            await sim.advance(sim.cluster.step)
            await asyncio.sleep(0.2)
        assert status == 200 and gpu_seconds(text) > 0 and warehouse_up(text) == [0.0]
        status, body = await _get(port, "/readyz")
        assert status == 503 and b"the warehouse cannot be opened" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        err = await proc.stderr.read()
        code = await proc.wait()
    assert code == 0 and b"Traceback" not in err
    # logged once, before "serving" (read by start_exporter), and never again
    assert sum('"event": "warehouse unavailable"' in line for line in _stderr_lines(err)) == 0
    assert path.read_bytes().startswith(b"\x00not a DuckDB file")  # left as it was


async def test_sigterm_after_warehouse_errors_exits_0(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """Writes failing when the stop comes (the staging folder gone): the final flush fails
    with a warning, the process exits 0, no traceback."""
    sim: SimulatorServer = await make_server(make_scenario())
    path = tmp_path / "w.duckdb"
    proc, port = await start_exporter(exporter_env(sim.write_outputs(tmp_path).kubeconfig,
                                                   path))
    try:
        for _ in range(3):
            await sim.advance(sim.cluster.step)
            await asyncio.sleep(1.0)
        shutil.rmtree(_staging(path))
        _staging(path).write_bytes(b"")    # nothing can be staged or written any more
        for _ in range(100):
            status, body = await _get(port, "/readyz")
            if b"the warehouse fails" in body:
                break
            await asyncio.sleep(0.2)
        assert status == 503
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        err = await proc.stderr.read()
        code = await proc.wait()
    assert b"Traceback" not in err, err.decode()[-2000:]
    assert code == 0
    assert any('"event": "final flush failed"' in line for line in _stderr_lines(err))
