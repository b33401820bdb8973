"""What if, end to end: simulated weeks whose truth is known, measured by the exporter,
turned into a trace and a layout, replayed and measured again; and a pods CSV from outside
the simulator, replayed on a layout in YAML, against a first-come-first-served queue
worked out by hand."""

from __future__ import annotations

import asyncio
import heapq
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pytest
import yaml

from analytics.store import DuckDBStore
from analytics.week import Week
from analytics.whatif import compare, engine, layout, parts, scenario, search, trace
from analytics.whatif.measure import Measured, measure
from exporter.cli import main
from exporter.config import Prices
from exporter.demo import Progress
from exporter.model.prices import load_price_book
from exporter.whatif import replay, replay_all
from simulator.scenario import Scenario, load_scenario

STEP = 600.0
DAYS = 2


def compressed(name: str) -> Scenario:
    """An embedded scenario at 10-minute steps, its week's faults and stockouts in two days
    (a reclaim and a stockout, XIDs, a NotReady node), on the grid of its steps."""
    s = load_scenario(name)
    scale = DAYS / 7

    def at(t: float) -> float:
        return round(t * scale / STEP) * STEP

    return s.model_copy(update={
        "step": STEP,
        "faults": [f.model_copy(update={"at": at(f.at), "duration": max(STEP, at(f.duration))})
                   for f in s.faults],
        "stockouts": [o.model_copy(update={"at": at(o.at), "duration": max(STEP, at(o.duration))})
                      for o in s.stockouts]})


@dataclass
class Replayed:
    scenario: Scenario
    window: Week
    jobs: list[trace.Job]
    layout: layout.Layout
    actual: Measured
    replay: Measured
    comparison: compare.Comparison
    reclaimed: list[Any]
    """The truth's pods a reclaim ended in the window."""


def week_of(scenario: Scenario, out: Path) -> tuple[Week, Path, list[Any]]:
    """The scenario run with the exporter measuring it, as a cluster's week would be; and
    the truth's pods a Spot reclaim ended."""
    window = Week(scenario.start, scenario.start + timedelta(days=DAYS))
    steps = round(DAYS * 86400 / STEP)
    ran = asyncio.run(replay(scenario, window, out, Progress(steps, STEP, "the week")))
    reclaimed = [ran.truth.pods[uid] for i in ran.truth.interruptions for uid in i.pod_uids]
    return window, ran.warehouse, reclaimed


@pytest.fixture(scope="module", params=["default", "kueue"])
def replayed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Replayed:
    s = compressed(request.param)
    out = tmp_path_factory.mktemp(request.param)
    window, path, reclaimed = week_of(s, out / "week")
    store = DuckDBStore(path)
    jobs = trace.of_week(store, window)
    lay = layout.of_week(store, window, None, s.cluster, s.region, STEP)
    actual = measure(store, window)
    store.close()
    built = scenario.build(jobs, layout.with_priorities(lay, jobs), window.start, window.end,
                           STEP)
    [done] = replay_all([("replayed", built)], window, out / "replays")
    return Replayed(s, window, jobs, lay, actual, done.measured,
                    compare.compare(actual, done.measured, done.measured, STEP), reclaimed)


def test_the_layout_of_the_week_is_the_cluster_it_ran_on(replayed: Replayed) -> None:
    truth = {p.name: p for p in replayed.scenario.pools}
    found = {p.name: p for p in replayed.layout.pools}
    assert set(found) == set(truth)
    for name, p in found.items():
        t = truth[name]
        assert (p.accelerator, p.gpus_per_node, p.spot, p.mig_partition_size, p.zone) == \
            (t.accelerator, t.gpus_per_node, t.spot, t.mig_partition_size, t.zone), name
        assert (p.sharing is None) == (t.sharing is None), name
        if t.sharing is not None and p.sharing is not None:
            assert p.sharing.max_shared_clients_per_gpu <= t.sharing.max_shared_clients_per_gpu
        if t.autoscaling is None:
            assert (p.nodes, p.autoscaling) == (t.nodes, None), name
        else:
            assert p.autoscaling is not None, f"{name} autoscales"
            assert 1 <= p.autoscaling.max_nodes <= t.autoscaling.max_nodes, \
                "the most nodes it had: its maximum, or below it"
    kinds = sorted((f.kind, f.at) for f in replayed.layout.incidents
                   if f.kind != "spot_preemption")
    expected = sorted((f.kind, f.at) for f in replayed.scenario.faults
                      if f.at < DAYS * 86400 and (f.kind == "node_not_ready" or (
                          f.kind == "xid" and f.code in (48, 64, 74, 79, 95))))
    assert [k for k, _ in kinds] == [k for k, _ in expected]
    for (_, found_at), (_, at) in zip(kinds, expected, strict=True):
        assert abs(found_at - at) <= STEP
    reclaims = [f for f in replayed.layout.incidents if f.kind == "spot_preemption"]
    assert len(reclaims) == len({p.node for p in replayed.reclaimed}), \
        "a reclaim shows by the pods it ended (an empty node's, by nothing)"
    assert (replayed.layout.kueue is None) == (replayed.scenario.kueue is None)
    if replayed.layout.kueue is not None and replayed.scenario.kueue is not None:
        found_q = {q.name: q for q in replayed.layout.kueue.cluster_queues}
        for q in replayed.scenario.kueue.cluster_queues:
            assert found_q[q.name].cohort == q.cohort
            assert sorted(found_q[q.name].flavors, key=str) == sorted(q.flavors, key=str)
            assert found_q[q.name].preemption in (q.preemption, "Never"), \
                "it preempts where the week saw it requeue a Workload"
        assert set(replayed.layout.kueue.local_queues) == \
            set(replayed.scenario.kueue.local_queues)


def test_the_trace_holds_every_job_of_the_week_and_its_work(replayed: Replayed) -> None:
    jobs = [j for j in replayed.jobs if j.kind == "job"]
    assert len({(j.namespace, j.job) for j in jobs}) == len(jobs)
    held = replayed.actual.headline["allocated_gpu_hours"]
    assert held
    worked = sum(j.pods * j.gpus_per_pod * (j.run_seconds + j.startup_seconds) / 3600
                 for j in jobs if j.run_basis != "estimated")
    always = sum(j.pods * j.gpus_per_pod * DAYS * 24 for j in replayed.jobs
                 if j.kind == "always_on")
    # time-shared GPUs count half per pod, MIG slices a seventh: the trace's GPUs are
    # Kubernetes' units, the headline's physical GPUs
    assert worked + always >= held * 0.99
    assert {j.profile for j in jobs} <= set(trace.PROFILES)
    assert any(j.reclaims for j in jobs) == any(
        f.kind == "spot_preemption" for f in replayed.layout.incidents)


def test_the_week_replayed_on_its_own_layout_is_the_week(replayed: Replayed) -> None:
    f = replayed.comparison.fidelity
    print()
    print(replayed.scenario.cluster)
    print(f.to_string())
    assert len(f) >= 3 + 2 * 4, "cost, GPU-hours and each team's p50 and p90"
    assert f.ok.all(), f[~f.ok].to_string()


AGREEMENT_COST = 0.01
AGREEMENT_CAUSE = 0.02


def agree(a: Measured, b: Measured, cost: float, each_cause: bool) -> pd.DataFrame:
    """``b`` agrees with ``a``: cost and GPU-hours within ``cost``, each team's p50 and
    p90 within a step of the measured week, GPU-hours waited by cause within
    ``AGREEMENT_CAUSE`` of each cause's (``each_cause``) or of all waited, the same Spot
    reclaims. The teams side by side (``b``'s columns suffixed ``_other``)."""
    for key in ("cost_usd", "gpu_hours", "allocated_gpu_hours"):
        x, y = a.headline[key], b.headline[key]
        assert x is not None and y is not None and abs(y - x) <= cost * x, key
    teams = a.teams.merge(b.teams, on="team", how="outer", suffixes=("", "_other"))
    for t in teams.itertuples():
        for q in ("wait_p50_seconds", "wait_p90_seconds"):
            x, y = getattr(t, q), getattr(t, f"{q}_other")
            assert abs(y - x) <= STEP + 1e-6, (t.team, q, x, y)
    causes = a.causes.merge(b.causes, on="cause", how="outer",
                            suffixes=("", "_other")).fillna(0.0)
    total = float(a.causes.gpu_hours.sum())
    for c in causes.itertuples():
        allowed = AGREEMENT_CAUSE * (c.gpu_hours if each_cause else total)
        assert abs(c.gpu_hours_other - c.gpu_hours) <= allowed + 1e-6, c
    assert b.reclaims == a.reclaims
    return teams


@pytest.mark.parametrize("resolution", [STEP, engine.RESOLUTION])
def test_the_engine_replays_the_week_as_the_full_loop_does(replayed: Replayed,
                                                           resolution: float) -> None:
    """The engine (the cluster alone, in event time) against the full replay (the simulator
    over HTTP, the exporter measuring it a cycle a step) on the same trace and layout: cost
    and GPU-hours within 1 %, each team's wait p50 and p90 within a step of the full
    loop's. GPU-hours waited by cause: within 2 % each at the full loop's step; at
    1-second steps, where jobs submitted between two of the loop's steps wait from their
    submission rather than from the next step, within 2 % of all the GPU-hours waited."""
    r = replayed
    built = scenario.build(r.jobs, layout.with_priorities(r.layout, r.jobs), r.window.start,
                           r.window.end, resolution)
    played = engine.play(built.scenario, r.window,
                         engine.Pricing.load(Prices(), r.scenario.region),
                         engine.utilizations(r.jobs))
    assert played.steps < 0.05 * DAYS * 86400, "event time: a step where something changes"
    fast, loop = played.measured, r.replay
    agree(loop, fast, AGREEMENT_COST, each_cause=resolution == STEP)
    assert fast.stranded_gpu_hours == pytest.approx(loop.stranded_gpu_hours, rel=0.02, abs=1.0)


PARTS_COST = 0.005
"""How far the cost and GPU-hours of a cluster played part by part may be from the whole
cluster's: the cluster autoscaler's one node group a loop, which playing parts alone drops
(``analytics.whatif.parts``)."""


def test_the_parts_played_alone_are_the_cluster_played_at_once(replayed: Replayed) -> None:
    """The week on its own layout and on the first setting the search weighs for each pool,
    played part by part (the engine's way) and as one cluster: cost and GPU-hours within
    0.5 %, each team's p50 and p90 within a step of the measured week, GPU-hours waited
    by cause within 2 % of all waited, the same Spot reclaims. Nodes are named in the
    order they are made, so a part alone names its nodes otherwise, and a pod may land on
    another of two equal nodes (the first by name): on one a fault fails it, and its
    replacement waits once more. With Kueue the cluster is one part, and the two are one
    play."""
    r = replayed
    pricing = engine.Pricing.load(Prices(), r.scenario.region)
    utilization = engine.utilizations(r.jobs)
    own = layout.with_priorities(r.layout, r.jobs)
    layouts = [own] + [s.layout for pool in own.pools for s in search.settings(own, pool)[1:2]]
    split = 0
    for on in layouts:
        built = scenario.build(r.jobs, on, r.window.start, r.window.end, engine.RESOLUTION)
        split = max(split, len(parts.split(built.scenario)))
        whole = engine.play(built.scenario, r.window, pricing, utilization, whole=True)
        alone = engine.play(built.scenario, r.window, pricing, utilization)
        whole.store.close()
        alone.store.close()
        teams = agree(whole.measured, alone.measured, PARTS_COST, each_cause=False)
        assert (teams.pods - teams.pods_other).abs().sum() <= 0.01 * teams.pods.sum() + 1, \
            "the same waits, but for a pod or so another node's fault failed"
    assert (split == 1) == (r.scenario.kueue is not None), "Kueue binds the cluster"


def test_a_node_more_costs_its_price_and_shortens_the_queue(
        tmp_path: Path, replayed: Replayed) -> None:
    """One more 8-GPU H100 node (and, with Kueue, 8 more GPUs of research's H100 quota):
    the cost grows by its price for the whole window, to the cent of the price book; pods
    wait fewer GPU-hours, research's no longer."""
    pools = [p.model_copy(update={"nodes": p.nodes + 1}) if p.name == "h100-ondemand" else p
             for p in replayed.layout.pools]
    kueue = replayed.layout.kueue
    if kueue is not None:
        kueue = kueue.model_copy(update={"cluster_queues": [
            q.model_copy(update={"flavors": [
                f.model_copy(update={"nominal_gpus": f.nominal_gpus + 8})
                if f.accelerator == "nvidia-h100-80gb" else f for f in q.flavors]})
            if q.name == "research" else q for q in kueue.cluster_queues]})
    more = replayed.layout.model_copy(update={"pools": pools, "kueue": kueue})
    built = scenario.build(replayed.jobs, layout.with_priorities(more, replayed.jobs),
                           replayed.window.start, replayed.window.end, STEP)
    [done] = replay_all([("proposed", built)], replayed.window, tmp_path)
    c = compare.compare(replayed.actual, replayed.replay, done.measured, STEP)
    pool = c.pools.set_index("node_pool").loc["h100-ondemand"]
    price = load_price_book(None, replayed.scenario.region).prices[
        "nvidia-h100-80gb", "on-demand"]
    node = 8 * price * DAYS * 24
    assert pool.cost_usd_proposed - pool.cost_usd_replay == pytest.approx(node, rel=1e-6)
    if replayed.layout.kueue is None:  # else borrowing moves the Spot pool's cost too
        assert c.summary.set_index("figure").loc["Cost"].delta == pytest.approx(node, rel=1e-6)
    assert c.summary.set_index("figure").loc["GPU-hours waited"].delta < 0
    assert c.teams.set_index("team").loc["research", "wait_p90_seconds_delta"] <= 0


# ----------------------------------------------------------------------------- a pods CSV

GPUS = 12
"""The layout's GPUs: three T4 nodes of four."""


def fifo_waits(pods: list[tuple[float, float]], servers: int) -> list[float]:
    """First come, first served on ``servers`` identical GPUs: each pod (arrival, run)
    starts when it arrives or the earliest GPU frees, whichever is later."""
    free = [0.0] * servers
    heapq.heapify(free)
    waits = []
    for arrival, run in sorted(pods):
        at = max(arrival, heapq.heappop(free))
        waits.append(at - arrival)
        heapq.heappush(free, at + run)
    return waits


WINDOW = 3.5 * 86400


def pods_csv(path: Path, start: datetime, n: int, seed: int) -> list[tuple[float, float]]:
    """``n`` one-GPU pods over three and a half days, recorded as another cluster (16
    GPUs) ran them: arrivals and runs on the 10-minute grid, the runs' mean 50 minutes (a
    thousand pods: 83 % of 12 GPUs)."""
    rng = random.Random(seed)
    pods = []
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(n / WINDOW)
        pods.append((math.floor(t / STEP) * STEP, STEP * rng.randint(1, 9)))
    recorded = fifo_waits(pods, 16)
    rows = []
    for i, ((arrival, run), wait) in enumerate(zip(sorted(pods), recorded, strict=True)):
        created = start + timedelta(seconds=arrival)
        scheduled = created + timedelta(seconds=wait)
        rows.append({"created": created.isoformat(), "scheduled": scheduled.isoformat(),
                     "deleted": (scheduled + timedelta(seconds=run)).isoformat(),
                     "gpus": 1, "gpu_model": "nvidia-tesla-t4",
                     "team": ("vision", "speech", "ads")[i % 3], "pod": f"job-{i:04d}",
                     "utilization": 0.5})
    pd.DataFrame(rows).to_csv(path, index=False)
    return sorted(pods)


def test_a_pods_csv_replays_on_a_layout_in_yaml_as_a_fifo_queue_would(tmp_path: Path,
                                                                        capsys: Any) -> None:
    start = datetime(2026, 3, 2, tzinfo=UTC)
    pods = pods_csv(tmp_path / "pods.csv", start, 1000, seed=11)
    (tmp_path / "layout.yaml").write_text(yaml.safe_dump({
        "cluster": "elsewhere", "region": "us-central1",
        "pools": [{"name": "t4", "accelerator": "nvidia-tesla-t4", "gpus_per_node": 4,
                   "nodes": GPUS // 4, "zone": "us-central1-f"}]}))
    out = tmp_path / "out"
    assert main(["whatif", "--trace", str(tmp_path / "pods.csv"), "--layout",
                 str(tmp_path / "layout.yaml"), "--out", str(out), "--duration", "3d12h",
                 "--step", f"{STEP:g}s"]) == 0
    printed = capsys.readouterr().out
    assert "What if: 2026-W10 on" in printed and "Queue wait p90" in printed
    for name in ("whatif.md", "whatif.html", "whatif.png", "summary.csv", "teams.csv",
                 "trace.csv"):
        assert (out / name).stat().st_size > 0, name
    con = duckdb.connect(str(out / "replays" / "proposed" / "warehouse.duckdb"),
                         read_only=True)
    rows = con.execute(
        "SELECT pod, epoch(scheduled) - epoch(created) FROM gpu_pods "
        "WHERE scheduled IS NOT NULL QUALIFY row_number() OVER "
        "(PARTITION BY pod_uid ORDER BY updated DESC) = 1").fetchall()
    con.close()
    replayed = {pod.rsplit("-", 1)[0]: wait for pod, wait in rows}
    expected = fifo_waits(pods, GPUS)
    window_end = WINDOW
    checked = 0
    for i, ((arrival, _), wait) in enumerate(zip(pods, expected, strict=True)):
        if arrival + wait >= window_end:
            continue  # not scheduled in the window
        assert replayed[f"job-{i:04d}"] == pytest.approx(wait), f"job-{i:04d}"
        checked += 1
    assert checked >= 950 and max(expected) >= 3600, "a real queue, mostly replayed"


def t4_layout(path: Path, gpus: int) -> Path:
    path.write_text(yaml.safe_dump({
        "cluster": "elsewhere", "region": "us-central1",
        "pools": [{"name": "t4", "accelerator": "nvidia-tesla-t4", "gpus_per_node": 4,
                   "nodes": gpus // 4, "zone": "us-central1-f"}]}))
    return path


def test_a_pods_csv_replayed_on_the_layout_it_ran_on_is_faithful_to_its_record(
        tmp_path: Path, capsys: Any) -> None:
    """The file was recorded on 16 GPUs: replayed there, every team's recorded wait p50 and
    p90 and the GPU-hours held come back; the changes to 12 GPUs are measured from it."""
    start = datetime(2026, 3, 2, tzinfo=UTC)
    pods_csv(tmp_path / "pods.csv", start, 1000, seed=5)
    out = tmp_path / "out"
    rc = main(["whatif", "--trace", str(tmp_path / "pods.csv"), "--recorded-layout",
               str(t4_layout(tmp_path / "recorded.yaml", 16)), "--layout",
               str(t4_layout(tmp_path / "small.yaml", GPUS)), "--out", str(out),
               "--duration", "3d12h", "--step", f"{STEP:g}s"])
    printed = capsys.readouterr().out
    fidelity = pd.read_csv(out / "fidelity.csv")
    assert rc == 0 and fidelity.ok.all(), printed
    assert set(fidelity.check) == {"GPU-hours held by pods"} | {
        f"{team} wait {q} (s)" for team in ("vision", "speech", "ads") for q in ("p50", "p90")}
    assert "as recorded  replayed  proposed" in printed
    summary = pd.read_csv(out / "summary.csv").set_index("figure")
    assert summary.loc["GPU-hours waited", "delta"] > 0, "12 GPUs wait more than 16"
    assert pd.isna(summary.loc["Cost", "actual"]), "the file records no cost"


def test_a_replay_that_fails_leaves_what_was_measured_and_a_line(
        tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proposed replay runs out of memory: the record and the replay on the layout the
    file ran on are written all the same, the failure told in one line, no traceback."""
    start = datetime(2026, 3, 2, tzinfo=UTC)
    pods_csv(tmp_path / "pods.csv", start, 100, seed=5)
    real = engine.Engine.play

    def play(self: engine.Engine, s: Scenario, *args: Any) -> engine.Played:
        if s.pools[0].nodes == GPUS // 4:
            raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate "
                                              "block of size 256.0 KiB\nmore detail")
        return real(self, s, *args)

    monkeypatch.setattr(engine.Engine, "play", play)
    out = tmp_path / "out"
    rc = main(["whatif", "--trace", str(tmp_path / "pods.csv"), "--recorded-layout",
               str(t4_layout(tmp_path / "recorded.yaml", 16)), "--layout",
               str(t4_layout(tmp_path / "small.yaml", GPUS)), "--out", str(out),
               "--duration", "1d"])
    captured = capsys.readouterr()
    assert rc == 1
    assert captured.err.splitlines() == [
        "error: proposed: not replayed: OutOfMemoryException: Out of Memory Error: could "
        "not allocate block of size 256.0 KiB"]
    assert "Traceback" not in captured.err + captured.out
    summary = pd.read_csv(out / "summary.csv").set_index("figure")
    wait = "Queue wait p90, pods submitted in the week"
    assert pd.notna(summary.loc[wait, "actual"]) and pd.notna(summary.loc[wait, "replay"])
    assert summary.proposed.isna().all()
    assert (out / "replays" / "replayed" / "warehouse.duckdb").exists()
    assert not (out / "replays" / "proposed").exists()
    assert "proposed: not replayed: OutOfMemoryException" in (out / "whatif.md").read_text()
