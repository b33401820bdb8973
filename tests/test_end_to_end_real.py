"""The exporter against the simulator in the cases real clusters bring: outages from before
the exporter starts, a restart in the middle of one, a Service in front of several nodes'
dcgm-exporters, dcgm-exporters that print their own pod's name as ``Hostname``, both MIG
layouts, and pods deleted while they run. Its figures equal the simulator's ground truth
over the time the exporter could know them.

The exporter counts an interval from the state it saw at the interval's start, and it knows
a node's GPUs only where the node is NotReady or its dcgm-exporter's answer covered it: the
truth compared is the truth over those intervals and nodes, taken from the simulator
(which node answered each request to the Service), never from the exporter.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exporter.config import Config
from exporter.demo import caught_up, demo_config, step_both
from exporter.model.prices import load_price_book
from exporter.model.totals import Totals
from exporter.runtime.app import open_exporter
from exporter.runtime.service import Exporter
from simulator.cluster import Pod
from simulator.scenario import Scenario, parse_scenario
from simulator.server import SimulatorServer
from simulator.truth import GpuSeconds, GroundTruth
from tests.conftest import scenario_data
from tests.timing import limit

STEP = 60.0
HOUR = 3600.0
PRICES = load_price_book(None, "us-central1").prices

Window = tuple[float, float, frozenset[str] | None]
"""An interval the exporter counted, and the nodes it knew then (None: every node)."""


def _workloads(rates: dict[str, float]) -> list[dict[str, Any]]:
    out = []
    for w in scenario_data()["workloads"]:
        w["arrivals_per_day"] = rates.get(w["name"], 0)
        w["duration"] = ["30m", "2h"]
        w["profiles"] = {"healthy": 1, "idle": 1, "input_bound": 1}
        out.append(w)
    return out


def counted_truth(sim: SimulatorServer, windows: Iterable[Window]) -> GroundTruth:
    """The truth of the whole run, its GPU-seconds only over ``windows``."""
    c = sim.cluster
    c.close()
    whole = c.truth.report(c.start, c.now, utilization=False)
    rows: list[GpuSeconds] = []
    for start, end, nodes in windows:
        rows += [r for r in c.truth.report(start, end, utilization=False).gpu_seconds
                 if nodes is None or r.node in nodes]
    return dataclasses.replace(whole, gpu_seconds=rows)


def added(totals: Sequence[Totals], table: str) -> dict[Any, float]:
    """One of ``Totals``' tables summed over several runs of the exporter."""
    out: dict[Any, float] = defaultdict(float)
    for t in totals:
        for key, value in getattr(t, table).items():
            out[key] += value
    return dict(out)


def check_figures(totals: Sequence[Totals], truth: GroundTruth) -> None:
    """Cost by state, team and pool to the cent; GPU-seconds by state and pool; availability
    by pool: the exporter's counters against the truth."""
    ours_cost: dict[tuple[str, str, str], float] = defaultdict(float)
    for (state, _, team, pool, _, _), usd in added(totals, "cost_usd").items():
        ours_cost[(state, team, pool)] += usd
    truth_cost: dict[tuple[str, str, str], float] = defaultdict(float)
    for (state, team, ns, pool, accel, prov), secs in truth.seconds_by(
            "state", "team", "namespace", "pool", "accelerator", "provisioning").items():
        truth_cost[(state, team or ns or "", pool)] += secs / HOUR * PRICES[(accel, prov)]
    assert ours_cost.keys() == truth_cost.keys()
    for key, usd in truth_cost.items():
        assert ours_cost[key] == pytest.approx(usd, abs=0.01), key

    ours_secs: dict[tuple[str, str], float] = defaultdict(float)
    for (state, _, _, pool, _, _), secs in added(totals, "gpu_seconds").items():
        ours_secs[(state, pool)] += secs
    truth_secs = truth.seconds_by("state", "pool")
    assert ours_secs.keys() == truth_secs.keys()
    for state_pool, secs in truth_secs.items():
        assert ours_secs[state_pool] == pytest.approx(secs, abs=1e-6), state_pool

    def availability(secs: dict[tuple[str, str], float]) -> dict[str, float]:
        pools = {p for _, p in secs}
        return {p: 1 - secs.get(("unavailable", p), 0.0) / sum(
            v for (_, q), v in secs.items() if q == p) for p in pools}

    assert availability(ours_secs) == pytest.approx(availability(truth_secs), abs=1e-9)


def events(exporter: Exporter) -> list[tuple[str, str, str, float, float]]:
    """(node, GPU, reason, start, end) of every availability_events row."""
    wh = exporter.warehouse
    assert wh is not None
    wh.flush(exporter.last_cycle_time, partial=True)
    return wh.con.execute("SELECT node, gpu_uuid, reason, epoch(start_time), epoch(end_time) "
                          "FROM availability_events ORDER BY ALL").fetchall()


def check_events(got: list[tuple[str, str, str, float, float]], truth: GroundTruth,
                 name: dict[str, str], slack: dict[str, float]) -> None:
    """One row per GPU incident of the truth, which ended, starting and ending within
    ``slack[node]`` (one interval, or one turn of the Service) of the truth's. ``name``
    gives the exporter's name of a GPU it had never seen when its incident began."""
    want = {(i.node, name.get(i.gpu_uuid, i.gpu_uuid), i.reason): i for i in truth.incidents}
    assert sorted((n, u, r) for n, u, r, _, _ in got) == sorted(want), \
        "one row per incident"
    for node, uuid, reason, start, end in got:
        inc = want[(node, uuid, reason)]
        assert inc.end is not None and inc.end < truth.end
        assert start == pytest.approx(inc.start, abs=slack[node]), (uuid, reason)
        assert end == pytest.approx(inc.end, abs=slack[node]), (uuid, reason)


async def synced(sim: SimulatorServer, exporter: Exporter) -> None:
    async with asyncio.timeout(limit(30)):
        await exporter.kube.wait_synced()
        await caught_up(sim, exporter)


# ----------------------------------------------------------------- outages and a restart

CLOSE, REOPEN, END = 1 * HOUR, 1 * HOUR + 5 * STEP, 4 * HOUR
"""The exporter runs until CLOSE and again from REOPEN (its restart), to END."""
FORCE_DELETE, GRACEFUL_DELETE, GRACE = 1.5 * HOUR, 2 * HOUR, 90
"""A grace period that ends between two steps: the pod's GPUs are freed at the next."""


def outage_scenario() -> Scenario:
    pools = scenario_data()["pools"] + [
        {"name": "mig-rc", "accelerator": "nvidia-tesla-a100", "gpus_per_node": 1,
         "nodes": 1, "mig_partition_size": "1g.5gb", "dcgm_mig_layout": "gpu_and_instances"}]
    return parse_scenario(scenario_data(step=STEP, pools=pools, faults=[
        # from before the exporter starts: a GPU off the bus, so the first scrape of its
        # node shows fewer GPUs than Kubernetes counts; a node NotReady, its exporter failing
        {"at": 0, "kind": "xid", "node": "l4/0", "gpu": 1, "code": 79, "duration": "2h"},
        {"at": 0, "kind": "node_not_ready", "node": "t4-spot/0", "duration": "2h"},
        {"at": 0, "kind": "endpoint", "node": "t4-spot/0", "mode": "error", "duration": "2h"},
        {"at": "2h30m", "kind": "xid", "node": "l4/0", "gpu": 3, "code": 48, "duration": "30m"},
        {"at": "3h", "kind": "node_not_ready", "node": "mig-rc/0", "duration": "20m"},
    ], workloads=_workloads({"shared": 30, "slice": 200, "spotjob": 12})), "outages")


@dataclass
class Outages:
    sim: SimulatorServer
    truth: GroundTruth
    totals: list[Totals]
    """Each run of the exporter's counters: before the restart, after it."""
    first: Totals
    """The counters after the first interval."""
    open_at_close: dict[tuple[str, str], tuple[float, str, str]]
    open_at_reopen: dict[tuple[str, str], tuple[float, str, str]]
    events: list[tuple[str, str, str, float, float]]
    pods: dict[str, dict[str, Any]]
    deleted: dict[str, Pod]
    """The force-deleted and the gracefully deleted pod."""


async def run_outages(out: Path) -> Outages:
    scenario = outage_scenario()
    async with SimulatorServer(scenario) as sim:
        c = sim.cluster
        cfg = demo_config(scenario, sim.write_outputs(out).kubeconfig, out)
        totals = []
        async with open_exporter(cfg) as exporter:
            await synced(sim, exporter)
            await exporter.cycle(c.now)
            await step_both(sim, exporter, 1)
            first = dataclasses.replace(exporter.totals, cost_usd=dict(exporter.totals.cost_usd),
                                        gpu_seconds=dict(exporter.totals.gpu_seconds),
                                        down_seconds=dict(exporter.totals.down_seconds))
            await step_both(sim, exporter, 8)
            await sim.advance(STEP)
            # two 4-GPU pods that fill the H100 node, deleted later while they run; what
            # happens at a step happens before that step's scrape
            victims = [c.submit("half", profile="healthy", run_seconds=6 * HOUR)[0]
                       for _ in range(2)]
            await caught_up(sim, exporter)
            await exporter.cycle(c.now)
            await step_both(sim, exporter, round((CLOSE - (c.now - c.start)) / STEP))
            totals.append(exporter.totals)
            open_at_close = dict(exporter.incidents.open)
        await sim.advance(REOPEN - CLOSE)  # the exporter is down: nothing counts it
        async with open_exporter(cfg) as exporter:
            open_at_reopen = dict(exporter.incidents.open)
            await synced(sim, exporter)
            await exporter.cycle(c.now)
            for at, pod, grace in ((FORCE_DELETE, victims[0], 0),
                                   (GRACEFUL_DELETE, victims[1], GRACE)):
                await step_both(sim, exporter, round((at - (c.now - c.start)) / STEP) - 1)
                await sim.advance(STEP)
                assert pod.phase == "Running"
                await sim.delete_pod(pod, grace_seconds=grace)  # before the cycle's scrape
                await caught_up(sim, exporter)
                await exporter.cycle(c.now)
            await step_both(sim, exporter, round((END - (c.now - c.start)) / STEP))
            totals.append(exporter.totals)
            got = events(exporter)
            wh = exporter.warehouse
            assert wh is not None
            cols = ["pod_uid", "phase", "epoch(finished)"]
            pods = {r[0]: dict(zip(cols, r, strict=True)) for r in wh.con.execute(
                f"SELECT {', '.join(cols)} FROM gpu_pods_current").fetchall()}
        truth = counted_truth(sim, [(c.start, c.start + CLOSE, None),
                                    (c.start + REOPEN, c.now, None)])
        return Outages(sim, truth, totals, first, open_at_close, open_at_reopen, got, pods,
                       {"force": victims[0], "graceful": victims[1]})


@pytest.fixture(scope="module")
def outages(tmp_path_factory: pytest.TempPathFactory) -> Outages:
    return asyncio.run(run_outages(tmp_path_factory.mktemp("outages")))


def _node(sim: SimulatorServer, pool: str) -> str:
    return next(n.name for n in sim.cluster.nodes.values() if n.pool.name == pool)


def _unseen_names(o: Outages) -> dict[str, str]:
    """The exporter's names of the GPUs DCGM had not shown when their incident began (at
    the start): ``<node>/k8s-<index>``."""
    c = o.sim.cluster
    start = c.start
    index = {g.uuid: g.index for n in c.nodes.values() for g in n.gpus}
    return {i.gpu_uuid: f"{i.node}/k8s-{index[i.gpu_uuid]}" for i in c.truth.incidents
            if i.start == start}


def test_outage_from_before_the_start_counts_from_the_first_interval(outages: Outages) -> None:
    """A node NotReady with its dcgm-exporter failing, and a GPU its dcgm-exporter never
    showed: unavailable, and priced, from the first interval, as in the truth."""
    c = outages.sim.cluster
    truth = c.truth.report(c.start, c.start + STEP, utilization=False)
    check_figures([outages.first], truth)
    down = truth.seconds_by("pool", state="unavailable")
    assert down == {("t4-spot",): 4 * STEP, ("l4",): STEP}
    t4, l4 = _node(outages.sim, "t4-spot"), _node(outages.sim, "l4")
    assert set(outages.first.down_seconds) == {
        *((f"{t4}/k8s-{i}", "node_not_ready") for i in range(4)), (f"{l4}/k8s-1", "gpu_missing")}


def test_cost_and_gpu_seconds_equal_the_truth_across_a_restart(outages: Outages) -> None:
    """Over the hours the exporter ran, before its restart and after it."""
    check_figures(outages.totals, outages.truth)
    assert sum(outages.truth.seconds_by("state", state="unavailable").values()) > 4 * HOUR


def test_an_outage_outlives_the_restart(outages: Outages) -> None:
    """What was open when the exporter stopped is what it picked up again."""
    assert outages.open_at_reopen == outages.open_at_close
    assert {reason for _, reason in outages.open_at_close} == {"node_not_ready", "gpu_missing"}


def test_one_event_per_incident_as_in_the_truth(outages: Outages) -> None:
    """The incidents from before the start end once, after the restart, from their start."""
    nodes = {n for n, *_ in outages.events}
    check_events(outages.events, outages.truth, _unseen_names(outages),
                 dict.fromkeys(nodes, STEP))
    assert {r for _, _, r, _, _ in outages.events} == {"node_not_ready", "gpu_missing", "xid"}


def test_downtime_per_gpu_equals_the_truth(outages: Outages) -> None:
    """MIG instances add up to their GPU: a partitioned GPU is down once, not per slice."""
    name = _unseen_names(outages)
    truth: dict[str, float] = defaultdict(float)
    for (device,), secs in outages.truth.seconds_by("device_id", state="unavailable").items():
        uuid = device.split("/")[0]
        truth[name.get(uuid, uuid)] += secs
    ours: dict[str, float] = defaultdict(float)
    for (uuid, _), secs in added(outages.totals, "down_seconds").items():
        ours[uuid] += secs
    assert ours == pytest.approx(truth, abs=1e-6)


def test_both_mig_layouts_count_each_gpu_once(outages: Outages) -> None:
    """Seven 1g.5gb slices are one GPU, whether the GPU's own series come beside them."""
    ours: dict[tuple[str, str], float] = defaultdict(float)
    for (state, _, _, pool, _, _), secs in added(outages.totals, "gpu_seconds").items():
        ours[(pool, state)] += secs
    counted = CLOSE + END - REOPEN
    truth = outages.truth.seconds_by("pool", "state")
    for pool in ("mig", "mig-rc"):
        assert sum(v for (p, _), v in ours.items() if p == pool) == pytest.approx(counted)
        assert ours[(pool, "allocated")] == pytest.approx(truth[(pool, "allocated")])
        assert ours[(pool, "allocated")] > HOUR


def test_deleted_pods_end_when_deleted_and_cost_no_more(outages: Outages) -> None:
    """Force-deleted: it ends at the deletion; deleted gracefully: at its
    deletionTimestamp, holding its GPUs until it is gone. Its cost is the truth's to the
    cent."""
    ours_cost = added(outages.totals, "pod_cost")
    truth_secs = outages.truth.seconds_by("pod_uid", "accelerator", "provisioning",
                                          state="allocated")
    for case, pod in outages.deleted.items():
        rec = outages.truth.pods[pod.uid]
        assert rec.phase == "Deleted" and rec.finished_at is not None and \
            rec.scheduled_at is not None
        row = outages.pods[pod.uid]
        assert row["phase"] == "Deleted", case
        want = pod.deletion_at if case == "graceful" else rec.finished_at
        assert row["epoch(finished)"] == want, case
        assert 0 <= rec.finished_at - (want or 0) < STEP, case
        held = sum(s for (uid, *_), s in truth_secs.items() if uid == pod.uid)
        # what it held, from scheduling to the end, less the exporter's restart
        assert held == 4 * (rec.finished_at - rec.scheduled_at - (REOPEN - CLOSE))
        usd = sum(s / HOUR * PRICES[(a, p)] for (uid, a, p), s in truth_secs.items()
                  if uid == pod.uid)
        assert ours_cost[pod.uid] == pytest.approx(usd, abs=0.01), case


# ----------------------------------------------------------------- a Service, pod hostnames

SERVICE_POOLS = ("l4", "t4-spot")
SERVICE_END = 2 * HOUR


def service_scenario() -> Scenario:
    pools = [{**p, "dcgm_hostname": "pod"} if p["name"] in ("l4", "h100") else p
             for p in scenario_data()["pools"]]
    return parse_scenario(scenario_data(
        step=STEP, pools=pools, dcgm_service={"pools": list(SERVICE_POOLS)}, faults=[
            {"at": "40m", "kind": "xid", "node": "l4/0", "gpu": 2, "code": 48, "duration": "30m"},
            {"at": "1h20m", "kind": "node_not_ready", "node": "t4-spot/0", "duration": "20m"},
        ], workloads=_workloads({"half": 8, "shared": 40, "slice": 40, "spotjob": 24})),
        "service")


def service_config(sim: SimulatorServer, out: Path) -> Config:
    """The Service for its pools' nodes, each other node's own URL."""
    cfg = demo_config(sim.scenario, sim.write_outputs(out).kubeconfig, out)
    own = [sim.endpoint_url(n) for n in sim.cluster.live_nodes()
           if n.pool.name not in SERVICE_POOLS]
    return cfg.model_copy(update={"dcgm": cfg.dcgm.model_copy(
        update={"targets": [sim.service_url, *own]})})


@dataclass
class ServiceRun:
    sim: SimulatorServer
    truth: GroundTruth
    totals: Totals
    known: list[frozenset[str]]
    """The nodes the simulator says the exporter could know at each cycle."""
    seen: list[dict[str, set[tuple[str, str, float | None]]]]
    """Per cycle, node -> (GPU, model, price per hour) of each device the exporter had."""
    events: list[tuple[str, str, str, float, float]]


async def run_service(out: Path) -> ServiceRun:
    async with SimulatorServer(service_scenario()) as sim:
        c = sim.cluster
        behind = {n.name for n in sim.service_nodes()}
        async with open_exporter(service_config(sim, out)) as exporter:
            await synced(sim, exporter)
            known: list[frozenset[str]] = []
            seen: list[dict[str, set[tuple[str, str, float | None]]]] = []
            times: list[float] = []
            for i in range(round(SERVICE_END / STEP) + 1):
                if i:
                    await sim.advance(STEP)
                    await caught_up(sim, exporter)
                await exporter.cycle(c.now)
                answered = [n for t, n in sim.service_answers if t == c.now]
                assert len(answered) == 1, "one request to the Service per cycle"
                not_ready = {n.name for n in c.live_nodes() if not n.ready}
                known.append(frozenset({n.name for n in c.live_nodes()} - behind
                                       | {answered[0]} | not_ready))
                states: dict[str, set[tuple[str, str, float | None]]] = defaultdict(set)
                for d in exporter.states:
                    states[d.node].add((d.gpu_uuid, d.accelerator, d.price_usd_per_hour))
                seen.append(states)
                times.append(c.now)
            got = events(exporter)
            truth = counted_truth(sim, [(t, t + STEP, k)
                                        for t, k in zip(times, known[:-1], strict=False)])
            return ServiceRun(sim, truth, exporter.totals, known, seen, got)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> ServiceRun:
    return asyncio.run(run_service(tmp_path_factory.mktemp("service")))


def test_the_service_answer_covers_the_node_that_gave_it(service: ServiceRun) -> None:
    """Each cycle the exporter has the nodes the simulator says it could know, no more."""
    assert [frozenset(s) for s in service.seen] == service.known
    behind = {n.name for n in service.sim.service_nodes()}
    answered = {n for k in service.known for n in k & behind}
    assert answered == behind  # each node behind the Service answered in turn


def test_gpus_land_on_their_node_at_their_price(service: ServiceRun) -> None:
    """By their ``Hostname`` (a node's name, or the dcgm-exporter pod's), through the
    Service or a node's own URL: never the L4 GPUs on the T4 node, nor at its price."""
    for cycle in service.seen:
        for name, devices in cycle.items():
            node = service.sim.cluster.nodes[name]
            price = PRICES[(node.pool.accelerator,
                            "spot" if node.pool.spot else "on-demand")]
            assert {u for u, _, _ in devices} == {g.uuid for g in node.gpus}, name
            share = 1 / 7 if node.pool.mig_partition_size else 1.0  # 1g.5gb slices
            for _, model, usd in devices:
                assert model == node.pool.accelerator, name
                assert usd == pytest.approx(price * share), name


def test_figures_equal_the_truth_where_known(service: ServiceRun) -> None:
    check_figures([service.totals], service.truth)


def test_no_false_downtime_and_one_event_per_incident(service: ServiceRun) -> None:
    """A node the Service did not answer for this cycle is unknown, not missing; an XID on
    it stays one incident, seen within one turn of the Service."""
    assert not any(r == "gpu_missing" for _, r in service.totals.down_seconds)
    behind = {n.name for n in service.sim.service_nodes()}
    nodes = {n.name for n in service.sim.cluster.nodes.values()}
    slack = {n: STEP * (len(behind) if n in behind else 1) for n in nodes}
    check_events(service.events, service.truth, {}, slack)
    assert {r for _, _, r, _, _ in service.events} == {"xid", "node_not_ready"}
