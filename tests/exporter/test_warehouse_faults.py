"""Faults of the warehouse cost no data and stop nothing: a failing warehouse leaves the
cycle and /metrics going, and a SIGKILLed exporter loses at most the cycle under way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter import duck
from exporter.demo import demo_config, step_both
from exporter.runtime.app import open_exporter
from exporter.runtime.service import Exporter
from exporter.sinks.warehouse import Warehouse
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.conftest import exporter_env, start_exporter


def gpu_seconds(text: str | bytes) -> float:
    """Sum of ``gke_gpu_gpu_seconds_total`` over every series."""
    if isinstance(text, bytes):
        text = text.decode()
    return sum(s.value for fam in text_string_to_metric_families(text)
               for s in fam.samples if s.name == "gke_gpu_gpu_seconds_total")


def warehouse_errors(exporter: Exporter) -> float:
    return sum(s.value for fam in text_string_to_metric_families(exporter.metrics.text.decode())
               for s in fam.samples if s.name == "gke_gpu_exporter_errors_total"
               and s.labels["source"] == "warehouse")


def stored_gpu_seconds(path: Path) -> float:
    """GPU-seconds in ``gpu_usage`` of the file."""
    con = duck.connect(path, read_only=True)
    try:
        row = con.execute("SELECT coalesce(sum(gpu_seconds), 0) FROM gpu_usage").fetchone()
    finally:
        con.close()
    return float(row[0]) if row else 0.0


def staged_gpu_seconds(path: Path) -> float:
    """GPU-seconds staged beside the file, not yet written."""
    files = sorted(path.with_name(path.name + ".staging").glob("*.parquet"))
    if not files:
        return 0.0
    con = duck.connect(":memory:")
    try:
        row = con.execute("SELECT sum(gpu_seconds) FROM read_parquet(["
                          + ", ".join(duck.quote(str(f)) for f in files) + "])").fetchone()
    finally:
        con.close()
    return float(row[0]) if row else 0.0


@contextlib.contextmanager
def staging_broken(wh: Warehouse) -> Iterator[None]:
    """The warehouse's staging directory replaced by a file: nothing can be staged."""
    directory = wh.staging.directory
    away = directory.with_name(directory.name + ".away")
    directory.rename(away)
    directory.write_bytes(b"")
    try:
        yield
    finally:
        directory.unlink()
        away.rename(directory)


async def test_a_failing_warehouse_stops_neither_the_cycle_nor_metrics(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every warehouse write failing for three cycles (nothing can be staged): each cycle
    still renders /metrics, counts a warehouse error and shows ``warehouse_ok`` false,
    logging once; once DuckDB works again, the rows of the failed cycles reach the table."""
    caplog.set_level(logging.INFO, logger="exporter.runtime.service")
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        await step_both(sim, exporter, 2)
        wh = exporter.warehouse
        assert wh is not None and exporter.warehouse_ok
        with staging_broken(wh):
            for n in range(1, 4):
                before = gpu_seconds(exporter.metrics.text)
                await step_both(sim, exporter, 1)
                assert not exporter.warehouse_ok
                assert warehouse_errors(exporter) == n
                assert gpu_seconds(exporter.metrics.text) > before   # /metrics moves on
            failed = [r for r in caplog.records if r.getMessage() == "warehouse write failed"]
            assert len(failed) == 1
        await step_both(sim, exporter, 1)
        assert exporter.warehouse_ok
        assert [r.getMessage() for r in caplog.records].count("warehouse write recovered") == 1
        wh.flush(exporter.last_cycle_time, partial=True)
        (stored,) = wh.con.execute("SELECT sum(gpu_seconds) FROM gpu_usage").fetchone()  # type: ignore[misc]
        assert stored == pytest.approx(gpu_seconds(exporter.metrics.text))


async def _gpu_seconds_now(port: int) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        return gpu_seconds(await r.text())


async def test_each_sigkill_loses_at_most_one_cycle(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """Four SIGKILLs at random moments of a 1 s cycle with a 60 s warehouse interval, then
    a clean stop: the GPU-seconds in the warehouse differ from those /metrics counted
    before each kill by at most one cycle per device and kill."""
    sim: SimulatorServer = await make_server(make_scenario())
    path = tmp_path / "w.duckdb"
    env = exporter_env(sim.write_outputs(tmp_path).kubeconfig, path,
                       WAREHOUSE__INTERVAL="60", WAREHOUSE__FLUSH_INTERVAL="60")
    rng = random.Random(7)
    devices = sum(len(g.devices) for n in sim.cluster.live_nodes() for g in n.gpus)
    cycle = 1.0 * 1.5  # the interval, and the lateness a loaded machine gives a cycle
    kills, counted = 4, 0.0
    for _ in range(kills):
        proc, port = await start_exporter(env)
        seen = 0.0
        for _ in range(rng.randint(3, 6)):  # cycles, each with the simulator 30 s on
            await sim.advance(sim.cluster.step)
            await asyncio.sleep(1.0)
            seen = max(seen, await _gpu_seconds_now(port))
        await asyncio.sleep(rng.uniform(0.0, 1.0))  # anywhere in a cycle
        seen = max(seen, await _gpu_seconds_now(port))
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        counted += seen
    proc, port = await start_exporter(env)
    for _ in range(3):
        await sim.advance(sim.cluster.step)
        await asyncio.sleep(1.0)
    last = await _gpu_seconds_now(port)
    proc.send_signal(signal.SIGTERM)
    assert await proc.wait() == 0
    stored = stored_gpu_seconds(path)
    # The clean stop stages everything and writes the intervals complete by its last cycle.
    stored += staged_gpu_seconds(path)
    counted += last
    assert counted > 0
    assert abs(stored - counted) <= kills * devices * cycle



async def test_a_slow_warehouse_never_holds_up_metrics(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """A flush that takes two seconds (a checkpoint of a large file, a slow disk) runs in
    the warehouse's thread: scrapes of /metrics during it are answered at once."""
    import time

    from aiohttp.test_utils import TestClient, TestServer

    from exporter.runtime.app import http_app

    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter, \
            TestClient(TestServer(http_app(exporter))) as client:
        await step_both(sim, exporter, 2)
        wh = exporter.warehouse
        assert wh is not None
        flush = wh.flush

        def slow_flush(now: float, partial: bool = False) -> None:
            time.sleep(2.0)
            flush(now, partial)

        wh.flush = slow_flush  # type: ignore[method-assign]
        wh._next_flush = 0.0
        cycle = asyncio.create_task(step_both(sim, exporter, 1))
        waits = []
        while not cycle.done():
            began = time.perf_counter()
            resp = await client.get("/metrics")
            assert resp.status == 200 and b"gke_gpu_gpu_seconds_total" in await resp.read()
            waits.append(time.perf_counter() - began)
            await asyncio.sleep(0.1)
        await cycle
        assert len(waits) >= 10 and max(waits) < 0.5
