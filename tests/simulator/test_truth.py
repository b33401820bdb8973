"""Ground truth: conserved, split as the definitions say, and equal to what the API shows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import aiohttp
import pytest

from simulator.cluster import Cluster
from simulator.scenario import Scenario, load_scenario
from simulator.server import SimulatorServer


def report(c: Cluster, utilization: bool = True) -> Any:
    c.close()
    return c.truth.report(c.start, c.now, utilization=utilization)


def test_gpu_seconds_are_conserved_over_a_busy_day() -> None:
    """Every GPU-second of every node is allocated, unallocated or unavailable, once."""
    c = Cluster(load_scenario())
    c.advance(86400)
    truth = report(c, utilization=False)
    total = sum(r.seconds for r in truth.gpu_seconds)
    capacity = sum(s.end - s.start for s in c.truth.segments
                   if s.device.fraction == 1) + sum(
        (s.end - s.start) * s.device.fraction for s in c.truth.segments
        if s.device.fraction < 1)
    assert total == pytest.approx(capacity)
    states = truth.seconds_by("state")
    assert set(states) == {("allocated",), ("unallocated",)}  # no fault in the first day


@pytest.mark.parametrize(("workload", "pods", "per_pod_gpu_seconds"), [
    ("train", 1, 8 * 3600),          # a whole node: 8 GPU-hours in an hour
    ("shared", 2, 0.5 * 3600),       # two pods time-share one L4: half each
    ("slice", 1, 3600 / 7),          # a 1g.5gb MIG slice is 1/7 of an A100
])
def test_attribution(workload: str, pods: int, per_pod_gpu_seconds: float,
                     make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    submitted = [c.submit(workload, run_seconds=3600)[0] for _ in range(pods)]
    c.advance(3600)
    truth = report(c)
    per_pod = truth.seconds_by("pod_uid", state="allocated")
    for pod in submitted:
        assert per_pod[(pod.uid,)] == pytest.approx(per_pod_gpu_seconds)
    team = truth.seconds_by("team", "namespace", state="allocated")
    assert team == {("alpha", "team-a"): pytest.approx(per_pod_gpu_seconds * pods)}


def test_utilisation_is_the_mean_gr_engine_active(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    pod = c.submit("train", profile="idle", run_seconds=1800)[0]
    busy = c.submit("half", profile="healthy", run_seconds=1800)  # waits: node full
    c.advance(3600)
    truth = report(c)
    assert truth.pod_utilization[pod.uid] < 0.05
    assert truth.pod_utilization[busy[0].uid] > 0.85
    node = pod.node
    assert node is not None
    # GPU 0 held the idle pod for 30 min then the busy one for 30 min.
    g0 = truth.device_utilization[node.gpus[0].uuid]
    assert g0 == pytest.approx((truth.pod_utilization[pod.uid]
                                + truth.pod_utilization[busy[0].uid]) / 2, abs=0.01)


async def test_queue_wait_matches_the_api_objects(make_server: Callable[..., Any],
                                                  make_scenario: Callable[..., Scenario]
                                                  ) -> None:
    server: SimulatorServer = await make_server(make_scenario())
    c = server.cluster
    c.submit("train", run_seconds=1200)
    waiting = c.submit("train", run_seconds=600)[0]
    await server.advance(1500)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{server.api_url}/api/v1/namespaces/team-a/pods/{waiting.name}") as r:
            obj = await r.json()
        async with s.get(f"{server.api_url}/sim/truth") as r:
            truth = await r.json()

    def ts(text: str) -> float:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    created = ts(obj["metadata"]["creationTimestamp"])
    scheduled = ts(next(x for x in obj["status"]["conditions"]
                        if x["type"] == "PodScheduled")["lastTransitionTime"])
    assert truth["pods"][waiting.uid]["queue_wait_seconds"] == scheduled - created == 1200


def test_pending_pod_waits_until_the_window_end(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    c.submit("train", run_seconds=7200)
    waiting = c.submit("train")[0]
    c.advance(1800)
    assert report(c).queue_wait(waiting.uid) == 1800


def test_downtime_incidents_follow_the_faults() -> None:
    c = Cluster(load_scenario())
    c.advance(4 * 86400)
    truth = report(c, utilization=False)
    by_reason: dict[str, list[float]] = {}
    for inc in truth.incidents:
        assert inc.end is not None
        by_reason.setdefault(inc.reason, []).append(inc.end - inc.start)
    assert by_reason == {"gpu_missing": [3 * 3600], "xid": [3600],
                         "node_not_ready": [45 * 60] * 8}
    unavailable = truth.seconds_by("state")[("unavailable",)]
    assert unavailable == pytest.approx(3 * 3600 + 3600 + 8 * 45 * 60)
    assert len(truth.interruptions) == 0  # the spot preemption comes on day 5
    c.advance(86400)
    assert len(report(c, utilization=False).interruptions) == 1


def test_every_workload_has_its_profile_label() -> None:
    c = Cluster(load_scenario())
    c.advance(86400)
    truth = report(c, utilization=False)
    assert truth.profiles["jupyter"] == "idle"
    assert truth.profiles["llm-serve"] == "memory_bound"
    assert set(truth.profiles.values()) <= {"healthy", "input_bound", "small_batch",
                                            "comm_bound", "memory_bound", "idle", "throttled"}
