"""The exporter against the simulator's dcgm-exporters collecting every 30 s and every
5 minutes, cycling every 5 s and every 30 s: each GPU's energy per interval is steady (no
interval reads 0 W while the counter waits for the next collection), no step of a healthy
counter is called a jump, and a driver reload is logged once, when DCGM collects it; over
the run the energy is the simulator's truth within a collection period's draw."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exporter.demo import catch_up, demo_config
from exporter.runtime.app import open_exporter
from exporter.runtime.energy_counters import ESTIMATED
from simulator.scenario import parse_scenario
from simulator.server import SimulatorServer
from tests.conftest import scenario_data

RUN = 2400.0
STEP = 10.0
"""The simulator's step: the reload falls between two collections of either exporter."""
PHASE = 10.0
"""The exporter's cycles fall 10 s after a collection (they keep their own time)."""
RELOAD = 1270.0
"""The H100 node's driver reloads 21 m 10 s in: 10 s after a collection of the 30-second
exporter, 70 s after one of the 5-minute exporter."""
JOBS = [{"name": "pretrain", "workload": "train", "at": -600, "run": "1d"},
        {"name": "serve", "workload": "shared", "at": -600, "run": "1d"},
        {"name": "sliced", "workload": "slice", "at": -600, "run": "1d"}]
"""Work that runs all along: each GPU draws the same power throughout."""


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Run:
    collect: float
    cycle: float
    start: float = 0.0
    """The cluster's start; the exporter's first cycle is ``PHASE`` after it."""
    intervals: list[tuple[float, dict[tuple[str, str], float]]] = field(default_factory=list)
    """(end of the interval, each GPU's joules over it by (node, UUID))."""
    logged: list[logging.LogRecord] = field(default_factory=list)
    logged_during: int = -1
    """Energy lines logged by the last cycle before DCGM collects the reload."""
    held_during: dict[str, tuple[float, float]] = field(default_factory=dict)
    """That cycle: each H100 GPU's counter as the exporter holds it, and the cluster's."""
    held_after: dict[str, tuple[float, float]] = field(default_factory=dict)
    bases: dict[str, int] = field(default_factory=dict)
    truth: dict[str, float] = field(default_factory=dict)
    """Joules each physical GPU drew from the first cycle to the last."""
    limits: dict[str, float] = field(default_factory=dict)
    """Each GPU's power limit, watts."""
    partitioned: set[str] = field(default_factory=set)
    """The GPUs cut into MIG instances (whose power readings are each instance's own)."""
    h100: str = ""


async def run(collect: float, cycle: float, out: Path) -> Run:
    scenario = parse_scenario(scenario_data(
        step=STEP, dcgm_collect_interval=collect, jobs=JOBS,
        faults=[{"at": RELOAD, "kind": "driver_reload", "node": "h100/0"}]), "test")
    lines = Lines()
    logger = logging.getLogger("exporter.runtime.energy_counters")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    got = Run(collect, cycle)
    try:
        async with SimulatorServer(scenario) as sim:
            c = sim.cluster
            cfg = demo_config(scenario, sim.write_outputs(out).kubeconfig, out)
            cfg = cfg.model_copy(update={"dcgm": cfg.dcgm.model_copy(
                update={"stuck_after": 4 * collect})})
            h100 = next(n for n in c.live_nodes() if n.pool.name == "h100")
            got.h100, got.start = h100.name, c.start
            for n in c.live_nodes():
                for g in n.gpus:
                    got.limits[g.uuid] = n.model.power_limit_watts
                    if n.pool.mig_partition_size is not None:
                        got.partitioned.add(g.uuid)
            shown = c.start + RELOAD + (-RELOAD % collect)  # DCGM collects the reload
            async with open_exporter(cfg) as ex:
                async with asyncio.timeout(30):
                    await ex.kube.wait_synced()
                t = c.start + PHASE
                await catch_up(sim, ex, t)
                before = dict(ex.totals.gpu_joules)
                while t < c.start + RUN:
                    t += cycle
                    await catch_up(sim, ex, t)
                    after = dict(ex.totals.gpu_joules)
                    got.intervals.append((t, {k: v - before.get(k, 0.0)
                                              for k, v in after.items()}))
                    before = after
                    held = {g.uuid: (ex.energy.counters[g.uuid].counter_mj, c.gpu_energy_mj(g))
                            for g in h100.gpus}
                    if c.now >= c.start + RELOAD and t < shown:  # reloaded, not yet collected
                        got.logged_during, got.held_during = len(lines.records), held
                    got.held_after = held
                got.bases = dict(ex.totals.energy_bases)
                c.close()
                truth = c.truth.report(c.start + PHASE, t, utilization=False)
                for (device_id,), joules in truth.joules_by("device_id").items():
                    uuid = device_id.split("/")[0]  # a MIG instance's: its GPU's
                    got.truth[uuid] = got.truth.get(uuid, 0.0) + joules
    finally:
        logger.removeHandler(lines)
    got.logged = lines.records
    return got


@pytest.fixture(scope="module", params=[(30.0, 5.0), (300.0, 5.0), (30.0, 30.0), (300.0, 30.0)],
                ids=lambda p: f"dcgm{p[0]:g}s-cycle{p[1]:g}s")
def energy_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    collect, cycle = request.param
    return asyncio.run(run(collect, cycle, tmp_path_factory.mktemp("energy")))


def test_each_gpus_power_is_steady_between_collections(energy_run: Run) -> None:
    """No interval of any GPU reads 0 W; once its counter has risen twice, every interval
    reads within 10 % of what the GPU really drew on average over the run (the interval in
    which the H100s' counters are seen to restart aside)."""
    r = energy_run
    per_gpu: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for t, joules in r.intervals:
        for key, j in joules.items():
            per_gpu[key].append((t, j / r.cycle))
    assert len(per_gpu) >= 4 + 8 + 1 + 4  # the L4s, H100s, the MIG GPU, the T4s
    warm = r.start + PHASE + 2 * r.collect + r.cycle  # the counters have risen twice
    shown = r.start + RELOAD + (-RELOAD % r.collect)
    reset_at = min(t for t, _ in r.intervals if t >= shown)  # the interval that sees it
    seconds = r.intervals[-1][0] - r.start - PHASE
    for (node, uuid), watts in per_gpu.items():
        assert all(w > 0 for _, w in watts), (node, uuid)
        drew = r.truth[uuid] / seconds
        for t, w in watts:
            if t >= warm and not (node == r.h100 and t == reset_at):
                assert w == pytest.approx(drew, rel=0.1), (node, uuid, t)


def test_no_healthy_step_is_a_jump_and_the_reload_is_logged_once(energy_run: Run) -> None:
    """Until DCGM collects the reload nothing is logged, and the exporter holds the H100s'
    counters from before it; the collection's interval is the reload's one line (8 GPUs)
    and the H100s' only reset intervals; then the counters are read on from their new
    values."""
    r = energy_run
    assert r.logged_during == 0 and len(r.held_during) == 8
    assert all(held > now for held, now in r.held_during.values())  # the page's, not yet reset
    assert [(x.getMessage(), x.ctx["node"], x.ctx["gpus"])  # type: ignore[attr-defined]
            for x in r.logged] == [(ESTIMATED["reset"], r.h100, 8)]
    assert r.bases.get("reset") == 8 and not r.bases.get("power")
    assert all(0 < held <= now for held, now in r.held_after.values())


def test_the_runs_energy_is_the_truths(energy_run: Run) -> None:
    """Per GPU, the exporter's energy over the run is what it drew: within 2 % where the
    power readings are the GPU's own; within the GPU's power limit over two collection
    periods and two cycles (the intervals up to its counter's second rise, which are the
    power integral) where they are a MIG instance's."""
    r = energy_run
    ours: dict[str, float] = defaultdict(float)
    for _, joules in r.intervals:
        for (_, uuid), j in joules.items():
            ours[uuid] += j
    assert ours.keys() == r.truth.keys()
    for uuid, j in ours.items():
        if uuid in r.partitioned:
            assert abs(j - r.truth[uuid]) <= r.limits[uuid] * 2 * (r.collect + r.cycle)
        else:
            assert j == pytest.approx(r.truth[uuid], rel=0.02), uuid
