"""The warehouse's disk at fleet scale, and the cost of rolling old rows up to hours.

Generates one day of ``gpu_usage`` rows for N GPUs at the default warehouse interval (60 s),
rolls that day up to hourly rows with the
exporter's own code, and prints the disk each needs per 1,000 GPUs per month (what
``warehouse.retention`` trades) and the time the roll-up took.

    .venv/bin/python benchmarks/warehouse_retention.py [--gpus 1000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from weekly_report import START, generate

from exporter import duck
from exporter.sinks.schema import GPU_USAGE
from exporter.sinks.warehouse import Warehouse

DAY_MINUTES = 1440
MIB = 1 << 20


def size(path: Path) -> float:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    args = parser.parse_args()
    per_1000_month = 1000 / args.gpus * 30
    with tempfile.TemporaryDirectory(prefix="retention-bench-") as tmp:
        raw = Path(tmp) / "raw.duckdb"
        began = time.perf_counter()
        rows = generate(raw, args.gpus, minutes=DAY_MINUTES)
        print(f"{args.gpus:,} GPUs, one day at 60 s: {rows:,} rows in "
              f"{time.perf_counter() - began:.0f} s, {size(raw):,.0f} MiB on disk "
              f"-> {size(raw) * per_1000_month / 1024:,.1f} GiB per 1,000 GPUs per month")
        wh = Warehouse(raw, "fleet", interval=60.0)
        start = duck.connect().execute(f"SELECT epoch(TIMESTAMPTZ '{START}')").fetchone()
        assert start is not None
        began, cpu = time.perf_counter(), time.process_time()
        done = wh.roll_up(float(start[0]) + 86400.0, budget_seconds=3600.0)
        print(f"  rolled up to hours in {time.perf_counter() - began:.1f} s wall, "
              f"{time.process_time() - cpu:.1f} s CPU (memory_limit 64MB, 1 thread): "
              f"{wh.rows_removed['gpu_usage', 'rolled_up']:,} rows -> "
              f"{wh.con.execute('SELECT count(*) FROM gpu_usage').fetchone()[0]:,}, "  # type: ignore[index]
              f"complete: {done}")
        hourly = Path(tmp) / "hourly.duckdb"
        wh.con.execute(f"ATTACH {duck.quote(str(hourly))} AS h")
        wh.con.execute(GPU_USAGE.duckdb_ddl().replace("gpu_usage", "h.gpu_usage", 1))
        wh.con.execute("INSERT INTO h.gpu_usage SELECT * FROM gpu_usage")
        wh.con.execute("DETACH h")
        wh.close()
        print(f"  hourly rows: {size(hourly):,.1f} MiB on disk -> "
              f"{size(hourly) * per_1000_month:,.0f} MiB per 1,000 GPUs per month")


if __name__ == "__main__":
    main()
