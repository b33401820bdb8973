"""The warehouse over simulated days at fleet scale: per-cycle staging, flush cost, disk, RSS.

For each simulated day, the first ``--real-hours`` go through the exporter's own path: one
``Warehouse.add_usage`` per 30 s cycle with N GPUs' usage rows (half of them held by a pod),
``maybe_flush`` after each (a flush per 60 s interval, the hourly retention, the file's
checkpoint and reopen on the cycles' time, as in production). The rest of
the day is appended in bulk (the real hours' rows again, shifted in time, with their own
ids), so that a month of rows is reached in minutes. Prints, per day: the rows in
``gpu_usage``, the per-cycle ``add_usage`` (building the batch and staging it), staging
and flush times (median, 99th percentile, worst), the time spent rolling up, the file's
size and the process's RSS.

    .venv/bin/python benchmarks/warehouse_soak.py [--gpus 8000] [--days 30] [--real-hours 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.model import compute
from exporter.sinks.warehouse import Warehouse, raw_table

T0 = 1_794_182_400.0  # Monday 2026-11-09 00:00 UTC
DAY = 86400.0
CYCLE = 30.0
MIB = 1 << 20


def devices(gpus: int) -> list[compute.DeviceState]:
    out = []
    for g in range(gpus):
        node = f"node-{g // 8}"
        owner = compute.Owner(f"uid-{g}", f"ns-{g % 40}", f"job-{g}", f"team-{g % 12}",
                              f"job-{g}") if g % 2 else None
        util = (g % 100) / 100
        out.append(compute.DeviceState(
            node=node, pool=f"pool-{g // 8 % 6}", accelerator="nvidia-h100-80gb",
            provisioning="spot" if g % 5 == 0 else "on-demand", zone="us-central1-a",
            gpu_uuid=f"GPU-{g}", device_id=f"GPU-{g}", gpu_index=str(g % 8), mig_profile=None,
            fraction=1.0, state="allocated" if owner else "unallocated", reason=None,
            owners=(owner,) if owner else (), utilization=util,
            utilization_source="gr_engine_active", price_usd_per_hour=11.06,
            memory_used_bytes=40000.0 * compute.MIB, memory_total_bytes=80000.0 * compute.MIB,
            fields={"DCGM_FI_PROF_GR_ENGINE_ACTIVE": util, "DCGM_FI_PROF_SM_ACTIVE": util * 0.8,
                    "DCGM_FI_DEV_GPU_UTIL": util * 100, "DCGM_FI_DEV_FB_USED": 40000.0,
                    "DCGM_FI_DEV_FB_FREE": 40000.0, "DCGM_FI_DEV_POWER_USAGE": 300.0,
                    "DCGM_FI_DEV_GPU_TEMP": 60.0}))
    return out


def usage(states: list[compute.DeviceState], start: float) -> list[compute.UsageRow]:
    return [compute.UsageRow(start, CYCLE, (d.utilization or 0.0) * CYCLE,
                             d.price_usd_per_hour * CYCLE / 3600 if d.price_usd_per_hour else None,
                             d, d.owners[0] if d.owners else None) for d in states]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def size_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / MIB


def ms(values: list[float]) -> str:
    """Median / 99th percentile / worst, in ms."""
    if len(values) < 2:
        return "-"
    p99 = statistics.quantiles(values, n=100, method="inclusive")[98]
    return " / ".join(f"{v * 1e3:5.0f}" for v in (statistics.median(values), p99, max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--real-hours", type=int, default=1)
    parser.add_argument("--raw-days", type=float, default=35.0,
                        help="warehouse.retention.raw, in days")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    states = devices(args.gpus)
    with tempfile.TemporaryDirectory(prefix="soak-", dir=args.dir) as tmp:
        path = Path(tmp) / "w.duckdb"
        now = T0  # the cycles' time, on which the file is checkpointed as in production
        wh = Warehouse(path, "fleet", interval=60.0, raw_retention=args.raw_days * DAY,
                       clock=lambda: now)
        staged: list[float] = []
        flushed: list[float] = []
        maintained: list[float] = []
        stage, flush, maintain = wh._stage, wh.flush, wh.maintain

        def timed(fn: Callable[..., None], into: list[float]) -> Callable[..., None]:
            def run(*args: Any, **kwargs: Any) -> None:
                began = time.perf_counter()
                fn(*args, **kwargs)
                into.append(time.perf_counter() - began)
            return run

        wh._stage = timed(stage, staged)  # type: ignore[method-assign]
        wh.flush = timed(flush, flushed)  # type: ignore[method-assign]
        wh.maintain = timed(maintain, maintained)  # type: ignore[method-assign]
        print(f"{args.gpus:,} GPUs, {CYCLE:.0f} s cycles, 60 s warehouse interval, "
              f"{args.real_hours} h/day through add_usage, raw retention {args.raw_days} d")
        print("day  gpu_usage rows  add_usage ms (median/p99/max)  staging ms"
              "            flush ms              roll-up s  file MiB  RSS MiB")
        began_all = time.perf_counter()
        for day in range(args.days):
            for times in (staged, flushed, maintained):
                times.clear()
            cycles: list[float] = []
            base = T0 + day * DAY
            for c in range(int(args.real_hours * 3600 / CYCLE)):
                start = base + c * CYCLE
                rows = usage(states, start)
                began = time.perf_counter()
                wh.add_usage(rows)
                cycles.append(time.perf_counter() - began)
                now = start + CYCLE
                wh.maybe_flush(now)
            real = args.real_hours * 3600
            table = raw_table(base)
            for k in range(1, int(24 * 3600 // real)):  # the rest of the day, in bulk
                wh.con.execute(
                    f"INSERT INTO {table} SELECT md5(id || ?), time + to_seconds(?), "
                    f"* EXCLUDE (id, time) FROM {table} WHERE time >= to_timestamp(?) "
                    "AND time < to_timestamp(?) AND interval_seconds = 60",
                    [str(k), k * real, base, base + real])
            wh.con.execute("CHECKPOINT")
            (n,) = wh.con.execute("SELECT count(*) FROM gpu_usage").fetchone()  # type: ignore[misc]
            print(f"{day + 1:3d}  {n:14,}  {ms(cycles):>29}  {ms(staged):>18}  {ms(flushed):>18}"
                  f"  {sum(maintained):9.1f}  {size_mib(path):8,.0f}  {rss_mib():7,.0f}",
                  flush=True)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"total {time.perf_counter() - began_all:,.0f} s; peak RSS {peak:,.0f} MiB")
        wh.close()
        reopen(path, states, T0 + args.days * DAY, args.raw_days * DAY)


def reopen(path: Path, states: list[compute.DeviceState], start: float,
           raw_retention: float) -> None:
    """A restart on the file: the time to open it, to write the next intervals, and what a
    rewrite of them adds."""
    began = time.perf_counter()
    wh = Warehouse(path, "fleet", interval=60.0, raw_retention=raw_retention)
    opened = time.perf_counter() - began
    flushes = []
    for c in range(4):
        wh.add_usage(usage(states, start + c * CYCLE))
        began = time.perf_counter()
        wh.flush(start + (c + 1) * CYCLE)
        flushes.append(time.perf_counter() - began)
    written = wh.rows_written["gpu_usage"]
    for c in range(4):  # the same cycles again, as a restart replays them
        wh.add_usage(usage(states, start + c * CYCLE))
    wh.flush(start + 4 * CYCLE)
    print(f"reopened in {opened:.2f} s; next two intervals flushed in "
          f"{' / '.join(f'{f * 1e3:.0f}' for f in flushes if f > 0.001)} ms, "
          f"{written:,} rows; written again: {wh.rows_written['gpu_usage'] - written} rows added; "
          f"RSS {rss_mib():,.0f} MiB")
    wh.close()


if __name__ == "__main__":
    main()
