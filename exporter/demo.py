"""``gke-gpu-exporter demo``: the simulated cluster, run for a week, seen over real HTTP.

Starts the simulator on loopback, runs the scenario in virtual time with a progress bar,
then reads the cluster the way the exporter does (every dcgm-exporter endpoint, the
Kubernetes API through ``kubernetes_asyncio``) and prints the simulator's ground truth
per team: GPU-hours, utilisation, queue wait and GPU downtime.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import aiohttp
from kubernetes_asyncio import client, config
from tqdm import tqdm

from exporter.lifecycle import wait_for_shutdown
from exporter.simulator.scenario import Scenario
from exporter.simulator.server import SimulatorServer
from exporter.simulator.truth import GroundTruth

CHUNK_SECONDS = 3600.0


async def run_demo(scenario: Scenario, *, duration: float, out: Path, serve: bool) -> int:
    async with SimulatorServer(scenario) as server:
        began = time.monotonic()
        steps = max(1, round(duration / CHUNK_SECONDS))
        with tqdm(total=steps, unit="h", desc="simulating", disable=not sys.stderr.isatty(),
                  leave=False) as bar:
            left = duration
            while left > 0:
                chunk = min(CHUNK_SECONDS, left)
                await server.advance(chunk)
                left -= chunk
                bar.update(1)
        outputs = server.write_outputs(out)
        samples, failed = await _scrape_all(server.targets)
        pods, nodes = await _list_cluster(str(outputs.kubeconfig))
        server.cluster.close()
        truth = server.cluster.truth.report(server.cluster.start, server.cluster.now)
        (out / "truth.json").write_text(json.dumps(truth.to_json(), indent=1))
        st = server.status()
        print(f"Simulated {duration / 86400:g} days of cluster '{scenario.cluster}' in "
              f"{time.monotonic() - began:.1f} s: {st['nodes']} nodes, {st['gpus']} GPUs, "
              f"{len(truth.pods)} pods.")
        print(f"Read back over HTTP: {len(server.targets) - failed}/{len(server.targets)} "
              f"dcgm-exporter endpoints ({samples} samples), {len(nodes)} nodes and "
              f"{len(pods)} pods from the Kubernetes API.")
        print()
        print(summary_table(truth))
        print()
        print(f"Outputs in {out}/: kubeconfig, targets.txt, truth.json")
        if serve:
            server.speed = 1.0
            server.start_ticking()
            print(f"Serving at {server.api_url} (kubectl --kubeconfig {outputs.kubeconfig} "
                  "get pods -A); Ctrl-C to stop.", flush=True)
            await wait_for_shutdown()
    return 0


async def _scrape_all(targets: list[str]) -> tuple[int, int]:
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(url: str) -> int | None:
            try:
                async with session.get(url) as resp:
                    if resp.status != 200:
                        return None
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError):
                return None
            return sum(1 for line in text.splitlines() if line and not line.startswith("#"))

        results = await asyncio.gather(*(one(t) for t in targets))
    return sum(r or 0 for r in results), sum(1 for r in results if r is None)


async def _list_cluster(kubeconfig: str) -> tuple[list[object], list[object]]:
    await config.load_kube_config(config_file=kubeconfig)
    async with client.ApiClient() as api:
        v1 = client.CoreV1Api(api)
        pods = await v1.list_pod_for_all_namespaces()
        nodes = await v1.list_node()
    return list(pods.items), list(nodes.items)


def summary_table(truth: GroundTruth) -> str:
    """Per-team GPU-hours, utilisation, queue wait and downtime, from the ground truth."""
    hours = truth.seconds_by("team", "namespace", state="allocated")
    team_hours: dict[str, float] = defaultdict(float)
    for (team, ns), secs in hours.items():
        team_hours[team or ns] += secs / 3600
    util_w: dict[str, float] = defaultdict(float)
    util_s: dict[str, float] = defaultdict(float)
    pod_secs = truth.seconds_by("pod_uid", state="allocated")
    waits: dict[str, list[float]] = defaultdict(list)
    for uid, rec in truth.pods.items():
        team = rec.team or rec.namespace
        w = pod_secs.get((uid,), 0.0)
        if uid in truth.pod_utilization and w > 0:
            util_s[team] += truth.pod_utilization[uid] * w
            util_w[team] += w
        wait = truth.queue_wait(uid)
        if wait is not None:
            waits[team].append(wait)
    lines = [f"{'team':<12} {'GPU-hours':>10} {'util':>6} {'wait p50':>9} {'wait p90':>9} "
             f"{'pods':>5}   (simulator ground truth)"]
    for team in sorted(team_hours, key=lambda t: -team_hours[t]):
        util = util_s[team] / util_w[team] if util_w[team] else 0.0
        ws = sorted(waits[team])
        p50 = statistics.median(ws) if ws else 0.0
        p90 = ws[min(len(ws) - 1, int(0.9 * len(ws)))] if ws else 0.0
        lines.append(f"{team:<12} {team_hours[team]:>10.1f} {util:>6.1%} {_mins(p50):>9} "
                     f"{_mins(p90):>9} {len(ws):>5}")
    unalloc = truth.seconds_by("state").get(("unallocated",), 0.0) / 3600
    down = truth.seconds_by("state").get(("unavailable",), 0.0) / 3600
    lines.append(f"{'(idle pool)':<12} {unalloc:>10.1f}   unallocated GPU-hours; "
                 f"{down:.1f} GPU-hours unavailable in {len(truth.incidents)} GPU incidents, "
                 f"{len(truth.interruptions)} spot preemptions")
    return "\n".join(lines)


def _mins(seconds: float) -> str:
    return f"{seconds / 60:.1f}m"
