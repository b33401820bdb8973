"""The cycle's waits (``runtime.waits.Waits``): evidence gathered from a snapshot, the
cause each waiting pod and Workload gets, and what the cycles add up to."""

from __future__ import annotations

from dataclasses import replace

from exporter.model.records import (
    AdmissionCheck,
    PodConstraints,
    PodEvent,
    PodInfo,
    WorkloadInfo,
)
from exporter.model.snapshot import Snapshot
from exporter.runtime.waits import Waits
from tests.exporter.test_pending_causes import A100, GPU_OK, WANTS_A100, bound, node

T0 = 1_800_000_000.0


def pending(name: str, gpus: int = 4, **kw: object) -> PodInfo:
    pod = replace(bound(name, "", gpus, "Pending"), node=None, scheduled_unix=None,
                  created_unix=T0 - 600, constraints=WANTS_A100, accelerator="nvidia-tesla-a100",
                  unschedulable_reason="Unschedulable",
                  unschedulable_message="0/2 nodes are available: 2 Insufficient "
                  "nvidia.com/gpu.", unschedulable_unix=T0 - 590)
    return replace(pod, **kw)  # type: ignore[arg-type]


def snapshot(now: float, pods: list[PodInfo], *, ended: tuple[PodInfo, ...] = (),
             workloads: dict[str, WorkloadInfo] | None = None,
             events: dict[str, dict[str, PodEvent]] | None = None) -> Snapshot:
    nodes = {"a": node("a", A100), "b": node("b", A100)}
    return Snapshot(now, nodes, {p.uid: p for p in pods}, ended, {}, frozenset(), True,
                    workloads=workloads or {}, events=events or {})


def observe(waits: Waits, snap: Snapshot, with_pods: frozenset[str] = frozenset()):  # type: ignore[no-untyped-def]
    return waits.observe(snap, lambda p: "research", lambda w: "research", lambda w: "cq",
                         lambda w: w.uid in with_pods, [])


def causes(waits: Waits) -> dict[str, str]:
    return {w.name: w.verdict.cause for w in waits.figures.waiting}


def test_fragments_on_two_nodes_are_fragmented_and_a_full_cluster_has_no_capacity() -> None:
    waits = Waits()
    running = [bound("r1", "a", 6), bound("r2", "b", 6)]
    observe(waits, snapshot(T0, [*running, pending("p")]))
    assert causes(waits) == {"p": "fragmented"}
    assert waits.figures.pools["a100"].gpus == {"fragment": 4.0}
    observe(waits, snapshot(T0 + 30, [bound("r1", "a", 8), bound("r2", "b", 8),
                                      pending("p")]))
    assert causes(waits) == {"p": "no_capacity"}


def test_a_replacement_of_a_reclaimed_pod_waits_preempted_until_it_runs_again() -> None:
    waits = Waits()
    gone = replace(bound("train-0-abc", "a", 8), phase="Failed", reason="Terminated",
                   disrupted=True, finished_unix=T0 - 5,
                   labels={"batch.kubernetes.io/job-completion-index": "0"},
                   workload="train")
    again = pending("train-0-def", 8, created_unix=T0 - 4, workload="train",
                    labels={"batch.kubernetes.io/job-completion-index": "0"})
    other = pending("other-0", 8, workload="other")
    running = [bound("r1", "a", 8), bound("r2", "b", 8)]
    observe(waits, snapshot(T0, [*running, again, other], ended=(gone,)))
    assert causes(waits) == {"train-0-def": "preempted", "other-0": "no_capacity"}
    scheduled = replace(again, node="a", scheduled_unix=T0 + 30, phase="Running")
    observe(waits, snapshot(T0 + 60, [bound("r2", "b", 8), scheduled]))
    late = pending("train-0-xyz", 8, created_unix=T0 + 90, workload="train",
                   labels={"batch.kubernetes.io/job-completion-index": "0"})
    observe(waits, snapshot(T0 + 90, [*running, late]))
    assert causes(waits) == {"train-0-xyz": "no_capacity"}  # it ran since: a new wait


def test_the_autoscalers_words_decide_scaling_up_and_stockout_and_failures_count() -> None:
    waits = Waits()
    running = [bound("r1", "a", 8), bound("r2", "b", 8)]
    p = pending("p")
    triggered = PodEvent("ml", "p", "p", "TriggeredScaleUp", "pod triggered scale-up: "
                         "[{gke-demo-a100-grp 2->3 (max: 4)}]", "cluster-autoscaler",
                         T0 - 100, T0 - 100)
    observe(waits, snapshot(T0, [*running, p], events={"p": {"TriggeredScaleUp": triggered}}))
    assert causes(waits) == {"p": "scaling_up"}
    failed = PodEvent("ml", "p", "p", "FailedScaleUp", "Node scale up in zones "
                      "us-central1-b associated with this pod failed: GCE out of resources. "
                      "Pod is at risk of not being scheduled.", "cluster-autoscaler",
                      T0 + 10, T0 + 20, count=2)
    events = {"p": {"TriggeredScaleUp": triggered, "FailedScaleUp": failed}}
    observe(waits, snapshot(T0 + 30, [*running, p], events=events))
    assert causes(waits) == {"p": "stockout"}
    assert waits.figures.scale_up_failures == {("a100", "out_of_resources"): 2}
    observe(waits, snapshot(T0 + 60, [*running, p], events=events))
    assert waits.figures.scale_up_failures == {("a100", "out_of_resources"): 2}
    events["p"]["FailedScaleUp"] = replace(failed, count=3, last_unix=T0 + 70)
    observe(waits, snapshot(T0 + 90, [*running, p], events=events))
    assert waits.figures.scale_up_failures == {("a100", "out_of_resources"): 3}


def workload(**kw: object) -> WorkloadInfo:
    wl = WorkloadInfo(uid="wl", namespace="ml", name="job-train-1a2b3", local_queue="lq",
                      cluster_queue=None, created_unix=T0 - 900, queued_unix=T0 - 900,
                      admitted_unix=None, finished_unix=None, gpus=8,
                      accelerator="nvidia-tesla-a100", priority=0, priority_class="",
                      owner_kind="Job", owner_name="train", gpus_per_pod=4,
                      pending_message="couldn't assign flavors to pod set main: insufficient "
                      "unused quota for nvidia.com/gpu in flavor a100, 4 more needed")
    return replace(wl, **kw)  # type: ignore[arg-type]


def test_a_workload_kueue_holds_waits_for_quota_and_its_gpus_are_stranded_by_it() -> None:
    waits = Waits()
    observe(waits, snapshot(T0, [bound("r1", "a", 4)], workloads={"wl": workload()}))
    (w,) = waits.figures.waiting
    assert (w.kind, w.verdict.cause, w.gpus, w.gpus_per_pod) == ("workload", "quota", 8, 4)
    assert w.verdict.said is not None and "insufficient unused quota" in w.verdict.said.words
    assert waits.figures.pools["a100"].gpus == {"quota": 12.0}


def test_a_workload_with_pods_counts_once_through_its_pods() -> None:
    waits = Waits()
    observe(waits, snapshot(T0, [pending("p")], workloads={"wl": workload()}),
            with_pods=frozenset({"wl"}))
    assert [w.kind for w in waits.figures.waiting] == ["pod"]


def test_provisioning_requests_and_evictions_of_workloads() -> None:
    cases = {
        "pending": (workload(quota_reserved=True, admission_checks=(
            AdmissionCheck("dws-prov", "Pending", "Waiting for resources."),)), "scaling_up"),
        "retry": (workload(quota_reserved=True, admission_checks=(
            AdmissionCheck("dws-prov", "Retry", "Provisioning failed."),)), "stockout"),
        "evicted": (workload(evicted_reason="Preempted"), "preempted"),
    }
    for name, (wl, cause) in cases.items():
        waits = Waits()
        observe(waits, snapshot(T0, [], workloads={"wl": wl}))
        assert [w.verdict.cause for w in waits.figures.waiting] == [cause], name


def test_the_last_cycles_waits_are_the_rows_and_the_gpu_seconds() -> None:
    waits = Waits()
    running = [bound("r1", "a", 8), bound("r2", "b", 8)]
    assert observe(waits, snapshot(T0, [*running, pending("p")])) == ([], [])
    rows, free = observe(waits, snapshot(T0 + 30, [*running]))
    assert [(r.start, r.seconds, r.waiting.verdict.cause) for r in rows] == [
        (T0, 30.0, "no_capacity")]
    assert free == []
    assert waits.figures.gpu_seconds == {("ml", "research", "a100", "nvidia-tesla-a100",
                                          "no_capacity"): 120.0}
    assert waits.figures.waiting == ()


def test_a_gated_pod_waits_for_quota() -> None:
    waits = Waits()
    gated = pending("p", scheduling_gates=("kueue.x-k8s.io/admission",),
                    constraints=PodConstraints(WANTS_A100.node_selector, (), (GPU_OK,)))
    observe(waits, snapshot(T0, [gated]))
    assert causes(waits) == {"p": "quota"}
