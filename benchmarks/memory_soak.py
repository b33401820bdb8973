"""The exporter's memory over a soak with churn: the RSS slope of its steady state, in MB
per hour, with the warehouse on and off.

Starts ``gke-gpu-exporter simulate --scenario fleet --nodes N`` in its own process (jobs
arrive and end all the time: pods come and go, with new names, uids and label values) and
runs the exporter here, as ``run`` does, one 30 s cycle after another in virtual time:
scrape, join, compute, ``/metrics``, and with the warehouse on, its staging, flushes,
checkpoints, hourly retention and reopens. The warehouse's own clock (checkpoints,
reopens) is the cycles' time, so that an hour of the soak is an hour of production's
cadence however fast the cycles run here. After ``--warmup`` simulated hours, the RSS
after each cycle of the whole hours that follow (the file is reopened hourly: a part hour
would tilt the fit) is fitted by least squares: the slope is printed in MB (10^6 bytes) per
simulated hour, beside what the warehouse holds (DuckDB's ``duckdb_memory()``, the file,
its change-tracking maps) and, with ``--tracemalloc``, the Python allocations that grew
most between the end of the warm-up and the end. Each mode runs in a process of its own,
so that one's memory is no part of the other's. The reference loop (as in
``exporter_cycle.py``) is printed at the start and the end: compare only beside it.

    .venv/bin/python benchmarks/memory_soak.py [--nodes 10] [--hours 24] [--warmup 4]
        [--minutes 4] [--modes on off] [--wall-clock] [--tracemalloc]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
from exporter_cycle import (
    allow_open_files,
    machine_reference,
    rss_mib,
    simulate,
)

from exporter.config import load_config
from exporter.runtime.app import open_exporter

CYCLE = 30.0
MB = 1e6
MIB = 1 << 20


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ``ys`` over ``xs`` (0 for fewer than two points)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def warehouse_held(wh: Any) -> dict[str, float]:
    """What the warehouse holds: DuckDB's memory by its own account, by tag (MiB), the file and its
    log (MiB), and the entries of its change-tracking maps."""
    with wh.lock:
        duck = wh.con.execute("SELECT lower(tag), memory_usage_bytes FROM duckdb_memory() "
                              "WHERE memory_usage_bytes > 0 ORDER BY tag").fetchall()
    on_disk = sum(p.stat().st_size for p in wh.path.parent.glob(wh.path.name + "*")
                  if p.is_file())
    changes = wh.changes
    return {**{f"{tag} MiB": n / MIB for tag, n in duck}, "file MiB": on_disk / MIB,
            "pods": len(changes.pod_signatures), "models": len(changes.pod_models),
            "workloads": len(changes.workload_signatures),
            "quotas": len(changes.quota_signatures)}


async def soak(nodes: int, hours: float, warmup: float, minutes: float, warehouse: bool,
               traced: bool, wall_clock: bool) -> None:
    proc, api, cfg, out = await simulate(nodes, "memory-soak-")
    if not warehouse:
        cfg = load_config(None, overrides={
            "cluster": "fleet", "interval": 30, "dcgm": {"timeout": 10},
            "kubernetes": {"kubeconfig": str(out / "kubeconfig")},
            "warehouse": {"enabled": False}})
    xs: list[float] = []
    ys: list[float] = []
    began = time.monotonic()
    snapshot = None
    try:
        async with open_exporter(cfg) as exporter, aiohttp.ClientSession() as s:
            await exporter.kube.wait_synced()
            wh = exporter.warehouse
            now = 0.0
            if wh is not None and not wall_clock:
                wh.clock = lambda: now  # production's cadence, one cycle per 30 s
            print(f"warehouse {'on' if warehouse else 'off'}: {nodes} nodes x 8 GPUs, "
                  f"{len(exporter.kube.pods)} pods listed; RSS {rss_mib():.0f} MiB")
            print(f"{'hour':>5} {'cycles':>6} {'pods':>5} {'RSS MiB':>8}"
                  + ("  warehouse" if wh is not None else ""))
            cycles = int(hours * 3600 / CYCLE)
            for i in range(cycles):
                async with s.post(f"{api}/sim/advance?seconds={CYCLE:.0f}") as resp:
                    now = (await resp.json())["now_unix"]
                await asyncio.sleep(0.05)  # let the watches deliver the step's changes
                await exporter.cycle(now)
                hour = (i + 1) * CYCLE / 3600
                if hour > warmup:
                    xs.append(hour)
                    ys.append(rss_mib() * MIB / MB)
                    if traced and snapshot is None:
                        tracemalloc.start(8)
                        snapshot = tracemalloc.take_snapshot()
                last = i + 1 == cycles or time.monotonic() - began > minutes * 60
                if (i + 1) % 120 == 0 or last:
                    held = warehouse_held(wh) if wh is not None else {}
                    print(f"{hour:>5.1f} {i + 1:>6} {len(exporter.kube.pods):>5} "
                          f"{rss_mib():>8.1f}  "
                          + ", ".join(f"{k} {v:,.1f}" if "MiB" in k else f"{k} {v:,.0f}"
                                      for k, v in held.items()), flush=True)
                if last:
                    break
            if snapshot is not None:
                grown = tracemalloc.take_snapshot().compare_to(snapshot, "traceback")
                print("Python allocations grown most since the warm-up:")
                for stat in grown[:8]:
                    frame = next((f for f in reversed(stat.traceback)
                                  if f"{os.sep}exporter{os.sep}" in f.filename),
                                 stat.traceback[-1])
                    print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks"
                          f"  {Path(frame.filename).name}:{frame.lineno}")
                tracemalloc.stop()
    finally:
        proc.terminate()
        await proc.wait()
    whole = warmup + int(xs[-1] - warmup) if xs else 0.0  # whole hours: the reopens' period
    if whole > warmup:
        ys = [y for x, y in zip(xs, ys, strict=True) if x <= whole + 1e-9]
        xs = xs[:len(ys)]
    if len(xs) < 2:
        print("steady state not reached: raise --minutes or lower --warmup")
        return
    print(f"warehouse {'on' if warehouse else 'off'}: RSS slope {slope(xs, ys):+.2f} MB per "
          f"hour over simulated hours {xs[0]:.1f}-{xs[-1]:.1f} ({len(xs)} cycles, "
          f"{time.monotonic() - began:.0f} s); RSS {min(ys):.1f}-{max(ys):.1f} MB, "
          f"mean {sum(ys) / len(ys):.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--hours", type=float, default=24.0,
                        help="simulated hours at most (30 s cycles)")
    parser.add_argument("--warmup", type=float, default=4.0,
                        help="simulated hours before the steady state is measured")
    parser.add_argument("--minutes", type=float, default=4.0,
                        help="wall minutes at most per mode")
    parser.add_argument("--modes", nargs="+", choices=("on", "off"), default=["on", "off"],
                        help="the warehouse on, off, or both (each in a process of its own)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="also print the Python allocations that grew most")
    parser.add_argument("--wall-clock", action="store_true",
                        help="leave the warehouse its own clock (the process's seconds): "
                        "cycles back to back then checkpoint and reopen it by wall time")
    parser.add_argument("--mode", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    allow_open_files()
    if args.mode:  # one mode, in this process
        asyncio.run(soak(args.nodes, args.hours, args.warmup, args.minutes,
                         args.mode == "on", args.tracemalloc, args.wall_clock))
        return
    print(f"reference loop: {machine_reference():.2f} s of CPU for 10 M additions")
    for mode in args.modes:
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--mode", mode],
                       check=True, env=os.environ)
    print(f"reference loop: {machine_reference():.2f} s")


if __name__ == "__main__":
    main()
