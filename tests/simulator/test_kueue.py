"""Kueue in the simulator: suspended Jobs, Workloads admitted by quota and priority,
borrowing in a cohort, preemption; served as kueue.x-k8s.io/v1beta2, listed by kubectl;
Kueue's own metrics for the same events."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.cluster import Cluster
from simulator.kueue import workload_name
from simulator.scenario import Scenario, ScenarioError, parse_scenario
from simulator.server import SimulatorServer
from tests.conftest import scenario_data
from tests.simulator.test_kubectl import kubectl

KUEUE = {
    "cluster_queues": [
        {"name": "research", "cohort": "gpus", "preemption": "LowerPriority",
         "flavors": [{"accelerator": "nvidia-h100-80gb", "nominal_gpus": 8}]},
        {"name": "batch", "cohort": "gpus",
         "flavors": [{"accelerator": "nvidia-h100-80gb", "nominal_gpus": 0,
                      "borrowing_limit_gpus": 4}]},
    ],
    "local_queues": [{"name": "research", "namespace": "team-a", "cluster_queue": "research"},
                     {"name": "batch", "namespace": "team-b", "cluster_queue": "batch"}],
}


def kueue_scenario(**overrides: Any) -> Scenario:
    """The small test cluster (one 8-GPU H100 node) with Kueue: team-a's "train" (low
    priority) and "urgent" (high) queued in ClusterQueue research (8 GPUs, preempting lower
    priorities), team-b's "half" (4 GPUs) in batch, which has no quota of its own and
    borrows the cohort's."""
    data = scenario_data(kueue=KUEUE, **overrides)
    for w in data["workloads"]:
        if w["name"] in ("train", "urgent"):
            w["namespace"], w["queue"] = "team-a", "research"
        if w["name"] == "half":
            w["queue"] = "batch"
    return parse_scenario(data, "kueue")


def workloads(c: Cluster) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in c.store.list_objects("Workload")}


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((x for x in obj["status"]["conditions"] if x["type"] == kind), None)


def test_a_queued_job_has_a_workload_and_no_pod_until_admitted() -> None:
    c = Cluster(kueue_scenario())
    first = c.submit("train", run_seconds=3600)
    second = c.submit("train", run_seconds=3600)   # 8 more GPUs: over research's quota
    assert len(first) == 1 and second == []
    wls = workloads(c)
    assert len(wls) == 2
    job = first[0].job
    admitted = wls[workload_name(job.name, job.uid)]
    assert admitted["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert admitted["metadata"]["ownerReferences"][0] | {"kind": "Job", "name": job.name} \
        == admitted["metadata"]["ownerReferences"][0]
    assert condition(admitted, "Admitted")["status"] == "True"  # type: ignore[index]
    assert admitted["status"]["admission"]["clusterQueue"] == "research"
    waiting = next(o for n, o in wls.items() if n != admitted["metadata"]["name"])
    reserved = condition(waiting, "QuotaReserved")
    assert reserved is not None and (reserved["status"], reserved["reason"]) == ("False", "Pending")
    pod = c.store.get("Pod", f"team-a/{first[0].name}")
    assert pod is not None
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "main"
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == admitted["metadata"]["name"]
    cq = c.store.get("ClusterQueue", "research")
    assert cq is not None and cq["status"]["pendingWorkloads"] == 1
    assert cq["status"]["flavorsReservation"][0]["resources"][0]["total"] == "8"
    # the first ends: the second is admitted then, its pods created then
    c.advance(3600 + 60)
    t1 = c.truth.workloads[waiting["metadata"]["uid"]]
    assert len(t1.admissions) == 1
    queued, at = t1.admissions[0]
    assert queued == t1.created_at == c.start and at == pytest.approx(c.start + 3600 + 30)
    pods = [p for p in c.pods.values() if p.job.queued is not None
            and p.job.queued.uid == t1.uid]
    assert pods and pods[0].created_at == at


def test_a_clusterqueue_without_quota_borrows_its_cohorts_unused_quota() -> None:
    c = Cluster(kueue_scenario())
    assert len(c.submit("half", run_seconds=600)) == 1   # 4 GPUs borrowed from research
    assert c.submit("half", run_seconds=600) == []       # its borrowing limit is 4
    cq = c.store.get("ClusterQueue", "batch")
    assert cq is not None
    assert cq["status"]["flavorsUsage"][0]["resources"][0] == {
        "name": "nvidia.com/gpu", "total": "4", "borrowed": "4"}
    assert c.submit("train", run_seconds=600) == []      # research's 8: 4 are lent now


def test_a_higher_priority_workload_preempts_and_the_evicted_one_is_requeued() -> None:
    c = Cluster(kueue_scenario())
    low = c.submit("train", run_seconds=7200)
    c.advance(600)
    high = c.submit("urgent", run_seconds=600)
    assert len(high) == 1 and low[0].deleted
    low_wl = low[0].job.queued
    assert low_wl is not None and low_wl.admitted_at is None
    obj = c.store.get("Workload", f"team-a/{low_wl.name}")
    assert obj is not None
    assert condition(obj, "Evicted")["reason"] == "Preempted"  # type: ignore[index]
    assert condition(obj, "Requeued")["status"] == "True"  # type: ignore[index]
    evicted_at = c.now
    c.advance(1200)   # urgent ends at 600 s: the evicted one comes back, waited from requeue
    record = c.truth.workloads[low_wl.uid]
    assert record.evictions == [evicted_at]
    assert record.admissions[-1][0] == evicted_at
    assert low_wl.admitted_at is not None
    kueue = c.kueue
    assert kueue is not None
    assert sorted(kueue.admission_waits["research", "low"]) == pytest.approx(
        [0.0, low_wl.admitted_at - evicted_at])


def test_kueues_own_metrics_count_the_same_admissions() -> None:
    c = Cluster(kueue_scenario())
    c.submit("train", run_seconds=3600)
    c.submit("train", run_seconds=3600)
    c.submit("half", run_seconds=600)   # nothing to borrow: research uses its 8
    kueue = c.kueue
    assert kueue is not None
    families = {f.name: f for f in text_string_to_metric_families(kueue.exposition())}
    waits = {(s.labels["cluster_queue"], s.labels["le"]): s.value
             for s in families["kueue_admission_wait_time_seconds"].samples
             if s.name.endswith("_bucket")}
    assert waits == {("research", le): 1.0 for _, le in waits}
    pending = {(s.labels["cluster_queue"], s.labels["status"]): s.value
               for s in families["kueue_pending_workloads"].samples}
    assert pending == {("research", "active"): 0, ("research", "inadmissible"): 1,
                       ("batch", "active"): 0, ("batch", "inadmissible"): 1}
    quota = {s.labels["cluster_queue"]: s.value
             for s in families["kueue_cluster_queue_nominal_quota"].samples}
    assert quota == {"research": 8, "batch": 0}


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["workloads"][0].update(queue="nowhere"), "is not a LocalQueue of namespace"),
    (lambda d: d["kueue"]["local_queues"][0].update(cluster_queue="x"), "cluster_queue 'x'"),
    (lambda d: d["kueue"]["cluster_queues"][0].update(cohort=None, flavors=[
        {"accelerator": "nvidia-h100-80gb", "nominal_gpus": 8, "borrowing_limit_gpus": 1}]),
     "borrowing_limit_gpus needs a cohort"),
    (lambda d: d["workloads"][4].update(queue="research", namespace="team-a"),
     "has no quota for nvidia-tesla-a100"),
])
def test_kueue_references_are_checked(change: Callable[[dict[str, Any]], None],
                                      message: str) -> None:
    data = kueue_scenario().model_dump(mode="json")
    change(data)
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(data, "kueue")


def test_without_kueue_a_queue_is_only_a_label() -> None:
    data = scenario_data()
    data["workloads"][0]["queue"] = "research"
    c = Cluster(parse_scenario(data, "plain"))
    assert len(c.submit("train", run_seconds=600)) == 1
    assert c.kueue is None and c.store.list_objects("Workload") == []


async def test_kubectl_lists_workloads_and_queues(make_server: Callable[..., Any],
                                                  tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(kueue_scenario())
    sim.cluster.submit("train", run_seconds=3600)
    sim.cluster.submit("train", run_seconds=3600)
    await sim.advance(60)
    config = sim.write_outputs(tmp_path).kubeconfig
    out = await kubectl(config, "get", "workloads", "-n", "team-a")
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "QUEUE", "RESERVED", "IN", "ADMITTED", "FINISHED", "AGE"]
    assert len(rows) == 2 and all(r.split()[1] == "research" for r in rows)
    assert sorted(r.split()[2] for r in rows) == ["False", "research"] or \
        sum("True" in r for r in rows) == 1
    out = await kubectl(config, "get", "clusterqueues")
    assert out.splitlines()[0].split() == ["NAME", "COHORT", "PENDING", "WORKLOADS"]
    rows = {r.split()[0]: r.split() for r in out.splitlines()[1:]}
    assert rows["research"][1:] == ["gpus", "1"] and rows["batch"][1:] == ["gpus", "0"]
    out = await kubectl(config, "get", "localqueues", "-A")
    assert {tuple(r.split()[:3]) for r in out.splitlines()[1:]} == {
        ("team-a", "research", "research"), ("team-b", "batch", "batch")}
    out = await kubectl(config, "get", "cq", "research", "-o", "jsonpath={.spec.cohortName}")
    assert out == "gpus"


async def test_kubernetes_asyncio_lists_and_watches_workloads(make_server: Callable[..., Any],
                                                              tmp_path: Path) -> None:
    from kubernetes_asyncio import client, config, watch

    sim: SimulatorServer = await make_server(kueue_scenario())
    sim.cluster.submit("train", run_seconds=3600)
    kubeconfig = sim.write_outputs(tmp_path).kubeconfig
    api = await config.new_client_from_config(config_file=str(kubeconfig))
    async with api:
        custom = client.CustomObjectsApi(api)
        listed = await custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                         "workloads")
        assert [w["spec"]["queueName"] for w in listed["items"]] == ["research"]
        queues = await custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                         "clusterqueues")
        assert {q["metadata"]["name"] for q in queues["items"]} == {"research", "batch"}
        sim.cluster.submit("half", run_seconds=600)
        await sim.advance(sim.cluster.step)
        seen = []
        async with watch.Watch().stream(
                custom.list_namespaced_custom_object, "kueue.x-k8s.io", "v1beta2", "team-b",
                "workloads", resource_version=listed["metadata"]["resourceVersion"],
                timeout_seconds=2) as stream:
            async for event in stream:
                seen.append((event["type"], event["object"]["spec"]["queueName"]))
                break
        assert seen == [("ADDED", "batch")]
    out = await kubectl(kubeconfig, "get", "workloads,clusterqueues", "-A")
    assert "workload.kueue.x-k8s.io/" in out and "clusterqueue.kueue.x-k8s.io/research" in out


def test_the_workloads_conditions_say_what_kueue_says() -> None:
    """Not admitted: how much more quota it needs; preempted: by whom, then requeued;
    admitted again: its eviction becomes a thing of the past."""
    c = Cluster(kueue_scenario())
    c.submit("half", run_seconds=7200)                  # batch borrows 4 of research's 8
    c.submit("half", run_seconds=600)                   # batch may borrow no more
    waiting = next(w for w in workloads(c).values()
                   if condition(w, "QuotaReserved")["status"] == "False")  # type: ignore[index]
    assert condition(waiting, "QuotaReserved")["message"] == (  # type: ignore[index]
        "couldn't assign flavors to pod set main: insufficient unused quota for "
        "nvidia.com/gpu in flavor nvidia-h100-80gb, 4 more needed")
    c = Cluster(kueue_scenario())
    low = c.submit("train", run_seconds=7200)[0].job.queued
    c.advance(600)
    high = c.submit("urgent", run_seconds=600)[0].job.queued
    assert low is not None and high is not None
    obj = workloads(c)[low.name]
    said = (f"Preempted to accommodate a workload (UID: {high.uid}, JobUID: {high.job_uid}) "
            "due to prioritization in the ClusterQueue; preemptor path: /gpus/research; "
            "preemptee path: /gpus/research")
    for kind, reason in (("Evicted", "Preempted"), ("Preempted", "InClusterQueue"),
                         ("Requeued", "Preempted")):
        cond = condition(obj, kind)
        assert cond is not None and (cond["status"], cond["reason"], cond["message"]) == (
            "True", reason, said), kind
    reserved = condition(obj, "QuotaReserved")
    assert reserved is not None and reserved["status"] == "False"
    c.advance(1200)
    obj = workloads(c)[low.name]
    evicted = condition(obj, "Evicted")
    assert evicted is not None and (evicted["status"], evicted["reason"], evicted["message"]) \
        == ("False", "QuotaReserved", f"Previously: {said}")
    assert condition(obj, "Admitted")["status"] == "True"  # type: ignore[index]
