"""How far the queue forecast's expected starts are from when waiting work really started.

Runs the simulator and the exporter together, a cycle a step, as ``make demo`` does (the
exporter over HTTP, its forecast every cycle), and keeps each waiting pod's or Kueue
Workload's first expected start: the one made at the first cycle that saw it wait. At the
end it compares them with the simulator's truth (a pod's ``PodScheduled``; a Workload's
first pod's), for the units that waited over an hour from that cycle, and prints the error's
median and 90th percentile (absolute, hours), its median sign (late or early), the share
given an expected start at all, and beside them a plain guess: the median wait so far of
the pods of its namespace that started before it, from the same truth.

    .venv/bin/python benchmarks/queue_forecast.py [--scenario default --scenario kueue]
                                                  [--days 4] [--arrivals 0]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exporter.demo import caught_up, demo_config
from exporter.runtime.app import open_exporter
from simulator.scenario import load_scenario
from simulator.server import SimulatorServer

HOUR = 3600.0


@dataclass
class Seen:
    namespace: str
    kind: str
    at: float
    """The cycle that first saw it wait."""
    expected: float | None
    basis: str


Truth = tuple[dict[str, Seen], dict[str, float], dict[str, list[tuple[float, float]]], float]


async def run(name: str, days: float, arrivals: float | None = None) -> Truth:
    """Each unit's first forecast, each unit's true start, each namespace's (start, wait)
    in the truth, and the forecasts' CPU seconds."""
    scenario = load_scenario(name).model_copy(update={"step": 300.0})
    seen: dict[str, Seen] = {}
    cpu = 0.0
    with tempfile.TemporaryDirectory(prefix="forecast-bench-") as tmp:
        out = Path(tmp)
        async with SimulatorServer(scenario) as sim:
            cfg = demo_config(scenario, sim.write_outputs(out).kubeconfig, out)
            if arrivals is not None:
                cfg = cfg.model_copy(update={"queue_forecast": cfg.queue_forecast.model_copy(
                    update={"arrivals": arrivals})})
            async with open_exporter(cfg) as exporter:
                async with asyncio.timeout(30):
                    await exporter.kube.wait_synced()
                await exporter.cycle(sim.cluster.now)
                for _ in range(round(days * 86400 / scenario.step)):
                    await sim.advance(sim.cluster.step)
                    await caught_up(sim, exporter)
                    await exporter.cycle(sim.cluster.now)
                    forecast = exporter.forecasts.last
                    cpu += forecast.cpu_seconds if forecast.made_unix == sim.cluster.now \
                        else 0.0
                    for w in exporter.waits.figures.waiting:
                        if w.uid in seen:
                            continue
                        e = forecast.starts.get(w.uid)
                        seen[w.uid] = Seen(w.namespace, w.kind, sim.cluster.now,
                                           e.start if e else None, e.basis if e else "none")
                truth = sim.cluster.truth.report(sim.cluster.start, sim.cluster.now)
    started: dict[str, float] = {}
    by_namespace: dict[str, list[tuple[float, float]]] = {}
    for uid, rec in truth.pods.items():
        if rec.scheduled_at is None:
            continue
        started[uid] = rec.scheduled_at
        if rec.workload_uid is not None:
            started[rec.workload_uid] = min(started.get(rec.workload_uid, rec.scheduled_at),
                                            rec.scheduled_at)
        by_namespace.setdefault(rec.namespace, []).append(
            (rec.scheduled_at, rec.scheduled_at - rec.created_at))
    for runs in by_namespace.values():
        runs.sort()
    return seen, started, by_namespace, cpu


def plain_guess(at: float, runs: list[tuple[float, float]]) -> float | None:
    """The median wait of the namespace's pods that started before ``at``."""
    before = runs[:bisect.bisect_left(runs, (at, -1.0))]
    return at + statistics.median(w for _, w in before) if before else None


def report(name: str, days: float, arrivals: float | None) -> None:
    began = time.process_time()
    seen, started, by_namespace, cpu = asyncio.run(run(name, days, arrivals))
    total = time.process_time() - began
    errors, guesses, late, none = [], [], [], 0
    for uid, s in seen.items():
        start = started.get(uid)
        if start is None or start - s.at <= HOUR:
            continue
        if s.expected is None:
            none += 1
            continue
        errors.append(abs(s.expected - start) / HOUR)
        late.append((s.expected - start) / HOUR)
        guess = plain_guess(s.at, by_namespace.get(s.namespace, []))
        if guess is not None:
            guesses.append(abs(guess - start) / HOUR)
    n = len(errors) + none
    print(f"{name}, {days:g} days: {n} units waited over an hour from the first forecast "
          f"that saw them; {len(errors)} given an expected start ({len(errors) / max(n, 1):.0%})")
    if errors:
        p50, p90 = np.percentile(errors, [50, 90])
        print(f"  forecast error: median {p50:.2f} h, p90 {p90:.2f} h, "
              f"median signed {statistics.median(late):+.2f} h (+: later than it started)")
    if guesses:
        g50, g90 = np.percentile(guesses, [50, 90])
        print(f"  plain guess (its namespace's median wait so far): median {g50:.2f} h, "
              f"p90 {g90:.2f} h, on {len(guesses)} of them")
    print(f"  forecasts' CPU {cpu:.2f} s of the run's {total:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", help="embedded scenario (repeatable; "
                        "default: default and kueue)")
    parser.add_argument("--days", type=float, default=4.0)
    parser.add_argument("--arrivals", type=float, help="queue_forecast.arrivals, seconds "
                        "(default: the config's)")
    args = parser.parse_args()
    for name in args.scenario or ["default", "kueue"]:
        report(name, args.days, args.arrivals)


if __name__ == "__main__":
    main()
