"""``gke-gpu-exporter demo --serve`` under a real Prometheus scraping every 15 s and every
30 s: the cluster and the exporter go on in real time, so no staleness alert fires, the
rate panels move, and the dashboards' GPU counts are the simulator's own."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from exporter.demo import ending_now
from simulator.scenario import load_scenario
from tests.conftest import free_port, start_prometheus
from tests.test_dashboards_alerts import ALERT_RULES, ALERTS, BOARDS, grafana_expr
from tests.timing import limit

SCRAPES = (15, 30)
"""Scrape intervals, seconds: a common one, and GMP's and kube-prometheus' default."""
STALENESS = ("GkeGpuExporterSourceStale", "GkeGpuExporterStale")
SCRAPED = "count_over_time(gke_gpu_exporter_last_cycle_timestamp_seconds[5m]) >= 2"
"""Whether Prometheus has scraped the exporter twice."""


def _panel(board: str, title: str, scrape: int) -> str:
    """The panel's query as Grafana sends it ($__rate_interval: four scrapes)."""
    (p,) = [p for p in BOARDS[board]["panels"] if p["title"] == title]
    expr = grafana_expr(p["targets"][0]["expr"])
    return expr.replace("[1m]", f"[{4 * scrape}s]")


async def _query(s: aiohttp.ClientSession, url: str, expr: str, at: float
                 ) -> list[dict[str, Any]]:
    async with s.get(f"{url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}) as r:
        body = await r.json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


async def _value(s: aiohttp.ClientSession, url: str, expr: str, at: float) -> float:
    (one,) = await _query(s, url, expr, at)
    return float(one["value"][1])


async def _demo(out: Path, port: int) -> tuple[asyncio.subprocess.Process, int, str]:
    """``demo --serve --port PORT`` on a short replay; returns it, its /metrics port and
    the simulator's API once it serves."""
    with (out.parent / "demo.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "exporter", "demo", "--duration", "1m", "--step", "30s",
            "--serve", "--port", str(port), "--out", str(out),
            stdout=asyncio.subprocess.PIPE, stderr=log)
    assert proc.stdout is not None
    async with asyncio.timeout(limit(120)):
        while True:
            line = (await proc.stdout.readline()).decode()
            assert line, "the demo exited before serving"
            if m := re.search(r"Serving http://127\.0\.0\.1:(\d+)/metrics .* cluster at "
                              r"(http://\S+)", line):
                return proc, int(m.group(1)), m.group(2)


async def _prometheus(tmp: Path, scrape: int, port: int
                      ) -> tuple[asyncio.subprocess.Process, str]:
    """A Prometheus scraping the demo every ``scrape`` seconds, with the rules."""
    where = tmp / f"prometheus-{scrape}"
    where.mkdir()
    config = {"global": {"scrape_interval": f"{scrape}s", "evaluation_interval": f"{scrape}s"},
              "rule_files": [str(ALERTS / "rules.yaml")],
              "scrape_configs": [{"job_name": "gke-gpu-exporter", "static_configs": [
                  {"targets": [f"127.0.0.1:{port}"]}]}]}
    return await start_prometheus(where, config)


async def _truths(s: aiohttp.ClientSession, api: str, seen: dict[float, dict[str, float]]
                  ) -> None:
    """The simulator's GPUs by state at each of its steps, as they come."""
    while True:
        async with s.get(f"{api}/sim/status") as r:
            status = await r.json()
        seen.setdefault(status["now_unix"], status["gpus_by_state"])
        await asyncio.sleep(0.5)


@pytest.mark.parametrize(("now", "duration", "start", "end"), [
    (1_800_000_000.0, 600.0, 1_799_999_400.0, 1_800_000_000.0),   # on a step
    (1_800_000_029.9, 600.0, 1_799_999_400.0, 1_800_000_000.0),   # the step before now
    (1_800_000_000.0, 610.0, 1_799_999_400.0, 1_800_000_000.0),   # whole steps
])
def test_the_served_days_end_now(now: float, duration: float, start: float, end: float
                                 ) -> None:
    scenario = ending_now(load_scenario("default"), duration, now)
    assert scenario.start.timestamp() == start
    assert start + round(duration / scenario.step) * scenario.step == end


@pytest.mark.timeout(300)
async def test_demo_serve_lives_under_prometheus_at_15s_and_30s(tmp_path: Path) -> None:
    procs: list[asyncio.subprocess.Process] = []
    seen: dict[float, dict[str, float]] = {}
    try:
        asked = free_port()
        demo, port, api = await _demo(tmp_path / "out", asked)
        procs.append(demo)
        assert port == asked
        written = tmp_path / "out" / "prometheus.yml"  # the config the demo prints
        config = yaml.safe_load(written.read_text())
        assert config["scrape_configs"][0]["static_configs"] == [
            {"targets": [f"127.0.0.1:{asked}"]}]
        assert config["rule_files"] == [str(ALERTS / "rules.yaml")]
        checked = await asyncio.to_thread(
            subprocess.run, ["promtool", "check", "config", str(written)],
            capture_output=True, text=True, timeout=limit(60), check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        started = await asyncio.gather(*(_prometheus(tmp_path, scrape, port)
                                         for scrape in SCRAPES))
        procs += [proc for proc, _ in started]
        servers = {scrape: url for scrape, (_, url) in zip(SCRAPES, started, strict=True)}
        async with aiohttp.ClientSession() as s:
            polling = asyncio.create_task(_truths(s, api, seen))
            # two scrapes each: a rate has its two points, changes() a change to see
            async with asyncio.timeout(limit(120)):
                for url in servers.values():
                    while not await _query(s, url, SCRAPED, time.time()):  # noqa: ASYNC110
                        await asyncio.sleep(1)
            polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await polling
            for scrape, url in servers.items():
                at = time.time()
                # the sample each panel reads is of the cycle the last scrape found, and
                # that cycle saw the simulator as it was at its last step before it
                cycle = await _value(s, url, "max(gke_gpu_exporter_last_cycle_timestamp_"
                                             "seconds)", at)
                assert at - 2 * scrape < cycle <= at, (scrape, cycle, at)  # real time
                truth = seen[max(t for t in seen if t <= cycle)]
                assert truth["allocated"] > 0 and truth["unavailable"] == 0  # a healthy demo
                read = {state: await _value(s, url, _panel(
                    "overview.json", f"{state.capitalize()} GPUs", scrape), at)
                        for state in ("allocated", "unavailable")}
                by_state = {r["metric"]["state"]: float(r["value"][1]) for r in await _query(
                    s, url, _panel("overview.json", "GPUs by state", scrape), at)}
                available = await _value(s, url, _panel("overview.json", "Available GPUs",
                                                        scrape), at)
                down = await _value(s, url, _panel("availability.json", "Unavailable GPUs",
                                                   scrape), at)
                assert read["allocated"] == pytest.approx(truth["allocated"]), scrape
                assert read["unavailable"] == down == truth["unavailable"], scrape
                assert by_state == pytest.approx(
                    {k: v for k, v in truth.items() if v}), scrape
                assert sum(by_state.values()) == pytest.approx(available), scrape
                # neither staleness alert's condition holds, and nothing of the exporter's
                # own is pending or firing
                for rule in ALERT_RULES:
                    if rule["alert"] in STALENESS:
                        assert not await _query(s, url, rule["expr"], at), (scrape, rule)
                assert not await _query(s, url, 'ALERTS{alertname=~"GkeGpuExporter.*"}',
                                        at), scrape
                # the rates move: spend now is the prices of every GPU in the cluster
                assert await _value(s, url, _panel("overview.json", "Spend now", scrape),
                                    at) > 0, scrape
                assert await _value(s, url, _panel(
                    "exporter-health.json", "Cycles in the last 5 minutes", scrape), at) >= 1
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
    assert demo.returncode == 0  # SIGTERM stops it cleanly
