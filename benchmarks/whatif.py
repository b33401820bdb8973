"""What a what-if replay costs: the demo's week, and a fleet of 1,000 GPUs.

For each cluster, a simulated week is first measured by the exporter (the week a replay
starts from), then timed: the trace and the layout read from its warehouse, and one
replay of the week on its own layout (the simulator and the exporter over real HTTP, in
virtual time, as ``gke-gpu-exporter whatif`` and the weekly report's replays run it),
with its fidelity. It prints the wall and CPU seconds of each part and the replay's
seconds per simulated day, beside the reference loop of ``exporter_cycle.py`` (this
machine's speed moves by half and more within minutes): a report's ``whatif_budget`` is
this, times the actions to replay plus one.

    .venv/bin/python benchmarks/whatif.py [--gpus 1000] [--days 7] [--step 300]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import exporter_cycle

from analytics.store import DuckDBStore
from analytics.week import Week
from analytics.whatif import compare, layout, scenario, trace
from analytics.whatif.measure import measure
from exporter.demo import Progress
from exporter.whatif import replay, replay_all
from simulator.scenario import Scenario, load_scenario


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
    lay = timed("layout", layout.of_week, store, window, None, s.cluster, s.region, s.step)
    actual = measure(store, window)
    built = timed("scenario", scenario.build, jobs, layout.with_priorities(lay, jobs),
                  window.start, window.end, s.step)
    wall = time.perf_counter()
    [done] = timed("replay (and measure)", replay_all, [("replayed", built)], window,
                   out / "replays")
    seconds = time.perf_counter() - wall
    f = compare.fidelity(actual, done.measured, s.step)
    print(f"  {len(jobs):,} jobs; the replay {seconds / days:.1f} s per simulated day; "
          f"fidelity {int(f.ok.sum())} of {len(f)} checks within bounds", flush=True)


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
