"""The exporter on a simulated Kueue cluster: the wait users feel (admission, then
scheduling), Kueue's admission waits and queues, against the simulator's truth and against
what Kueue itself exports for the same events."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from analytics.report import WeeklyReport, build
from analytics.store import DuckDBStore
from analytics.week import parse_week
from exporter.demo import demo_config, step_both
from exporter.model.prices import load_price_book
from exporter.model.totals import Totals
from exporter.runtime.app import open_exporter
from simulator.scenario import Scenario, parse_scenario
from simulator.server import SimulatorServer
from simulator.truth import GroundTruth, PodRecord, WorkloadRecord
from tests.conftest import scenario_data
from tests.timing import limit

STEP = 60.0
HOURS = 16


def kueue_cluster() -> Scenario:
    """team-a's training Jobs queued by Kueue in ClusterQueue research (8 H100s, lower
    priorities preempted), team-b's fine-tuning in batch (no quota of its own: it borrows
    research's unused GPUs, 4 at most); team-b's other work plain pods, as today."""
    data = scenario_data(step=STEP, kueue={
        "cluster_queues": [
            {"name": "research", "cohort": "gpus", "preemption": "LowerPriority",
             "flavors": [{"accelerator": "nvidia-h100-80gb", "nominal_gpus": 8}]},
            {"name": "batch", "cohort": "gpus",
             "flavors": [{"accelerator": "nvidia-h100-80gb", "nominal_gpus": 0,
                          "borrowing_limit_gpus": 4}]}],
        "local_queues": [
            {"name": "research", "namespace": "team-a", "cluster_queue": "research"},
            {"name": "batch", "namespace": "team-b", "cluster_queue": "batch"}]})
    rates = {"train": 12, "urgent": 4, "half": 16, "shared": 30, "slice": 40, "spotjob": 12}
    for w in data["workloads"]:
        w["arrivals_per_day"] = rates[w["name"]]
        w["duration"] = ["20m", "2h"]
        if w["name"] in ("train", "urgent"):
            w["namespace"], w["queue"] = "team-a", "research"
        if w["name"] == "half":
            w["queue"] = "batch"
    return parse_scenario(data, "kueue-e2e")


Series = dict[tuple[tuple[str, str], ...], float]


def parse_exposition(text: bytes) -> dict[str, dict[str, Series]]:
    """Family -> "value", "count" or "sum" -> labels -> value."""
    out: dict[str, dict[str, Series]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            part = "count" if s.name.endswith("_count") else "sum" \
                if s.name.endswith("_sum") else "bucket" if s.name.endswith("_bucket") \
                else "value"
            labels = tuple(sorted(s.labels.items()))
            out.setdefault(fam.name, {}).setdefault(part, {})[labels] = s.value
    return out


@dataclass
class Run:
    totals: Totals
    truth: GroundTruth
    pods: dict[str, dict[str, Any]]
    exposition: dict[str, dict[str, Series]]
    kueue: dict[str, Any]
    report: WeeklyReport
    workloads: dict[str, dict[str, Any]]
    """Each Workload's latest ``kueue_workloads`` row."""


async def run(out: Path) -> Run:
    scenario = kueue_cluster()
    async with SimulatorServer(scenario) as sim:
        cfg = demo_config(scenario, sim.write_outputs(out).kubeconfig, out)
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(limit(30)):
                await exporter.kube.wait_synced()
            assert exporter.kube.kueue is True
            await exporter.cycle(sim.cluster.now)
            await step_both(sim, exporter, round(HOURS * 3600 / STEP))
            sim.cluster.close()
            truth = sim.cluster.truth.report(sim.cluster.start, sim.cluster.now)
            wh = exporter.warehouse
            assert wh is not None
            wh.flush(sim.cluster.now, partial=True)
            cols = ["pod_uid", "queue_wait_seconds", "admission_wait_seconds", "cluster_queue",
                    "team", "queued", "created", "gpus"]
            pods = {r[0]: dict(zip(cols, r, strict=True)) for r in wh.con.execute(
                f"SELECT {', '.join(cols)} FROM gpu_pods_current").fetchall()}
            wl_cols = ["workload_uid", "state", "queued", "admitted", "gpus",
                       "cluster_queue", "team"]
            workloads = {r[0]: dict(zip(wl_cols, r, strict=True)) for r in wh.con.execute(
                "SELECT workload_uid, state, epoch(queued), epoch(admitted), gpus, "
                "cluster_queue, team FROM kueue_workloads QUALIFY row_number() OVER "
                "(PARTITION BY workload_uid ORDER BY updated DESC) = 1").fetchall()}
            assert sim.cluster.kueue is not None
            kueue = {f.name: f for f in text_string_to_metric_families(
                sim.cluster.kueue.exposition())}
            exposition = parse_exposition(exporter.metrics.text)
            report = build(DuckDBStore(con=wh.con), parse_week("2026-W47"),
                           load_price_book(None, scenario.region).prices, cfg.sla.target,
                           cfg.cluster)
            return Run(exporter.totals, truth, pods, exposition, kueue, report, workloads)


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return asyncio.run(run(tmp_path_factory.mktemp("kueue-e2e")))


def test_each_pods_wait_is_admission_then_scheduling(day: Run) -> None:
    """Per pod: from its Workload's creation (the Job's submission) to scheduling, within
    one interval of the truth; a pod Kueue did not queue waits from its own creation."""
    queued = plain = 0
    for uid, rec in day.truth.pods.items():
        if rec.scheduled_at is None or uid not in day.pods:
            continue
        ours = day.pods[uid]
        assert ours["queue_wait_seconds"] == pytest.approx(day.truth.total_wait(uid), abs=STEP)
        if rec.workload_uid is not None:
            queued += 1
            assert ours["cluster_queue"] in ("research", "batch")
        else:
            plain += 1
            assert ours["admission_wait_seconds"] is None
    waited = [w for w in day.truth.workloads.values()
              if w.admissions and w.admissions[0][1] - w.created_at >= 3600]
    assert queued > 10 and plain > 50 and waited, "Kueue queued Jobs, some for an hour or more"


def test_admission_waits_equal_the_truth_and_kueues_own_histogram(day: Run) -> None:
    truth = sorted(at - since for w in day.truth.workloads.values()
                   for since, at in w.admissions)
    hist = day.exposition["gke_gpu_kueue_admission_wait_seconds"]
    count = sum(v for labels, v in hist["count"].items())
    total = sum(v for labels, v in hist["sum"].items())
    assert count == len(truth) > 10
    assert total == pytest.approx(sum(truth), abs=STEP * len(truth))
    # Kueue's kueue_admission_wait_time_seconds, per ClusterQueue
    theirs: dict[str, tuple[float, float]] = {}
    for s in day.kueue["kueue_admission_wait_time_seconds"].samples:
        cq = s.labels["cluster_queue"]
        n, secs = theirs.get(cq, (0.0, 0.0))
        if s.name.endswith("_count"):
            n += s.value
        elif s.name.endswith("_sum"):
            secs += s.value
        theirs[cq] = (n, secs)
    ours: dict[str, tuple[float, float]] = {}
    for labels, n in hist["count"].items():
        cq = dict(labels)["cluster_queue"]
        c, secs = ours.get(cq, (0.0, 0.0))
        ours[cq] = (c + n, secs + hist["sum"][labels])
    assert set(ours) == set(theirs) == {"research", "batch"}
    for cq, (n, secs) in theirs.items():
        assert ours[cq][0] == n, cq
        assert ours[cq][1] == pytest.approx(secs, abs=STEP * n), cq
    evicted = [w for w in day.truth.workloads.values() if w.evictions]
    assert evicted, "a high-priority Job preempted a lower one"


def test_pending_workloads_and_quota_agree_with_kueue(day: Run) -> None:
    theirs: dict[str, float] = {}
    for s in day.kueue["kueue_pending_workloads"].samples:
        theirs[s.labels["cluster_queue"]] = theirs.get(s.labels["cluster_queue"], 0) + s.value
    ours: dict[str, float] = {}
    for labels, v in day.exposition["gke_gpu_kueue_pending_workloads"]["value"].items():
        cq = dict(labels)["cluster_queue"]
        ours[cq] = ours.get(cq, 0) + v
    assert {k: v for k, v in theirs.items() if v} == {k: v for k, v in ours.items() if v}
    quota = {dict(k)["cluster_queue"]: v
             for k, v in day.exposition["gke_gpu_kueue_quota_gpus"]["value"].items()}
    assert quota == {"research": 8.0, "batch": 0.0}
    used = {dict(k)["cluster_queue"]: v
            for k, v in day.exposition["gke_gpu_kueue_used_gpus"]["value"].items()}
    kueue_used = {s.labels["cluster_queue"]: s.value
                  for s in day.kueue["kueue_cluster_queue_resource_usage"].samples}
    assert used == kueue_used


def test_the_reports_waits_per_team_equal_the_truth(day: Run) -> None:
    """The weekly report's queue table: p50/p90 per team of the waits begun in the week (to
    the first run, admission + scheduling; one still waiting, to the data's end), within
    one interval of the truth's."""
    table = day.report.frame("queue").set_index(["team", "gpu_model"])
    teams = {"team-a": "alpha", "team-b": "team-b"}
    start = day.report.week.start.timestamp()
    end = min(day.report.week.end.timestamp(), day.truth.end)  # the data's end
    checked = 0
    for (team, model), row in table.iterrows():
        waits = []
        for uid, rec in day.truth.pods.items():
            since = submitted(day.truth, rec)
            if uid in day.pods and since >= start and teams[rec.namespace] == team and \
                    rec.accelerator == model:
                until = rec.scheduled_at if rec.scheduled_at is not None else \
                    rec.finished_at if rec.finished_at is not None else end
                waits.append(max(0.0, min(until, end) - since))
        if model == "nvidia-h100-80gb":  # every ClusterQueue's flavor: Jobs with no pod yet
            waits += [end - began for w in day.truth.workloads.values()
                      if (began := awaiting_since(w)) is not None and began >= start
                      and teams[w.namespace] == team]
        if not waits:
            continue
        p50, p90 = np.percentile(waits, [50, 90])
        assert row.p50_seconds == pytest.approx(p50, abs=STEP), (team, model)
        assert row.p90_seconds == pytest.approx(p90, abs=STEP), (team, model)
        checked += 1
    assert checked >= 3
    kueue = day.report.frame("kueue").set_index("cluster_queue")
    assert kueue.nominal_gpus.to_dict() == {"research": 8.0, "batch": 0.0}
    held = kueue.loc["research"]
    assert held.quota_share == pytest.approx(held.mean_gpus / 8)
    assert kueue.workloads.sum() >= 10 and (kueue.admission_p90_seconds > 0).all()


def submitted(truth: GroundTruth, rec: PodRecord) -> float:
    """When a pod's wait began: its Kueue Workload's creation, else its own."""
    wl = truth.workloads.get(rec.workload_uid or "")
    return wl.created_at if wl is not None else rec.created_at


def awaiting_since(w: WorkloadRecord) -> float | None:
    """When the wait of a Workload not admitted at the end began (creation, or its first
    requeue, as Kueue's ``Requeued`` condition keeps it); None if it is admitted."""
    if not w.admissions:
        return w.created_at
    if w.evictions and w.evictions[-1] > w.admissions[-1][1]:
        return w.evictions[0]
    return None


def test_each_workloads_last_state_is_the_truths(day: Run) -> None:
    """Every Workload Kueue made has a row: waiting for admission (since its creation or
    requeue) or admitted when the simulator admitted it, within one interval."""
    waiting = 0
    assert set(day.workloads) == set(day.truth.workloads)
    for uid, w in day.truth.workloads.items():
        ours = day.workloads[uid]
        assert (ours["gpus"], ours["cluster_queue"]) == (w.gpus, w.cluster_queue), uid
        since = awaiting_since(w)
        if since is not None:
            assert (ours["state"], ours["admitted"]) == ("Pending", None), uid
            assert ours["queued"] == pytest.approx(since, abs=STEP), uid
            waiting += 1
        else:
            assert ours["state"] in ("Admitted", "Finished"), uid
            assert ours["admitted"] == pytest.approx(w.admissions[-1][1], abs=STEP), uid
    assert waiting, "some Jobs still wait for admission at the end"


def test_the_reports_pending_gpu_hours_count_jobs_not_admitted_yet(day: Run) -> None:
    """Per team, the GPU-hours pending in the week: the pods' (from the Job's submission
    for a Job Kueue queued) and those of the Jobs that have no pod yet, waiting for
    admission with all their GPUs until the data's end, as the simulator's truth has it."""
    teams = {"team-a": "alpha", "team-b": "team-b"}
    start = day.report.week.start.timestamp()
    end = min(day.report.week.end.timestamp(), day.truth.end)  # the data's end
    want: dict[str, float] = {}
    gpus: dict[str, float] = {}
    for uid, rec in day.truth.pods.items():
        if uid not in day.pods:
            continue
        wl = day.truth.workloads.get(rec.workload_uid or "")
        since = wl.created_at if wl is not None else rec.created_at
        until = rec.scheduled_at if rec.scheduled_at is not None else \
            rec.finished_at if rec.finished_at is not None else end
        team, n = teams[rec.namespace], day.pods[uid]["gpus"]  # what the pod asked for
        want[team] = want.get(team, 0.0) + max(0.0, min(until, end) - max(since, start)) * n
        gpus[team] = gpus.get(team, 0.0) + n
    awaiting = 0.0
    for w in day.truth.workloads.values():
        began = awaiting_since(w)
        if began is not None:
            team = teams[w.namespace]
            want[team] = want.get(team, 0.0) + (end - max(began, start)) * w.gpus
            gpus[team] = gpus.get(team, 0.0) + w.gpus
            awaiting += (end - max(began, start)) * w.gpus
    got = day.report.frame("queue").groupby("team").pending_gpu_hours.sum()
    assert awaiting > 0
    for team, seconds in want.items():
        assert got[team] == pytest.approx(seconds / 3600, abs=gpus[team] * STEP / 3600), team
    longest = day.report.frame("longest_waits")
    assert "awaiting admission" in set(longest.state)
    # and per ClusterQueue, the Jobs still waiting for its admission at the end
    queues = day.report.frame("kueue").set_index("cluster_queue")
    for cq in queues.index:
        waiting = [w for w in day.truth.workloads.values()
                   if w.cluster_queue == cq and awaiting_since(w) is not None]
        assert queues.awaiting_workloads[cq] == len(waiting), cq
        assert queues.awaiting_gpus[cq] == sum(w.gpus for w in waiting), cq


async def demo_day(out: Path) -> tuple[dict[str, tuple[float, float]], dict[str, list[float]]]:
    """A day of the embedded ``kueue`` scenario, as ``demo --scenario kueue`` runs it: the
    per-team wait p50/p90 it prints, and the truth's waits per team: of each pod submitted
    in the day (a pod of a Job Kueue queued: from the Job's submission), to its scheduling
    or the day's end, and of each Job Kueue never admitted, once."""
    from analytics.week import week_containing
    from exporter.summary import _queue_percentiles
    from simulator.scenario import load_scenario

    scenario = load_scenario("kueue").model_copy(update={"step": 300.0})
    async with SimulatorServer(scenario) as sim:
        cfg = demo_config(scenario, sim.write_outputs(out).kubeconfig, out)
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(limit(30)):
                await exporter.kube.wait_synced()
            await exporter.cycle(sim.cluster.now)
            await step_both(sim, exporter, round(86400 / scenario.step))
            printed = _queue_percentiles(exporter, week_containing(scenario.start))
            truth = sim.cluster.truth.report(sim.cluster.start, sim.cluster.now)
    waits: dict[str, list[float]] = {}
    with_pods = set()
    for uid, rec in truth.pods.items():
        wl = truth.workloads.get(rec.workload_uid or "")
        with_pods.add(rec.workload_uid)
        if (wl.created_at if wl is not None else rec.created_at) >= truth.start and \
                rec.phase != "Deleted":
            waits.setdefault(rec.team or rec.namespace, []).append(truth.total_wait(uid) or 0.0)
    for uid, wl in truth.workloads.items():
        if uid not in with_pods and not wl.admissions:
            waits.setdefault(wl.team or wl.namespace, []).append(truth.end - wl.created_at)
    return printed, waits


def test_the_kueue_demos_waits_per_team_equal_the_truth(tmp_path: Path) -> None:
    """The demo's wait p50/p90 per team (admission + scheduling), within one interval of
    the simulator's; research and ranking queue through Kueue, the others do not."""
    printed, truth = asyncio.run(demo_day(tmp_path))
    assert set(printed) == set(truth) >= {"research", "ranking", "perception", "serving"}
    for team, waits in truth.items():
        p50, p90 = np.percentile(waits, [50, 90])
        assert printed[team][0] == pytest.approx(p50, abs=300), team
        assert printed[team][1] == pytest.approx(p90, abs=300), team
    assert max(printed["research"][1], printed["ranking"][1]) > 3600, "Kueue held Jobs back"
