"""A replayed trace in the simulator: jobs submitted at their times with their own run and
profile, jobs carried in from before the start, the placement policy, and the run time a
Spot reclaim costs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from simulator.cluster import Cluster, Pod
from simulator.scenario import Scenario, ScenarioError

STEP = 30.0


def job(name: str, workload: str, at: float, run: float, profile: str = "healthy"
        ) -> dict[str, Any]:
    return {"name": name, "workload": workload, "at": at, "run": run, "profile": profile}


def pods_of(c: Cluster, job_name: str) -> list[Pod]:
    return sorted((p for p in c.pods.values() if p.job.name == job_name), key=lambda p: p.name)


def test_a_traced_job_is_submitted_at_its_time_with_its_run_and_profile(
        make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario(jobs=[job("ablation-7", "half", at=600, run=3600,
                                        profile="comm_bound")]))
    c.advance(570)
    assert pods_of(c, "ablation-7") == [], "not before its time"
    c.advance(STEP)
    [pod] = pods_of(c, "ablation-7")
    assert pod.created_at == c.start + 600 and pod.scheduled_at == c.start + 600
    assert pod.job.profile == "comm_bound" and pod.gpus == 4
    assert pod.name.startswith("ablation-7-")
    c.advance(3600 - STEP)
    assert pod.phase == "Running"
    c.advance(STEP)
    assert pod.phase == "Succeeded" and pod.finished_at == c.start + 600 + 3600


def test_a_job_carried_in_was_created_before_the_start_and_runs_from_it(
        make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario(jobs=[job("old", "train", at=-7200, run=900)]))
    [pod] = pods_of(c, "old")
    assert pod.created_at == c.start - 7200
    assert pod.scheduled_at == c.start and pod.phase == "Running"
    assert c.truth.pods[pod.uid].created_at == c.start - 7200
    c.advance(900)
    assert pod.phase == "Succeeded"


def test_traced_jobs_queue_behind_each_other_first_come_first_served(
        make_scenario: Callable[..., Scenario]) -> None:
    """Two 8-GPU jobs on the one 8-GPU node: the second waits for the first to end."""
    c = Cluster(make_scenario(jobs=[job("a", "train", 0, 1800), job("b", "train", 60, 600)]))
    c.advance(1800)
    [a], [b] = pods_of(c, "a"), pods_of(c, "b")
    assert a.phase == "Succeeded" and b.scheduled_at == c.start + 1800
    assert b.scheduled_at - b.created_at == 1740


@pytest.mark.parametrize(("placement", "same_node"), [("compact", True), ("spread", False)])
def test_the_placement_policy_packs_or_spreads(make_scenario: Callable[..., Scenario],
                                                placement: str, same_node: bool) -> None:
    data: dict[str, Any] = {"placement": placement, "jobs": [job("x", "half", 0, 600),
                                                             job("y", "half", 0, 600)]}
    scenario = make_scenario(**data)
    scenario = scenario.model_copy(update={"pools": [
        scenario.pools[0].model_copy(update={"nodes": 2}), *scenario.pools[1:]]})
    c = Cluster(scenario)
    [x], [y] = pods_of(c, "x"), pods_of(c, "y")
    assert x.node is not None and y.node is not None
    assert (x.node is y.node) == same_node


@pytest.mark.parametrize(("restart_cost", "left"), [(0, 3600 - 1200), (600, 3600 - 600),
                                                    (3000, 3600)])
def test_a_reclaim_costs_the_pods_it_ends_their_restart_cost(
        make_scenario: Callable[..., Scenario], restart_cost: float, left: float) -> None:
    """A pod that ran 20 minutes of an hour is reclaimed: its replacement runs what was
    left, plus the work since its last checkpoint (never more than it had done)."""
    c = Cluster(make_scenario(
        jobs=[job("sweep", "spotjob", 0, 3600)],
        faults=[{"at": "20m", "kind": "spot_preemption", "pool": "t4-spot",
                 "restart_cost": restart_cost}]))
    c.advance(1200)
    [reclaimed] = [p for p in pods_of(c, "sweep") if p.reason == "Terminated"]
    [replacement] = [p for p in pods_of(c, "sweep") if p is not reclaimed]
    assert replacement.remaining_seconds == left


def test_restart_cost_belongs_to_spot_reclaims(make_scenario: Callable[..., Scenario]) -> None:
    with pytest.raises(ScenarioError, match="restart_cost is only for kind spot_preemption"):
        make_scenario(faults=[{"at": 0, "kind": "node_not_ready", "node": "h100/0",
                               "restart_cost": 60}])


@pytest.mark.parametrize(("jobs", "error"), [
    ([job("a", "nope", 0, 60)], r"jobs\[0\] \(a\): workload 'nope' is not a workload of Jobs"),
    ([job("a", "urgent", 0, 60), job("a", "half", 5, 60)],
     "jobs: name 'team-b/a' is used twice"),
    ([job("a", "train", 0, 0)], "run must be positive"),
])
def test_a_bad_traced_job_is_named(make_scenario: Callable[..., Scenario],
                                   jobs: list[dict[str, Any]], error: str) -> None:
    with pytest.raises(ScenarioError, match=error):
        make_scenario(jobs=jobs)


def test_jobs_of_one_name_in_two_namespaces_are_two_jobs(
        make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario(jobs=[job("a", "train", 0, 60), job("a", "urgent", 0, 60)]))
    assert {p.namespace for p in c.pods.values() if p.job.name == "a"} == {"team-a", "team-b"}
