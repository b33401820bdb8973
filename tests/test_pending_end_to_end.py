"""Why jobs waited, end to end: the exporter against the simulator over the demo's week and
the Kueue scenario. The cause the warehouse gives each waiting pod (or Workload) in each
interval is the simulator's truth for nearly every GPU-second waited, and the free GPUs no
waiting pod could use are the truth's within an interval."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from analytics.figures.headline import Pricing
from analytics.report import WeeklyReport, build
from analytics.store import DuckDBStore
from analytics.week import parse_week
from exporter.config import Config
from exporter.demo import demo_config, step_both
from exporter.model.carbon import load_carbon_book, region_of_zone
from exporter.model.pending import CAUSES, STRANDED
from exporter.model.prices import load_price_book
from exporter.runtime.app import open_exporter
from exporter.sinks.warehouse import Warehouse
from simulator.scenario import Scenario, load_scenario
from simulator.server import SimulatorServer
from simulator.truth import FreeSegment, PendingSegment, Segment, TruthLog
from tests.timing import limit

AGREEMENT = 0.98
"""The share of waited GPU-seconds whose cause must be the truth's."""
STEP = 180.0
"""The demo week's step: three minutes (the demo runs 30 s steps), shorter than the delays
that make a cause (a scale-up's five minutes, an image pull's eight)."""
KUEUE_STEP = 300.0
"""The Kueue week's: five minutes, as long as a scale-up takes."""

Mass = dict[tuple[str, float], dict[str, float]]
"""(uid, interval start) -> cause -> GPU-seconds."""


@dataclass
class Run:
    name: str
    interval: float
    ours: Mass
    truth: Mass
    free_ours: dict[tuple[str, str], float]
    free_truth: dict[tuple[str, str], float]
    pool_gpus: dict[str, float]
    """Each pool's most physical GPUs free at once (the truth's)."""
    energy: Energy


@dataclass
class Energy:
    """Joules and grams by (team, pool) from the warehouse and the truth, and the weekly
    report over the run."""

    ours: dict[tuple[str, str], float]
    truth: dict[tuple[str, str], float]
    co2e: dict[str, tuple[float, float]]
    """Zone -> (joules, grams) of the warehouse's rows."""
    report: WeeklyReport | None
    """The weekly report over the run, where asked for."""
    resets: int
    """Counter resets in the truth."""


def split_as_cost(segments: list[Segment], start: float, end: float
                  ) -> dict[tuple[str, str], float]:
    """The truth's joules by (team, pool), each MIG instance taking its GPU's energy by its
    compute slices, as the product splits it (the GPU's counter is all a page shows; how
    much each instance drew is no reading), a whole GPU's as the truth records it."""
    out: dict[tuple[str, str], float] = defaultdict(float)

    def add(seg: Segment, joules: float) -> None:
        d = seg.device
        if seg.down is not None or not seg.occupants:
            out["(unavailable)" if seg.down else "(unallocated)", d.pool] += joules
            return
        for p in seg.occupants:
            out[p.team or p.namespace, d.pool] += joules / len(seg.occupants)

    by_gpu: dict[str, list[Segment]] = defaultdict(list)
    for seg in segments:
        if seg.end > start and seg.start < end and seg.end > seg.start:
            by_gpu[seg.device.gpu_uuid].append(seg)
    for segs in by_gpu.values():
        if all(seg.device.mig_profile is None for seg in segs):
            for seg in segs:
                lo, hi = max(start, seg.start), min(end, seg.end)
                add(seg, seg.joules * (hi - lo) / (seg.end - seg.start))
            continue
        slices = sum({seg.device.device_id: seg.device.fraction for seg in segs}.values())
        cuts = sorted({t for seg in segs for t in (seg.start, seg.end)} | {start, end})
        cuts = [t for t in cuts if start <= t <= end]
        for a, b in itertools.pairwise(cuts):
            live = [seg for seg in segs if seg.start <= a and seg.end >= b]
            watts = sum(seg.joules / (seg.end - seg.start) for seg in live)
            for seg in live:
                add(seg, watts * (b - a) * seg.device.fraction / slices)
    return dict(out)


def energy_of(wh: Warehouse, log: TruthLog, start: float, end: float, scenario: Scenario,
              cfg: Config, with_report: bool) -> Energy:
    ours = {(team, pool): j for team, pool, j in wh.con.execute(
        "SELECT CASE WHEN state = 'allocated' THEN team ELSE '(' || state || ')' END, "
        "node_pool, sum(energy_joules) FROM gpu_usage GROUP BY ALL").fetchall()}
    truth = log.report(start, end, utilization=False)
    physical = sum(truth.joules_by("pool").values())
    truth_j = split_as_cost(log.segments, start, end)
    assert sum(truth_j.values()) == pytest.approx(physical, rel=1e-9)  # a split, no more
    co2e = {zone: (j, g) for zone, j, g in wh.con.execute(
        "SELECT zone, sum(energy_joules), sum(co2e_grams) FROM gpu_usage "
        "WHERE energy_joules IS NOT NULL GROUP BY ALL").fetchall()}
    report = None
    if with_report:
        book = load_price_book(None, scenario.region)
        week = parse_week(time.strftime("%G-W%V", time.gmtime(scenario.start.timestamp())))
        report = build(DuckDBStore(con=wh.con), week, Pricing.of(book, cfg.prices),
                       cfg.sla.target, cfg.cluster, carbon=cfg.carbon.in_force().basis)
    return Energy(ours, truth_j, co2e, report, len(truth.counter_resets))


def bucketed(segments: list[PendingSegment], interval: float) -> Mass:
    out: Mass = defaultdict(lambda: defaultdict(float))
    for seg in segments:
        t = seg.start
        while t < seg.end - 1e-9:
            bucket = t - t % interval
            upto = min(seg.end, bucket + interval)
            out[seg.uid, bucket][seg.cause] += seg.gpus * (upto - t)
            t = upto
    return out


async def replay(name: str, scenario: Scenario, seconds: float, out: Path,
                 with_report: bool = False) -> Run:
    async with SimulatorServer(scenario) as sim:
        cfg = demo_config(scenario, sim.write_outputs(out).kubeconfig, out)
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(limit(30)):
                await exporter.kube.wait_synced()
            start = sim.cluster.now
            await exporter.cycle(start)
            await step_both(sim, exporter, round(seconds / scenario.step))
            end = sim.cluster.now
            wh = exporter.warehouse
            assert wh is not None
            wh.flush(end, partial=True)
            ours: Mass = defaultdict(lambda: defaultdict(float))
            for uid, t, cause, gs in wh.con.execute(
                    "SELECT uid, epoch(time), cause, gpu_seconds FROM gpu_pending").fetchall():
                ours[uid, float(t)][cause] += gs
            free_ours = {(pool, use): gs for pool, use, gs in wh.con.execute(
                "SELECT node_pool, use, sum(gpu_seconds) FROM gpu_free "
                "GROUP BY ALL").fetchall()}
            truth_log = sim.cluster.truth
            # the exporter's first cycle is where it starts counting; the last one's
            # state holds past the end
            segments = truth_log.pending_segments(start, end)
            free_segments: list[FreeSegment] = truth_log.free_segments(start, end)
            free_truth: dict[tuple[str, str], float] = defaultdict(float)
            pool_gpus: dict[str, float] = defaultdict(float)
            for fs in free_segments:
                free_truth[fs.pool, fs.use] += fs.gpus * (fs.end - fs.start)
                pool_gpus[fs.pool] = max(pool_gpus[fs.pool], fs.gpus)
            sim.cluster.close()
            energy = energy_of(wh, truth_log, start, end, scenario, cfg, with_report)
            return Run(name, wh.interval, ours, bucketed(segments, wh.interval),
                       free_ours, dict(free_truth), dict(pool_gpus), energy)


def confusion(run: Run) -> tuple[dict[tuple[str, str], float], float, float]:
    """(truth's cause, ours) -> GPU-seconds; the GPU-seconds both give the same cause; the
    truth's total. Within one interval of one pod, the same causes are matched first and
    the rest of each side shared out in proportion."""
    table: dict[tuple[str, str], float] = defaultdict(float)
    agreed = total = 0.0
    for key in run.truth.keys() | run.ours.keys():
        truth = dict(run.truth.get(key, {}))
        ours = dict(run.ours.get(key, {}))
        total += sum(truth.values())
        for cause in list(truth):
            same = min(truth[cause], ours.get(cause, 0.0))
            if same:
                table[cause, cause] += same
                agreed += same
                truth[cause] -= same
                ours[cause] -= same
        left_t = {c: x for c, x in truth.items() if x > 1e-6}
        left_o = {c: x for c, x in ours.items() if x > 1e-6}
        sum_o = sum(left_o.values())
        for tc, tx in left_t.items():
            if not sum_o:
                table[tc, "(not waiting)"] += tx
                continue
            for oc, ox in left_o.items():
                table[tc, oc] += tx * ox / sum_o
        if not left_t:
            for oc, ox in left_o.items():
                table["(not waiting)", oc] += ox
    return dict(table), agreed, total


def printed(run: Run, table: dict[tuple[str, str], float]) -> str:
    cols = [*CAUSES, "(not waiting)"]
    lines = [f"{run.name}: GPU-hours waited, truth (rows) x exporter (columns)",
             "".join(f"{c[:12]:>13}" for c in ["", *cols])]
    for tc in cols:
        row = [table.get((tc, oc), 0.0) / 3600 for oc in cols]
        if any(row):
            lines.append(f"{tc[:12]:>13}" + "".join(f"{x:13.1f}" for x in row))
    return "\n".join(lines)


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Run:
    scenario = load_scenario(None).model_copy(update={"step": STEP})
    return asyncio.run(replay("the demo week", scenario, 7 * 86400.0,
                              tmp_path_factory.mktemp("week"), with_report=True))


@pytest.fixture(scope="module")
def kueue(tmp_path_factory: pytest.TempPathFactory) -> Run:
    scenario = load_scenario("kueue").model_copy(update={"step": KUEUE_STEP})
    return asyncio.run(replay("the Kueue week", scenario, 7 * 86400.0,
                              tmp_path_factory.mktemp("kueue")))


@pytest.mark.parametrize("which", ["week", "kueue"])
def test_the_cause_of_nearly_every_gpu_second_waited_is_the_truths(
        which: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(which)
    table, agreed, total = confusion(run)
    print("\n" + printed(run, table))
    assert total > 0
    assert agreed / total >= AGREEMENT, printed(run, table)


def test_the_demo_week_shows_every_cause(week: Run) -> None:
    shown = {c for causes in week.ours.values() for c, x in causes.items() if x > 0}
    expected = set(CAUSES) - {"quota"}  # the default scenario runs no Kueue
    assert expected <= shown, sorted(expected - shown)


def test_the_kueue_scenario_shows_quota_and_preempted_waits(kueue: Run) -> None:
    shown = {c for causes in kueue.ours.values() for c, x in causes.items() if x > 0}
    assert {"quota", "preempted"} <= shown


@pytest.mark.parametrize("which", ["week", "kueue"])
def test_stranded_gpu_seconds_per_pool_are_the_truths_within_an_interval(
        which: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(which)
    for pool in sorted({p for p, _ in run.free_truth | run.free_ours}):
        for use in STRANDED:
            truth = run.free_truth.get((pool, use), 0.0)
            ours = run.free_ours.get((pool, use), 0.0)
            assert abs(ours - truth) <= run.pool_gpus.get(pool, 0.0) * run.interval + 1e-6, \
                (pool, use, ours, truth)


ENERGY_WITHIN = 0.01
"""How far the exporter's energy per team and per pool may be from the truth's."""


@pytest.mark.parametrize("which", ["week", "kueue"])
def test_energy_per_team_and_pool_is_the_truths_within_one_percent(
        which: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(which)
    e = run.energy
    for by in (0, 1):  # team, then pool
        ours: dict[str, float] = defaultdict(float)
        truth: dict[str, float] = defaultdict(float)
        for key, j in e.ours.items():
            ours[key[by]] += j or 0.0
        for key, j in e.truth.items():
            truth[key[by]] += j
        print(f"\n{run.name}, by {('team', 'pool')[by]}: kWh ours / truth")
        for k in sorted(truth, key=lambda k: -truth[k]):
            print(f"  {k:>20} {ours.get(k, 0.0) / 3.6e6:12.2f} {truth[k] / 3.6e6:12.2f}")
        for k, j in truth.items():
            if k == "(unavailable)" or j < 0.001 * sum(truth.values()):
                continue  # a down GPU's draw is not on any page; a crumb is no share
            assert ours.get(k, 0.0) == pytest.approx(j, rel=ENERGY_WITHIN), (k, ours.get(k), j)
    assert sum(truth.values()) > 3.6e6 * 100  # a real week's energy, not a trivial one


def test_co2e_is_energy_times_the_shipped_intensity_times_pue_to_the_gram(week: Run) -> None:
    book = load_carbon_book(None)
    for zone, (joules, grams) in week.energy.co2e.items():
        grid = book.regions[region_of_zone(zone)].grid_g_per_kwh
        assert grams == pytest.approx(joules / 3.6e6 * book.pue * grid, abs=1.0), zone
    assert sum(g for _, g in week.energy.co2e.values()) > 1000


def test_the_reports_energy_tables_sum_to_its_headline(week: Run) -> None:
    r = week.energy.report
    assert r is not None
    h = r.headline
    assert h["energy_kwh"] and h["energy_kwh"] > 100
    for name in ("energy_by_team", "energy_by_node_pool"):
        t = r.frame(name)
        assert t.energy_kwh.sum() == pytest.approx(h["energy_kwh"], rel=1e-9), name
        assert t.co2e_kg.sum() == pytest.approx(h["co2e_kg"], rel=1e-9), name
        assert t.idle_kwh.sum() == pytest.approx(h["idle_energy_kwh"], rel=1e-9), name
    teams = r.frame("energy_by_team").set_index("team")
    assert teams.loc["(unallocated)", "energy_kwh"] == pytest.approx(
        h["unallocated_energy_kwh"], rel=1e-9)
    assert r.carbon is not None and "PUE 1.09" in r.carbon
