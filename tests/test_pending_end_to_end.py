"""Why jobs waited, end to end: the exporter against the simulator over the demo's week and
the Kueue scenario. The cause the warehouse gives each waiting pod (or Workload) in each
interval is the simulator's truth for nearly every GPU-second waited, and the free GPUs no
waiting pod could use are the truth's within an interval."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.demo import demo_config, step_both
from exporter.model.pending import CAUSES, STRANDED
from exporter.runtime.app import open_exporter
from simulator.scenario import Scenario, load_scenario
from simulator.server import SimulatorServer
from simulator.truth import FreeSegment, PendingSegment

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


async def replay(name: str, scenario: Scenario, seconds: float, out: Path) -> Run:
    async with SimulatorServer(scenario) as sim:
        cfg = demo_config(scenario, sim.write_outputs(out).kubeconfig, out)
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(30):
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
            return Run(name, wh.interval, ours, bucketed(segments, wh.interval),
                       free_ours, dict(free_truth), dict(pool_gpus))


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
                              tmp_path_factory.mktemp("week")))


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
