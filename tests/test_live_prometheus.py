"""A real Prometheus scrapes the exporter running on the simulated cluster: every dashboard
query (but those of what the simulated hours do not have, which return nothing) and every
recording rule returns data, and every rule loads."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import pytest

from simulator.scenario import load_scenario
from simulator.server import SimulatorServer
from tests.conftest import free_port, post_faults, start_exporter, start_prometheus
from tests.test_dashboards_alerts import ALERTS, ALL_RULES, RECORDED, panel_exprs

SETTLED_SECONDS = 5.0
"""How far in the past the panels are compared: five scrapes, so that what a slow scrape
or remote write delivers late is in before either query reads that instant."""
RATE_INTERVAL = "10s"
"""What Grafana's $__rate_interval is for a 1 s scrape interval (4 scrapes), rounded up."""
NOT_IN_THESE_HOURS = {("queue.json", "Scale-up failures by pool and reason"):
                      "no scale-up of the scenario fails in its first six hours",
                      ("queue.json", "Pool fragmentation"):
                      "the pods that wait fit only pools with no GPU free: nothing is "
                      "fragmented against them"}
"""Panels of what the simulated cluster does not do while the test watches: empty, and
checked to be (one that shows data leaves this table)."""


async def _exporter(kubeconfig: Path, tmp: Path, push_to: int
                    ) -> tuple[asyncio.subprocess.Process, int]:
    env = os.environ | {
        "GKE_GPU_EXPORTER_REMOTE_WRITE__URL": f"http://127.0.0.1:{push_to}/api/v1/write",
        "GKE_GPU_EXPORTER_INTERVAL": "1", "GKE_GPU_EXPORTER_PORT": "0",
        "GKE_GPU_EXPORTER_LISTEN_ADDRESS": "127.0.0.1", "GKE_GPU_EXPORTER_CLUSTER": "live",
        "GKE_GPU_EXPORTER_DCGM__TIMEOUT": "0.8",
        "GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(kubeconfig),
        "GKE_GPU_EXPORTER_WAREHOUSE__PATH": str(tmp / "w.duckdb"),
        "GKE_GPU_EXPORTER_WAREHOUSE__INTERVAL": "1",
        "GKE_GPU_EXPORTER_WAREHOUSE__FLUSH_INTERVAL": "1",
        "GKE_GPU_EXPORTER_BUDGETS": '{"research": 1000}',
        "GKE_GPU_EXPORTER_ALLOCATION__LABEL": "cost-center",   # the default scenario's
        "GKE_GPU_EXPORTER_ALLOCATION__ANNOTATION": "billing.example.com/cost-center"}
    return await start_exporter(env)


async def _prometheus(exporter_port: int, port: int, tmp: Path
                      ) -> tuple[asyncio.subprocess.Process, str]:
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(ALERTS / "rules.yaml")],
              "scrape_configs": [{"job_name": "gke-gpu-exporter", "static_configs": [
                  {"targets": [f"127.0.0.1:{exporter_port}"]}]}]}
    return await start_prometheus(tmp, config, "--web.enable-remote-write-receiver",
                                  port=port)


async def _query(s: aiohttp.ClientSession, url: str, expr: str,
                 at: float | None = None) -> list[object]:
    params = {"query": expr} | ({} if at is None else {"time": f"{at:.3f}"})
    async with s.get(f"{url}/api/v1/query", params=params) as r:
        body = await r.json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def _values(result: list[object]) -> list[tuple[str, str]]:
    """A query's answer, series by series (labels and value), in order."""
    return sorted((str(sorted(r["metric"].items())), r["value"][1])  # type: ignore[index]
                  for r in result)


@pytest.mark.timeout(240)
async def test_dashboards_and_rules_return_data_from_a_live_prometheus(tmp_path: Path) -> None:
    sim = SimulatorServer(load_scenario("kueue"))  # the default, with Kueue
    await sim.start()
    procs: list[asyncio.subprocess.Process] = []
    try:
        await sim.advance(6 * 3600)  # six hours of the cluster's life
        for _ in range(4):           # more pretraining than the H100s hold: a queue
            sim.cluster.submit("llm-pretrain")
        sim.cluster.submit("hparam-sweep", run_seconds=86400)  # a spot job to preempt
        await sim.advance(15 * 60)   # the spot pool scales up for it
        kubeconfig = sim.write_outputs(tmp_path).kubeconfig
        prometheus_port = free_port()
        exporter, port = await _exporter(kubeconfig, tmp_path, prometheus_port)
        procs.append(exporter)
        prometheus, url = await _prometheus(port, prometheus_port, tmp_path)
        procs.append(prometheus)
        api = sim.api_url
        async with aiohttp.ClientSession() as s:
            await asyncio.sleep(3)  # the exporter's first cycles, before the faults
            await post_faults(s, api)
            # pods scheduled while it watches; a Job Kueue admits (ranking's A100 quota)
            for workload in ("jupyter", "scratch", "ranker-train"):
                sim.cluster.submit(workload)
            for _ in range(3):
                await sim.advance(sim.cluster.step)
                await asyncio.sleep(1)
            # rates need a few scrapes; rules a few evaluations
            await asyncio.sleep(12 + SETTLED_SECONDS)
            empty, unlike, filled = [], [], []
            # An instant whose samples are all in: a scrape or a remote write that a busy
            # machine slowed down can still bring samples of the last seconds.
            at = time.time() - SETTLED_SECONDS
            chosen = panel_exprs(cluster="live")  # the one cluster there is
            for (board, title, expr), (_, _, one) in zip(panel_exprs(), chosen, strict=True):
                expr = expr.replace("[1m]", f"[{RATE_INTERVAL}]")
                one = one.replace("[1m]", f"[{RATE_INTERVAL}]")
                every = await _query(s, url, expr, at)
                if (board, title) in NOT_IN_THESE_HOURS:
                    if every:
                        filled.append(f"{board}: {title}")
                elif not every:
                    empty.append(f"{board}: {title}: {expr}")
                if _values(await _query(s, url, one, at)) != _values(every):
                    unlike.append(f"{board}: {title}: {one}")
            for record in sorted(RECORDED):
                if not await _query(s, url, record):
                    empty.append(f"recording rule {record}")
            assert not empty, "\n".join(empty)
            assert not filled, "now with data: take them out of NOT_IN_THESE_HOURS"
            assert not unlike, "\n".join(unlike)   # choosing the cluster keeps its data
            # the exporter also pushed its series by remote write (no job label: not scraped)
            pushed = await _query(s, url, 'gke_gpu_sla_target_ratio{job=""}')
            assert [p["metric"]["cluster"] for p in pushed] == ["live"]  # type: ignore[index]
            sent = await _query(s, url, 'gke_gpu_exporter_remote_write_requests_total'
                                        '{job="gke-gpu-exporter", outcome="sent"} > 0')
            assert sent
            async with s.get(f"{url}/api/v1/rules") as r:
                groups = (await r.json())["data"]["groups"]
            rules = [rule for g in groups for rule in g["rules"]]
            assert len(rules) == len(ALL_RULES)  # every rule of alerts/rules.yaml loaded
            assert all(rule["health"] == "ok" for rule in rules), [
                (rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
        await sim.stop()
