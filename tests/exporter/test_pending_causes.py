"""The pending causes and the use of free GPUs (``exporter.model.pending``), case by case."""

from __future__ import annotations

import pytest

from exporter.model.pending import (
    SCALE_UP_PATIENCE_SECONDS,
    Demand,
    Evidence,
    Said,
    decide,
    fits,
    free_units,
    pools_free,
    room,
    selects,
    use_of,
)
from exporter.model.records import (
    NodeInfo,
    PodConstraints,
    PodInfo,
    Requirement,
    Taint,
    Toleration,
)

A100 = {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
        "cloud.google.com/gke-nodepool": "a100"}
MIG = {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
       "cloud.google.com/gke-nodepool": "a100-mig",
       "cloud.google.com/gke-gpu-partition-size": "1g.5gb"}
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")
SPOT_TAINT = Taint("cloud.google.com/gke-spot", "true", "NoSchedule")
GPU_OK = Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule")
NOT_MIG = (Requirement("cloud.google.com/gke-gpu-partition-size", "DoesNotExist"),)
WANTS_A100 = PodConstraints({"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"},
                            (NOT_MIG,), (GPU_OK,))
NOW = 1_800_000_000.0


def node(name: str, labels: dict[str, str], gpus: int = 8, *, ready: bool = True,
         taints: tuple[Taint, ...] = (GPU_TAINT,), mig: str | None = None,
         clients: int = 1) -> NodeInfo:
    return NodeInfo(name=name, pool=labels["cloud.google.com/gke-nodepool"],
                    accelerator=labels["cloud.google.com/gke-accelerator"],
                    provisioning="on-demand", zone="us-central1-b",
                    instance_type="a2-highgpu-8g", ready=ready, capacity_gpus=gpus,
                    allocatable_gpus=gpus, clients_per_gpu=clients, mig_profile=mig,
                    address="10.0.0.1", labels=labels, taints=taints)


def bound(name: str, node_name: str, gpus: int, phase: str = "Running") -> PodInfo:
    return PodInfo(uid=name, namespace="ml", name=name, node=node_name, phase=phase,
                   gpus=gpus, created_unix=0.0, scheduled_unix=0.0, finished_unix=None,
                   labels={}, workload=name, owner_kind="Job", priority=0,
                   priority_class="", queue=None, accelerator=None, reason=None)


@pytest.mark.parametrize(("constraints", "labels", "taints", "expected"), [
    (WANTS_A100, A100, (GPU_TAINT,), True),
    (WANTS_A100, MIG, (GPU_TAINT,), False),  # DoesNotExist keeps it off MIG nodes
    (WANTS_A100, A100, (GPU_TAINT, SPOT_TAINT), False),  # a taint it does not tolerate
    (WANTS_A100, A100, (GPU_TAINT, Taint("node.kubernetes.io/unreachable", "", "NoExecute")),
     True),  # a node's condition says "not now", not "never"
    (WANTS_A100, A100, (GPU_TAINT, Taint("x", "y", "PreferNoSchedule")), True),
    (PodConstraints({}, (), (Toleration(None, "Exists", "", None),)), A100,
     (GPU_TAINT, SPOT_TAINT), True),  # tolerates everything
    (PodConstraints({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, (), (GPU_OK,)),
     A100, (GPU_TAINT,), False),
])
def test_a_node_fits_a_pod_by_its_labels_and_taints(constraints: PodConstraints,
                                                    labels: dict[str, str],
                                                    taints: tuple[Taint, ...],
                                                    expected: bool) -> None:
    assert fits(constraints, 4, node("n", labels, taints=taints)) is expected


@pytest.mark.parametrize(("req", "labels", "expected"), [
    (Requirement("k", "In", ("a", "b")), {"k": "b"}, True),
    (Requirement("k", "In", ("a",)), {}, False),
    (Requirement("k", "NotIn", ("a",)), {}, True),
    (Requirement("k", "NotIn", ("a",)), {"k": "a"}, False),
    (Requirement("k", "Exists"), {"k": ""}, True),
    (Requirement("k", "DoesNotExist"), {"k": ""}, False),
    (Requirement("k", "Gt", ("4",)), {"k": "8"}, True),
    (Requirement("k", "Lt", ("4",)), {"k": "8"}, False),
    (Requirement("k", "Gt", ("4",)), {"k": "many"}, False),
    (Requirement("k", "Near", ("4",)), {"k": "4"}, False),
])
def test_node_affinity_operators(req: Requirement, labels: dict[str, str],
                                 expected: bool) -> None:
    assert selects(PodConstraints({}, ((req,),), ()), labels) is expected


def test_any_affinity_term_will_do_and_an_empty_one_none() -> None:
    terms = ((Requirement("zone", "In", ("a",)),), (Requirement("zone", "In", ("b",)),))
    assert selects(PodConstraints({}, terms, ()), {"zone": "b"})
    assert not selects(PodConstraints({}, ((),), ()), {"zone": "b"})


def test_free_gpus_are_what_bound_pods_leave_on_ready_uncordoned_nodes() -> None:
    nodes = {"a": node("a", A100), "b": node("b", A100, ready=False),
             "c": node("c", A100)}
    pods = [bound("p", "a", 4), bound("q", "a", 2, "Pending"), bound("done", "c", 8,
                                                                    "Succeeded")]
    assert free_units(nodes, pods) == {"a": 2, "b": 0, "c": 8}


SCHED = Said("0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) didn't "
             "match Pod's node affinity/selector.", "default-scheduler", NOW - 60)
TRIGGERED = Said("pod triggered scale-up: [{https://www.googleapis.com/compute/v1/projects/p/"
                 "zones/us-central1-b/instanceGroups/gke-demo-a100-1234abcd-grp 1->2 "
                 "(max: 4)}]", "cluster-autoscaler", NOW - 120)
FAILED = Said("Node scale up in zones us-central1-b associated with this pod failed: GCE out "
              "of resources. Pod is at risk of not being scheduled.", "cluster-autoscaler",
              NOW - 30)
QUOTA = Said("couldn't assign flavors to pod set main: insufficient unused quota for "
             "nvidia.com/gpu in flavor a100, 4 more needed", "kueue", NOW - 300)


def _room(free: dict[str, int], seen: bool = True) -> tuple[dict[str, NodeInfo], dict[str, int],
                                                            dict[str, NodeInfo]]:
    nodes = {n: node(n, A100) for n in free}
    shapes = {"a100": node("shape", A100)} if seen else {}
    return nodes, free, shapes


@pytest.mark.parametrize(("evidence", "free", "seen", "cause", "words"), [
    (Evidence(4, WANTS_A100, scheduled=True, starting=Said("ContainerCreating", "kubelet")),
     {"a": 0}, True, "starting", "ContainerCreating"),
    (Evidence(4, WANTS_A100, preempted=Said("replaces p-0", "exporter"), held=QUOTA),
     {"a": 8}, True, "preempted", "replaces p-0"),
    (Evidence(4, WANTS_A100, held=QUOTA), {"a": 8}, True, "quota", QUOTA.words),
    (Evidence(4, WANTS_A100, scheduler=SCHED), {}, False, "unschedulable", SCHED.words),
    (Evidence(4, WANTS_A100, scheduler=SCHED, scale_up="no_group"), {}, False,
     "unschedulable", SCHED.words),
    (Evidence(4, WANTS_A100, scheduler=SCHED, scale_up="failed", scale_up_said=FAILED),
     {"a": 2, "b": 2}, True, "stockout", FAILED.words),
    (Evidence(4, WANTS_A100, scheduler=SCHED), {"a": 2, "b": 2}, True, "fragmented",
     SCHED.words),
    (Evidence(4, WANTS_A100, scheduler=SCHED, scale_up="triggered", scale_up_said=TRIGGERED),
     {"a": 2}, True, "scaling_up", TRIGGERED.words),
    # a pool scaled to zero the exporter never saw: the autoscaler's word is what shows it
    (Evidence(4, WANTS_A100, scheduler=SCHED, scale_up="triggered", scale_up_said=TRIGGERED),
     {}, False, "scaling_up", TRIGGERED.words),
    (Evidence(4, WANTS_A100, scheduler=SCHED, scale_up="triggered",
              scale_up_said=Said(TRIGGERED.words, "cluster-autoscaler",
                                 NOW - SCALE_UP_PATIENCE_SECONDS - 1)),
     {"a": 2}, True, "no_capacity", SCHED.words),
    (Evidence(4, WANTS_A100, scheduler=SCHED), {"a": 2}, True, "no_capacity", SCHED.words),
    (Evidence(4, WANTS_A100, scheduler=SCHED), {}, True, "no_capacity", SCHED.words),
    (Evidence(4, WANTS_A100, provisioning="pending",
              provisioning_said=Said("Waiting for resources.", "kueue")), {}, False,
     "scaling_up", "Waiting for resources."),
    (Evidence(4, WANTS_A100, provisioning="failed",
              provisioning_said=Said("Provisioning failed.", "kueue")), {}, False,
     "stockout", "Provisioning failed."),
])
def test_the_first_cause_that_holds_is_the_one(evidence: Evidence, free: dict[str, int],
                                               seen: bool, cause: str, words: str) -> None:
    nodes, free_gpus, shapes = _room(free, seen)
    verdict = decide(evidence, room(WANTS_A100, 4, nodes, free_gpus, shapes), NOW)
    assert verdict.cause == cause
    assert verdict.said is not None and verdict.said.words == words


def test_a_waiting_pod_goes_to_the_pool_it_fits_with_the_most_free_gpus() -> None:
    other = {**A100, "cloud.google.com/gke-nodepool": "a100-b"}
    nodes = {"a": node("a", A100), "b": node("b", other), "c": node("c", other)}
    where = room(WANTS_A100, 4, nodes, {"a": 3, "b": 2, "c": 2}, {})
    assert where.pool == "a100-b"
    assert room(WANTS_A100, 4, {}, {}, {"a100": node("x", A100)}).pool == "a100"
    assert room(WANTS_A100, 4, {}, {}, {}).pool == ""


def test_a_node_too_small_for_the_pod_is_not_room_for_it() -> None:
    nodes = {"a": node("a", A100, gpus=2)}
    assert not room(WANTS_A100, 4, nodes, {"a": 2}, {"a100": nodes["a"]}).free


FOUR = Demand(WANTS_A100, 4)
ONE_MIG = Demand(PodConstraints({"cloud.google.com/gke-gpu-partition-size": "1g.5gb"}, (),
                                (GPU_OK,)), 1)


@pytest.mark.parametrize(("labels", "units", "demands", "use"), [
    (A100, 4, [FOUR], "usable"),
    (A100, 2, [FOUR], "fragment"),
    (A100, 4, [Demand(WANTS_A100, 4, held=True)], "quota"),
    (A100, 2, [Demand(WANTS_A100, 4, held=True)], "mismatch"),
    (MIG, 7, [FOUR], "mismatch"),  # a MIG pool the 4-GPU pods can never use
    (MIG, 7, [FOUR, ONE_MIG], "usable"),
    (A100, 8, [], "no_demand"),
])
def test_what_could_use_a_nodes_free_gpus(labels: dict[str, str], units: int,
                                          demands: list[Demand], use: str) -> None:
    assert use_of(node("n", labels), units, demands) == use


@pytest.mark.parametrize(("free", "demands", "fragmentation"), [
    ({"a": 4, "b": 2}, [FOUR], 2 / 6),  # b's two cannot take the 4-GPU pod
    ({"a": 4, "b": 2}, [Demand(WANTS_A100, 1)], 0.0),  # a 1-GPU pod fits either
    ({"a": 2, "b": 2}, [FOUR], 1.0),  # four free, but never on one node
    ({"a": 4, "b": 2}, [], None),  # nothing waits: idle, not fragmented
    ({"a": 4, "b": 2}, [ONE_MIG], None),  # only a pod of another pool waits
    ({"a": 4, "b": 2}, [Demand(WANTS_A100, 4, held=True)], None),  # Kueue holds it back
])
def test_fragmentation_is_against_the_pods_waiting_for_the_pool(
        free: dict[str, int], demands: list[Demand], fragmentation: float | None) -> None:
    nodes = {"a": node("a", A100), "b": node("b", A100)}
    got = pools_free(nodes, free, demands, {})["a100"].fragmentation
    assert got == (None if fragmentation is None else pytest.approx(fragmentation))


def test_pools_free_counts_physical_gpus_and_their_cost_and_fragmentation() -> None:
    """Fragmentation is against the pods waiting for the pool (``fragmentation``)."""
    nodes = {"a": node("a", A100), "b": node("b", A100),
             "m": node("m", MIG, gpus=7, mig="1g.5gb")}
    free = {"a": 2, "b": 1, "m": 7}
    out = pools_free(nodes, free, [FOUR], {"a": 3.0, "b": 3.0, "m": 3.5})
    assert out["a100"].gpus == {"fragment": 3.0}
    assert out["a100"].cost_usd_per_hour == {"fragment": 9.0}
    assert out["a100"].fragmentation == 1.0, "a 4-GPU pod waits: every free GPU a fragment"
    assert out["a100-mig"].gpus == {"mismatch": pytest.approx(1.0)}
    assert out["a100-mig"].fragmentation is None, "no pod that fits it waits: no figure"
