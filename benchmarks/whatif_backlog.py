"""A pods CSV that a layout cannot keep up with, replayed to the end: its time and memory.

``.venv/bin/python benchmarks/whatif_backlog.py [--pods 10000] [--days 7]`` writes a pods
CSV of ``--pods`` pods over ``--days`` days (``write_pods``: several teams, one whose name
is not a DNS label; whole GPUs, fractions of one and pods that accept two models;
withdrawn pods, pods still running and still waiting at the file's end), replays it with
``gke-gpu-exporter whatif`` on a layout of a few nodes (``SMALL``: hundreds of pods wait
at once) in a fresh process, and prints its wall and CPU time, the most pods waiting at
once, and the process's peak resident memory (``ru_maxrss``). With ``--scale``, the same at
a quarter and a half of the pods too: the memory follows the backlog, not the week.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

START = datetime(2026, 3, 2, tzinfo=UTC)
TEAMS = ("vision", "speech", "ads", "Data Science", "search", "robotics")
"""Several teams, one whose name is not a DNS label."""

SMALL = {
    "cluster": "elsewhere", "region": "us-central1", "placement": "compact",
    "pools": [
        {"name": "h100", "accelerator": "nvidia-h100-80gb", "gpus_per_node": 8, "nodes": 11,
         "zone": "us-central1-a"},
        {"name": "a100", "accelerator": "nvidia-tesla-a100", "gpus_per_node": 8, "nodes": 11,
         "zone": "us-central1-a"},
        {"name": "l4", "accelerator": "nvidia-l4", "gpus_per_node": 4, "nodes": 10,
         "zone": "us-central1-a"},
        {"name": "l4-shared", "accelerator": "nvidia-l4", "gpus_per_node": 4, "nodes": 1,
         "zone": "us-central1-a", "sharing": {"max_shared_clients_per_gpu": 4}}]}
"""A layout of 220 GPUs for 10,000 pods a week that kept about 230 busy: the backlog
grows to hundreds of pods."""


def write_pods(path: Path, pods: int, days: float = 7.0, seed: int = 7) -> Path:
    """``pods`` pods over ``days`` days from ``START``, as a larger cluster ran them: the
    recorded waits short (10 minutes on average), the runs from minutes to a day (an hour
    and a half on average). About 8 % are withdrawn (deleted, never scheduled); those
    whose run goes past the file's end are still running then, as are a few (0.2 %) that
    run from their start to the end; a third of the pods of the last two hours are still
    waiting. 15 % ask for a fraction of a GPU (0.25-0.81), 10 % accept an A100 or an
    H100; 30 % of the utilisations are not recorded."""
    rng = random.Random(seed)
    span = days * 86400
    end = START + timedelta(seconds=span)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["created", "scheduled", "deleted", "gpus", "gpu_model", "team", "pod",
                    "job", "utilization"])
        i = 0
        while i < pods:
            created = START + timedelta(seconds=rng.uniform(0, span * 0.98))
            team = rng.choice(TEAMS)
            kind = rng.random()
            if kind < 0.15:
                gpus, model = round(rng.uniform(0.25, 0.81), 2), "nvidia-l4"
            elif kind < 0.25:
                gpus, model = float(rng.choice((1, 2, 4))), \
                    "nvidia-tesla-a100|nvidia-h100-80gb"
            elif kind < 0.55:
                gpus, model = float(rng.choice((1, 2))), "nvidia-l4"
            else:
                gpus, model = float(rng.choice((1, 2, 4, 8))), \
                    rng.choice(("nvidia-h100-80gb", "nvidia-tesla-a100"))
            size = 2 if gpus == 8 and rng.random() < 0.3 else 1
            job = f"{team.lower().replace(' ', '-')}-{i:05d}"
            fate = rng.random()
            for k in range(min(size, pods - i)):
                waited = timedelta(seconds=rng.expovariate(1 / 600))
                run = timedelta(seconds=min(86400.0, rng.expovariate(1 / 5400) + 60))
                scheduled: datetime | None = created + waited
                deleted: datetime | None = scheduled + run if scheduled else None
                if fate < 0.08:  # withdrawn: deleted while still waiting
                    scheduled, deleted = None, created + waited * 3 + timedelta(minutes=5)
                elif fate < 0.082:  # running from its start to the file's end
                    deleted = None
                elif end - created < timedelta(hours=2) and fate < 0.33:  # still waiting
                    scheduled = deleted = None
                if deleted is not None and deleted > end:
                    deleted = None
                if scheduled is not None and scheduled > end:
                    scheduled = None
                w.writerow([_t(created), _t(scheduled), _t(deleted), f"{gpus:g}", model,
                            team, f"{job}-{k}", job,
                            "" if rng.random() < 0.3 else f"{rng.uniform(0.2, 0.95):.2f}"])
                i += 1
    return path


def _t(t: datetime | None) -> str:
    return "" if t is None else t.isoformat().replace("+00:00", "Z")


def replay(pods: Path, out: Path, days: float) -> dict[str, object]:
    """``whatif`` on the pods and ``SMALL``, in a fresh process: its exit status, wall and
    CPU seconds, peak RSS, and the most pods waiting at once."""
    out.mkdir(parents=True, exist_ok=True)
    layout = out / "small.yaml"
    layout.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(pods), str(layout), str(out / "whatif"),
         f"{days:g}"], capture_output=True, text=True, check=False)
    wall = time.monotonic() - began
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}"
    child = json.loads(line) if line.startswith("{") else {}
    return {"rc": child.get("rc", done.returncode), "wall_s": wall, **child,
            "stderr": done.stderr.strip().splitlines()[-3:]}


def most_waiting(warehouse: Path) -> int:
    """The most pods waiting at once in the replay's warehouse (``gpu_pending``)."""
    import duckdb

    con = duckdb.connect(str(warehouse), read_only=True)
    try:
        found = con.execute("SELECT MAX(n) FROM (SELECT time, COUNT(DISTINCT uid) AS n "
                            "FROM gpu_pending WHERE kind = 'pod' GROUP BY time)").fetchone()
    finally:
        con.close()
    return int(found[0] or 0) if found else 0


def child(pods: str, layout: str, out: str, days: str) -> None:
    """The replay itself (``--child``): prints one JSON line of what it measured."""
    from exporter.cli import main

    cpu = time.process_time()
    rc = main(["whatif", "--trace", pods, "--layout", layout, "--out", out,
               "--duration", f"{float(days) * 86400:g}s"])
    warehouse = Path(out) / "replays" / "proposed" / "warehouse.duckdb"
    print(json.dumps({
        "rc": rc, "cpu_s": time.process_time() - cpu,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "most_waiting": most_waiting(warehouse) if warehouse.exists() else None,
        "written": sorted(p.name for p in Path(out).iterdir())}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:6])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--scale", action="store_true",
                    help="also a quarter and a half of the pods (same days)")
    ap.add_argument("--out", type=Path, help="keep the files here (default: a temporary "
                    "directory)")
    args = ap.parse_args()
    sizes = [args.pods // 4, args.pods // 2, args.pods] if args.scale else [args.pods]
    with tempfile.TemporaryDirectory() as tmp:
        base = args.out or Path(tmp)
        print(f"{'pods':>7} {'exit':>4} {'wall s':>7} {'CPU s':>7} {'peak RSS MiB':>12} "
              f"{'most waiting':>12}")
        for n in sizes:
            pods = write_pods(base / f"pods-{n}.csv", n, args.days)
            r = replay(pods, base / f"out-{n}", args.days)
            print(f"{n:>7,} {r['rc']!s:>4} {float(r['wall_s']):>7.1f} "  # type: ignore[arg-type]
                  f"{float(r.get('cpu_s') or 0):>7.1f} "  # type: ignore[arg-type]
                  f"{float(r.get('peak_rss_mib') or 0):>12.0f} "  # type: ignore[arg-type]
                  f"{r.get('most_waiting')!s:>12}", flush=True)
            if r["rc"] != 0:
                print("  " + " / ".join(map(str, r["stderr"])), flush=True)  # type: ignore[call-overload]


if __name__ == "__main__":
    main()
