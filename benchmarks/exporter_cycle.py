"""One full exporter cycle at fleet scale: CPU, wall time and memory.

Starts ``gke-gpu-exporter simulate --scenario fleet --nodes N`` in its own process, then
runs the exporter here, as ``run`` does: Kubernetes list + watch, discovery of the
dcgm-exporter pods, and per cycle: scrape every endpoint, parse, join, compute, append to
the DuckDB warehouse, render /metrics. Virtual time moves one step between cycles.

    .venv/bin/python benchmarks/exporter_cycle.py [--nodes 1000 125] [--cycles 4]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from exporter.app import open_exporter
from exporter.config import load_config


async def bench(nodes: int, cycles: int) -> None:
    out = Path(tempfile.mkdtemp(prefix="cycle-bench-"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter", "simulate", "--scenario", "fleet", "--nodes",
        str(nodes), "--manual", "--warmup", "6h", "--dcgm-port", "0", "--out", str(out),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    api = ""
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 600)).decode()
        if not line:
            raise SystemExit("simulator exited early")
        if "Kubernetes API" in line:
            api = line.split()[-1]
        if line.startswith("Ctrl-C"):
            break
    cfg = load_config(None, overrides={
        "cluster": "fleet", "interval": 30, "dcgm": {"timeout": 10},
        "kubernetes": {"kubeconfig": str(out / "kubeconfig")},
        "warehouse": {"path": str(out / "w.duckdb"), "interval": 30, "flush_interval": 30}})
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    async with open_exporter(cfg) as exporter, aiohttp.ClientSession() as s:
        await exporter.kube.wait_synced()
        print(f"{nodes} nodes x 8 GPUs: {len(exporter.kube.pods)} pods listed")
        print(f"{'cycle':>5} {'CPU s':>6} {'wall s':>7} {'render s':>8} {'samples':>8} "
              f"{'RSS MiB':>8}")
        now = 0.0
        for i in range(cycles):
            async with s.post(f"{api}/sim/advance?seconds=30") as resp:
                now = (await resp.json())["now_unix"]
            await asyncio.sleep(0.2)  # let the watches deliver the step's changes
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await exporter.cycle(now)
            t_render = time.perf_counter()
            body = exporter.metrics_text
            if exporter.warehouse is not None:
                exporter.warehouse.flush(now + 30)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            render = time.perf_counter() - t_render
            samples = sum(len(d.fields) for d in exporter.states)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{i + 1:>5} {cpu:>6.2f} {wall:>7.2f} {render:>8.2f} {samples:>8} "
                  f"{rss:>8.0f}")
            del body
        print(f"exporter RSS high-water mark {rss:.0f} MiB (at start {rss0:.0f} MiB)")
    proc.terminate()
    await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[125, 1000])
    parser.add_argument("--cycles", type=int, default=4)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8192)), hard))
    for n in args.nodes:
        asyncio.run(bench(n, args.cycles))


if __name__ == "__main__":
    main()
