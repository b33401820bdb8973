"""The scheduler: never over-allocates, priority then FIFO, a pod waits iff nothing fits."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from simulator.cluster import Cluster, Pod
from simulator.objects import rfc3339
from simulator.scenario import Scenario, load_scenario
from simulator.store import Event


def check_invariants(c: Cluster) -> None:
    held: dict[str, int] = {}
    for node in c.live_nodes():
        for unit, pod in enumerate(node.units):
            if pod is not None:
                assert pod.node is node and unit in pod.units, "unit held by a stranger"
                assert pod.phase == "Running" or (
                    pod.phase == "Pending" and pod.running_at is not None
                    and pod.running_at > c.now), "a pod holds GPUs it neither uses nor starts on"
                held[pod.uid] = held.get(pod.uid, 0) + 1
        assert len(node.units) == node.pool.gpus_per_node * node.pool.units_per_gpu
    for pod in c.pods.values():
        if pod.phase == "Running" or (pod.node is not None and pod.phase == "Pending"):
            assert held.get(pod.uid) == pod.gpus, f"{pod.name} holds the wrong GPU count"
        else:
            assert pod.uid not in held
    for pod in c.pending:
        assert pod.phase == "Pending" and pod.node is None
        for node in c.live_nodes():
            fits = node.schedulable and c.placement.eligible(node.pool, pod.workload) and \
                len(node.free_units()) >= pod.gpus
            assert not fits, f"{pod.name} waits although {node.name} fits it"


def test_default_cluster_keeps_invariants_for_two_days() -> None:
    c = Cluster(load_scenario())
    for _ in range(2 * 24 * 4):  # every 15 minutes of two busy days
        c.advance(900)
        check_invariants(c)
    assert c.truth.pods, "jobs arrived"
    assert any(r.scheduled_at and r.scheduled_at > r.created_at for r in c.truth.pods.values()), \
        "some pod queued"


def test_pending_pod_has_unschedulable_condition(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    first = c.submit("train")[0]
    second = c.submit("train")[0]
    assert first.phase == "Running" and second.phase == "Pending"
    obj = c.store.get("Pod", f"team-a/{second.name}")
    assert obj is not None
    cond = obj["status"]["conditions"][0]
    assert cond["type"] == "PodScheduled" and cond["status"] == "False"
    assert cond["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    assert "spec" in obj and "nodeName" not in obj["spec"]


@pytest.mark.parametrize(("grace", "stamped"), [
    (0, False),   # --force --grace-period=0: gone at once, as it last was
    (30, True),   # graceful: holds its GPUs until its deletionTimestamp, then removed
], ids=["forced", "graceful"])
def test_deleting_a_running_pod_frees_its_gpus(grace: int, stamped: bool,
                                               make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    running, waiting = c.submit("train")[0], c.submit("train")[0]
    c.advance(c.step)  # the replacement its Job makes comes after the waiting pod
    events: list[Event] = []
    c.store.listen(events.append)
    asked = c.now
    c.delete_pod(running, grace_seconds=grace)
    check_invariants(c)
    assert waiting.phase == ("Pending" if stamped else "Running")
    c.advance(grace)
    check_invariants(c)
    assert waiting.phase == "Running" and running.uid not in {p.uid for p in c.pods.values()}
    (gone,) = [e.obj for e in events
               if e.type == "DELETED" and e.obj["metadata"]["uid"] == running.uid]
    assert gone["status"]["phase"] == "Running"
    assert gone["metadata"].get("deletionTimestamp") == (
        rfc3339(asked + grace) if stamped else None)
    assert c.truth.pods[running.uid].phase == "Deleted"


def _run_until_done(c: Cluster, pod: Pod) -> None:
    while pod.phase in ("Pending", "Running"):
        c.advance(c.step)


def test_priority_then_fifo(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    blocker = c.submit("train", run_seconds=600)[0]
    low_early = c.submit("train", run_seconds=600)[0]
    c.advance(60)
    low_late = c.submit("half", run_seconds=600)[0]
    high = c.submit("urgent", run_seconds=600)[0]
    assert [p.phase for p in (low_early, low_late, high)] == ["Pending"] * 3
    _run_until_done(c, blocker)
    # The high-priority pod goes first although it came last.
    assert high.phase == "Running" and low_early.phase == "Pending"
    _run_until_done(c, high)
    # Then FIFO among equals: the earlier 8-GPU pod before the later 4-GPU pod.
    assert low_early.phase == "Running" and low_late.phase == "Pending"
    assert high.scheduled_at is not None and low_early.scheduled_at is not None
    assert high.scheduled_at < low_early.scheduled_at


def test_smaller_pod_is_not_blocked_by_a_waiting_bigger_one(
        make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    c.submit("half", run_seconds=3600)
    big = c.submit("urgent")[0]      # needs 8, only 4 free: waits
    small = c.submit("half")[0]      # needs 4: fits now, not blocked by the bigger pod
    assert big.phase == "Pending" and small.phase == "Running"
    check_invariants(c)


def test_scheduled_time_is_the_transition_time(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    c.submit("train", run_seconds=900)
    waiting = c.submit("train", run_seconds=60)[0]
    c.advance(900)
    obj = c.store.get("Pod", f"team-a/{waiting.name}")
    assert obj is not None
    cond = next(x for x in obj["status"]["conditions"] if x["type"] == "PodScheduled")
    assert cond["status"] == "True"
    assert cond["lastTransitionTime"] == "2026-11-16T00:15:00Z"
    assert obj["metadata"]["creationTimestamp"] == "2026-11-16T00:00:00Z"
    assert c.truth.pods[waiting.uid].scheduled_at == waiting.scheduled_at


def test_time_shared_pool_packs_clients_per_gpu(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    pods = [c.submit("shared")[0] for _ in range(9)]
    running = [p for p in pods if p.phase == "Running"]
    assert len(running) == 8  # 4 GPUs x 2 clients
    node = running[0].node
    assert node is not None
    for gpu in node.gpus:
        assert len(gpu.devices[0].occupants) == 2
    obj = c.store.get("Node", node.name)
    assert obj is not None
    assert obj["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert obj["metadata"]["labels"]["cloud.google.com/gke-max-shared-clients-per-gpu"] == "2"


def test_mig_pool_offers_one_unit_per_instance(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    pods = [c.submit("slice")[0] for _ in range(8)]
    assert sum(p.phase == "Running" for p in pods) == 7  # 1g.5gb: seven per A100
    node = next(n for n in c.live_nodes() if n.pool.name == "mig")
    assert [d.info.instance_id for d in node.gpus[0].devices] == [7, 8, 9, 10, 11, 12, 13]
    assert all(len(d.occupants) == 1 for d in node.gpus[0].devices)


def test_autoscaler_adds_nodes_after_the_delay_and_removes_idle_ones(
        make_scenario: Callable[..., Scenario]) -> None:
    s = make_scenario()
    pools = [p.model_dump() for p in s.pools]
    pools[0]["autoscaling"] = {"min_nodes": 1, "max_nodes": 3, "provisioning_delay": "5m",
                               "scale_down_delay": "10m"}
    c = Cluster(make_scenario(pools=pools))
    c.submit("train", run_seconds=1800)
    waiting = c.submit("train", run_seconds=600)[0]
    assert waiting.phase == "Pending"
    c.advance(300)  # the autoscaler notices at the next step, then 5 minutes to provision
    assert waiting.phase == "Pending" and len([n for n in c.live_nodes()
                                               if n.pool.name == "h100"]) == 1
    c.advance(30)
    assert waiting.phase == "Running"
    assert len([n for n in c.live_nodes() if n.pool.name == "h100"]) == 2
    c.advance(3600)
    assert len([n for n in c.live_nodes() if n.pool.name == "h100"]) == 1
