"""Each definition in exporter.model.compute, as a table of cases."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.model import compute
from exporter.model.compute import DeviceIdentity, Owner
from exporter.model.records import DeviceReading, PodOnDevice
from exporter.sources.kube import NodeInfo, PodInfo

U = "GPU-0000"


@pytest.mark.parametrize(("fields", "expected"), [
    ({"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.156, "DCGM_FI_DEV_GPU_UTIL": 91}, (0.156,
                                                                            "gr_engine_active")),
    ({"DCGM_FI_DEV_GPU_UTIL": 91}, (0.91, "gpu_util")),
    ({"DCGM_FI_DEV_FB_USED": 10}, (None, None)),          # unknown stays unknown
    ({"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1.2}, (1.0, "gr_engine_active")),
    ({compute.DUTY_CYCLE: 37}, (0.37, "duty_cycle")),  # GKE system metric, no DCGM
    ({compute.DUTY_CYCLE: 37, "DCGM_FI_DEV_GPU_UTIL": 40}, (0.40, "gpu_util")),
])
def test_utilization(fields: dict[str, float], expected: tuple[Any, Any]) -> None:
    assert compute.utilization(fields) == expected


MIB = 1024 * 1024


@pytest.mark.parametrize(("fields", "expected"), [
    ({"DCGM_FI_DEV_FB_USED": 10, "DCGM_FI_DEV_FB_FREE": 20, "DCGM_FI_DEV_FB_RESERVED": 2},
     (10 * MIB, 32 * MIB)),
    ({"DCGM_FI_DEV_FB_USED": 10, "DCGM_FI_DEV_FB_FREE": 20}, (10 * MIB, 30 * MIB)),
    ({"DCGM_FI_DEV_FB_USED": 10}, (10 * MIB, None)),
    ({"DCGM_FI_DEV_FB_FREE": 20}, (None, None)),
    ({compute.ACCELERATOR_MEMORY_USED: 5 * MIB, compute.ACCELERATOR_MEMORY_TOTAL: 16 * MIB},
     (5 * MIB, 16 * MIB)),
    ({"DCGM_FI_DEV_FB_USED": 0, "DCGM_FI_DEV_FB_FREE": 0}, (0.0, 0.0)),
])
def test_memory_bytes(fields: dict[str, float], expected: tuple[Any, Any]) -> None:
    assert compute.memory_bytes(fields) == expected


@pytest.mark.parametrize(("profile", "fraction"), [
    (None, 1.0), ("1g.5gb", 1 / 7), ("2g.10gb", 2 / 7), ("3g.40gb", 3 / 7), ("7g.80gb", 1.0),
])
def test_mig_fraction(profile: str | None, fraction: float) -> None:
    assert compute.mig_fraction(profile) == pytest.approx(fraction)


@pytest.mark.parametrize(("pod_labels", "ns_labels", "team"), [
    ({"team": "a"}, {"team": "b"}, "a"),
    ({}, {"team": "b"}, "b"),
    ({}, {}, "ns"),
])
def test_team(pod_labels: dict[str, str], ns_labels: dict[str, str], team: str) -> None:
    assert compute.team_of(pod_labels, "ns", {"ns": ns_labels}, "team") == team


@pytest.mark.parametrize(("pod_labels", "namespaces", "listed", "team"), [
    ({"team": "a"}, {}, False, "a"),                   # the pod's own label needs nothing
    ({}, {"ns": {"team": "b"}}, False, "b"),           # its namespace's, as last listed
    ({}, {}, False, compute.UNKNOWN_TEAM),             # namespaces never listed: not "ns"
    ({}, {"other": {"team": "b"}}, True, "ns"),        # listed, this one not yet: its name
    ({}, {"ns": {}}, True, "ns"),                      # listed, no label: its name
])
def test_team_without_the_namespaces(pod_labels: dict[str, str],
                                     namespaces: dict[str, dict[str, str]], listed: bool,
                                     team: str) -> None:
    """A team is never the namespace's name guessed while namespaces cannot be listed."""
    assert compute.team_of(pod_labels, "ns", namespaces, "team", listed) == team


@pytest.mark.parametrize(("namespaces", "team"), [
    ({"ns": {"team": "b"}}, "b"),              # the namespace's label
    ({"ns": {"cost-center": "c"}}, "ns"),      # a listed namespace without one: its name
    ({"other": {"team": "b"}}, compute.UNKNOWN_TEAM),  # namespace unknown
    ({}, compute.UNKNOWN_TEAM),                # namespaces not listed
])
def test_owner_of_a_pod_not_in_the_view(namespaces: dict[str, dict[str, str]],
                                        team: str) -> None:
    assert compute.unviewed_owner("ns", "p", namespaces, "team") == \
        Owner("", "ns", "p", team, "p")


CC, NOTE = "cost-center", "billing.example.com/cost-center"


@pytest.mark.parametrize(("pod_labels", "pod_notes", "ns_labels", "label", "note", "value"), [
    ({CC: "cc-1"}, {NOTE: "cc-2"}, {CC: "cc-3"}, CC, NOTE, "cc-1"),  # the pod's label first
    ({}, {NOTE: "cc-2"}, {CC: "cc-3"}, CC, NOTE, "cc-2"),            # then its annotation
    ({}, {}, {CC: "cc-3"}, CC, NOTE, "cc-3"),                         # then its namespace's
    ({}, {}, {}, CC, NOTE, ""),                                       # none
    ({CC: ""}, {}, {CC: "cc-3"}, CC, None, "cc-3"),                   # an empty label: none
    ({}, {NOTE: "cc-2"}, {CC: "cc-3"}, None, NOTE, "cc-2"),           # an annotation alone
    ({}, {}, {NOTE: "cc-3"}, None, NOTE, ""),                         # namespaces: labels only
    ({CC: "cc-1"}, {}, {}, None, None, ""),                           # not configured
])
def test_allocation(pod_labels: dict[str, str], pod_notes: dict[str, str],
                    ns_labels: dict[str, str], label: str | None, note: str | None,
                    value: str) -> None:
    assert compute.allocation_of(pod_labels, pod_notes, "ns", {"ns": ns_labels}, label,
                                 note) == value


@pytest.mark.parametrize(("cost", "utilized", "expected"), [
    (10.0, 3600.0, 10.0),       # fully used: the list price
    (10.0, 1800.0, 20.0),       # half used: a useful GPU-hour costs twice as much
    (10.0, 0.0, None),          # never used: no effective cost, not infinity
])
def test_effective_cost_per_utilized_hour(cost: float, utilized: float,
                                          expected: float | None) -> None:
    assert compute.effective_cost_per_utilized_hour(cost, utilized) == expected


def node(name: str = "n1", **kw: Any) -> NodeInfo:
    base: dict[str, Any] = dict(name=name, pool="p", accelerator="nvidia-l4",
                                provisioning="on-demand", zone="z", instance_type="g2",
                                ready=True, capacity_gpus=1, allocatable_gpus=1,
                                clients_per_gpu=1, mig_profile=None, address="127.0.0.1")
    return NodeInfo(**(base | kw))


def pod(**kw: Any) -> PodInfo:
    base: dict[str, Any] = dict(uid="u", namespace="ns", name="p", node="n1", phase="Running",
                                gpus=1, created_unix=100.0, scheduled_unix=160.0,
                                finished_unix=None,
                                labels={}, workload="w", owner_kind="Job", priority=0,
                                priority_class="", queue=None, accelerator="nvidia-l4",
                                reason=None)
    return PodInfo(**(base | kw))


@pytest.mark.parametrize(("nodes", "reserved", "gpus"), [
    ([node(allocatable_gpus=4)], 0, 4.0),
    ([node(allocatable_gpus=4), node("n2", ready=False)], 0, 4.0),     # NotReady: none
    ([node(allocatable_gpus=8, clients_per_gpu=2)], 0, 4.0),           # time-shared x2
    ([node(allocatable_gpus=7, mig_profile="1g.5gb")], 0, 1.0),        # 7 slices = 1 GPU
    ([node(allocatable_gpus=4)], 1, 3.0),
    ([node(allocatable_gpus=4)], 9, 0.0),
])
def test_available_gpus(nodes: list[NodeInfo], reserved: int, gpus: float) -> None:
    assert compute.available_gpus(nodes, reserved) == pytest.approx(gpus)


@pytest.mark.parametrize(("p", "now", "wait"), [
    (pod(), 1000.0, 60.0),
    (pod(scheduled_unix=None, phase="Pending", node=None), 1000.0, 900.0),
])
def test_queue_wait(p: PodInfo, now: float, wait: float) -> None:
    assert compute.queue_wait_seconds(p, now) == wait


def reading(uuid: str = U, pods: tuple[str, ...] = (), instance: str | None = None,
            **fields: float) -> DeviceReading:
    return DeviceReading(uuid, "0", "n1", "NVIDIA L4", "1g.5gb" if instance else None,
                         instance, [PodOnDevice("ns", p, "c") for p in pods], dict(fields))


OWNERS = {("ns", n): Owner(f"uid-{n}", "ns", n, "t", "w") for n in ("a", "b")}
PRICE = {("nvidia-l4", "on-demand"): 0.7, ("nvidia-l4", "spot"): 0.28,
         ("nvidia-tesla-a100", "on-demand"): 2.8}


def states(nodes: list[NodeInfo], readings: dict[str, list[DeviceReading]],
           unknown: frozenset[str] = frozenset(),
           inventory: dict[str, dict[str, DeviceIdentity]] | None = None,
           discounts: dict[str, float] | None = None) -> list[compute.DeviceState]:
    return compute.device_states({n.name: n for n in nodes}, readings, unknown,
                                 inventory or {}, OWNERS, PRICE, discounts or {})


KNOWN = {"n1": {U: DeviceIdentity(U, U, "0", None)}}


@pytest.mark.parametrize(("case", "n", "readings", "unknown", "state", "reason"), [
    ("held", node(), {"n1": [reading(pods=("a",))]}, frozenset(), "allocated", None),
    ("free", node(), {"n1": [reading()]}, frozenset(), "unallocated", None),
    ("fatal xid", node(), {"n1": [reading(pods=("a",), DCGM_FI_DEV_XID_ERRORS=79)]},
     frozenset(), "unavailable", "xid"),
    ("non-fatal xid", node(), {"n1": [reading(DCGM_FI_DEV_XID_ERRORS=63)]}, frozenset(),
     "unallocated", None),
    ("node not ready", node(ready=False), {}, frozenset(), "unavailable", "node_not_ready"),
    ("gpu gone from dcgm", node(capacity_gpus=2, allocatable_gpus=2),
     {"n1": [reading("GPU-other")]}, frozenset(), "unavailable", "gpu_missing"),
    ("the node's one gpu back under a new uuid: the old one is no device",
     node(), {"n1": [reading("GPU-other")]}, frozenset(), None, None),
    ("endpoint down: unknown", node(), {}, frozenset({"n1"}), None, None),
])
def test_allocation_state(case: str, n: NodeInfo, readings: dict[str, list[DeviceReading]],
                          unknown: frozenset[str], state: str | None,
                          reason: str | None) -> None:
    got = [d for d in states([n], readings, unknown, KNOWN) if d.gpu_uuid == U]
    if state is None:
        assert got == []
    else:
        assert [(d.state, d.reason) for d in got] == [(state, reason)]


def gpu(index: int) -> DeviceReading:
    return DeviceReading(f"GPU-{index}", str(index), "n1", "NVIDIA L4", None, None)


@pytest.mark.parametrize(("case", "n", "readings", "unknown", "expected"), [
    ("Ready, DCGM shows 3 of 4: the fourth is missing", node(capacity_gpus=4),
     {"n1": [gpu(0), gpu(1), gpu(2)]}, frozenset(),
     [("GPU-0", "unallocated", None), ("GPU-1", "unallocated", None),
      ("GPU-2", "unallocated", None), ("n1/k8s-3", "unavailable", "gpu_missing")]),
    ("the lowest index DCGM lacks", node(capacity_gpus=3), {"n1": [gpu(0), gpu(2)]},
     frozenset(), [("GPU-0", "unallocated", None), ("GPU-2", "unallocated", None),
                   ("n1/k8s-1", "unavailable", "gpu_missing")]),
    ("NotReady, exporter down, never seen", node(ready=False, capacity_gpus=2), {},
     frozenset({"n1"}), [("n1/k8s-0", "unavailable", "node_not_ready"),
                         ("n1/k8s-1", "unavailable", "node_not_ready")]),
    ("NotReady, exporter still answering", node(ready=False, capacity_gpus=2),
     {"n1": [gpu(0)]}, frozenset(), [("GPU-0", "unavailable", "node_not_ready"),
                                     ("n1/k8s-1", "unavailable", "node_not_ready")]),
    ("Ready, exporter down: unknown", node(capacity_gpus=2), {}, frozenset({"n1"}), []),
    ("Ready, no exporter covers it: unknown", node(capacity_gpus=2), {}, frozenset(), []),
    ("Ready, exporter answered with no GPU", node(capacity_gpus=1), {"n1": []}, frozenset(),
     [("n1/k8s-0", "unavailable", "gpu_missing")]),
    ("time-shared x2: physical GPUs", node(capacity_gpus=4, clients_per_gpu=2),
     {"n1": [gpu(0)]}, frozenset(), [("GPU-0", "unallocated", None),
                                     ("n1/k8s-1", "unavailable", "gpu_missing")]),
    ("DCGM shows more than Kubernetes: both count", node(capacity_gpus=0),
     {"n1": [gpu(0)]}, frozenset(), [("GPU-0", "unallocated", None)]),
])
def test_devices_kubernetes_counts(case: str, n: NodeInfo,
                                   readings: dict[str, list[DeviceReading]],
                                   unknown: frozenset[str],
                                   expected: list[tuple[str, str, str | None]]) -> None:
    got = states([n], readings, unknown)
    assert [(d.device_id, d.state, d.reason) for d in got] == expected
    assert all(d.price_usd_per_hour == pytest.approx(0.7) and d.fraction == 1.0 for d in got)
    assert all(d.gpu_uuid == d.device_id for d in got if "/k8s-" in d.device_id)


def test_mig_instances_kubernetes_counts_are_slices() -> None:
    n = node(accelerator="nvidia-tesla-a100", mig_profile="1g.5gb", capacity_gpus=7)
    shown = [reading(pods=(), instance=str(i)) for i in range(2)]
    got = states([n], {"n1": shown})
    assert [d.device_id for d in got][2:] == [f"n1/k8s-mig-{i}" for i in range(5)]
    assert [d.state for d in got] == ["unallocated"] * 2 + ["unavailable"] * 5
    assert sum(d.fraction for d in got) == pytest.approx(1.0)


def test_a_gpu_seen_before_and_gone_keeps_its_identity() -> None:
    """Kubernetes adds nothing while the devices DCGM has shown cover its count."""
    inv = {"n1": {"GPU-0": DeviceIdentity("GPU-0", "GPU-0", "0", None),
                  "GPU-1": DeviceIdentity("GPU-1", "GPU-1", "1", None)}}
    got = states([node(capacity_gpus=2)], {"n1": [gpu(0)]}, inventory=inv)
    assert [(d.device_id, d.reason) for d in got] == [("GPU-0", None),
                                                      ("GPU-1", "gpu_missing")]


@pytest.mark.parametrize(("case", "readings", "state"), [
    ("known GPU no container holds: idle", {"n1": [reading("GPU-other")]}, "unallocated"),
    ("node with no GPU in use: its known GPUs idle", {}, "unallocated"),
    ("held", {"n1": [reading(pods=("a",))]}, "allocated"),
])
def test_per_container_readings_cannot_tell_missing_from_idle(
        case: str, readings: dict[str, list[DeviceReading]], state: str) -> None:
    got = compute.device_states({"n1": node()}, readings, frozenset(), KNOWN, OWNERS, PRICE,
                                {}, complete=False)
    assert [(d.state, d.reason) for d in got if d.gpu_uuid == U] == [(state, None)]


@pytest.mark.parametrize(("case", "n", "dev", "discounts", "costs"), [
    ("one pod, list price", node(), reading(pods=("a",), DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.5),
     {}, {"uid-a": 0.7}),
    ("spot price", node(provisioning="spot"), reading(pods=("a",)), {}, {"uid-a": 0.28}),
    ("pool discount", node(), reading(pods=("a",)), {"p": 0.25}, {"uid-a": 0.525}),
    ("time-shared: split", node(clients_per_gpu=2, capacity_gpus=2), reading(pods=("a", "b")),
     {},
     {"uid-a": 0.35, "uid-b": 0.35}),
    ("MIG slice: its fraction", node(accelerator="nvidia-tesla-a100", mig_profile="1g.5gb"),
     reading(pods=("a",), instance="7"), {}, {"uid-a": 0.4}),
    ("unallocated: to the pool", node(), reading(), {}, {None: 0.7}),
])
def test_cost_of_one_hour(case: str, n: NodeInfo, dev: DeviceReading,
                          discounts: dict[str, float], costs: dict[str | None, float]) -> None:
    rows = compute.usage_rows(states([n], {"n1": [dev]}, discounts=discounts), 0.0, 3600.0)
    got = {r.owner.uid if r.owner else None: r.cost_usd for r in rows}
    assert got == pytest.approx(costs)


def test_zero_utilisation_costs_but_has_no_effective_cost() -> None:
    rows = compute.usage_rows(states([node()], {"n1": [reading(
        pods=("a",), DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.0)]}), 0.0, 3600.0)
    (r,) = rows
    assert r.cost_usd == pytest.approx(0.7) and r.utilized_seconds == 0.0
    assert compute.effective_cost_per_utilized_hour(r.cost_usd or 0,
                                                    r.utilized_seconds or 0) is None


def test_pod_deleted_mid_interval_keeps_its_share() -> None:
    """A pod seen at the start of an interval owns it, even if gone by the end."""
    before = states([node()], {"n1": [reading(pods=("a",))]})
    rows = compute.usage_rows(before, 0.0, 30.0)   # integrated after the pod disappeared
    assert [(r.owner.uid if r.owner else None, r.seconds) for r in rows] == [("uid-a", 30.0)]


def test_inventory_remembers_devices_of_live_nodes_only() -> None:
    inv = compute.remember({}, {"n1": [reading()]}, {"n1": node()})
    assert list(inv["n1"]) == [U]
    assert compute.remember(inv, {}, {}) == {}


def test_unpriced_model_has_no_cost_rather_than_zero() -> None:
    (d,) = states([node(accelerator="nvidia-h200-141gb")], {"n1": [reading(pods=("a",))]})
    assert d.price_usd_per_hour is None
    (row,) = compute.usage_rows([d], 0.0, 3600.0)
    assert row.cost_usd is None and row.seconds == 3600.0


def gpus(n: int, start: int = 0) -> list[DeviceReading]:
    return [reading(f"GPU-{i}") for i in range(start, start + n)]


@pytest.mark.parametrize(("case", "n", "devices", "known", "kept"), [
    ("as many as Kubernetes counts", node(capacity_gpus=8), gpus(8), set(), 8),
    ("one more: a GPU back under a new UUID", node(capacity_gpus=8), gpus(9), set(), 9),
    ("1,024 on an 8-GPU node: the first 8", node(capacity_gpus=8), gpus(1024), set(), 8),
    ("Kubernetes counts none yet: the largest machine's 16", node(capacity_gpus=0),
     gpus(1024), set(), 16),
    ("time-shared: physical GPUs", node(capacity_gpus=16, clients_per_gpu=4), gpus(9),
     set(), 4),
])
def test_a_node_holds_what_kubernetes_counts_plus_one(
        case: str, n: NodeInfo, devices: list[DeviceReading], known: set[str],
        kept: int) -> None:
    ok, rejected = compute.admit(devices, known, n, 1024)
    assert [d.uuid for d in ok] == [d.uuid for d in devices[:kept]]
    assert len(rejected) == len(devices) - kept


def test_too_many_gpus_keep_the_known_ones_first() -> None:
    devices = gpus(100) + gpus(8, start=1000)
    known = {f"GPU-{i}" for i in range(1000, 1008)}
    ok, _ = compute.admit(devices, known, node(capacity_gpus=8), 1024)
    assert {d.uuid for d in ok} == known


def test_mig_instances_count_as_their_gpu_seven_at_most() -> None:
    n = node(capacity_gpus=14, mig_profile="1g.5gb")  # two GPUs of 7 instances
    devices = [reading(f"GPU-{g}", instance=str(i)) for g in range(3) for i in range(7)] + \
        [reading("GPU-0", instance=str(i)) for i in range(7, 20)]
    ok, rejected = compute.admit(devices, set(), n, 1024)
    assert len(ok) == 21 and len(rejected) == 13  # 3 GPUs (2 + 1), 7 instances each


def test_devices_neither_reported_nor_counted_are_retired() -> None:
    inv = {"n1": {f"GPU-{i}": DeviceIdentity(f"GPU-{i}", f"GPU-{i}", str(i), None)
                  for i in range(3)}}
    seen = {"GPU-0": 5000.0, "GPU-1": 1000.0, "GPU-2": 4000.0}
    nodes = {"n1": node(capacity_gpus=1)}
    # GPU-0 is counted (the most recently seen); GPU-2 is recent; GPU-1 is stale
    assert list(compute.retire(inv, nodes, seen, 5000.0, 3600.0)["n1"]) == ["GPU-0", "GPU-2"]
    assert list(compute.retire(inv, nodes, seen, 9000.0, 3600.0)["n1"]) == ["GPU-0"]
    # counted by Kubernetes: kept however long unreported (a GPU missing is downtime)
    counted = {"n1": node(capacity_gpus=3)}
    assert len(compute.retire(inv, counted, seen, 1e9, 3600.0)["n1"]) == 3
    # never reported since a restart: it counts from now
    assert len(compute.retire(inv, nodes, {}, 1e9, 3600.0)["n1"]) == 3


def test_a_remembered_device_beyond_the_count_has_no_state() -> None:
    """A 1-GPU node whose GPU came back under a new UUID: the old one is neither missing
    nor billed while it waits to be retired; the new one is the node's GPU."""
    got = compute.device_states({"n1": node()}, {"n1": [reading("GPU-new")]}, frozenset(),
                                KNOWN, OWNERS, PRICE, {}, last_seen={U: 10.0})
    assert [(d.gpu_uuid, d.state) for d in got] == [("GPU-new", "unallocated")]
    down = compute.device_states({"n1": node(ready=False)}, {},
                                 frozenset(), {"n1": {**KNOWN["n1"], "GPU-new": DeviceIdentity(
                                     "GPU-new", "GPU-new", "0", None)}}, OWNERS, PRICE, {},
                                 last_seen={U: 10.0, "GPU-new": 20.0})
    assert [(d.gpu_uuid, d.reason) for d in down] == [("GPU-new", "node_not_ready")]


def test_a_gpu_of_a_pod_not_in_the_view_is_the_unknown_teams_unless_told() -> None:
    """Without ``unviewed`` a GPU whose pod is not among the owners is ``UNKNOWN_TEAM``'s
    (never its namespace's name); with it, whatever ``unviewed`` says."""
    readings = {"n1": [reading(pods=("gone",))]}
    (alone,) = states([node()], readings)
    assert alone.state == "allocated"
    assert alone.owners == (Owner("", "ns", "gone", compute.UNKNOWN_TEAM, "gone"),)
    told = Owner("uid-gone", "ns", "gone", "t", "w")
    (d,) = compute.device_states({"n1": node()}, readings, frozenset(), {}, OWNERS, PRICE, {},
                                 unviewed=lambda ns, p: told)
    assert d.owners == (told,)
