"""A failing or hostile dcgm-exporter costs only its own series, never the cycle."""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from exporter.demo import demo_config, step_both
from exporter.errors import SourceDataError, SourceTimeout, SourceUnavailable
from exporter.model.records import TargetScrape
from exporter.runtime.app import open_exporter
from exporter.runtime.service import Exporter
from exporter.sources import dcgm
from exporter.sources.dcgm import DcgmSource
from simulator.server import SimulatorServer
from tests.conftest import FIXTURES, Handler
from tests.exporter.test_exporter import families

REAL = (FIXTURES / "dcgm" / "dcgm-exporter_L4_kops_driver580.prom").read_text()


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
async def source() -> AsyncIterator[DcgmSource]:
    source = DcgmSource(timeout_seconds=1.0, max_body_bytes=32 * 1024 * 1024, max_devices=256)
    yield source
    source.close()


async def test_failures_are_contained(serve: Callable[[Handler], Awaitable[str]],
                                      source: DcgmSource) -> None:
    ok = await serve(good)
    failing = {"error": await serve(error), "hang": await serve(hang),
               "drip": await serve(drip), "refused": "http://127.0.0.1:9/metrics"}
    began = time.monotonic()
    results = await source.fetch([ok, *failing.values()])
    assert time.monotonic() - began < 10, "the timeout is honoured (the drip alone takes 14 s)"
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
    # the source's own cap (max_devices); what a node then holds of those is the node's
    # count plus one (test_a_hostile_scrape_leaves_no_trace_once_the_target_is_healthy)
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


HOSTILE_SERIES = 200_000


def uuid_labels(text: bytes) -> set[str]:
    """Every GPU UUID a series of the exposition names."""
    return {s.labels["uuid"] for fam in text_string_to_metric_families(text.decode())
            for s in fam.samples if "uuid" in s.labels}


def series(text: bytes) -> int:
    return sum(len(fam.samples) for fam in text_string_to_metric_families(text.decode()))


def node_price(exporter: Exporter, node: str) -> float:
    return sum(d.price_usd_per_hour or 0.0 for d in exporter.states if d.node == node)


async def test_a_hostile_scrape_leaves_no_trace_once_the_target_is_healthy(
        sim: SimulatorServer, tmp_path: Path,
        serve: Callable[[Handler], Awaitable[str]], caplog: pytest.LogCaptureFixture) -> None:
    """One answer of the 8-GPU node's dcgm-exporter carries 200,000 series of distinct
    GPUs under its hostname: the node still has its 8 GPUs, the rest is counted
    ``too_many_devices`` and never billed, logged once as it begins and once as it ends;
    once the exporter answers normally again, /metrics names the GPUs it named before, as
    many series as before, at the same cost."""
    caplog.set_level(logging.INFO, logger="exporter.runtime.service")
    (h100,) = [n for n in sim.cluster.live_nodes() if n.pool.name == "h100"]
    hostile = False

    async def proxy(_: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as s, s.get(sim.endpoint_url(h100)) as r:
            body = await r.text()
        if hostile:
            body += "".join(
                f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i % 8}",UUID="GPU-phantom-{i}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{h100.name}"}} 1\n'
                for i in range(HOSTILE_SERIES))
        return web.Response(text=body)

    targets = [await serve(proxy)] + [sim.endpoint_url(n) for n in sim.cluster.live_nodes()
                                      if n is not h100]
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    cfg = cfg.model_copy(update={"dcgm": cfg.dcgm.model_copy(update={
        "targets": targets, "timeout": 10.0})})
    async with open_exporter(cfg) as exporter:
        await exporter.kube.wait_synced()
        await step_both(sim, exporter, 2)
        uuids, count = uuid_labels(exporter.metrics.text), series(exporter.metrics.text)
        price = node_price(exporter, h100.name)
        assert len([d for d in exporter.states if d.node == h100.name]) == 8 and price > 0

        hostile = True
        await step_both(sim, exporter, 1)
        assert len([d for d in exporter.states if d.node == h100.name]) == 8
        assert node_price(exporter, h100.name) == price
        assert len(exporter.inventory.devices[h100.name]) == 8
        assert exporter.health.rejected["too_many_devices"] == 1024 - 8
        assert exporter.health.rejected["too_many_series"] == HOSTILE_SERIES - (1024 - 8)

        hostile = False
        await step_both(sim, exporter, 2)
        logged = [r.getMessage() for r in caplog.records if r.getMessage().endswith(
            "gpus than the node holds")]
        assert logged == ["more gpus than the node holds", "no more gpus than the node holds"]
        assert uuid_labels(exporter.metrics.text) == uuids
        assert series(exporter.metrics.text) == count
        assert node_price(exporter, h100.name) == price
        assert b"phantom" not in exporter.metrics.text


JUNK = ('DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="NVIDIA L4"} 5\n'  # no UUID
        "DCGM_FI_DEV_GPU_UTIL{gpu=0} 5\n")                         # malformed
"""An answer none of whose samples can be kept."""


async def answer_each_cycle(sim: SimulatorServer, tmp_path: Path,
                            serve: Callable[[Handler], Awaitable[str]], answers: str
                            ) -> tuple[str, bytes]:
    """Cycles 30 s apart against one target (the L4 node's dcgm-exporter) that answers, in
    turn: ``.`` good, ``E`` 500, ``J`` nothing to keep, ``R`` good with a malformed line,
    ``U`` good and ending with a family nothing reads.
    Returns the target and the last /metrics."""
    (l4,) = [n for n in sim.cluster.live_nodes() if n.pool.name == "l4"]
    answer = "."

    async def switch(_: web.Request) -> web.Response:
        if answer == "E":
            return web.Response(status=500, text="failed to collect metrics: DCGM error\n")
        if answer == "J":
            return web.Response(text=JUNK)
        async with aiohttp.ClientSession() as s, s.get(sim.endpoint_url(l4)) as r:
            body = await r.text()
        if answer == "U":
            body += unread_family(body)
        return web.Response(text=body + "DCGM_FI_DEV_GPU_UTIL{gpu=0} 5\n" * (answer == "R"))

    url = await serve(switch)
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    cfg = cfg.model_copy(update={"dcgm": cfg.dcgm.model_copy(update={"targets": [url]})})
    async with open_exporter(cfg) as exporter:
        await exporter.kube.wait_synced()
        for i, this in enumerate(answers):
            answer = this
            await exporter.cycle(sim.cluster.now + 30 * i)
        return url, exporter.metrics.text


def unread_family(page: str) -> str:
    """A family nothing reads, for the GPUs of ``page``: what dcgm-exporter's older default
    counters end with."""
    name = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
    labels = {line[line.index("{"):line.rindex("}") + 1] for line in page.splitlines()
              if line.startswith("DCGM_FI_DEV_GPU_UTIL{")}
    return (f"# HELP {name} Whether remapping of rows has failed\n# TYPE {name} gauge\n"
            + "".join(f"{name}{lb} 0\n" for lb in sorted(labels)))


async def test_a_page_ending_with_a_family_nothing_reads_is_read_every_cycle(
        sim: SimulatorServer, tmp_path: Path,
        serve: Callable[[Handler], Awaitable[str]]) -> None:
    """Learnt once, then read by its plan cycle after cycle; the target stays up and its
    GPUs keep their readings."""
    url, text = await answer_each_cycle(sim, tmp_path, serve, "UUUU")
    fams = families(text)
    up = {lbl["target"]: v for lbl, v in fams["gke_gpu_exporter_source_up"]
          if lbl["source"] == "dcgm"}
    assert up == {url: 1}
    pages = {lbl["read"]: v for lbl, v in fams["gke_gpu_exporter_dcgm_pages_total"]}
    assert pages == {"plan": 3, "new_plan": 1, "full": 0, "plan_failed": 0}
    assert fams["gke_gpu_utilization_ratio"]


async def test_a_page_that_breaks_the_parser_fails_its_own_target_alone(
        serve: Callable[[Handler], Awaitable[str]], source: DcgmSource,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a page does to the parser is that target's error; the round goes on."""
    parse = dcgm.parse_page

    def breaks_on_poison(body: bytes, *args: Any) -> Any:
        if b"poison" in body:
            raise RecursionError("maximum recursion depth exceeded")
        return parse(body, *args)

    monkeypatch.setattr(dcgm, "parse_page", breaks_on_poison)
    poison = REAL.replace("i-030791dc5a37cd257", "poison")
    ok, bad = await source.fetch([await serve(good), await serve(text(poison))])
    assert isinstance(ok, TargetScrape) and ok.result.samples == 23
    assert isinstance(bad, SourceDataError) and bad.label == "bad_answer"
    assert bad.reason == ("page could not be parsed: RecursionError: maximum recursion "
                          "depth exceeded")
    again, = await source.fetch([await serve(good)])
    assert isinstance(again, TargetScrape)


def logged(caplog: pytest.LogCaptureFixture, level: int, event: str) -> list[dict[str, Any]]:
    return [r.ctx for r in caplog.records  # type: ignore[attr-defined]
            if r.levelno == level and r.getMessage() == event]


@pytest.mark.parametrize(("case", "answers", "outages"), [
    # outages: (seconds, failed attempts) of each outage that ended
    ("one outage", ".EEE.", [(90, 3)]),
    ("thirteen outages", ".E" * 13 + ".", [(30, 1)] * 13),
    ("an error, then unusable answers", ".E.JJ..EJE.", [(30, 1), (60, 2), (90, 3)]),
    ("failing at the end", "..EE", []),
])
async def test_each_outage_of_a_target_is_logged_when_it_begins_and_ends(
        case: str, answers: str, outages: list[tuple[float, int]], sim: SimulatorServer,
        tmp_path: Path, serve: Callable[[Handler], Awaitable[str]],
        caplog: pytest.LogCaptureFixture) -> None:
    """One warning when a target starts failing, one info line with the outage's length and
    failed attempts when it answers again, nothing between; every failure is counted by
    reason, and the samples of an answer none of which is kept as rejected."""
    caplog.set_level(logging.INFO, logger="exporter.runtime.service")
    url, text = await answer_each_cycle(sim, tmp_path, serve, answers)
    fams = families(text)
    began = logged(caplog, logging.WARNING, "dcgm scrape failed")
    assert len(began) == answers.count(".E") + answers.count(".J")
    assert all(b["target"] == url for b in began)
    ended = logged(caplog, logging.INFO, "dcgm scrape recovered")
    assert [(e["outage_seconds"], e["failed_attempts"]) for e in ended] == outages
    errors = {lbl["reason"]: v for lbl, v in fams["gke_gpu_exporter_errors_total"]
              if lbl["target"] == url}
    assert errors == {k: v for k, v in (("http_500", answers.count("E")),
                                        ("bad_answer", answers.count("J"))) if v}
    rejected = {lbl["reason"]: v for lbl, v in
                fams["gke_gpu_exporter_rejected_samples_total"]}
    assert rejected["no_gpu_uuid"] == answers.count("J")
    assert rejected["malformed"] == answers.count("J") + answers.count("R")


@pytest.mark.parametrize(("case", "answers", "episodes"), [
    # episodes: (seconds, answers with rejects) of each run of answers with rejects that ended
    ("rejects for a while", ".RRR.", [(90, 3)]),
    ("rejects come and go", ".R.R.RR.", [(30, 1), (30, 1), (60, 2)]),
    ("an outage between does not end them", ".RER.", [(90, 2)]),
    ("rejects to the end", ".RR", []),
])
async def test_rejects_are_logged_once_per_episode(
        case: str, answers: str, episodes: list[tuple[float, int]], sim: SimulatorServer,
        tmp_path: Path, serve: Callable[[Handler], Awaitable[str]],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.runtime.service")
    url, _ = await answer_each_cycle(sim, tmp_path, serve, answers)
    began = logged(caplog, logging.WARNING, "dcgm samples rejected")
    assert [(b["target"], b["reason"]) for b in began] == \
        [(url, "malformed")] * answers.count(".R")
    ended = logged(caplog, logging.INFO, "dcgm samples accepted again")
    assert [(e["outage_seconds"], e["failed_attempts"]) for e in ended] == episodes


async def test_an_answer_with_nothing_to_keep_names_what_it_dropped(
        serve: Callable[[Handler], Awaitable[str]], source: DcgmSource) -> None:
    (res,) = await source.fetch([await serve(text(JUNK))])
    assert isinstance(res, SourceDataError)
    assert (res.label, res.rejected) == ("bad_answer", {"no_gpu_uuid": 1, "malformed": 1})
