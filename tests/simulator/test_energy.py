"""The energy truth: the GPUs' energy counters, their resets, and the joules in the truth,
which are the counters' own energy split as the GPU-seconds are."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from exporter.model.catalog import GPU_MODELS
from simulator.cluster import Cluster, Node
from simulator.exposition import render_node
from simulator.profiles import POWER_RATIO, PROFILES, STARTING_POWER_RATIO, activity
from simulator.scenario import Fault, Scenario, ScenarioError, parse_scenario
from simulator.server import SimulatorServer
from simulator.truth import GroundTruth
from tests.conftest import scenario_data
from tests.simulator.dcgm_text import by_gpu

STEP = 30
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"


def node_of(c: Cluster, pool: str) -> Node:
    return next(n for n in c.live_nodes() if n.pool.name == pool)


def counters(c: Cluster) -> dict[str, float]:
    """Every live GPU's energy counter now (mJ), by UUID."""
    return {g.uuid: c.gpu_energy_mj(g) for n in c.live_nodes() for g in n.gpus}


def report(c: Cluster, start: float, end: float) -> GroundTruth:
    c.close()
    return c.truth.report(start, end, utilization=False)


def joules_by_gpu(truth: GroundTruth) -> dict[str, float]:
    """Truth joules of each physical GPU: its devices' (MIG instances') summed."""
    out: dict[str, float] = defaultdict(float)
    for (device_id,), j in truth.joules_by("device_id").items():
        out[device_id.split("/")[0]] += j
    return dict(out)


def watts(accelerator: str, ratio: float, fraction: float = 1.0) -> float:
    m = GPU_MODELS[accelerator]
    return (m.idle_power_watts + ratio * (m.power_limit_watts - m.idle_power_watts)) * fraction


# The power model


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_draws_its_power_ratio_on_average(profile: str) -> None:
    """The table's ratio, which the energy counter advances at, is the mean of what DCGM's
    power gauge shows step by step."""
    values = [activity(profile, pod_key, 99, step, True, True, True).power_ratio
              for pod_key in range(5) for step in range(600)]
    assert sum(values) / len(values) == pytest.approx(POWER_RATIO[profile], abs=0.005)
    assert activity(profile, 1, 99, 0, False, False, True).power_ratio == STARTING_POWER_RATIO
    assert POWER_RATIO["throttled"] > max(v for k, v in POWER_RATIO.items() if k != "throttled")


def test_an_idle_gpu_draws_its_idle_floor(make_scenario: Callable[..., Scenario]) -> None:
    """No pod: every device at its model's idle power, a MIG instance its fraction of it."""
    c = Cluster(make_scenario())
    c.advance(3600)
    truth = report(c, c.start, c.now)
    assert set(truth.joules_by("state")) == {("unallocated",)}
    for (accel, device_id), j in truth.joules_by("accelerator", "device_id").items():
        fraction = 1 / 7 if "/" in device_id else 1.0
        assert j == pytest.approx(GPU_MODELS[accel].idle_power_watts * 3600 * fraction), accel
    mig = [j for (device_id,), j in truth.joules_by("device_id").items() if "/" in device_id]
    assert len(mig) == 7 and sum(mig) == pytest.approx(55.0 * 3600)  # A100 40GB: 55 W


def test_a_pod_draws_its_profile_once_its_containers_run() -> None:
    """Pulling its image (``startup``) a pod draws 0.03 of the curve; then its profile's."""
    data = scenario_data()
    data["workloads"][0]["startup"] = "5m"  # train: a whole H100 node
    c = Cluster(parse_scenario(data, "test"))
    pod = c.submit("train", profile="memory_bound", run_seconds=3600)[0]
    c.advance(1800)
    truth = report(c, c.start, c.now)
    per_pod = truth.joules_by("pod_uid", state="allocated")[(pod.uid,)]
    expected = 8 * (watts("nvidia-h100-80gb", STARTING_POWER_RATIO) * 300
                    + watts("nvidia-h100-80gb", POWER_RATIO["memory_bound"]) * 1500)
    assert per_pod == pytest.approx(expected)


def test_time_shared_pods_split_the_gpus_joules_evenly(
        make_scenario: Callable[..., Scenario]) -> None:
    """Two pods time-share one L4: it draws the mean of their ratios, and each pod gets
    half its joules, as each gets half its seconds, whatever its own profile."""
    c = Cluster(make_scenario())
    busy = c.submit("shared", profile="healthy", run_seconds=7200)[0]
    quiet = c.submit("shared", profile="idle", run_seconds=7200)[0]
    assert busy.node is quiet.node and busy.units[0] // 2 == quiet.units[0] // 2
    c.advance(3600)
    truth = report(c, c.start, c.now)
    per_pod = truth.joules_by("pod_uid", state="allocated")
    gpu = watts("nvidia-l4", (POWER_RATIO["healthy"] + POWER_RATIO["idle"]) / 2) * 3600
    assert per_pod[(busy.uid,)] == pytest.approx(gpu / 2)
    assert per_pod[(quiet.uid,)] == pytest.approx(gpu / 2)
    assert truth.seconds_by("pod_uid", state="allocated")[(busy.uid,)] == pytest.approx(1800)


def test_a_mig_instance_draws_its_fraction(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    pod = c.submit("slice", profile="healthy", run_seconds=7200)[0]
    c.advance(3600)
    truth = report(c, c.start, c.now)
    assert truth.joules_by("pod_uid", state="allocated")[(pod.uid,)] == pytest.approx(
        watts("nvidia-tesla-a100", POWER_RATIO["healthy"], 1 / 7) * 3600)


# Down devices


def test_a_not_ready_node_draws_nothing_and_restarts_its_counters(
        make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario(faults=[
        {"at": "10m", "kind": "node_not_ready", "node": "mig/0", "duration": "20m"}]))
    c.submit("slice", run_seconds=7200)
    node = node_of(c, "mig")
    gpu = node.gpus[0]
    c.advance(600)
    frozen = c.gpu_energy_mj(gpu)
    assert not node.ready
    c.advance(600)
    assert c.gpu_energy_mj(gpu) == frozen  # powered off: the counter stands still
    c.advance(600)
    assert node.ready and c.gpu_energy_mj(gpu) == 0.0  # the driver loaded at boot
    c.advance(600)
    assert c.gpu_energy_mj(gpu) > 0
    since = joules_by_gpu(report(c, c.start + 1800, c.now))[gpu.uuid]
    assert since == pytest.approx(c.gpu_energy_mj(gpu) * 1e-3)
    truth = report(c, c.start, c.now)
    down = truth.joules_by("node", state="unavailable")
    assert down == {(node.name,): 0.0}
    assert truth.seconds_by("node", state="unavailable") == {(node.name,): pytest.approx(1200)}
    assert [(r.node, r.gpu_uuid, r.at - c.start, r.why) for r in truth.counter_resets] == [
        (node.name, gpu.uuid, 1800, "node_restart")]


def test_a_gpu_down_for_an_xid_keeps_drawing_its_idle_floor(
        make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario(faults=[
        {"at": "10m", "kind": "xid", "node": "l4/0", "gpu": 1, "code": 48, "duration": "30m"},
        {"at": "10m", "kind": "xid", "node": "h100/0", "gpu": 3, "code": 79, "duration": "30m"},
    ]))
    c.advance(3600)
    truth = report(c, c.start, c.now)
    down = truth.joules_by("accelerator", state="unavailable")
    assert down == {("nvidia-l4",): pytest.approx(16.0 * 1800),
                    ("nvidia-h100-80gb",): pytest.approx(70.0 * 1800)}
    assert truth.counter_resets == []


# Counters and resets


FAULTS = [
    {"at": "10m", "kind": "node_not_ready", "node": "l4/0", "duration": "20m"},
    {"at": "20m", "kind": "driver_reload", "node": "h100/0"},
    {"at": "25m", "kind": "xid", "node": "h100/0", "gpu": 2, "code": 48, "duration": "10m"},
    {"at": "40m", "kind": "driver_reload", "node": "mig/0"},
]


def busy_cluster(make_scenario: Callable[..., Scenario]) -> Cluster:
    c = Cluster(make_scenario(faults=FAULTS))
    c.submit("half", profile="input_bound", run_seconds=2400)
    c.submit("half", profile="throttled", run_seconds=1500)
    for profile in ("healthy", "small_batch", "idle"):
        c.submit("shared", profile=profile, run_seconds=1800)
    for profile in ("comm_bound", "memory_bound"):
        c.submit("slice", profile=profile, run_seconds=3000)
    c.submit("spotjob", run_seconds=900)
    return c


def test_counters_only_grow_between_resets(make_scenario: Callable[..., Scenario]) -> None:
    """Step by step: each counter grows (stands still while its node is off), and drops
    only at a reset, to 0; a driver reload changes nothing else."""
    c = busy_cluster(make_scenario)
    h100 = node_of(c, "h100")
    running = {p.name for p in c.pods.values() if p.node is h100 and p.phase == "Running"}
    resets: list[tuple[float, str]] = []
    before = counters(c)
    for _ in range(3600 // STEP):
        off = {g.uuid for n in c.live_nodes() if not n.ready for g in n.gpus}  # this step
        c.advance(STEP)
        now = counters(c)
        for uuid, value in now.items():
            if value < before[uuid]:
                assert value == 0.0
                resets.append((c.now - c.start, uuid))
            elif uuid in off:
                assert value == before[uuid]
            else:
                assert value > before[uuid]
        before = now
        if c.now - c.start == 1200:  # just after the driver reload: nothing else changed
            assert h100.ready
            assert {p.name for p in c.pods.values()
                    if p.node is h100 and p.phase == "Running"} == running
    uuids = {pool: [g.uuid for g in node_of(c, pool).gpus] for pool in ("h100", "l4", "mig")}
    expected = sorted([(1200, u) for u in uuids["h100"]] + [(1800, u) for u in uuids["l4"]]
                      + [(2400, u) for u in uuids["mig"]])
    assert sorted(resets) == expected
    truth = report(c, c.start, c.now)
    assert sorted((r.at - c.start, r.gpu_uuid) for r in truth.counter_resets) == expected
    whys = {r.gpu_uuid: r.why for r in truth.counter_resets}
    assert {whys[u] for u in uuids["h100"] + uuids["mig"]} == {"driver_reload"}
    assert {whys[u] for u in uuids["l4"]} == {"node_restart"}
    # clipped to the window, as incidents are
    assert {r.why for r in c.truth.report(c.start + 1500, c.now,
                                          utilization=False).counter_resets} == {
        "node_restart", "driver_reload"}
    assert c.truth.report(c.start + 2500, c.now, utilization=False).counter_resets == []


@pytest.mark.parametrize(("t1", "t2"), [(0, 1200), (300, 1170), (1230, 1800), (1800, 2400),
                                         (2430, 3600)])
def test_truth_joules_are_the_counter_delta(make_scenario: Callable[..., Scenario],
                                            t1: int, t2: int) -> None:
    """Between two reads with no reset between them, each GPU's counter grew by its
    devices' truth joules (x 1e3): busy, shared, MIG, down and powered-off GPUs alike."""
    c = busy_cluster(make_scenario)
    c.advance(t1)
    first = counters(c)
    c.advance(t2 - t1)
    second = counters(c)
    truth = report(c, c.start + t1, c.start + t2)
    # a read at a reset's time reads after it
    reset = {r.gpu_uuid for r in c.truth.counter_resets if t1 < r.at - c.start <= t2}
    joules = joules_by_gpu(truth)
    checked = 0
    for uuid in first:
        if uuid in reset:
            continue
        assert joules[uuid] == pytest.approx((second[uuid] - first[uuid]) * 1e-3, rel=1e-9,
                                             abs=1e-6), uuid
        checked += 1
    assert checked == len(first) - len(reset) >= 9
    # the rows add up to the segments': nothing lost in the split among pods
    assert sum(r.joules for r in truth.gpu_seconds) == pytest.approx(sum(joules.values()))


def test_after_a_reset_the_counter_is_the_joules_since(
        make_scenario: Callable[..., Scenario]) -> None:
    c = busy_cluster(make_scenario)
    c.advance(3000)
    value = counters(c)
    truth = report(c, c.start + 1200, c.now)  # from the H100 node's driver reload
    joules = joules_by_gpu(truth)
    for gpu in node_of(c, "h100").gpus:
        assert joules[gpu.uuid] == pytest.approx(value[gpu.uuid] * 1e-3, rel=1e-9)


def test_segments_carry_their_joules(make_scenario: Callable[..., Scenario]) -> None:
    c = busy_cluster(make_scenario)
    c.advance(3600)
    c.close()
    assert c.truth.segments
    for seg in c.truth.segments:
        if seg.down == "node_not_ready":
            assert seg.joules == 0.0
        else:
            fraction = seg.device.fraction
            lo = GPU_MODELS[seg.device.accelerator].idle_power_watts * fraction
            hi = GPU_MODELS[seg.device.accelerator].power_limit_watts * fraction
            assert lo - 1e-9 <= seg.joules / (seg.end - seg.start) <= hi + 1e-9


def test_reading_the_truth_does_not_change_the_counters(
        make_scenario: Callable[..., Scenario]) -> None:
    """Closing segments (as ``/sim/truth`` does) splits them without changing their power."""
    a, b = busy_cluster(make_scenario), busy_cluster(make_scenario)
    for _ in range(12):
        a.advance(300)
        b.advance(300)
        a.close()
    assert counters(a) == pytest.approx(counters(b), rel=1e-12)


# On the wire


def test_the_page_shows_the_reset_and_the_counter_grows_on(
        make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario(faults=[{"at": "20m", "kind": "driver_reload",
                                       "node": "h100/0"}]))
    c.submit("train", run_seconds=7200)
    node = node_of(c, "h100")

    def page() -> dict[str, float]:
        return {k: v[ENERGY] for k, v in by_gpu(render_node(c, node)).items()}

    seen = []
    for _ in range(8):
        c.advance(300)
        seen.append(page())
    for i, (before, after) in enumerate(itertools.pairwise(seen)):
        dropped = i == 2  # 15m -> 20m
        for uuid, value in after.items():
            assert (value < before[uuid]) if dropped else (value > before[uuid]), (i, uuid)
    assert all(v < watts("nvidia-h100-80gb", 1.0) * 1e3 * 600 for v in seen[4].values())


async def test_driver_reload_injected_and_served(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario]) -> None:
    """``POST /sim/faults`` takes a driver reload; ``/sim/truth`` has its resets and
    every row's joules."""
    server: SimulatorServer = await make_server(make_scenario())
    c = server.cluster
    c.submit("train", run_seconds=7200)
    await server.advance(600)
    async with aiohttp.ClientSession() as s:
        async with s.post(server.api_url + "/sim/faults",
                          json={"kind": "driver_reload", "node": "h100/0"}) as resp:
            assert resp.status == 200
        async with s.post(server.api_url + "/sim/faults",
                          json={"kind": "driver_reload", "node": "h100/0",
                                "duration": "5m"}) as resp:
            assert resp.status == 400
        await server.advance(600)
        async with s.get(f"{server.api_url}/sim/truth") as r:
            truth = await r.json()
    h100 = node_of(c, "h100")
    assert [(x["node"], x["at"], x["why"]) for x in truth["counter_resets"]] == \
        [(h100.name, c.start + 600, "driver_reload")] * 8
    assert all(row["joules"] > 0 for row in truth["gpu_seconds"])
    assert all(0 < c.gpu_energy_mj(g) <= watts("nvidia-h100-80gb", 1.0) * 600 * 1e3
               for g in h100.gpus)


# Scenarios


@pytest.mark.parametrize(("fault", "words"), [
    ({"at": "1h", "kind": "driver_reload"}, "needs node"),
    ({"at": "1h", "kind": "driver_reload", "pool": "h100"}, "needs node"),
    ({"at": "1h", "kind": "driver_reload", "node": "h100/0", "duration": "5m"}, "duration"),
    ({"at": "1h", "kind": "driver_reload", "node": "h100/0", "gpu": 1}, "gpu"),
    ({"at": "1h", "kind": "driver_reload", "node": "h100/0", "code": 79}, "code"),
    ({"at": "1h", "kind": "driver_reload", "node": "h100/0", "mode": "hang"}, "mode"),
    ({"at": "1h", "kind": "driver_reload", "node": "h100"}, "POOL/INDEX"),
    ({"at": "1h", "kind": "driver_reload", "node": "nopool/0"}, "nopool"),
])
def test_a_bad_driver_reload_is_rejected(fault: dict[str, Any], words: str) -> None:
    with pytest.raises(ScenarioError, match=words):
        parse_scenario(scenario_data(faults=[fault]), "test")


def test_a_driver_reload_needs_only_at_and_node() -> None:
    s = parse_scenario(scenario_data(faults=[{"at": "1h", "kind": "driver_reload",
                                              "node": "h100/0"}]), "test")
    assert s.faults == [Fault(at=3600, kind="driver_reload", node="h100/0")]
