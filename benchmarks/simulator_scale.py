"""Simulator at fleet scale: one round of dcgm-exporter scrapes plus one pod list.

Starts ``gke-gpu-exporter simulate --scenario fleet --nodes N`` in its own process (the
server gets one core, this client the other), warms the cluster up, then times rounds of
N concurrent scrapes (one per node endpoint) plus one ``GET /api/v1/pods``. Virtual time
moves one step before each round, so every round renders fresh text.

    .venv/bin/python benchmarks/simulator_scale.py [--nodes 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", default="6h")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.nodes + 256)), hard))

    out = Path(tempfile.mkdtemp(prefix="sim-bench-"))
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter", "simulate", "--scenario", "fleet",
        "--nodes", str(args.nodes), "--manual", "--warmup", args.warmup, "--dcgm-port", "0",
        "--out", str(out), stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    api = ""
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 600)).decode()
        if not line:
            print("simulator exited early", file=sys.stderr)
            return 1
        if "Kubernetes API" in line:
            api = line.split()[-1]
        if line.startswith("Ctrl-C"):
            break
    started = time.monotonic() - began
    targets = (out / "targets.txt").read_text().split()
    print(f"simulator: {len(targets)} nodes, fleet scenario, warm-up {args.warmup} simulated "
          f"in {started:.1f} s (start-up included); server RSS {rss_mib(proc.pid):.0f} MiB")

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def fetch(url: str) -> tuple[int, int]:
            async with session.get(url) as resp:
                body = await resp.read()
                return len(body), body.count(b"\n") - body.count(b"\n#")

        print(f"{'round':>5} {'wall s':>7} {'server CPU s':>12} {'MB':>7} {'samples':>9} "
              f"{'pods':>6}")
        walls = []
        for r in range(1, args.rounds + 1):
            async with session.post(f"{api}/sim/advance?seconds=30") as resp:
                resp.raise_for_status()
            cpu0 = cpu_seconds(proc.pid)
            t0 = time.perf_counter()
            results = await asyncio.gather(*(fetch(u) for u in targets),
                                           fetch(f"{api}/api/v1/pods"))
            wall = time.perf_counter() - t0
            cpu = cpu_seconds(proc.pid) - cpu0
            walls.append(wall)
            scraped = results[:-1]
            pods_bytes = results[-1][0]
            async with session.get(f"{api}/sim/status") as resp:
                pods = (await resp.json())["pods"]
            print(f"{r:>5} {wall:>7.2f} {cpu:>12.2f} "
                  f"{(sum(b for b, _ in scraped) + pods_bytes) / 1e6:>7.1f} "
                  f"{sum(n for _, n in scraped):>9} {pods:>6}")
        print(f"best round: {min(walls):.2f} s wall for {len(targets)} scrapes + 1 pod list; "
              f"server RSS {rss_mib(proc.pid):.0f} MiB")
    proc.terminate()
    await proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
