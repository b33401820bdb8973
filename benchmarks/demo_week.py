"""The demo's simulated week: the CPU and wall seconds of ``gke-gpu-exporter demo``.

Runs the demo as ``make demo`` does (the default cluster, 15 nodes and 84 GPUs, seven
simulated days at a 5-minute step, the weekly report at the end) in a process of its own,
output captured (so off a terminal, as in CI), into a temporary folder, and prints its CPU
seconds (user and system, of the process and any it started), its wall seconds, and the
reference loop and memory walk of ``exporter_cycle.py`` before and after it: this machine's
speed moves by half and more within minutes, so the figures are compared only beside them.
Arguments after ``--`` go to the demo (``-- --duration 1d``).

    .venv/bin/python benchmarks/demo_week.py [-- --duration 1d --step 30s]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import exporter_cycle

ROOT = Path(__file__).parent.parent


def run_demo(demo_args: list[str]) -> tuple[float, float, float, str]:
    """The demo in a process of its own: CPU user and system seconds, wall seconds, and
    the first line it prints."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="demo-bench-") as out:
        done = subprocess.run(
            [sys.executable, "-m", "exporter", "demo", "--out", out, *demo_args],
            cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the demo failed:\n{done.stderr[-2000:]}")
    first = done.stdout.splitlines()[0] if done.stdout else ""
    return (after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, wall, first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("demo_args", nargs="*", metavar="-- DEMO ARGS",
                        help="arguments for the demo (default: none, the simulated week)")
    args = parser.parse_args()
    ref, mem = exporter_cycle.machine_reference(), exporter_cycle.memory_reference()
    print(f"before: reference loop {ref:.2f} s, memory walk {mem:.2f} s")
    user, system, wall, first = run_demo(args.demo_args)
    print(first)
    ref, mem = exporter_cycle.machine_reference(), exporter_cycle.memory_reference()
    print(f"after: reference loop {ref:.2f} s, memory walk {mem:.2f} s")
    print(f"demo {' '.join(args.demo_args) or '(a week)'}: CPU {user + system:.1f} s "
          f"(user {user:.1f}, system {system:.1f}), wall {wall:.1f} s")


if __name__ == "__main__":
    main()
