"""The exporter against the simulator over a simulated day with faults: its figures equal
the simulator's ground truth."""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from analytics.figures.headline import Pricing
from analytics.report import WeeklyReport, build
from analytics.store import DuckDBStore
from analytics.week import parse_week
from exporter.demo import demo_config, step_both
from exporter.model.catalog import GPU_MODELS
from exporter.model.prices import PriceBook, load_price_book
from exporter.model.totals import Totals
from exporter.runtime.app import open_exporter
from simulator.scenario import Scenario, parse_scenario
from simulator.server import SimulatorServer
from simulator.truth import GroundTruth
from tests.conftest import scenario_data
from tests.test_pending_end_to_end import split_as_cost
from tests.timing import limit

STEP = 60.0
DAY = 86400.0


def day_scenario() -> Scenario:
    data = scenario_data(step=STEP, faults=[
        {"at": "3h", "kind": "xid", "node": "h100/0", "gpu": 2, "code": 79, "duration": "2h"},
        {"at": "9h", "kind": "xid", "node": "l4/0", "gpu": 1, "code": 48, "duration": "1h"},
        {"at": "14h", "kind": "node_not_ready", "node": "mig/0", "duration": "40m"},
        {"at": "18h", "kind": "spot_preemption", "pool": "t4-spot"},
        {"at": "6h10m", "kind": "driver_reload", "node": "h100/0"},
    ])
    rates = {"train": 2, "urgent": 1, "half": 6, "shared": 30, "slice": 40, "spotjob": 12}
    for w in data["workloads"]:
        w["arrivals_per_day"] = rates[w["name"]]
        w["duration"] = ["30m", "5h"]
        w["profiles"] = {"healthy": 1, "idle": 1, "input_bound": 1, "small_batch": 1}
    data["workloads"].append({"name": "web", "kind": "serving", "namespace": "team-b",
                              "accelerator": "nvidia-l4", "sharing": "time-sharing",
                              "replicas": 3, "profiles": {"memory_bound": 1}})
    # cost centres: team-a's by its namespace, but "slice" by its pods' label; "urgent"
    # by its pods' annotation; the rest of team-b none
    data["namespaces"][0]["labels"] = {"cost-center": "cc-100"}
    for w in data["workloads"]:
        if w["name"] == "slice":
            w["labels"] = {"cost-center": "cc-200"}
        if w["name"] == "urgent":
            w["annotations"] = {"billing.example.com/cost-center": "cc-300"}
    return parse_scenario(data, "e2e")


COST_CENTRES = {("team-a", "slice"): "cc-200", ("team-b", "urgent"): "cc-300",
                ("team-a", None): "cc-100"}
"""The scenario's cost centre of each namespace's workloads (None: the others)."""


@dataclass
class Day:
    totals: Totals
    truth: GroundTruth
    pods: dict[str, dict[str, Any]]
    events: list[tuple[Any, ...]]
    prices: dict[tuple[str, str], float]
    bottlenecks: dict[str, str]
    """Each pod's last live bottleneck class."""
    report: WeeklyReport
    """The weekly report over the day's week, from the warehouse."""
    book: PriceBook
    energy_truth: dict[str, float]
    """Joules by team (``(unallocated)``, ``(unavailable)``), split as the product splits."""
    counter_resets: list[str]
    """Why each energy counter restarted (``driver_reload``, ``node_restart``)."""


async def run_day(out: Path) -> Day:
    scenario = day_scenario()
    async with SimulatorServer(scenario) as sim:
        outputs = sim.write_outputs(out)
        cfg = demo_config(scenario, outputs.kubeconfig, out)
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(limit(30)):
                await exporter.kube.wait_synced()
            await exporter.cycle(sim.cluster.now)
            bottlenecks: dict[str, str] = {}
            for _ in range(round(DAY / STEP)):
                await step_both(sim, exporter, 1)
                bottlenecks |= {uid: d.bottleneck for uid, (_, d) in exporter.diagnoses.items()}
            sim.cluster.close()
            truth = sim.cluster.truth.report(sim.cluster.start, sim.cluster.now)
            wh = exporter.warehouse
            assert wh is not None
            wh.flush(sim.cluster.now, partial=True)
            cols = ["pod_uid", "queue_wait_seconds", "scheduled", "team"]
            pods = {r[0]: dict(zip(cols, r, strict=True)) for r in wh.con.execute(
                f"SELECT {', '.join(cols)} FROM gpu_pods_current").fetchall()}
            events = wh.con.execute("SELECT gpu_uuid, reason, seconds FROM "
                                    "availability_events").fetchall()
            book = load_price_book(None, scenario.region)
            report = build(DuckDBStore(con=wh.con), parse_week("2026-W47"),
                           Pricing.of(book, cfg.prices), cfg.sla.target, cfg.cluster,
                           allocation=cfg.allocation.title)
            energy: dict[str, float] = defaultdict(float)
            for (team, _), j in split_as_cost(sim.cluster.truth.segments, truth.start,
                                              truth.end).items():
                energy[team] += j
            return Day(exporter.totals, truth, pods, events, book.prices, bottlenecks, report,
                       book, dict(energy), [r.why for r in truth.counter_resets])


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Day:
    return asyncio.run(run_day(tmp_path_factory.mktemp("e2e")))


def truth_cost_by_team(day: Day) -> dict[str, float]:
    """What each team's pods really cost: true GPU-seconds at list price."""
    truth_cost: dict[str, float] = {}
    for (team, ns, accel, prov), secs in day.truth.seconds_by(
            "team", "namespace", "accelerator", "provisioning", state="allocated").items():
        name = team or ns
        truth_cost[name] = truth_cost.get(name, 0.0) + secs / 3600 * day.prices[(accel, prov)]
    return truth_cost


def test_cost_per_team_equals_ground_truth_to_the_cent(day: Day) -> None:
    truth_cost = truth_cost_by_team(day)
    ours: dict[str, float] = {}
    for key, cost in day.totals.cost_usd.items():
        if key[0] == "allocated":
            ours[key[2]] = ours.get(key[2], 0.0) + cost
    assert set(ours) == set(truth_cost) == {"alpha", "team-b"}
    for team, cost in truth_cost.items():
        assert ours[team] == pytest.approx(cost, abs=0.01), team
    assert sum(truth_cost.values()) > 100  # a real day of spend, not a trivial one


def truth_cost_by_cost_centre(day: Day) -> dict[str, float]:
    """What each cost centre's pods really cost (``(none)``: pods without one)."""
    truth_cost: dict[str, float] = {}
    for (ns, job, accel, prov), secs in day.truth.seconds_by(
            "namespace", "workload", "accelerator", "provisioning", state="allocated").items():
        workload = job.rsplit("-", 1)[0]   # the scenario's workload: its job's name less a suffix
        centre = COST_CENTRES.get((ns, workload)) or COST_CENTRES.get((ns, None)) or "(none)"
        truth_cost[centre] = truth_cost.get(centre, 0.0) + secs / 3600 * day.prices[(accel, prov)]
    return truth_cost


def test_cost_per_cost_centre_equals_ground_truth_to_the_cent(day: Day) -> None:
    """The allocation dimension (label, else annotation, else the namespace's label), in
    ``/metrics``' totals and in the weekly report."""
    truth_cost = truth_cost_by_cost_centre(day)
    assert set(truth_cost) == {"cc-100", "cc-200", "cc-300", "(none)"}
    ours = {a or "(none)": usd for a, usd in day.totals.allocation_cost.items()}
    assert ours == pytest.approx(truth_cost, abs=0.01)
    table = day.report.tables["cost_by_allocation"].set_index("allocation")
    for centre, cost in truth_cost.items():
        assert table.loc[centre, "cost_usd"] == pytest.approx(cost, abs=0.01), centre
    assert table.cost_usd.sum() == pytest.approx(day.report.headline["cost_usd"], abs=0.01)
    assert day.report.section_title("cost_by_allocation") == "Cost by cost centre"


def test_gpu_seconds_by_state_equal_ground_truth(day: Day) -> None:
    truth = day.truth.seconds_by("state", "pool")
    ours: dict[tuple[str, str], float] = {}
    for key, secs in day.totals.gpu_seconds.items():
        ours[(key[0], key[3])] = ours.get((key[0], key[3]), 0.0) + secs
    assert ours.keys() == truth.keys()
    for key, secs in truth.items():
        assert ours[key] == pytest.approx(secs, abs=1e-6), key


def test_utilisation_per_pod_within_one_hundredth(day: Day) -> None:
    checked = 0
    for uid, util in day.truth.pod_utilization.items():
        secs = day.totals.pod_seconds.get(uid)
        assert secs, f"pod {uid} has GPU time in the truth but not in the exporter"
        assert day.totals.pod_utilized[uid] / secs == pytest.approx(util, abs=0.01)
        checked += 1
    assert checked > 50


def test_queue_wait_per_pod_within_one_interval(day: Day) -> None:
    checked = 0
    for uid, rec in day.truth.pods.items():
        if rec.scheduled_at is None or uid not in day.pods:
            continue
        ours = day.pods[uid]["queue_wait_seconds"]
        assert ours == pytest.approx(rec.scheduled_at - rec.created_at, abs=STEP)
        checked += 1
    waited = [r for r in day.truth.pods.values()
              if r.scheduled_at is not None and r.scheduled_at > r.created_at]
    assert checked > 50 and waited, "the day had queueing"


def test_downtime_per_gpu_within_one_interval_per_incident(day: Day) -> None:
    truth: dict[tuple[str, str], float] = {}
    for inc in day.truth.incidents:
        assert inc.end is not None
        truth[(inc.gpu_uuid, inc.reason)] = truth.get((inc.gpu_uuid, inc.reason), 0.0) + \
            inc.end - inc.start
    assert {r for _, r in truth} == {"gpu_missing", "xid", "node_not_ready"}
    for (uuid, reason), secs in truth.items():
        assert day.totals.down_seconds.get((uuid, reason), 0.0) == \
            pytest.approx(secs, abs=STEP), (uuid, reason)
    assert {(u, r) for u, r, _ in day.events} == set(truth)
    assert dict(day.totals.interruptions) == {i.pool: 1 for i in day.truth.interruptions}


def test_weekly_report_has_one_incident_per_event(day: Day) -> None:
    """A NotReady node is one incident of all its GPUs, not a row per GPU."""
    table = day.report.frame("incidents")
    down = table[table.kind == "node_not_ready"]
    truth: dict[tuple[str, float], int] = {}
    for inc in day.truth.incidents:
        if inc.reason == "node_not_ready":
            truth[(inc.node, inc.start)] = truth.get((inc.node, inc.start), 0) + 1
    assert len(down) == len(truth) > 0 and sorted(down.gpus) == sorted(truth.values())
    assert down["where"].is_unique


def precision_recall_ok(pairs: list[tuple[str, str]]) -> None:
    for cls in {p for p, _ in pairs}:
        predicted = [t for t, got in pairs if got == cls]
        actual = [got for t, got in pairs if t == cls]
        precision = sum(1 for t in predicted if t == cls) / len(predicted)
        recall = sum(1 for got in actual if got == cls) / len(actual)
        assert precision >= 0.9 and recall >= 0.9, (cls, precision, recall)


def test_weekly_report_cost_per_team_equals_ground_truth_to_the_cent(day: Day) -> None:
    truth_cost = truth_cost_by_team(day)
    table = day.report.tables["cost_by_team"].set_index("team")
    assert set(table.index) - {"(unallocated)", "(unavailable)"} == set(truth_cost)
    assert table.cost_usd.sum() == pytest.approx(day.report.headline["cost_usd"], abs=0.01)
    for team, cost in truth_cost.items():
        assert table.loc[team, "cost_usd"] == pytest.approx(cost, abs=0.01), team
    assert day.report.headline["cost_usd"] == pytest.approx(
        sum(day.totals.cost_usd.values()), abs=0.01)


def test_weekly_report_states_its_price_basis(day: Day) -> None:
    """The costs are the book's list prices (none configured off them); the machines the
    GPUs ran in, from the true GPU-hours and the book's machine types; the spot share."""
    basis = day.report.basis
    assert basis is not None
    assert basis.discounts == () and basis.off_list_usd == 0.0 and basis.unpriced_gpu_hours == 0
    assert basis.list_cost_usd == pytest.approx(day.report.headline["cost_usd"], abs=0.01)
    assert basis.as_of == tuple(sorted({day.book.provenance[k].as_of for k in day.book.prices
                                        if k in day.truth.seconds_by("accelerator",
                                                                     "provisioning")}))
    shares: dict[tuple[str, str], list[float]] = {}
    for (_, prov), m in day.book.machines.items():
        shares.setdefault((m.accelerator, prov), []).append(m.per_gpu)
    hours = {k: s / 3600 for k, s in day.truth.seconds_by("accelerator", "provisioning").items()}
    assert basis.machine_unknown == tuple(sorted({a for a, p in hours if (a, p) not in shares}))
    assert basis.machine_unknown == ("nvidia-tesla-t4",)   # N1: any number of GPUs a machine
    assert basis.machine_usd is not None
    low, high = basis.machine_usd
    assert low == pytest.approx(sum(h * min(shares[k]) for k, h in hours.items()
                                    if k in shares), rel=0.02)
    assert high == pytest.approx(sum(h * max(shares[k]) for k, h in hours.items()
                                     if k in shares), rel=0.02)
    spot = day.report.frame("cost_by_provisioning").set_index("provisioning")
    assert basis.spot_cost_share == pytest.approx(spot.cost_usd["spot"] / spot.cost_usd.sum())
    assert basis.spot_hour_share == pytest.approx(
        hours["nvidia-tesla-t4", "spot"] / sum(hours.values()), rel=0.02)


def test_weekly_report_bottlenecks_match_the_workload_profiles(day: Day) -> None:
    """The report's class per pod over the week, from the warehouse's aggregates."""
    got = dict(zip(day.report.pods.pod_uid, day.report.pods.bottleneck, strict=True))
    pairs = [(rec.profile, got[uid]) for uid, rec in day.truth.pods.items()
             if uid in got and not rec.workload.startswith(("shared", "web"))]
    assert len(pairs) > 50
    precision_recall_ok(pairs)


def test_bottleneck_classes_match_the_workload_profiles(day: Day) -> None:
    """Per class, precision and recall >= 0.9 against the simulator's labelled profiles.

    Pods on time-shared GPUs are left out: DCGM sees the GPU, not the pods sharing it, so
    an idle notebook next to a busy one looks busy; their class describes the shared GPU.
    """
    pairs = [(rec.profile, day.bottlenecks[uid]) for uid, rec in day.truth.pods.items()
             if uid in day.bottlenecks and not rec.workload.startswith(("shared", "web"))]
    assert len(pairs) > 50
    precision_recall_ok(pairs)


def test_xid_events_are_counted_once_each(day: Day) -> None:
    """XID 79 (fell off the bus: the GPU vanishes, so DCGM never reports the code) is seen
    as gpu_missing; XID 48 is reported, and counted once though it stays for an hour."""
    counted = {key: n for key, n in day.totals.xid_events.items() if n}
    assert list(counted.values()) == [1]
    assert "-l4-" in next(iter(counted))[0]   # the XID 48 was on the L4 node
    assert len(day.totals.xid_events) > 10   # every GPU has its counter, at 0


def test_the_report_opens_with_what_to_do_and_no_lever_contradicts_its_tables(day: Day) -> None:
    """The first section is the actions, matched in time: a pool's scale-down is the cost of
    its free GPUs no waiting pod could use (the stranded table's removable cost), and each
    lever answers a cause the waits table shows for its place."""
    from analytics import render
    from analytics.figures.actions import LEVERS, LONG_WAIT_SECONDS

    sections = re.findall(r"^## (.+)$", render.markdown(day.report), re.M)
    assert sections[0] == "What to do this week"
    actions, waits = day.report.frame("actions"), day.report.frame("waits")
    stranded = day.report.frame("stranded").set_index("node_pool")
    assert not waits.empty, "the simulated day records why pods waited"
    for a in actions[actions.action == "scale this pool down"].itertuples():
        assert a.weekly_saving_usd == pytest.approx(
            stranded.loc[a.where.split(" ")[0], "removable_cost_usd"])
    for a in actions[actions.answers.isin(list(LEVERS))].itertuples():
        assert (waits[waits.cause == a.answers].p90_seconds > LONG_WAIT_SECONDS).any()
    assert not actions.why.str.contains("do not remove|no [a-z0-9-]+ queue").any()


def test_energy_per_team_is_the_truths_within_one_interval_per_counter_reset(day: Day) -> None:
    """A driver reload restarts the H100 node's eight counters mid-day: that interval's
    energy is the power integral, within one interval's draw of each GPU; every other
    interval is its counter's. (The MIG node that comes back from NotReady restarts its
    counter too, unseen: no interval spans its outage.)"""
    assert sorted(day.counter_resets) == ["driver_reload"] * 8 + ["node_restart"]
    assert day.totals.energy_bases["reset"] == 8
    ours: dict[str, float] = defaultdict(float)
    for key, j in day.totals.energy_joules.items():
        ours[key.team if key.state == "allocated" else f"({key.state})"] += j
    slack = 8 * GPU_MODELS["nvidia-h100-80gb"].power_limit_watts * STEP
    for team, j in day.energy_truth.items():
        if team == "(unavailable)":
            continue  # a GPU off the bus draws, but no page shows it
        assert abs(ours[team] - j) <= slack + 1e-9 * j, (team, ours[team], j)
    assert day.energy_truth["alpha"] > 3.6e6  # a real day's energy
