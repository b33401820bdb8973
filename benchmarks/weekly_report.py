"""The weekly report at fleet scale: N GPUs at minute resolution for a week, from DuckDB.

Generates a warehouse file (``gpu_usage`` rows for N GPUs x 10,080 minutes, pods that turn
over every six hours, a few incidents), then builds the platform report and writes every
format in a fresh process, printing wall time, CPU time and peak RSS.

    .venv/bin/python benchmarks/weekly_report.py [--gpus 1000 8000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from exporter import duck
from exporter.sinks.schema import AVAILABILITY_EVENTS, GPU_PODS, GPU_USAGE
from exporter.sinks.warehouse import CURRENT_PODS_VIEW

START = "2026-11-16 00:00:00+00"
MODELS = "['nvidia-h100-80gb', 'nvidia-tesla-a100', 'nvidia-l4', 'nvidia-tesla-t4']"


def generate(path: Path, gpus: int, minutes: int = 10080) -> int:
    """``gpu_usage`` rows for ``gpus`` GPUs x ``minutes`` from START, and their pods."""
    con = duck.connect(path)
    con.execute(GPU_USAGE.duckdb_ddl())
    con.execute(GPU_PODS.duckdb_ddl())
    con.execute(AVAILABILITY_EVENTS.duckdb_ddl())
    con.execute(CURRENT_PODS_VIEW)
    cols = ", ".join(GPU_USAGE.names)
    con.execute(f"""
        INSERT INTO gpu_usage ({cols})
        SELECT md5(g || '|' || m), TIMESTAMPTZ '{START}' + to_minutes(m), 60, 'fleet',
               'node-' || (g // 8), 'pool-' || (g // 8 % 6), 'us-central1-a',
               {MODELS}[1 + g % 4], CASE WHEN g % 5 = 0 THEN 'spot' ELSE 'on-demand' END,
               'GPU-' || g, (g % 8)::VARCHAR, NULL, 'GPU-' || g,
               CASE WHEN alloc THEN 'ns-' || (g % 40) END,
               CASE WHEN alloc THEN 'job-' || g || '-' || (m // 360) || '-0' END,
               CASE WHEN alloc THEN 'uid-' || g || '-' || (m // 360) END,
               CASE WHEN alloc THEN 'team-' || (g % 12) END,
               CASE WHEN alloc THEN 'job-' || g || '-' || (m // 360) END,
               CASE WHEN alloc THEN 'allocated' ELSE 'unallocated' END, NULL,
               60, util, util, util * 0.8, 0.5, util * 0.4, 0.3, 1e9, 1e9, 0, 0, util * 100,
               300, 60, 40e9, 80e9, 0, 0, price, 60 * price / 3600
        FROM (SELECT g, m, hash(g, m // 360) % 10 < 8 AS alloc,
                     (hash(g, m) % 1000) / 1000.0 AS util,
                     [11.06, 2.93, 0.71, 0.35][1 + g % 4] AS price
              FROM range({gpus}) r(g), range({minutes}) t(m))""")
    con.execute(f"""
        INSERT INTO gpu_pods
        SELECT md5(uid), 'fleet', uid, 'ns-' || (g % 40), 'job-' || g || '-' || j || '-0',
               'team-' || (g % 12), 'job-' || g || '-' || j, 'Job', 1, {MODELS}[1 + g % 4],
               'node-' || (g // 8), 'Running', t - INTERVAL 10 MINUTE, t, t + INTERVAL 6 HOUR,
               600, NULL, 0, '', NULL, t
        FROM (SELECT g, j, 'uid-' || g || '-' || j AS uid,
                     TIMESTAMPTZ '{START}' + to_minutes(j * 360) AS t
              FROM range({gpus}) r(g), range({max(1, minutes // 360)}) s(j))""")
    rows = con.execute("SELECT count(*) FROM gpu_usage").fetchone()
    con.close()
    return int(rows[0]) if rows else 0


def run_report(path: Path, out: Path) -> None:
    from analytics import render
    from analytics.report import build
    from analytics.store import DuckDBStore
    from analytics.week import parse_week
    from exporter.prices import load_price_book

    prices = load_price_book(None, "us-central1").prices
    wall, cpu = time.perf_counter(), time.process_time()
    store = DuckDBStore(path)
    report = build(store, parse_week("2026-W47"), prices, 0.995, "fleet")
    built = time.perf_counter() - wall
    render.write(report, out)
    with open("/proc/self/status") as f:  # not ru_maxrss: it counts the parent's pages
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    print(f"  report: {time.perf_counter() - wall:.1f} s wall ({built:.1f} s building, the "
          f"rest rendering), {time.process_time() - cpu:.1f} s CPU, peak RSS {rss:.0f} MiB; "
          f"{len(report.pods):,} pods, {len(report.tables['bottlenecks']):,} workloads")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1000])
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, help="keep the generated warehouse here")
    args = parser.parse_args()
    if args.report:
        run_report(args.report, args.report.parent / "out")
        return
    for n in args.gpus:
        with tempfile.TemporaryDirectory(prefix="report-bench-") as tmp:
            path = (args.keep or Path(tmp)) / f"w{n}.duckdb"
            if not path.exists():
                began = time.perf_counter()
                rows = generate(path, n)
                print(f"{n:,} GPUs: {rows:,} gpu_usage rows generated in "
                      f"{time.perf_counter() - began:.0f} s")
            subprocess.run([sys.executable, __file__, "--report", str(path)], check=True)


if __name__ == "__main__":
    main()
