"""One full exporter cycle at fleet scale: CPU, wall time and memory.

Starts ``gke-gpu-exporter simulate --scenario fleet --nodes N`` in its own process, then
runs the exporter here, as ``run`` does: Kubernetes list + watch, discovery of the
dcgm-exporter pods, and per cycle: scrape every endpoint, parse, join, compute, append to
the DuckDB warehouse, render /metrics, with the default configuration (a 30-s cycle,
warehouse rows of 60 s flushed every 60 s). Virtual time moves one step between cycles. Prints
each cycle's CPU by stage (scrape: HTTP and parsing; compute; warehouse; render), the
median and 95th percentile of each, and after each cycle the process's RSS, its open file
descriptors and the warehouse file's size: ``--cycles 1000`` is the soak. It prints the CPU
time of a fixed pure-Python loop (``ref s``) and of a walk of scattered objects (``mem s``)
at the start and again every ``--every`` cycles, and each cycle's CPU as a multiple of the
latest walk: this machine's speed moves by half and more within minutes, its memory's
more than its arithmetic (the loop barely moves while a cycle and the walk slow alike), so
figures are compared only beside their references.

    .venv/bin/python benchmarks/exporter_cycle.py [--nodes 125 1000] [--cycles 20]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from exporter.config import Config, load_config
from exporter.runtime.app import open_exporter

HEAVY = ("pandas", "pyarrow", "matplotlib", "jinja2", "kubernetes_asyncio",
         "google.cloud.bigquery", "google.protobuf", "numpy")
"""Libraries a cycle has no use for (protobuf: remote write and Cloud Monitoring, both off
here): none is loaded once the cycles have run."""


async def simulate(nodes: int, prefix: str
                   ) -> tuple[asyncio.subprocess.Process, str, Config, Path]:
    """The simulator's ``fleet`` scenario at ``nodes`` nodes, in its own process, six
    hours in and moved on by hand: the process, its API's URL, the exporter's default
    configuration against it, and the folder it writes to (the warehouse's too)."""
    out = Path(tempfile.mkdtemp(prefix=prefix))
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
        "warehouse": {"path": str(out / "w.duckdb")}})
    return proc, api, cfg, out


async def bench(nodes: int, cycles: int, every: int, ref: float) -> None:
    proc, api, cfg, out = await simulate(nodes, "cycle-bench-")
    stages = ("scrape", "compute", "warehouse", "render")
    per_cycle: list[dict[str, float]] = []
    rss: list[float] = []
    async with open_exporter(cfg) as exporter, aiohttp.ClientSession() as s:
        await exporter.kube.wait_synced()
        print(f"{nodes} nodes x 8 GPUs: {len(exporter.kube.pods)} pods listed; "
              f"RSS {rss_mib():.0f} MiB before the first cycle")
        print(f"{'cycle':>5} {'CPU s':>6} {'wall s':>7} " + " ".join(f"{s:>9}" for s in stages)
              + f" {'samples':>8} {'RSS MiB':>8} {'fds':>5} {'file MiB':>8} {'ref s':>5}"
              f" {'mem s':>5}")
        mem = memory_reference()
        refs, mems = [ref], [mem]
        for i in range(cycles):
            async with s.post(f"{api}/sim/advance?seconds=30") as resp:
                now = (await resp.json())["now_unix"]
            await asyncio.sleep(0.2)  # let the watches deliver the step's changes
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await exporter.cycle(now)
            body = exporter.metrics.parts  # what a scrape is served
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            stage = exporter.stage_cpu | {"render": exporter.metrics.render_cpu_seconds or 0.0}
            rss.append(rss_mib())
            samples = sum(len(d.fields) for d in exporter.states)
            if (i + 1) % every == 0 or i + 1 == cycles:
                ref, mem = machine_reference(), memory_reference()
                refs.append(ref)
                mems.append(mem)
            per_cycle.append(stage | {"cycle": cpu, "relative": cpu / mem})
            if i < 10 or (i + 1) % every == 0 or i + 1 == cycles:
                print(f"{i + 1:>5} {cpu:>6.3f} {wall:>7.3f} "
                      + " ".join(f"{stage.get(s, 0):>9.3f}" for s in stages)
                      + f" {samples:>8} {rss[-1]:>8.0f} {len(os.listdir('/proc/self/fd')):>5}"
                      f" {file_mib(out):>8.0f} {ref:>5.2f} {mem:>5.2f}", flush=True)
            del body
        steady = per_cycle[1:] or per_cycle  # the first cycle warms caches up
        print("CPU s per cycle, median / p95 over cycles 2-"
              f"{cycles}: " + ", ".join(
                  f"{k} {_q(steady, k, 50):.3f} / {_q(steady, k, 95):.3f}"
                  for k in ("cycle", *stages)))
        print(f"reference loop {min(refs):.2f}-{max(refs):.2f} s, memory walk {min(mems):.2f}-"
              f"{max(mems):.2f} s over the run; CPU per cycle over the latest "
              f"memory walk: median {_q(steady, 'relative', 50):.2f} / p95 "
              f"{_q(steady, 'relative', 95):.2f}")
        print(f"RSS after cycle 1 {rss[0]:.0f} MiB, after cycle {cycles} {rss[-1]:.0f} MiB, "
              f"high-water mark {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}"
              " MiB")
        heavy = sorted(m for m in HEAVY if m in sys.modules)
        print(f"heavy modules loaded: {', '.join(heavy) or 'none'}")
    proc.terminate()
    await proc.wait()


MEMORY_WALK = """
import random, time
rows = [{f"f{k}": float(k) for k in range(8)} for _ in range(200_000)]
random.Random(0).shuffle(rows)
best = 1e9
for _ in range(3):
    cpu, total = time.process_time(), 0.0
    for name in ("f0", "f3", "f5", "f7", "f1"):
        for row in rows:
            total += row[name]
    best = min(best, time.process_time() - cpu)
print(best)
"""


def memory_reference() -> float:
    """CPU seconds of a fixed walk of scattered objects (a million dict lookups in 200,000
    dicts, as a cycle walks its readings), best of three, in a process of its own so that
    its objects are no part of this one's memory: the Python loop misses a machine whose
    memory is slow, as this one's is at times."""
    done = subprocess.run([sys.executable, "-c", MEMORY_WALK], capture_output=True,
                          text=True, check=True)
    return float(done.stdout)


def machine_reference() -> float:
    """CPU seconds of a fixed pure-Python loop (ten million additions), best of three."""
    best = math.inf
    for _ in range(3):
        cpu, total = time.process_time(), 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.process_time() - cpu)
    return best


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def file_mib(out: Path) -> float:
    """The warehouse file and its write-ahead log."""
    return sum(p.stat().st_size for p in out.glob("w.duckdb*") if p.is_file()) / (1 << 20)


def allow_open_files() -> None:
    """Raise this process's open-file limit (the simulator it starts inherits it) for a
    fleet's connections: a thousand targets hold a socket each, on both sides."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8192)), hard))


def _q(cycles: list[dict[str, float]], key: str, pct: int) -> float:
    values = sorted(c.get(key, 0.0) for c in cycles)
    return values[min(len(values) - 1, round(pct / 100 * (len(values) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[125, 1000])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--every", type=int, default=50,
                        help="after the first 10 cycles, print every Nth")
    args = parser.parse_args()
    ref = machine_reference()
    print(f"this machine: a pure-Python loop of 10 M additions takes {ref:.2f} s of CPU")
    allow_open_files()
    for n in args.nodes:
        asyncio.run(bench(n, args.cycles, args.every, ref))


if __name__ == "__main__":
    main()
