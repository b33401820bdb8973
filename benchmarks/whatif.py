"""What a what-if replay costs: the engine against the full loop, on the demo's week and a
fleet of 1,000 GPUs.

For each cluster, a simulated week is first measured by the exporter (the week a replay
starts from); its trace and layout are read from its warehouse. Then, in the same run, the
week is replayed on its own layout twice:

- the full loop: the simulator and the exporter over real HTTP in virtual time, a cycle a
  step (``exporter.whatif.replay``), measured from its warehouse;
- the engine: the simulated cluster alone, in event time at 1-second steps, its truth
  written as the warehouse's tables in memory (``analytics.whatif.engine``), measured by
  the same queries.

It prints the CPU seconds of each (the engine's the first time, and the median of
``ENGINE_RUNS``: the report replays some thirty layouts in one process), their ratio, and
how far the engine's figures are from the loop's (cost, GPU-hours, each team's p50/p90,
GPU-hours per cause), beside the reference loop of ``exporter_cycle.py`` (this machine's
speed moves by half and more within minutes).

    .venv/bin/python benchmarks/whatif.py [--gpus 1000] [--days 7] [--step 300]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import exporter_cycle
import pandas as pd

from analytics.report import WeeklyReport
from analytics.store import DuckDBStore
from analytics.week import Week
from analytics.weekly import Replays, run_weekly
from analytics.whatif import compare, engine, layout, scenario, trace
from analytics.whatif.measure import Measured, measure
from exporter.config import Config, Prices, load_config
from exporter.demo import Progress
from exporter.model.prices import load_price_book
from exporter.whatif import replay, replay_all, replay_levers
from simulator.scenario import Scenario, load_scenario

ENGINE_RUNS = 3

def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed[**P, T](label: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn``'s result, its wall and CPU seconds printed."""
    wall, used = time.perf_counter(), cpu()
    out = fn(*args, **kwargs)
    print(f"  {label:<28} wall {time.perf_counter() - wall:7.1f} s   CPU "
          f"{cpu() - used:7.1f} s", flush=True)
    return out


def agreement(loop: Measured, fast: Measured) -> list[str]:
    """The engine's figures against the loop's, a line each."""
    out = []
    for key in ("cost_usd", "gpu_hours"):
        a, b = loop.headline[key] or 0.0, fast.headline[key] or 0.0
        out.append(f"{key}: loop {a:,.2f}, engine {b:,.2f} ({(b - a) / a:+.3%})" if a else
                   f"{key}: loop {a}, engine {b}")
    teams = loop.teams.merge(fast.teams, on="team", suffixes=("", "_e"))
    worst = max((abs(getattr(t, f"{q}_e") - getattr(t, q)) for t in teams.itertuples()
                 for q in ("wait_p50_seconds", "wait_p90_seconds")
                 if not (math.isnan(getattr(t, q)) or math.isnan(getattr(t, f"{q}_e")))),
                default=0.0)
    out.append(f"team wait p50/p90: largest gap {worst:,.0f} s over {len(teams)} teams")
    causes = loop.causes.merge(fast.causes, on="cause", how="outer",
                               suffixes=("", "_e")).fillna(0.0)
    out.append("GPU-hours waited by cause (loop / engine): " + (", ".join(
        f"{c.cause} {c.gpu_hours:,.1f} / {c.gpu_hours_e:,.1f}" for c in causes.itertuples())
        or "none waited"))
    return out


def bench(name: str, s: Scenario, days: float, out: Path) -> None:
    gpus = sum(p.nodes * p.gpus_per_node for p in s.pools)
    print(f"{name}: {sum(p.nodes for p in s.pools)} nodes, {gpus} GPUs, {days:g} days at "
          f"{s.step:g} s steps", flush=True)
    window = Week(s.start, s.start + timedelta(days=days))
    steps = round(days * 86400 / s.step)
    ran = timed("the week, measured", lambda: asyncio.run(replay(
        s, window, out / "week", Progress(steps, s.step, "the week"))))
    store = DuckDBStore(ran.warehouse)
    jobs = timed("trace", trace.of_week, store, window)
    lay = layout.with_priorities(
        timed("layout", layout.of_week, store, window, None, s.cluster, s.region, s.step), jobs)
    actual = measure(store, window)
    used = cpu()
    built = scenario.build(jobs, lay, window.start, window.end, s.step)
    [done] = timed("full loop (and measure)", replay_all, [("replayed", built)], window,
                   out / "replays")
    loop_cpu = cpu() - used
    pricing = engine.Pricing.load(Prices(), s.region)
    runs = []
    for _ in range(ENGINE_RUNS):
        used = cpu()
        fast = engine.play(scenario.build(jobs, lay, window.start, window.end,
                                          engine.RESOLUTION).scenario,
                           window, pricing, engine.utilizations(jobs))
        runs.append(cpu() - used)
    first, median = runs[0], statistics.median(runs)
    print(f"  {'engine (and measure)':<28} CPU {first:7.2f} s the first time, {median:.2f} s "
          f"the median of {ENGINE_RUNS}; {fast.steps:,} steps of "
          f"{days * 86400 / engine.RESOLUTION:,.0f}", flush=True)
    print(f"  {len(jobs):,} jobs; the engine {loop_cpu / median:,.0f}x cheaper than the "
          f"full loop ({loop_cpu / first:,.0f}x its first time; CPU, same run); full loop "
          f"{loop_cpu / days:.1f} s CPU per simulated day", flush=True)
    f = compare.fidelity(actual, fast.measured, s.step)
    print(f"  the engine's fidelity to the week: {int(f.ok.sum())} of {len(f)} checks within "
          "bounds", flush=True)
    for line in agreement(done.measured, fast.measured):
        print(f"  {line}", flush=True)
    report_with_replays(store, window, s)


def report_with_replays(store: DuckDBStore, window: Week, s: Scenario) -> None:
    """The weekly report's CPU without its replays and with every action replayed."""
    cfg = load_config(None, overrides={"cluster": s.cluster, "prices": {"region": s.region}})
    book = load_price_book(None, s.region)
    used = cpu()
    run_weekly(store, window, cfg, book, None, email=False, force=True)
    alone = cpu() - used
    used = cpu()
    report, _ = run_weekly(store, window, cfg, book, None, email=False, force=True,
                           replays=replay_levers_of(store, window, cfg))
    both = cpu() - used
    replayed = report.frame("replayed") if "replayed" in report.tables else None
    count = 0 if replayed is None else int(replayed.cost_change_usd.notna().sum())
    print(f"  the weekly report: CPU {alone:.1f} s without replays, {both:.1f} s with "
          f"{count} actions replayed: the replays {(both - alone) / alone:.2f}x the report's "
          "own CPU", flush=True)


def replay_levers_of(store: DuckDBStore, window: Week, cfg: Config) -> Replays:
    def replays(platform: WeeklyReport) -> pd.DataFrame:
        return replay_levers(store, window, None, cfg, platform.frame("actions"),
                             platform.frame("spot"), None, cfg.report.whatif_step)
    return replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000, help="the fleet's GPUs (8 a node)")
    parser.add_argument("--days", type=float, default=7.0, help="simulated days (default 7)")
    parser.add_argument("--fleet-days", type=float, help="the fleet's days (default --days)")
    parser.add_argument("--step", type=float, default=300.0, help="seconds (default 300)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"before: reference loop {exporter_cycle.machine_reference():.2f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="whatif-bench-") as tmp:
        demo = load_scenario().model_copy(update={"step": args.step})
        bench("demo", demo, args.days, Path(tmp) / "demo")
        fleet = load_scenario("fleet").scaled(args.gpus // 8).model_copy(
            update={"step": args.step})
        bench("fleet", fleet, args.fleet_days or args.days, Path(tmp) / "fleet")
    print(f"after: reference loop {exporter_cycle.machine_reference():.2f} s")


if __name__ == "__main__":
    main()
