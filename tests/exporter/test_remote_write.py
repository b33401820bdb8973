"""Remote write to a real Prometheus (its remote-write receiver): values arrive, a vanished
series goes stale at once, a refused request is not retried, a failing one is."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from exporter.backoff import Backoff
from exporter.sinks.remote_write import RemoteWriter
from tests.conftest import start_prometheus
from tests.exporter.views import gpus_up, view_of
from tests.timing import limit

TWO = view_of(gpus_up(2, start=1))
"""GPUs gpu-1 and gpu-2, up 1 and 2 seconds."""
ONE = view_of(gpus_up(1, start=3))
"""GPU gpu-3 only, up 3 seconds."""


@pytest.fixture
async def prometheus(tmp_path: Path) -> AsyncIterator[str]:
    proc, url = await start_prometheus(tmp_path, {"global": {}},
                                       "--web.enable-remote-write-receiver")
    yield url
    proc.terminate()
    await proc.wait()


async def drain(writer: RemoteWriter) -> None:
    task = asyncio.create_task(writer.run())
    async with asyncio.timeout(limit(30)):
        while writer.stats.queued:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    task.cancel()


async def query(url: str, expr: str, at: float) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(
            f"{url}/api/v1/query", params={"query": expr, "time": str(at)}) as r:
        result = (await r.json())["data"]["result"]
    return {x["metric"]["uuid"]: float(x["value"][1]) for x in result}


async def test_values_arrive_and_a_vanished_series_goes_stale(prometheus: str) -> None:
    now = time.time()
    async with aiohttp.ClientSession() as s:
        writer = RemoteWriter(s, f"{prometheus}/api/v1/write")
        writer.add_cycle(TWO, now - 60)
        writer.add_cycle(ONE, now - 30)
        await drain(writer)
        assert (writer.stats.requests_sent, writer.stats.requests_dropped) == (2, 0)
        up = "gke_gpu_up_seconds_total"
        assert await query(prometheus, up, now - 45) == {"gpu-1": 1, "gpu-2": 2}
        # gpu-1 and gpu-2 got a staleness marker: gone at once, not for the 5-minute lookback
        assert await query(prometheus, up, now - 20) == {"gpu-3": 3}
        # a sample older than what the receiver has is refused (400): dropped, not retried
        late = RemoteWriter(s, f"{prometheus}/api/v1/write")
        late.add_cycle(ONE, now - 50)
        await drain(late)
        assert (late.stats.requests_sent, late.stats.requests_dropped,
                late.stats.retries) == (0, 1, 0)


async def test_server_errors_are_retried_with_backoff() -> None:
    answers = [500, 429, 204]
    got: list[bytes] = []

    async def write(request: web.Request) -> web.Response:
        got.append(await request.read())
        assert request.headers["Content-Encoding"] == "snappy"
        return web.Response(status=answers.pop(0))

    app = web.Application()
    app.router.add_post("/write", write)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as s:
            writer = RemoteWriter(s, f"http://127.0.0.1:{port}/write",
                                  backoff=Backoff(base=0.01, cap=0.05))
            writer.add_cycle(ONE, time.time())
            await drain(writer)
        assert (writer.stats.requests_sent, writer.stats.retries) == (1, 2)
        assert len(got) == 3 and got[0] == got[2]   # the same request, resent
    finally:
        await runner.cleanup()


async def test_a_full_queue_drops_the_oldest() -> None:
    async with aiohttp.ClientSession() as s:
        writer = RemoteWriter(s, "http://127.0.0.1:9/write", queue_size=2)
        for i in range(3):
            writer.add_cycle(ONE, 1000.0 + i)
        assert (writer.stats.queued, writer.stats.requests_dropped) == (2, 1)
