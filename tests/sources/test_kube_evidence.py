"""What a pod, a node, a Kueue Workload and an Event say about why a pod waits, read from
objects in the API's own shapes (``tests/fixtures/scheduling/``)."""

from __future__ import annotations

import copy
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.errors import SourceDataError
from exporter.model.records import NO_CONSTRAINTS, Requirement, Taint, Toleration
from exporter.sources.kube import (
    EVENT_MESSAGE_CHARS,
    ConstraintsTable,
    node_info,
    pod_constraints,
    pod_event,
    pod_info,
)
from exporter.sources.kueue import workload_info

FIXTURES = Path(__file__).parents[1] / "fixtures" / "scheduling"
OBJECTS = yaml.safe_load((FIXTURES / "objects_real.yaml").read_text())
EVENTS = yaml.safe_load((FIXTURES / "events_real.yaml").read_text())["items"]


def unix(stamp: str | None) -> float | None:
    return None if stamp is None else datetime.fromisoformat(
        stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("name", list(OBJECTS["pods"]))
def test_a_pod_gives_where_it_may_run_and_why_it_waits(name: str) -> None:
    obj = OBJECTS["pods"][name]
    want = obj["expect"]
    pod = pod_info(obj)
    c = pod.constraints
    assert dict(c.node_selector) == want["node_selector"]
    assert [[[r.key, r.operator, list(r.values)] for r in term] for term in c.affinity] == \
        want["affinity"]
    assert [[t.key, t.operator, t.value, t.effect] for t in c.tolerations] == \
        want["tolerations"]
    assert list(pod.scheduling_gates) == want["scheduling_gates"]
    assert (pod.unschedulable_reason, pod.unschedulable_message, pod.unschedulable_unix) == (
        want["unschedulable_reason"], want["unschedulable_message"],
        unix(want["unschedulable_unix"]))
    assert (pod.waiting_reason, pod.disrupted) == (want["waiting_reason"], want["disrupted"])


def test_a_pod_reclaimed_with_its_node_ended_disrupted() -> None:
    pod = pod_info(OBJECTS["pods"]["reclaimed"])
    assert (pod.phase, pod.reason, pod.disrupted) == ("Failed", "Terminated", True)


@pytest.mark.parametrize("name", list(OBJECTS["nodes"]))
def test_a_node_gives_its_labels_taints_and_cordon(name: str) -> None:
    obj = OBJECTS["nodes"][name]
    node = node_info(obj)
    assert dict(node.labels) == obj["metadata"]["labels"]
    assert [[t.key, t.value, t.effect] for t in node.taints] == obj["expect"]["taints"]
    assert node.unschedulable is obj["expect"]["unschedulable"]


@pytest.mark.parametrize("name", list(OBJECTS["workloads"]))
def test_a_workload_gives_its_pods_size_its_quota_and_kueues_words(name: str) -> None:
    obj = OBJECTS["workloads"][name]
    want = obj["expect"]
    w = workload_info(obj)
    assert (w.gpus_per_pod, w.quota_reserved, w.pending_message, w.evicted_reason) == (
        want["gpus_per_pod"], want["quota_reserved"], want["pending_message"],
        want["evicted_reason"])
    assert [[c.name, c.state, c.message] for c in w.admission_checks] == \
        want["admission_checks"]


def test_an_admitted_workload_says_nothing_of_a_wait() -> None:
    """Once admitted, neither the pending message nor an old eviction is its state."""
    obj = copy.deepcopy(OBJECTS["workloads"]["evicted"])
    obj["status"]["conditions"] = [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
         "message": "Quota reserved in ClusterQueue cq",
         "lastTransitionTime": "2024-10-24T09:20:00Z"},
        {"type": "Admitted", "status": "True", "reason": "Admitted",
         "message": "The workload is admitted", "lastTransitionTime": "2024-10-24T09:20:00Z"},
        {"type": "Evicted", "status": "False", "reason": "QuotaReserved",
         "message": "Previously: Preempted", "lastTransitionTime": "2024-10-24T09:20:00Z"}]
    w = workload_info(obj)
    assert (w.quota_reserved, w.pending_message, w.evicted_reason, w.pending) == (
        True, "", None, False)


def test_a_check_not_ready_speaks_for_a_workload_holding_quota() -> None:
    obj = copy.deepcopy(OBJECTS["workloads"]["provisioning"])
    obj["status"]["admissionChecks"][0] |= {"state": "Retry", "message": (
        "Provisioning Request wasn't provisioned. Last provisioning condition: "
        "ResourcePoolExhausted")}
    w = workload_info(obj)
    assert w.pending_message.startswith("Provisioning Request wasn't provisioned")
    assert w.admission_checks[0].state == "Retry"


@pytest.mark.parametrize(("spec", "want"), [
    ({}, NO_CONSTRAINTS),
    ({"nodeSelector": {"b": "2", "a": "1"}}, None),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]}}}}, None),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{}]}}}}, None),
    ({"affinity": {"podAntiAffinity": {}}}, NO_CONSTRAINTS),
])
def test_constraints_as_kubernetes_reads_them(spec: dict[str, Any], want: Any) -> None:
    got = pod_constraints(spec)
    if want is not None:
        assert got is want
    elif "nodeSelector" in spec:
        assert dict(got.node_selector) == {"a": "1", "b": "2"}
    elif spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"] == [{}]:
        assert got.affinity == ((),), "an empty term: meets no node"
    else:
        assert got.affinity == ((Requirement("metadata.name", "In", ("node-1",)),),)


def test_the_pods_of_one_template_share_their_constraints() -> None:
    table = ConstraintsTable(size=2)
    spec = OBJECTS["pods"]["pending"]["spec"]
    first, second = pod_info(OBJECTS["pods"]["pending"], constraints=table), pod_info(
        copy.deepcopy(OBJECTS["pods"]["pending"]), constraints=table)
    assert first.constraints is second.constraints
    assert first.constraints == pod_constraints(spec)
    other = {"tolerations": [{"key": "a", "operator": "Exists"}]}
    third = {"tolerations": [{"key": "b", "operator": "Exists"}]}
    assert table(other).tolerations == (Toleration("a", "Exists", "", None),)
    table(third)
    assert len(table) == 2, "the oldest set goes when it is full"
    assert table(copy.deepcopy(spec)) is not first.constraints
    assert table(copy.deepcopy(spec)) == first.constraints
    assert table({}) is NO_CONSTRAINTS


def test_a_node_without_spec_has_no_taints() -> None:
    obj = copy.deepcopy(OBJECTS["nodes"]["gpu"])
    del obj["spec"]
    node = node_info(obj)
    assert (node.taints, node.unschedulable) == ((), False)
    assert node_info(OBJECTS["nodes"]["gpu"]).taints == (
        Taint("nvidia.com/gpu", "present", "NoSchedule"),)


@pytest.mark.parametrize("item", EVENTS, ids=[e["object"]["reason"] for e in EVENTS])
def test_an_event_about_a_pod_is_kept_with_its_time_count_and_author(
        item: dict[str, Any]) -> None:
    obj = item["object"]
    got = pod_event(obj)
    if "expect" not in item:
        assert got is None
        return
    want = item["expect"]
    assert got is not None
    about = obj["involvedObject"]
    assert (got.pod_uid, got.namespace, got.pod, got.reason, got.message) == (
        about["uid"], about["namespace"], about["name"], obj["reason"], obj["message"])
    assert (got.component, got.count, got.first_unix, got.last_unix) == (
        want["component"], want["count"], unix(want["first"]), unix(want["last"]))


def test_an_event_in_the_events_api_shape_reads_the_same() -> None:
    """``events.k8s.io/v1``'s own names: regarding, note, reportingController, the
    deprecated source and times."""
    core = EVENTS[1]["object"]
    native = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": core["metadata"],
              "regarding": core["involvedObject"], "note": core["message"],
              "reason": core["reason"], "reportingController": "cluster-autoscaler",
              "deprecatedSource": {"component": "cluster-autoscaler"},
              "deprecatedFirstTimestamp": core["firstTimestamp"],
              "deprecatedLastTimestamp": core["lastTimestamp"], "deprecatedCount": 2,
              "eventTime": None, "type": "Normal"}
    assert pod_event(native) == pod_event(core)


@pytest.mark.parametrize(("change", "kept"), [
    ({"involvedObject": {"kind": "Node", "name": "n", "uid": "n-1"}}, False),
    ({"reason": "Failed", "message": "Error: ErrImagePull"}, True),
    ({"reason": "Failed", "message": "Error: context deadline exceeded"}, False),
    ({"reason": "BackOff", "message": "Back-off pulling image \"x\""}, True),
    ({"reason": "Preempted", "message": "Preempted by pod 1a2b on node gke-x"}, True),
])
def test_only_the_reasons_a_cause_reads_are_kept(change: dict[str, Any], kept: bool) -> None:
    obj = copy.deepcopy(EVENTS[1]["object"]) | change
    assert (pod_event(obj) is not None) is kept


def test_a_long_message_is_cut() -> None:
    obj = copy.deepcopy(EVENTS[0]["object"]) | {"message": "0/9 nodes are available: " +
                                                "x" * 5000}
    got = pod_event(obj)
    assert got is not None and len(got.message) == EVENT_MESSAGE_CHARS


@pytest.mark.parametrize("change", [
    {"involvedObject": {"kind": "Pod", "name": "p"}},                  # no uid
    {"eventTime": None, "series": None, "metadata": {}},               # no time at all
    {"eventTime": "yesterday"},
])
def test_an_event_that_cannot_be_read_is_refused(change: dict[str, Any]) -> None:
    obj = copy.deepcopy(EVENTS[0]["object"]) | change
    with pytest.raises((SourceDataError, ValueError)):
        pod_event(obj)
