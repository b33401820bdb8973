"""A dcgm-exporter whose page stops changing while its GPUs are allocated is flagged stuck:
a series per target, one log line when it begins and one when it ends."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from exporter.demo import caught_up, demo_config
from exporter.metrics.health import PageRuns
from exporter.runtime.app import open_exporter
from simulator.server import SimulatorServer
from tests.conftest import Handler
from tests.exporter.test_dcgm_failures import logged
from tests.exporter.test_exporter import families
from tests.timing import limit


@pytest.mark.parametrize(("run", "unchanged", "after", "allocated_nodes", "stuck"), [
    (5, 150.0, 150.0, 1, True),
    (9, 600.0, 150.0, 2, True),
    (4, 120.0, 150.0, 1, False),
    (6, 25.0, 150.0, 1, False),   # scraped every 5 s, collected every 30 s: not stuck
    (5, 150.0, 150.0, 0, False),  # an idle node's page may rightly stand still
    (1, 900.0, 150.0, 1, False),  # one answer is no run, however old the last one
    (2, 600.0, 150.0, 1, True),   # the same page again after ten minutes of failures
])
def test_stuck(run: int, unchanged: float, after: float, allocated_nodes: int,
               stuck: bool) -> None:
    assert PageRuns.stuck(run, unchanged, after, allocated_nodes) is stuck


def test_page_runs_count_the_same_page_in_a_row_and_time_it_from_the_first() -> None:
    runs = PageRuns()
    pages = [(1, 10), (1, 10), (1, 10), (2, 10), (2, 10), (2, 11)]
    assert [runs.see("t", p, 30.0 * i) for i, p in enumerate(pages)] == [1, 2, 3, 1, 2, 1]
    assert runs.unchanged_seconds("t", 200.0) == 50.0   # (2, 11) first came at 150
    assert runs.see("u", (1, 10), 0.0) == 1  # each target its own
    runs.forget("t")
    assert runs.see("t", (2, 11), 210.0) == 1 and runs.unchanged_seconds("t", 210.0) == 0.0


async def answer_each_cycle(sim: SimulatorServer, tmp_path: Path,
                            serve: Callable[[Handler], Awaitable[str]], answers: str,
                            stuck_after: float) -> tuple[str, list[float | None]]:
    """Cycles a simulated interval apart against the dcgm-exporter of a node whose GPUs
    a training pod holds, answering in turn: ``L`` its live page (the cluster moved on), ``F``
    the page it gave last again, frozen (a run of one page begins with its live answer).
    Returns the target and its stuck flag after each."""
    pod = sim.cluster.submit("train", run_seconds=7200)[0]  # all 8 H100s of a node
    await sim.advance(sim.cluster.step)
    node = pod.node
    assert node is not None and pod.phase == "Running"
    answer, last = "L", ""

    async def switch(_: web.Request) -> web.Response:
        nonlocal last
        if answer == "L" or not last:
            async with aiohttp.ClientSession() as s, s.get(sim.endpoint_url(node)) as r:
                last = await r.text()
        return web.Response(text=last)

    url = await serve(switch)
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    cfg = cfg.model_copy(update={"dcgm": cfg.dcgm.model_copy(update={
        "targets": [url], "stuck_after": stuck_after})})
    flags: list[float | None] = []
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        for this in answers:
            answer = this
            await sim.advance(sim.cluster.step)
            await caught_up(sim, exporter)
            await exporter.cycle(sim.cluster.now)
            flag = [v for lbl, v in families(exporter.metrics.text).get(
                "gke_gpu_exporter_dcgm_target_stuck", []) if lbl["target"] == url]
            flags.append(flag[0] if flag else None)
    return url, flags


@pytest.mark.parametrize(("case", "answers", "after", "flags"), [
    ("a live exporter", "LLLLLLL", 60.0, [0, 0, 0, 0, 0, 0, 0]),
    ("frozen for less than stuck_after", "LFFLFFL", 90.0, [0, 0, 0, 0, 0, 0, 0]),
    ("frozen, then live again", "LFFFFL", 60.0, [0, 0, 1, 1, 1, 0]),
    ("frozen to the end", "LLFFFFF", 120.0, [0, 0, 0, 0, 0, 1, 1]),
])
async def test_a_frozen_page_is_flagged_once_per_episode(
        case: str, answers: str, after: float, flags: list[float], sim: SimulatorServer,
        tmp_path: Path, serve: Callable[[Handler], Awaitable[str]],
        caplog: pytest.LogCaptureFixture) -> None:
    """Cycles a simulated step (30 s) apart: a page the same for ``after`` seconds is
    flagged at the answer ``after / 30 + 1`` of its run."""
    caplog.set_level(logging.INFO, logger="exporter.runtime.service")
    url, seen = await answer_each_cycle(sim, tmp_path, serve, answers, after)
    assert seen == flags
    began = logged(caplog, logging.WARNING, "dcgm page unchanged while its gpus are allocated")
    ended = logged(caplog, logging.INFO, "dcgm page changing again")
    pairs = list(itertools.pairwise([0.0, *flags]))
    step = sim.cluster.step
    assert [(b["target"], b["scrapes"], b["unchanged_seconds"]) for b in began] == \
        [(url, round(after / step) + 1, after)] * sum(1 for a, b in pairs if b and not a)
    assert [e["target"] for e in ended] == [url] * sum(1 for a, b in pairs if a and not b)
