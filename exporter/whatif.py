"""``gke-gpu-exporter whatif``: last week's jobs replayed on a cluster layout, and measured.

A replay plays the replay's scenario (``analytics.whatif.scenario``) on the engine
(``analytics.whatif.engine``): the simulated cluster alone, in event time at 1-second steps,
its account written as the warehouse's tables, which ``analytics.whatif.measure`` reads as it
reads the week's. Each replay's warehouse is saved as a DuckDB file, to query further.

The full loop (``--full-loop``, and the engine's reference in the tests) is the demo's
machinery on the scenario instead: the simulator serves the layout's cluster on loopback and
submits the trace's jobs at their times; the exporter watches its Kubernetes API and
scrapes its dcgm-exporters over real HTTP, a cycle per step in virtual time, and writes a
warehouse of its own.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb
import pandas as pd

from analytics import holdings, queries, tables
from analytics.store import DuckDBStore, Store
from analytics.week import Week
from analytics.whatif import (
    compare,
    engine,
    layout,
    levers,
    pods_csv,
    render,
    scenario,
    search,
    trace,
)
from analytics.whatif.engine import Pricing
from analytics.whatif.measure import Measured, measure, told_as, without_utilization
from analytics.whatif.priced import AS_IT_IS
from analytics.whatif.scenario import Built
from exporter.config import Config
from exporter.demo import Progress, demo_config, run_steps
from exporter.runtime.app import open_exporter
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from simulator.truth import GroundTruth

WAREHOUSE = "warehouse.duckdb"


@dataclass(frozen=True, slots=True)
class Replayed:
    name: str
    built: Built
    warehouse: Path
    measured: Measured
    seconds: float
    """Wall time the replay took."""


@dataclass(frozen=True, slots=True)
class Ran:
    warehouse: Path
    """The warehouse the exporter wrote."""
    truth: GroundTruth
    """The simulator's own account of the replay (``simulator.truth``)."""


async def replay(scenario: Scenario, week: Week, out: Path, progress: Progress,
                 prices: dict[str, object] | None = None) -> Ran:
    """Run ``scenario`` over ``week`` with the exporter measuring it."""
    await asyncio.to_thread(_fresh, out)
    async with SimulatorServer(scenario) as sim:
        outputs = sim.write_outputs(out)
        cfg = demo_config(scenario, outputs.kubeconfig, out, prices=prices)
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(30):
                await exporter.kube.wait_synced()
            await exporter.cycle(sim.cluster.now)
            steps = round((week.end - week.start).total_seconds() / scenario.step)
            await run_steps(sim, exporter, steps, progress)
            wh = exporter.warehouse
            assert wh is not None
            wh.flush(exporter.last_cycle_time, partial=True)
            wh.checkpoint()
        sim.cluster.close()
        truth = sim.cluster.truth.report(sim.cluster.start, sim.cluster.now, utilization=False)
    return Ran(out / WAREHOUSE, truth)


def _fresh(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / WAREHOUSE).unlink(missing_ok=True)


def replay_all(runs: Sequence[tuple[str, Built]], week: Week, out: Path,
               prices: dict[str, object] | None = None, quiet: bool = True
               ) -> list[Replayed]:
    """Each named scenario replayed in turn under one progress bar, then measured."""
    step = runs[0][1].scenario.step
    steps = round((week.end - week.start).total_seconds() / step) * len(runs)
    service = logging.getLogger("exporter")
    level = service.level
    if quiet:  # a replay's faults are the week's, logged when they happened
        service.setLevel(logging.ERROR)
    done = []
    try:
        with Progress(steps, step, desc="replaying") as progress:
            for name, built in runs:
                began = time.monotonic()
                path = asyncio.run(replay(built.scenario, week, out / name, progress,
                                          prices)).warehouse
                store = DuckDBStore(path)
                try:
                    measured = measure(store, week)
                finally:
                    store.close()
                done.append(Replayed(name, built, path, told_as(measured, built.names),
                                     time.monotonic() - began))
    finally:
        service.setLevel(level)
    return done


def play_all(runs: Sequence[tuple[str, Built]], week: Week, out: Path, pricing: Pricing,
             utilization: dict[str, float]) -> tuple[list[Replayed], list[str]]:
    """Each named scenario played on the engine and measured; its warehouse saved to
    ``out/NAME/warehouse.duckdb``. A replay that fails is told in a line (``failures``)
    and the others go on: what was measured is kept."""
    done = []
    failed = []
    player = engine.Engine(pricing, utilization)  # a part the runs share plays once
    try:
        for name, built in runs:
            try:
                played = player.play(built.scenario, week)
            except (MemoryError, OSError, RuntimeError, ValueError, duckdb.Error) as exc:
                failed.append(f"{name}: not replayed: {failure(exc)}")
                continue
            path = out / name / WAREHOUSE
            try:
                played.store.save(path)
            except (OSError, duckdb.Error) as exc:
                path.unlink(missing_ok=True)
                failed.append(f"{name}: its warehouse not saved: {failure(exc)}")
            done.append(Replayed(name, built, path, told_as(played.measured, built.names),
                                 played.seconds))
    finally:
        player.close()
    return done, failed


def failure(exc: BaseException) -> str:
    """An error in one line: its kind and the first line of what it says."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True, slots=True)
class Request:
    """What ``whatif`` was asked: the week and where it is, or a trace file; the layout."""

    out: Path
    step: float
    seed: int
    layout: Path | None = None
    trace: Path | None = None
    week: Week | None = None
    cluster: str | None = None
    days: float = 7.0
    """A pods CSV's replay window without a week: days from its first pod's."""
    full_loop: bool = False
    """Replay through the simulator's HTTP and the exporter, a cycle a step, rather than
    on the engine."""
    recorded_layout: Path | None = None
    """A trace without a warehouse: the layout its cluster ran on, replayed first (the
    fidelity, against a pods CSV's record; the changes are the proposed replay less it)."""


@dataclass(frozen=True, slots=True)
class WeekOf:
    week: Week
    """The week as far as its rows go (``covered``)."""
    cluster: str
    jobs: list[trace.Job]
    layout: layout.Layout
    """Its own layout, with every priority class its jobs name."""
    measured: Measured


def week_of(store: Store, week: Week, cluster: str | None, cfg: Config,
            step: float) -> WeekOf:
    """What a replay of ``week`` starts from: its jobs, its layout, its figures."""
    week = queries.covered(store, week, cluster)
    name = cluster or next(iter(holdings.clusters(store)), cfg.cluster)
    jobs = trace.of_week(store, week, cluster)
    own = layout.of_week(store, week, cluster, name, _region(store, week, cfg), step)
    return WeekOf(week, name, jobs, layout.with_priorities(own, jobs),
                         measure(store, week, cluster))


def run(request: Request, store: Store | None, cfg: Config) -> int:
    """Replay, measure, compare, write; print the summary. 0, or 1 when the week's own
    replay is outside its fidelity bounds (the comparison is written all the same), or
    when a replay failed (what was measured is written, the failure told in a line)."""
    r = request
    out = r.out
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    actual = week_layout = None
    pods = pods_csv.read_pods(r.trace) if r.trace and pods_csv.is_pods_csv(r.trace) \
        else None
    if store is not None:
        assert r.week is not None
        found = week_of(store, r.week, r.cluster, cfg, r.step)
        week, actual, week_layout = found.week, found.measured, found.layout
        jobs = pods.jobs if pods else trace.read(r.trace) if r.trace else found.jobs
        layout.write(week_layout, out / "layout.yaml",
                     f"The layout cluster {found.cluster} ran on in {week.label}, as its "
                     "warehouse shows it.")
        origin = f"{len(jobs):,} jobs of {week.label} in cluster {found.cluster}"
    else:
        assert r.trace is not None and (r.layout is not None or r.recorded_layout is not None)
        jobs = pods.jobs if pods else trace.read(r.trace)
        week = r.week or trace.window(jobs, r.days)
        if r.recorded_layout is not None:
            week_layout = layout.load(r.recorded_layout)
        origin = f"{len(jobs):,} jobs of {r.trace}"
    unchecked = None
    if pods is not None:  # the week as the file recorded it, not as the warehouse measured
        actual = pods_csv.recorded(pods, week)
        unchecked = pods_csv.unrecorded(pods) or (
            None if week_layout is not None else
            "the layout the file's cluster ran on is not given (--recorded-layout replays "
            "the file on it and checks that replay against the recorded waits)")
    trace.write(jobs, out / "trace.csv")
    proposed = layout.load(r.layout) if r.layout is not None else None
    runs: list[tuple[str, Built]] = []
    step = r.step if r.full_loop else engine.RESOLUTION
    if week_layout is not None:
        runs.append(("replayed", scenario.build(jobs, layout.with_priorities(week_layout, jobs),
                                                week.start, week.end, step, r.seed)))
    if proposed is not None and proposed != week_layout:
        runs.append(("proposed", scenario.build(jobs, layout.with_priorities(proposed, jobs),
                                                week.start, week.end, step, r.seed)))
    for label, built in runs:
        notes += [f"{label}: {n}" for n in built.notes]
    failed: list[str] = []
    if r.full_loop:
        done = replay_all(runs, week, out / "replays",
                          cfg.prices.model_dump(mode="json", exclude_defaults=True))
        if all(j.utilization is None for j in jobs):  # drawn from profiles, not measured
            done = [replace(d, measured=without_utilization(d.measured)) for d in done]
    else:
        done, failed = play_all(runs, week, out / "replays",
                                Pricing.load(cfg.prices, runs[0][1].scenario.region),
                                engine.utilizations(jobs))
    notes += failed
    by_name = {d.name: d for d in done}
    base = by_name.get("replayed")
    asked = [name for name, _ in runs]
    last = by_name.get("proposed") if "proposed" in asked else base
    compared = compare.compare(actual, base.measured if base else None,
                               last.measured if last else None, r.step, unchecked)
    what = f"{r.layout}" if r.layout is not None and proposed != week_layout else \
        "its own layout"
    shown = "proposed" if "proposed" in asked else "replayed"
    recorded = "as recorded" if pods is not None else "the week"
    page = render.Page(
        title=f"What if: {week.label} on {what}",
        lines=[f"{origin}, replayed from {week.start:%Y-%m-%d %H:%M} to "
               f"{week.end:%Y-%m-%d %H:%M} UTC at {step:g} s steps"
               + (", the simulator and the exporter a cycle a step." if r.full_loop else
                  ", on the engine (the simulated cluster alone, in event time)."),
               "; ".join(f"{d.name}: {d.built.jobs:,} jobs in {d.seconds:.1f} s"
                         for d in done) + ".", _changes(shown, base is not None, pods)],
        comparison=compared, notes=notes, proposed=shown, actual=recorded)
    written = render.write(page, out)
    print(page.title)
    print(render.terminal(page))
    for n in notes:
        print(f"note: {n}")
    print(f"Written to {out}/: {', '.join(p.name for p in written)}, trace.csv"
          + (", layout.yaml (the week's own: copy it and change it)" if store else "")
          + f"; each replay's warehouse under {out}/replays/.")
    for f in failed:
        print(f"error: {f}", file=sys.stderr)
    return 1 if failed or not (compared.fidelity.empty or compared.faithful) else 0


def _changes(shown: str, own: bool, pods: pods_csv.PodsFile | None) -> str:
    """What the page's changes are the difference of."""
    if shown == "proposed" and own:
        return ("Changes are the proposed replay less the week's own replay: the same jobs "
                "through the same simulator, on two layouts.")
    if shown == "proposed" and pods is not None:
        return ("Changes are the replay less the week as the file recorded it (its waits, "
                "created to scheduled; its GPU-hours, scheduled to deleted).")
    if pods is not None:
        return "The week as the file recorded it beside its replay on the layout it ran on."
    return "The week beside its replay on its own layout."


def _region(store: Store, week: Week, cfg: Config) -> str:
    """The region the week's GPUs were in (from their zones), else the config's."""
    zones = store.query("SELECT DISTINCT zone FROM {gpu_usage} WHERE time >= @start AND "
                        "time < @end AND zone IS NOT NULL", {"start": week.start,
                                                              "end": week.end})
    regions = sorted({str(z).rsplit("-", 1)[0] for z in zones.zone})
    return regions[0] if len(regions) == 1 else cfg.prices.region


def replay_levers(store: Store, week: Week, cluster: str | None, cfg: Config,
                  actions: pd.DataFrame, spot: pd.DataFrame, budget: float | None,
                  step: float) -> dict[str, pd.DataFrame]:
    """The ``replayed`` and ``settings`` tables of the platform report: the week on its
    own layout, then on the layout each action implies (``analytics.whatif.levers``), in
    the actions' order, then each pool's candidate settings (``analytics.whatif.search``),
    on the engine; with a ``budget``, while its seconds last (a replay reckoned to take as
    long as the first). ``step``: the week's interval, which its fidelity allows."""
    began = time.monotonic()
    cols = [c.name for c in tables.BY_NAME["replayed"].columns]
    weighed_cols = [c.name for c in tables.BY_NAME["settings"].columns]
    found = week_of(store, week, cluster, cfg, step)
    week, jobs, base, actual = found.week, found.jobs, found.layout, found.measured
    pairs = spot.sort_values("weekly_saving_usd", ascending=False)[
        ["namespace", "gpu_model"]].dropna().drop_duplicates() if not spot.empty else spot
    candidates = levers.layouts(actions, base, [(str(n), str(m)) for n, m in
                                                pairs.itertuples(index=False)])
    pricing = Pricing.load(cfg.prices, base.region)
    utilization = engine.utilizations(jobs)
    targets = cfg.report.wait_targets

    def target(team: str) -> float:
        return float(targets.get(team, cfg.report.wait_target))

    played: dict[str, tuple[Measured, float]] = {}
    player = engine.Engine(pricing, utilization)

    def play(on: layout.Layout) -> tuple[Measured, float]:
        """``on`` replayed, once: an action's layout and a setting weighed can be one;
        the parts of the cluster it leaves as they were are not played again."""
        key = on.model_dump_json()
        if key not in played:
            built = scenario.build(jobs, on, week.start, week.end, engine.RESOLUTION)
            done = player.play(built.scenario, week)
            played[key] = done.measured, done.seconds
        return played[key]

    try:
        own, took = play(base)

        def over(budget: float | None) -> bool:
            return budget is not None and time.monotonic() - began + took > budget

        fidelity = compare.fidelity(actual, own, step)
        off = fidelity[~fidelity.ok.astype(bool)]
        told = "the week's own replay within its fidelity bounds" if off.empty else \
            "the week's own replay outside its bounds: " + ", ".join(off.check)
        rows: list[tuple[object, ...]] = []
        for lever in candidates:
            if over(budget):
                rows.append((lever.action, lever.where, lever.change, *[None] * 9,
                             f"not replayed: over report.whatif_budget ({budget:g} s)"))
                continue
            measured, _ = play(lever.layout)
            c = compare.compare(actual, own, measured, step)
            s = c.summary.set_index("figure")
            worst = c.teams.dropna(subset=["wait_p90_seconds_delta"]) \
                .sort_values("wait_p90_seconds_delta", ascending=False)
            past = compare.past_targets(c.teams, target)
            rows.append((lever.action, lever.where, lever.change,
                         s.loc["Cost", "delta"], s.loc["GPU-hours waited", "delta"],
                         str(worst.team.iloc[0]) if len(worst) else None,
                         float(worst.wait_p90_seconds_delta.iloc[0]) if len(worst) else None,
                         float(worst.wait_p90_seconds_proposed.iloc[0]) if len(worst) else None,
                         s.loc["Stranded GPU-hours (free, no waiting pod fits)", "delta"],
                         s.loc["Lowest pool availability", "proposed"],
                         s.loc["Spot reclaims", "delta"], "; ".join(past) or None, told))
        weighed: list[tuple[object, ...]] = []
        for pool in base.pools:
            settings = search.settings(base, pool, search.evidence(own, pool))
            if len(settings) == 1:
                continue  # its week gives no reason to weigh another
            weighs = [search.weigh(settings[0], own, target)]
            for setting in settings[1:]:
                if over(budget):
                    break
                weighs.append(search.weigh(setting, play(setting.layout)[0], target))
            best = search.choose(weighs)
            weighed += [(pool.name, pool.accelerator, w.setting.label,
                         AS_IT_IS if w is weighs[0] else
                         "recommended" if w is best else None,
                         w.cost_usd - weighs[0].cost_usd, w.team, w.wait_p90_seconds,
                         w.over_seconds) for w in weighs]
    finally:
        player.close()
    return {"replayed": pd.DataFrame(rows, columns=cols),
            "settings": pd.DataFrame(weighed, columns=weighed_cols)}
