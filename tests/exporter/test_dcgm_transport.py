"""The dcgm source's HTTP side: what it sends, what it refuses, connections it keeps, and
a round that ends on time and leaves no thread behind."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import trustme
from aiohttp import web

from exporter.errors import SourceDataError, SourceTimeout, SourceUnavailable
from exporter.model.records import TargetScrape
from exporter.sources.dcgm import DcgmSource
from tests.conftest import FIXTURES, Handler

REAL = (FIXTURES / "dcgm" / "dcgm-exporter_L4_kops_driver580.prom").read_text()
CAP = 1 << 20


async def good(_: web.Request) -> web.Response:
    return web.Response(text=REAL)


async def hang(_: web.Request) -> web.Response:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


@pytest.fixture
async def source() -> AsyncIterator[DcgmSource]:
    source = DcgmSource(timeout_seconds=2.0, max_body_bytes=CAP, max_devices=256)
    yield source
    source.close()


def workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dcgm-scrapes"]


async def test_each_target_gets_its_answer_or_its_error_in_order(
        serve: Callable[[Handler], Awaitable[str]], source: DcgmSource) -> None:
    async def missing(_: web.Request) -> web.Response:
        return web.Response(status=404, text="no such page")

    async def announced_too_big(_: web.Request) -> web.Response:
        return web.Response(body=b"#\n" * CAP)

    async def growing_too_big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()  # chunked: no length announced
        await resp.prepare(request)
        for _ in range(4):
            await resp.write(REAL.encode() * 100)
        return resp

    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPFound(ok)

    ok = await serve(good)
    targets = [ok, await serve(missing), await serve(announced_too_big),
               await serve(growing_too_big), await serve(redirect),
               "http://127.0.0.1:9/metrics", ok]
    results = await source.fetch(targets)
    assert [r.target for r in results] == targets
    first, status, announced, grown, moved, refused, again = results
    for scrape in first, again:
        assert isinstance(scrape, TargetScrape)
        assert scrape.result.samples == 23 and scrape.bytes_read == len(REAL.encode())
        assert 0 < scrape.duration_seconds < 2
    assert isinstance(status, SourceUnavailable)
    assert (status.reason, status.status, status.label) == ("HTTP 404", 404, "http_404")
    assert isinstance(announced, SourceDataError)
    assert announced.reason == f"body of {2 * CAP} bytes exceeds the {CAP}-byte cap"
    assert isinstance(grown, SourceDataError)
    assert grown.reason == f"body exceeds the {CAP}-byte cap"
    assert isinstance(moved, SourceUnavailable) and moved.status == 302, "no redirect followed"
    assert isinstance(refused, SourceUnavailable) and refused.label == "refused"


async def test_it_asks_for_plain_text_directly_over_kept_connections(
        serve: Callable[[Handler], Awaitable[str]], source: DcgmSource,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The request asks for text, uncompressed, from the target itself whatever proxy the
    environment names; the next round reuses the connection."""
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    seen: list[tuple[str | None, str | None, object]] = []

    async def record(request: web.Request) -> web.Response:
        assert request.transport is not None
        seen.append((request.headers.get("Accept"), request.headers.get("Accept-Encoding"),
                     request.transport.get_extra_info("peername")))
        return web.Response(text=REAL)

    url = await serve(record)
    for _ in range(3):
        (res,) = await source.fetch([url])
        assert isinstance(res, TargetScrape)
    assert [s[:2] for s in seen] == [("text/plain", "identity")] * 3
    assert len({s[2] for s in seen}) == 1, "one connection for every round"


async def test_each_source_keeps_its_own_parse_cache(
        serve: Callable[[Handler], Awaitable[str]], source: DcgmSource) -> None:
    """What one source's parses remember (the label sets' entities) is its own: another
    source's rounds neither fill nor read it."""
    other = DcgmSource(timeout_seconds=2.0, max_body_bytes=CAP)
    try:
        (res,) = await source.fetch([await serve(good)])
        assert isinstance(res, TargetScrape)
        assert source.parse_cache.entities_cached == 1  # the L4's one label set
        assert other.parse_cache is not source.parse_cache
        assert other.parse_cache.entities_cached == 0
    finally:
        other.close()


async def test_a_round_ends_at_its_timeout_however_many_targets_hang(
        serve: Callable[[Handler], Awaitable[str]]) -> None:
    """Twelve hanging targets, two transfers at a time: the round still ends at its
    timeout, those that never started included."""
    source = DcgmSource(timeout_seconds=1.0, max_body_bytes=CAP, concurrency=2)
    try:
        hanging = await serve(hang)
        ok = await serve(good)
        began = time.monotonic()
        results = await source.fetch([hanging] * 12 + [ok])
        assert time.monotonic() - began < 4  # one timeout; unbounded, six in a row (6 s)
        assert all(isinstance(r, SourceTimeout) for r in results)
        assert results[0].reason == "no complete answer in 1 s"  # type: ignore[union-attr]
        (res,) = await source.fetch([ok])
        assert isinstance(res, TargetScrape), "the next round starts afresh"
    finally:
        source.close()


async def test_a_cancelled_round_and_close_leave_no_thread(
        serve: Callable[[Handler], Awaitable[str]]) -> None:
    source = DcgmSource(timeout_seconds=60, max_body_bytes=CAP)
    url = await serve(hang)
    task = asyncio.create_task(source.fetch([url] * 20))
    await asyncio.sleep(0.2)
    assert workers(), "the round runs in its own thread"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    began = time.monotonic()
    source.close()
    assert time.monotonic() - began < 20 and not workers()  # not the 60 s timeout
    with pytest.raises(RuntimeError):
        await source.fetch([url])


async def test_connections_to_targets_no_longer_asked_for_are_closed(
        serve: Callable[[Handler], Awaitable[str]]) -> None:
    """A connection idle for longer than the keep-alive is closed by the next round."""
    source = DcgmSource(timeout_seconds=2.0, max_body_bytes=CAP, keepalive_seconds=1)
    transports: list[asyncio.BaseTransport] = []

    async def record(request: web.Request) -> web.Response:
        assert request.transport is not None
        transports.append(request.transport)
        return web.Response(text=REAL)

    try:
        gone, kept = await serve(record), await serve(good)
        await source.fetch([gone, kept])
        await asyncio.sleep(1.5)
        await source.fetch([kept])
        await asyncio.sleep(0.1)
        assert transports[0].is_closing()
    finally:
        source.close()


async def test_a_target_named_by_its_host_name_keeps_its_connection(
        serve: Callable[[Handler], Awaitable[str]], source: DcgmSource) -> None:
    """No resolved address is cached: a target named by host name is resolved when it is
    first connected to, and its connection then serves every round."""
    transports: list[asyncio.BaseTransport] = []

    async def record(request: web.Request) -> web.Response:
        assert request.transport is not None
        transports.append(request.transport)
        return web.Response(text=REAL)

    url = (await serve(record)).replace("127.0.0.1", "localhost")
    for _ in range(3):
        (res,) = await source.fetch([url])
        assert isinstance(res, TargetScrape), res
    assert len(transports) == 3 and len(set(map(id, transports))) == 1


async def test_a_failure_of_the_worker_fails_its_round_only(
        serve: Callable[[Handler], Awaitable[str]], source: DcgmSource,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected error in the worker is raised by the round it hit, never left
    unanswered; the next round starts a new worker."""
    url = await serve(good)
    transport = source._transport
    monkeypatch.setattr(transport, "_collect", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        await source.fetch([url])
    monkeypatch.undo()
    (res,) = await source.fetch([url])
    assert isinstance(res, TargetScrape)


async def test_https_targets_are_checked_against_the_system_trust(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A target whose certificate the system trusts (here through ``SSL_CERT_FILE``, as
    Python's own clients find it) answers; before it is trusted, it is refused."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    app = web.Application()
    app.router.add_get("/metrics", good)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server).start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}/metrics"
    try:
        untrusted = DcgmSource(timeout_seconds=2.0, max_body_bytes=CAP)
        (res,) = await untrusted.fetch([url])
        untrusted.close()
        assert isinstance(res, SourceUnavailable)
        ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
        trusted = DcgmSource(timeout_seconds=2.0, max_body_bytes=CAP)
        (res,) = await trusted.fetch([url])
        trusted.close()
        assert isinstance(res, TargetScrape) and res.result.samples == 23
    finally:
        await runner.cleanup()
