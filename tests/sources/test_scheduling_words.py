"""What the exporter reads in the scheduler's, the cluster autoscaler's and Kueue's own
words: a table of real messages (``tests/fixtures/scheduling/messages_real.yaml``) and what
each says, and any text at all read without an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from exporter.model.scheduling_words import (
    GPU,
    NodeCounts,
    NotTriggered,
    ScaleUpFailed,
    Triggered,
    autoscaler_words,
    group_reason_kind,
    mig_pool,
    node_counts,
    node_reason_kind,
    quota_shortfalls,
    scale_up_failure,
    scale_up_word,
)

SAMPLES = yaml.safe_load((Path(__file__).parents[1] / "fixtures" / "scheduling"
                          / "messages_real.yaml").read_text())
POOLS = ("gpupool", "default-pool", "original-nodepool", "spot-h100")
"""The node pools the exporter knows, for ``mig_pool``."""


def ids(section: str) -> list[str]:
    return [f"{s['source']}:{s['message'][:40]}" for s in SAMPLES[section]]


@pytest.mark.parametrize("sample", SAMPLES["scheduler"], ids=ids("scheduler"))
def test_a_scheduler_message_gives_the_nodes_turned_down_by_reason(
        sample: dict[str, Any]) -> None:
    got = node_counts(sample["message"])
    if sample["nodes"] is None:
        assert got is None
        return
    assert got is not None
    assert got.nodes == sample["nodes"]
    assert dict(got.reasons) == sample["reasons"]
    assert got.by_kind() == sample["kinds"]
    assert got.preemption == sample.get("preemption", "")


@pytest.mark.parametrize("sample", SAMPLES["autoscaler"], ids=ids("autoscaler"))
def test_an_autoscaler_event_says_what_it_did(sample: dict[str, Any]) -> None:
    got = autoscaler_words(sample["reason"], sample["message"])
    if "triggered" in sample:
        assert isinstance(got, Triggered)
        assert [{"name": g.name, "zone": g.zone, "from": g.from_nodes, "to": g.to_nodes,
                 "max": g.max_nodes, "pool": mig_pool(g.group, POOLS)}
                for g in got.groups] == sample["triggered"]
    elif "reasons" in sample:
        assert isinstance(got, NotTriggered)
        assert dict(got.reasons) == sample["reasons"]
        assert (got.max_size, got.backoff, got.no_matching_group) == (
            sample["max_size"], sample["backoff"], sample["no_matching_group"])
    else:
        assert isinstance(got, ScaleUpFailed)
        assert (list(got.zones), got.reason, got.detail) == (
            sample["zones"], sample["failure"], sample["detail"])


@pytest.mark.parametrize("sample", SAMPLES["autoscaler"], ids=ids("autoscaler"))
def test_an_autoscaler_event_says_in_a_word_what_came_of_the_scale_up(
        sample: dict[str, Any]) -> None:
    assert scale_up_word(sample["reason"], sample["message"]) == sample["word"]


@pytest.mark.parametrize(("reason", "word"), [
    ("ScaleUpTimedOut", "failed"), ("FailedScheduling", None), ("Pulling", None)])
def test_other_reasons_say_what_they_say_of_a_scale_up(reason: str, word: str | None) -> None:
    assert scale_up_word(reason, "") == word


@pytest.mark.parametrize("sample", SAMPLES["kueue"], ids=ids("kueue"))
def test_a_kueue_pending_message_gives_the_quota_lacking(sample: dict[str, Any]) -> None:
    assert [{"pod_set": s.pod_set, "resource": s.resource, "flavor": s.flavor,
             "more_needed": s.more_needed, "over_max": s.over_max}
            for s in quota_shortfalls(sample["message"])] == sample["shortfalls"]


def test_the_gpus_a_workload_lacks_are_read_by_resource() -> None:
    message = ("couldn't assign flavors to pod set main: insufficient unused quota for cpu "
               "in flavor default, 3 more needed, insufficient unused quota for "
               "nvidia.com/gpu in flavor a100, 4 more needed; couldn't assign flavors to pod "
               "set workers: insufficient unused quota for nvidia.com/gpu in flavor a100, "
               "8 more needed")
    assert [(s.pod_set, s.flavor, s.more_needed) for s in quota_shortfalls(message, GPU)] == [
        ("main", "a100", 4.0), ("workers", "a100", 8.0)]


@pytest.mark.parametrize(("reason", "kind"), [
    ("Insufficient nvidia.com/gpu", "insufficient_gpu"),
    ("Insufficient nvidia.com/gpu.shared", "insufficient"),
    ("Insufficient memory", "insufficient"),
    ("Too many pods", "insufficient"),
    ("node(s) didn't match Pod's node affinity/selector", "selector"),
    ("node(s) didn't match node selector", "selector"),
    ("node(s) had untolerated taint {nvidia.com/gpu: present}", "taint"),
    ("node(s) had untolerated taint {node.kubernetes.io/unreachable: }", "not_ready"),
    ("node(s) had untolerated taint {node.kubernetes.io/unschedulable: }", "cordoned"),
    ("node(s) were unschedulable", "cordoned"),
    ("node(s) had volume node affinity conflict", "other"),
    ("node(s) didn't match pod anti-affinity rules", "other"),
    ("Insufficient ", "insufficient"),
])
def test_each_scheduler_reason_has_a_kind(reason: str, kind: str) -> None:
    assert node_reason_kind(reason) == kind


@pytest.mark.parametrize(("reason", "kind"), [
    ("max node group size reached", "max_size"),
    ("max cluster cpu, memory limit reached", "limit"),
    ("max total nodes in cluster reached", "limit"),
    ("in backoff after failed scale-up", "backoff"),
    ("not ready for scale-up", "not_ready"),
    ("not all pods would fit and scale-up is using all-or-nothing strategy", "other"),
    ("Insufficient nvidia.com/gpu", "mismatch"),
    ("node(s) didn't match Pod's node affinity/selector", "mismatch"),
])
def test_each_node_group_reason_has_a_kind(reason: str, kind: str) -> None:
    assert group_reason_kind(reason) == kind


def test_a_node_group_held_by_a_cluster_limit_counts_as_at_its_maximum() -> None:
    words = autoscaler_words("NotTriggerScaleUp", "pod didn't trigger scale-up: 2 max cluster "
                             "cpu, memory limit reached, 1 Insufficient nvidia.com/gpu")
    assert isinstance(words, NotTriggered)
    assert dict(words.reasons) == {"max cluster cpu, memory limit reached": 2,
                                   "Insufficient nvidia.com/gpu": 1}
    assert words.max_size and not words.no_matching_group


@pytest.mark.parametrize(("detail", "failure"), [
    ("GCE out of resources", "out_of_resources"),
    ("ZONE_RESOURCE_POOL_EXHAUSTED", "out_of_resources"),
    ("GCE quota exceeded", "quota_exceeded"),
    ("IP space exhausted", "other"),
    ("Waiting for instances timeout", "other"),
])
def test_a_failed_scale_up_is_a_stockout_a_quota_or_something_else(
        detail: str, failure: str) -> None:
    assert scale_up_failure(detail) == failure


@pytest.mark.parametrize(("group", "pool"), [
    ("gke-ml-gke-gpupool-08500106-grp", "gpupool"),
    ("https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/instanceGroups/"
     "gke-demo-ip-original-nodepool-22330990-grp", "original-nodepool"),
    ("gke-prod-default-pool-1a2b3c4d-grp", "default-pool"),
    ("gke-a-very-long-cluster-name-spot-h1-1a2b3c4d-grp", "spot-h100"),  # both names cut
    ("gke-prod-spo-1a2b3c4d-grp", None),               # cut to fewer than four characters
    ("gke-prod-spot-h100-x-1a2b3c4d-grp", None),       # another pool, not known
    ("gke-prod-gpupool-grp", None),                    # no hash: not a GKE group
    ("aks-gpunp-98036146-vmss", None),
])
def test_a_managed_instance_group_names_its_node_pool(group: str, pool: str | None) -> None:
    assert mig_pool(group, POOLS) == pool


def test_a_cut_pool_name_is_found_by_its_beginning() -> None:
    assert mig_pool("gke-research-a100-mig-1g5g-f00dcafe-grp",
                    ["a100-mig-1g5gb", "a100"]) == "a100-mig-1g5gb"


def test_a_message_cut_short_by_the_scheduler_keeps_what_it_said() -> None:
    """The scheduler cuts a message at 1,024 characters with " ..."."""
    full = "0/500 nodes are available: " + ", ".join(
        f"1 node(s) had untolerated taint {{team-{i}: x}}" for i in range(100)) + "."
    cut = full[:1020] + " ..."
    got = node_counts(cut)
    assert got is not None and got.nodes == 500
    assert 0 < sum(n for _, n in got.reasons) <= 100
    assert set(got.by_kind()) == {"taint"}


TEXT = st.text(st.characters(codec="utf-8"), max_size=400) | st.from_regex(
    r"(0/\d{1,12} nodes are available: ((\d{1,12} [^,.]{0,20}(, )?){0,5}\.? ?)*"
    r"(preemption: .{0,30})?|(P|p)od (didn't )?trigger(ed)? scale-up.{0,80}"
    r"|Node scale up in zones? .{0,40} failed: .{0,40}"
    r"|couldn't assign flavors to pod set \S{0,8}: insufficient (unused )?quota for \S{0,12} "
    r"in flavor \S{0,10}, .{0,60})", fullmatch=True)


@given(TEXT, st.sampled_from(["TriggeredScaleUp", "NotTriggerScaleUp", "FailedScaleUp",
                              "ScaleUpTimedOut", "FailedScheduling", ""]))
def test_any_text_is_read_without_an_error(text: str, reason: str) -> None:
    counts = node_counts(text)
    assert counts is None or (isinstance(counts, NodeCounts) and counts.nodes >= 0
                              and all(n >= 0 for _, n in counts.reasons))
    autoscaler_words(reason, text)
    quota_shortfalls(text)
    mig_pool(text, POOLS)
