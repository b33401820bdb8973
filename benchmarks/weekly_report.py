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
from exporter.sinks.schema import TABLES
from exporter.sinks.warehouse import CURRENT_PODS_VIEW

START = "2026-11-16 00:00:00+00"
MODELS = "['nvidia-h100-80gb', 'nvidia-tesla-a100', 'nvidia-l4', 'nvidia-tesla-t4']"


def generate(path: Path, gpus: int, minutes: int = 10080) -> int:
    """``gpu_usage`` rows for ``gpus`` GPUs x ``minutes`` from START, and their pods."""
    con = duck.connect(path)
    for table in TABLES:
        con.execute(table.duckdb_ddl())
    con.execute(CURRENT_PODS_VIEW)
    # by name: a column of a later release is left to its default (NULL)
    con.execute(f"""
        INSERT INTO gpu_usage BY NAME
        SELECT md5(g || '|' || m) AS id, TIMESTAMPTZ '{START}' + to_minutes(m) AS time,
               60 AS interval_seconds, 'fleet' AS cluster, 'node-' || (g // 8) AS node,
               'pool-' || (g // 8 % 6) AS node_pool, 'us-central1-a' AS zone,
               {MODELS}[1 + g % 4] AS gpu_model,
               CASE WHEN g % 5 = 0 THEN 'spot' ELSE 'on-demand' END AS provisioning,
               'GPU-' || g AS gpu_uuid, (g % 8)::VARCHAR AS gpu_index,
               'GPU-' || g AS device_id,
               CASE WHEN alloc THEN 'ns-' || (g % 40) END AS namespace,
               CASE WHEN alloc THEN 'job-' || g || '-' || (m // 360) || '-0' END AS pod,
               CASE WHEN alloc THEN 'uid-' || g || '-' || (m // 360) END AS pod_uid,
               CASE WHEN alloc THEN 'team-' || (g % 12) END AS team,
               CASE WHEN alloc THEN 'job-' || g || '-' || (m // 360) END AS workload,
               CASE WHEN alloc THEN 'allocated' ELSE 'unallocated' END AS state,
               60 AS gpu_seconds, util AS utilization, util AS gr_engine_active,
               util * 0.8 AS sm_active, 0.5 AS sm_occupancy, util * 0.4 AS tensor_active,
               0.3 AS dram_active, 1e9 AS pcie_tx_bytes_per_second,
               1e9 AS pcie_rx_bytes_per_second, 0 AS nvlink_tx_bytes_per_second,
               0 AS nvlink_rx_bytes_per_second, util * 100 AS gpu_util_percent,
               300 AS power_watts, 60 AS temperature_celsius, 40e9 AS memory_used_bytes,
               80e9 AS memory_total_bytes, 0 AS last_xid, 0 AS clock_event_reasons,
               price AS price_usd_per_hour, 60 * price / 3600 AS cost_usd
        FROM (SELECT g, m, hash(g, m // 360) % 10 < 8 AS alloc,
                     (hash(g, m) % 1000) / 1000.0 AS util,
                     [11.06, 2.93, 0.71, 0.35][1 + g % 4] AS price
              FROM range({gpus}) r(g), range({minutes}) t(m))""")
    con.execute(f"""
        INSERT INTO gpu_pods BY NAME
        SELECT md5(uid) AS id, 'fleet' AS cluster, uid AS pod_uid,
               'ns-' || (g % 40) AS namespace, 'job-' || g || '-' || j || '-0' AS pod,
               'team-' || (g % 12) AS team, 'job-' || g || '-' || j AS workload,
               'Job' AS owner_kind, 1 AS gpus, {MODELS}[1 + g % 4] AS gpu_model,
               'node-' || (g // 8) AS node, 'Running' AS phase,
               t - INTERVAL 10 MINUTE AS created, t AS scheduled,
               t + INTERVAL 6 HOUR AS finished, 600 AS queue_wait_seconds, 0 AS priority,
               '' AS priority_class, t AS updated
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
    from exporter.model.prices import load_price_book

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
