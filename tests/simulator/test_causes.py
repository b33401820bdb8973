"""Why things wait: each cause arises in a small cluster with the words Kubernetes would
say, the truth records it, and the demo's week and the Kueue scenario's show them all."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from simulator.causes import CAUSES, USES
from simulator.cluster import Cluster, Pod
from simulator.kueue import QueuedWorkload
from simulator.scenario import Fault, Scenario, load_scenario, parse_scenario
from tests.conftest import FIXTURES, scenario_data
from tests.simulator.test_kueue import kueue_scenario

SAMPLES = yaml.safe_load((FIXTURES / "scheduling" / "samples.yaml").read_text())
SHAPES = {
    "FailedScheduling": r"0/\d+ nodes are available: \d+ [^,]+(, \d+ [^,]+)*\. preemption: .+\.",
    "TriggeredScaleUp": r"pod triggered scale-up: \[\{https://www\.googleapis\.com/compute/v1/"
                        r"projects/[\w-]+/zones/[a-z0-9-]+/instanceGroups/gke-[a-z0-9-]+-grp "
                        r"\d+->\d+ \(max: \d+\)\}\]",
    "NotTriggerScaleUp": r"pod didn't trigger scale-up: \d+ [^,]+(, \d+ [^,]+)*",
    "FailedScaleUp": r"Node scale up in zones [a-z0-9-]+ associated with this pod failed: "
                     r"[^.]+\. Pod is at risk of not being scheduled\.",
    "Pulling": r'Pulling image "[^"]+"',
    "QuotaReserved": r"couldn't assign flavors to pod set main: insufficient unused quota for "
                     r"\S+ in flavor \S+, \S+ more needed",
    "Evicted": r"Preempted to accommodate a workload \(UID: [0-9a-f-]+, JobUID: [0-9a-f-]+\) "
               r"due to prioritization in the ClusterQueue.*",
}
"""The shape of each message, as the real ones in ``tests/fixtures/scheduling`` have it."""
Waiting = Pod | QueuedWorkload


def test_the_real_samples_have_the_shapes_the_simulator_is_held_to() -> None:
    checked = set()
    for sample in SAMPLES["events"]:
        if sample["reason"] in SHAPES:
            assert re.fullmatch(SHAPES[sample["reason"]], sample["message"]), sample
            checked.add(sample["reason"])
    for cond in SAMPLES["workload_conditions"]:
        if cond["type"] in SHAPES:
            assert re.fullmatch(SHAPES[cond["type"]], cond["message"]), cond
            checked.add(cond["type"])
    assert checked >= {"FailedScheduling", "TriggeredScaleUp", "NotTriggerScaleUp",
                       "FailedScaleUp", "QuotaReserved", "Evicted"}


# ------------------------------------------------------------------ one cause at a time


def _base(**changes: Any) -> Callable[[], Scenario]:
    """The small test cluster with some pools or workloads changed."""
    def build() -> Scenario:
        data = scenario_data()
        for pool in data["pools"]:
            pool.update(changes.get(pool["name"], {}))
        for w in data["workloads"]:
            w.update(changes.get(w["name"], {}))
        data["workloads"] += changes.get("more_workloads", [])
        data["stockouts"] = changes.get("stockouts", [])
        return parse_scenario(data, "test")
    return build


AUTOSCALED = {"autoscaling": {"min_nodes": 1, "max_nodes": 2, "provisioning_delay": "5m"}}
LOST = {"name": "lost", "kind": "finetuning", "namespace": "team-b",
        "accelerator": "nvidia-h100-80gb", "gpus_per_pod": 4, "arrivals_per_day": 0,
        "node_selector": {"cloud.google.com/gke-nodepool": "h100-reserved"}}


def two_trains(c: Cluster) -> Pod:
    c.submit("train", run_seconds=7200)
    return c.submit("train")[0]


def starting(c: Cluster) -> Pod:
    return c.submit("train")[0]


def preempted(c: Cluster) -> Pod:
    first = c.submit("spotjob", run_seconds=7200)[0]
    c.advance(60)
    c.inject(Fault(at=0, kind="spot_preemption", pool="t4-spot"))
    return next(p for p in c.pending if p.job is first.job)


def scaling(c: Cluster) -> Pod:
    waiting = two_trains(c)
    c.advance(30)  # the autoscaler's loop
    return waiting


def stockout(c: Cluster) -> Pod:
    waiting = two_trains(c)
    c.advance(90)  # the autoscaler tries at the next step; GKE says it failed a minute on
    return waiting


def fragmented(c: Cluster) -> Pod:
    c.submit("half", run_seconds=7200)
    c.submit("half", run_seconds=60)
    c.submit("half", run_seconds=7200)   # best fit: two on one node, one on the other
    c.advance(60)                        # one of the two ends: 4 free GPUs on each node
    return c.submit("train")[0]


def quota(c: Cluster) -> QueuedWorkload:
    c.submit("train", run_seconds=3600)
    c.submit("train")
    return next(w for w in (c.kueue.workloads.values() if c.kueue else ()) if w.pending)


def evicted(c: Cluster) -> QueuedWorkload:
    low = c.submit("train", run_seconds=7200)[0]
    c.advance(600)
    c.submit("urgent", run_seconds=3600)
    assert low.job.queued is not None
    return low.job.queued


@dataclass(frozen=True)
class Case:
    scenario: Callable[[], Scenario]
    act: Callable[[Cluster], Waiting]
    cause: str
    says: str
    """The reason of the event (or Workload condition) that tells it."""
    words: str
    """What that message says, beside its shape."""


CASES = {
    "image being pulled": Case(_base(train={"startup": "5m"}), starting, "starting",
                               "Pulling", "us-docker.pkg.dev/"),
    "spot node reclaimed": Case(_base(), preempted, "preempted", "FailedScheduling",
                                "3 node(s) didn't match"),  # its node is gone
    "over the ClusterQueue's quota": Case(kueue_scenario, quota, "quota", "QuotaReserved",
                                          "8 more needed"),
    "preempted by Kueue": Case(kueue_scenario, evicted, "preempted", "Evicted",
                               "preemptor path: /gpus/research"),
    "selects a pool that is gone": Case(_base(more_workloads=[LOST]),
                                        lambda c: c.submit("lost")[0], "unschedulable",
                                        "FailedScheduling", "didn't match Pod's node affinity"),
    "pool's taint not tolerated": Case(
        _base(h100={"taints": [{"key": "dedicated", "value": "research"}]},
              more_workloads=[LOST | {"node_selector": {}}]),
        lambda c: c.submit("lost")[0], "unschedulable", "FailedScheduling",
        "1 node(s) had untolerated taint {dedicated: research}"),
    "zone out of GPUs": Case(_base(h100=AUTOSCALED, stockouts=[
        {"pool": "h100", "at": 0, "duration": "2h", "reason": "out_of_resources"}]),
        stockout, "stockout", "FailedScaleUp", "GCE out of resources"),
    "project quota spent": Case(_base(h100=AUTOSCALED, stockouts=[
        {"pool": "h100", "at": 0, "duration": "2h", "reason": "quota_exceeded"}]),
        stockout, "stockout", "FailedScaleUp", "GCE quota exceeded"),
    "free GPUs split between nodes": Case(_base(h100={"nodes": 2}), fragmented, "fragmented",
                                          "FailedScheduling", "2 Insufficient nvidia.com/gpu"),
    "a node on its way": Case(_base(h100=AUTOSCALED), scaling, "scaling_up",
                              "TriggeredScaleUp", " 1->2 (max: 2)"),
    "pool at its maximum": Case(
        _base(h100={"autoscaling": {"min_nodes": 1, "max_nodes": 1}}), two_trains,
        "no_capacity", "NotTriggerScaleUp", "1 max node group size reached"),
    "pool full, no autoscaling": Case(_base(), two_trains, "no_capacity", "FailedScheduling",
                                      "1 Insufficient nvidia.com/gpu"),
}


def cause_recorded(c: Cluster, uid: str) -> str:
    """The cause the truth gives ``uid`` for the step starting now (one step on)."""
    t = c.now
    c.advance(c.step)
    (seg,) = [s for s in c.truth.pending_segments() if s.uid == uid and s.start <= t < s.end]
    return seg.cause


def said(c: Cluster, thing: Waiting, reason: str) -> list[str]:
    """The messages the API shows about ``thing`` for ``reason``: its events', or its
    Workload's condition of that type."""
    if isinstance(thing, QueuedWorkload):
        obj = c.store.get("Workload", f"{thing.namespace}/{thing.name}")
        assert obj is not None
        return [x["message"] for x in obj["status"]["conditions"] if x["type"] == reason]
    return [e["message"] for e in c.store.list_objects("Event")
            if e["involvedObject"]["uid"] == thing.uid and e["reason"] == reason]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_cause_arises_with_its_real_message(case: Case) -> None:
    c = Cluster(case.scenario())
    thing = case.act(c)
    assert cause_recorded(c, thing.uid) == case.cause
    messages = said(c, thing, case.says)
    assert messages, f"nothing said {case.says}"
    assert all(re.fullmatch(SHAPES.get(case.says, ".*"), m) for m in messages), messages
    assert any(case.words in m for m in messages), messages


def test_a_bound_pod_stays_pending_while_its_image_is_pulled() -> None:
    """Phase Pending, scheduled, its container ContainerCreating until its startup has
    passed; then Running, its scheduled time still the bind time."""
    c = Cluster(_base(train={"startup": "5m"})())
    pod = c.submit("train", run_seconds=3600)[0]
    bound = c.now
    obj = c.store.get("Pod", f"team-a/{pod.name}")
    assert obj is not None and obj["status"]["phase"] == "Pending"
    conds = {x["type"]: x for x in obj["status"]["conditions"]}
    assert conds["PodScheduled"]["status"] == "True"
    assert conds["ContainersReady"]["status"] == "False"
    (status,) = obj["status"]["containerStatuses"]
    assert status["state"] == {"waiting": {"reason": "ContainerCreating"}}
    c.advance(300)
    obj = c.store.get("Pod", f"team-a/{pod.name}")
    assert obj is not None and obj["status"]["phase"] == "Running"
    assert c.truth.pods[pod.uid].scheduled_at == bound
    (pulled,) = said(c, pod, "Pulled")
    assert pulled.startswith(f'Successfully pulled image "{obj["spec"]["containers"][0]["image"]}"'
                             " in 5m0s (5m0s including waiting). Image size: ")
    segs = [s for s in c.truth.pending_segments() if s.uid == pod.uid]
    assert [(s.cause, s.start, s.end) for s in segs] == [("starting", bound, bound + 300)]


def test_the_autoscaler_tries_again_after_its_backoff_and_succeeds_when_stock_is_back() -> None:
    """During the stockout every try fails (5 then 10 minutes apart), the pod told each
    time; once it ends, the next try brings the node after its provisioning delay."""
    c = Cluster(_base(h100=AUTOSCALED, stockouts=[
        {"pool": "h100", "at": 0, "duration": "20m", "reason": "out_of_resources"}])())
    waiting = two_trains(c)
    while waiting.node is None:
        c.advance(c.step)
    causes = [(s.cause, s.end - s.start) for s in c.truth.pending_segments()
              if s.uid == waiting.uid]
    assert [k for k, _ in causes] == ["no_capacity", "scaling_up", "stockout", "scaling_up",
                                      "stockout", "scaling_up", "stockout", "scaling_up"]
    failed = next(e for e in c.store.list_objects("Event")
                  if e["reason"] == "FailedScaleUp" and e["involvedObject"]["uid"] == waiting.uid)
    triggered = next(e for e in c.store.list_objects("Event") if e["reason"] ==
                     "TriggeredScaleUp" and e["involvedObject"]["uid"] == waiting.uid)
    assert (failed["count"], triggered["count"]) == (3, 4)
    assert causes[-1][1] == 300  # the last try: the node's provisioning delay


def test_free_gpus_get_one_use_each() -> None:
    """An 8-GPU pod waits while each of two nodes has 4 free: they are fragments; the
    other pools' free GPUs fit nothing that waits (mismatch); with nothing waiting, every
    free GPU is no_demand. MIG slices count as their fraction, shared GPUs once."""
    c = Cluster(_base(h100={"nodes": 2})())
    c.advance(c.step)
    idle = c.truth.free_gpu_seconds(c.start, c.now)
    assert idle == pytest.approx({("h100", "no_demand"): 16 * 30, ("l4", "no_demand"): 4 * 30,
                                  ("mig", "no_demand"): 1 * 30,
                                  ("t4-spot", "no_demand"): 4 * 30})
    waiting = fragmented(c)
    t = c.now
    c.advance(c.step)
    uses = c.truth.free_gpu_seconds(t, c.now)
    assert uses == pytest.approx({("h100", "fragment"): 8 * 30, ("l4", "mismatch"): 4 * 30,
                                  ("mig", "mismatch"): 1 * 30, ("t4-spot", "mismatch"): 4 * 30})
    assert cause_recorded(c, waiting.uid) == "fragmented"


def test_pending_segments_are_runs_per_thing_and_cause() -> None:
    c = Cluster(_base()())
    waiting = two_trains(c)
    c.advance(3600)
    (seg,) = [s for s in c.truth.pending_segments() if s.uid == waiting.uid]
    assert (seg.kind, seg.namespace, seg.cause, seg.gpus) == ("pod", "team-a", "no_capacity", 8)
    assert (seg.start, seg.end) == (c.start, c.now)
    half = c.start + 1800
    assert c.truth.pending_gpu_seconds(half, c.now) == {"no_capacity": 8 * 1800}
    report = c.truth.report(c.start, half, utilization=False)
    assert [(s.uid, s.end) for s in report.pending] == [(waiting.uid, half)]


# ------------------------------------------------------------------ the demos' weeks


def week_causes(name: str) -> tuple[dict[str, float], dict[str, float], set[tuple[str, str]]]:
    """GPU-hours waited per cause, free GPU-hours per use, and which kinds of things
    (pod, workload) waited for which cause, over the scenario's week."""
    c = Cluster(load_scenario(name))
    c.advance(7 * 86400)
    pending = {k: v / 3600 for k, v in c.truth.pending_gpu_seconds().items()}
    free: dict[str, float] = {}
    for (_, use), v in c.truth.free_gpu_seconds().items():
        free[use] = free.get(use, 0.0) + v / 3600
    return pending, free, {(s.kind, s.cause) for s in c.truth.pending_segments()}


def _show(name: str, pending: dict[str, float], free: dict[str, float]) -> None:
    print(f"\n{name}: GPU-hours waited by cause")
    for cause in CAUSES:
        print(f"  {cause:14s} {pending.get(cause, 0.0):9.1f}")
    print(f"{name}: free GPU-hours by use")
    for use in USES:
        print(f"  {use:14s} {free.get(use, 0.0):9.1f}")


def test_the_demo_week_shows_every_cause_but_kueues() -> None:
    """The default scenario has no Kueue: every other cause takes GPU-hours in its week,
    and stranded GPUs show as fragments and as pools nothing waiting fits."""
    pending, free, kinds = week_causes("default")
    _show("default", pending, free)
    assert set(pending) == set(CAUSES) - {"quota"}
    assert all(v > 1 for v in pending.values()), pending
    assert {"fragment", "mismatch", "no_demand"} <= set(free)
    assert {kind for kind, _ in kinds} == {"pod"}


def test_the_kueue_week_holds_jobs_back_for_quota_and_after_preemption() -> None:
    """Workloads wait for quota, and evicted ones wait again to be re-admitted."""
    pending, free, kinds = week_causes("kueue")
    _show("kueue", pending, free)
    assert pending["quota"] > pending["preempted"] > 1
    assert {("workload", "quota"), ("workload", "preempted")} <= kinds
    assert free["quota"] > 0, "free GPUs only quota-held Workloads could use"

