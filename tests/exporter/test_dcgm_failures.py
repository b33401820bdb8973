"""A failing or hostile dcgm-exporter costs only its own series, never the cycle."""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from exporter.errors import SourceDataError, SourceTimeout, SourceUnavailable
from exporter.sources.dcgm import DcgmSource, TargetScrape
from tests.conftest import FIXTURES

REAL = (FIXTURES / "dcgm" / "dcgm-exporter_L4_kops_driver580.prom").read_text()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def good(_: web.Request) -> web.Response:
    return web.Response(text=REAL)


async def error(_: web.Request) -> web.Response:
    return web.Response(status=500, text="boom")


async def hang(_: web.Request) -> web.Response:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def drip(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    for line in REAL.splitlines(keepends=True):
        await resp.write(line.encode())
        await asyncio.sleep(0.2)
    return resp


async def huge(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()  # chunked: no Content-Length to refuse up front
    await resp.prepare(request)
    chunk = REAL.encode() * 64
    for _ in range(50 * 1024 * 1024 // len(chunk) + 1):
        await resp.write(chunk)
    return resp


def text(body: str) -> Handler:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=body)

    return handler


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"

    yield start
    for r in runners:
        await r.cleanup()


@pytest.fixture
async def source() -> AsyncIterator[DcgmSource]:
    async with aiohttp.ClientSession() as session:
        yield DcgmSource(session, timeout_seconds=1.0, max_body_bytes=32 * 1024 * 1024,
                         max_devices=256)


async def test_failures_are_contained(serve: Callable[[Handler], Awaitable[str]],
                                      source: DcgmSource) -> None:
    ok = await serve(good)
    failing = {"error": await serve(error), "hang": await serve(hang),
               "drip": await serve(drip), "refused": "http://127.0.0.1:9/metrics"}
    began = time.monotonic()
    results = await source.fetch([ok, *failing.values()])
    assert time.monotonic() - began < 3, "the timeout is honoured"
    assert isinstance(results[0], TargetScrape) and results[0].result.samples == 23
    kinds = dict(zip(failing, (type(r) for r in results[1:]), strict=True))
    assert kinds == {"error": SourceUnavailable, "hang": SourceTimeout,
                     "drip": SourceTimeout, "refused": SourceUnavailable}
    assert all(r.target == u for r, u in zip(results[1:], failing.values(), strict=True))  # type: ignore[union-attr]


async def test_oversized_body_is_refused_without_reading_it_all(
        serve: Callable[[Handler], Awaitable[str]], source: DcgmSource) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    (res,) = await source.fetch([await serve(huge)])
    assert isinstance(res, SourceDataError) and "cap" in res.reason
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 40, "memory stays bounded by the body cap"


LINE = 'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-{u}",modelName="NVIDIA L4",Hostname="n"}} {v}\n'


@pytest.mark.parametrize(("case", "body", "samples", "rejected"), [
    ("1 MB line", 'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a",pod="' + "x" * (1 << 20) + '"} 1\n'
     + LINE.format(u="b", v=2), 1, {"too_long": 1}),
    ("200k distinct label values", "".join(LINE.format(u=i, v=1) for i in range(200_000)),
     256, {"too_many_series": 200_000 - 256}),
    ("binary garbage", "\x00\x01\xfe\xff" * 1000 + "\n" + LINE.format(u="a", v=3), 1,
     {"malformed": 1}),
    ("duplicate series", LINE.format(u="a", v=1) * 3, 1, {"duplicate": 2}),
    ("NaN and Inf", LINE.format(u="a", v="NaN") + LINE.format(u="b", v="+Inf")
     + LINE.format(u="c", v=4), 1, {"not_finite": 2}),
    ("blanks after commas, as the format allows", LINE.format(u="a", v=5).replace(",", ", "),
     1, {}),
    ("a blank instead of a comma", LINE.format(u="a", v=5).replace(",", " ", 1)
     + LINE.format(u="b", v=6), 1, {"malformed": 1}),
])
async def test_hostile_payloads_keep_the_valid_subset(
        case: str, body: str, samples: int, rejected: dict[str, int],
        serve: Callable[[Handler], Awaitable[str]], source: DcgmSource) -> None:
    (res,) = await source.fetch([await serve(text(body))])
    assert isinstance(res, TargetScrape)
    assert res.result.samples == samples
    assert res.result.rejected == rejected


async def test_nothing_valid_fails_the_target(serve: Callable[[Handler], Awaitable[str]],
                                              source: DcgmSource) -> None:
    (res,) = await source.fetch([await serve(text("\x00garbage\nnot metrics\n"))])
    assert isinstance(res, SourceDataError) and "no DCGM GPU samples" in res.reason
