"""The benchmarks run, at a small scale, so that they keep working: what they print is
what docs/benchmarks.md and docs/warehouse.md quote at fleet scale."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timing import limit

ROOT = Path(__file__).parent.parent


def bench(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=limit(300), check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    return done.stdout


def test_the_cycle_benchmark_prints_cpu_by_stage_and_rss() -> None:
    out = bench("benchmarks/exporter_cycle.py", "--nodes", "125", "--cycles", "3")
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+ ", line)]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert all(r[7] == "19000" for r in rows)                  # 125 nodes x 8 GPUs x 19
    assert all(float(r[1]) > 0 and int(r[9]) > 0 for r in rows)  # CPU, open files
    summary = re.search(r"cycle ([\d.]+) / ([\d.]+), scrape ([\d.]+) / [\d.]+, compute "
                        r"([\d.]+) / [\d.]+, warehouse ([\d.]+) / [\d.]+, render ([\d.]+)", out)
    assert summary is not None, out
    cycle, _, *stages = map(float, summary.groups())
    assert 0 < sum(stages) <= cycle * 1.5
    assert re.search(r"RSS after cycle 1 \d+ MiB, after cycle 3 \d+ MiB", out)
    assert "heavy modules loaded: none" in out


def test_the_floor_benchmark_prints_each_part_and_the_exporter_beside_their_sum() -> None:
    out = bench("benchmarks/cycle_floor.py", "--nodes", "20", "--rounds", "2")
    assert re.search(r"20 nodes: 20 pages, 160 GPUs; /metrics has \d+ series, \d+ of them", out)
    ways = dict(re.findall(r"^  (\w+): .*? ([\d.]+)$", out, re.M))
    assert list(ways) == ["get", "find", "check", "convert", "compute", "warehouse", "render"]
    floor = re.search(r"^floor: (.*); sum ([\d.]+)$", out, re.M)
    assert floor is not None, out
    parts = dict(p.split() for p in floor[1].split(", "))
    assert list(parts) == list(ways)
    assert float(floor[2]) == pytest.approx(sum(map(float, parts.values())), abs=0.002)
    cycle = re.search(r"the exporter's cycle in the same minutes: median ([\d.]+) s, "
                      r"([\d.]+) times the floor", out)
    assert cycle is not None and float(cycle[1]) > 0, out


def test_the_warehouse_soak_writes_rolls_up_and_reopens() -> None:
    out = bench("benchmarks/warehouse_soak.py", "--gpus", "100", "--days", "2",
                "--raw-days", "1")
    days = [line.split() for line in out.splitlines() if re.match(r"\s+[12] ", line)]
    assert [d[1] for d in days] == ["144,000", "288,000"]    # 100 GPUs x 1,440 minutes
    assert "written again: 0 rows added" in out


def test_the_weekly_report_benchmark_builds_the_report_on_the_present_schema() -> None:
    out = bench("benchmarks/weekly_report.py", "--gpus", "8")
    assert "8 GPUs: 80,640 gpu_usage rows generated" in out   # 8 GPUs x 10,080 minutes
    report = re.search(r"report: [\d.]+ s wall .* peak RSS (\d+) MiB; ([\d,]+) pods, "
                       r"([\d,]+) workloads", out)
    assert report is not None, out
    assert int(report[1]) > 0 and int(report[2].replace(",", "")) > 0


def test_the_demo_benchmark_prints_the_demo_cpu_and_wall_beside_the_references() -> None:
    out = bench("benchmarks/demo_week.py", "--", "--duration", "1h")
    assert "Simulated 0.0416667 days of cluster 'demo'" in out
    assert len(re.findall(r"^(before|after): reference loop [\d.]+ s, memory walk [\d.]+ s$",
                          out, re.M)) == 2
    cpu = re.search(r"^demo --duration 1h: CPU ([\d.]+) s \(user ([\d.]+), system ([\d.]+)\), "
                    r"wall ([\d.]+) s$", out, re.M)
    assert cpu is not None, out
    total, user, system, wall = map(float, cpu.groups())
    assert total > 0 and wall > 0 and total == pytest.approx(user + system, abs=0.11)


def test_the_memory_soak_prints_the_rss_slope_with_the_warehouse_on_and_off() -> None:
    out = bench("benchmarks/memory_soak.py", "--nodes", "3", "--hours", "0.5", "--warmup",
                "0.2", "--minutes", "2")
    slopes = re.findall(r"^warehouse (on|off): RSS slope [+-][\d.]+ MB per hour over simulated "
                        r"hours 0\.2-0\.5 \((\d+) cycles", out, re.M)
    assert [(mode, int(n)) for mode, n in slopes] == [("on", 36), ("off", 36)], out
    assert re.search(r"^  0\.5     60 .* in_memory_table MiB [\d.]+, file MiB", out, re.M), out
    assert "external_file_cache" not in out


def test_the_whatif_benchmark_prints_the_engine_beside_the_full_loop() -> None:
    out = bench("benchmarks/whatif.py", "--days", "0.1", "--gpus", "16")
    for part in ("the week, measured", "trace", "layout", "full loop (and measure)"):
        assert len(re.findall(rf"  {re.escape(part)}\s+wall\s+[\d.]+ s\s+CPU\s+[\d.]+ s",
                              out)) == 2, part
    engines = re.findall(r"  engine \(and measure\)\s+CPU\s+([\d.]+) s the first time, "
                         r"([\d.]+) s the median of 3; ([\d,]+) steps of", out)
    assert len(engines) == 2 and all(float(c) > 0 and float(m) > 0 for c, m, _ in engines), out
    ratios = re.findall(r"the engine ([\d,]+)x cheaper than the full loop \(([\d,]+)x its "
                        r"first time; CPU, same run\)", out)
    assert len(ratios) == 2, out
    fidelity = re.findall(r"the engine's fidelity to the week: (\d+) of (\d+) checks", out)
    assert len(fidelity) == 2 and all(int(n) > 0 for _, n in fidelity), out
    assert len(re.findall(r"cost_usd: loop [\d,.]+, engine [\d,.]+", out)) == 2, out
    assert len(re.findall(r"GPU-hours waited by cause \(loop / engine\): \S", out)) == 2, out
    assert len(re.findall(r"the weekly report: CPU [\d.]+ s without replays, [\d.]+ s with "
                          r"\d+ actions replayed", out)) == 2, out
    assert re.search(r"fleet: 2 nodes, 16 GPUs", out)


def test_the_forecast_benchmark_prints_the_error_against_the_truth() -> None:
    """A day of the Kueue scenario: some units wait over an hour, and each is given a start
    whose error is printed beside the plain guess's."""
    out = bench("benchmarks/queue_forecast.py", "--scenario", "kueue", "--days", "1")
    found = re.search(r"kueue, 1 days: (\d+) units waited over an hour .*; (\d+) given", out)
    assert found is not None, out
    assert int(found.group(1)) > 0
    assert re.search(r"forecast error: median [\d.]+ h, p90 [\d.]+ h", out), out
    assert re.search(r"plain guess .*: median [\d.]+ h", out), out


def test_the_backlog_benchmark_replays_a_pods_csv_the_layout_cannot_keep_up_with() -> None:
    """Fractions, two-model pods, withdrawn, unfinished: hundreds wait, the replay runs to
    the end and writes its outputs; the peak memory is printed."""
    out = bench("benchmarks/whatif_backlog.py", "--pods", "2000", "--days", "1")
    rows = re.findall(r"^\s+([\d,]+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)$", out,
                      re.MULTILINE)
    assert len(rows) == 1, out
    pods, rc, _, cpu, rss, waiting = rows[0]
    assert (pods, rc) == ("2,000", "0")
    assert float(cpu) > 0 and int(rss) > 0
    assert int(waiting) >= 100, "hundreds wait in the busiest hour"
