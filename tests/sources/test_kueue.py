"""Kueue's objects as the exporter reads them, and its watches: found by Kueue's API, absent
without it, an unreadable object skipped and counted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.errors import SourceDataError
from exporter.sources.kueue import (
    cluster_queue_info,
    local_queue_info,
    quantity,
    workload_info,
)
from simulator.server import SimulatorServer
from tests.simulator.test_kueue import kueue_scenario
from tests.sources.test_kube import open_source
from tests.timing import limit

T0 = "2026-11-16T00:00:00Z"


def workload(**status: Any) -> dict[str, Any]:
    gpus = {"nvidia.com/gpu": "4"}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "job-train-1-abcde", "namespace": "ml", "uid": "wl-1",
                     "creationTimestamp": T0,
                     "ownerReferences": [{"kind": "Job", "name": "train-1", "controller": True}]},
        "spec": {"queueName": "research", "priority": 1000,
                 "priorityClassRef": {"name": "training-high"},
                 "podSets": [{"name": "main", "count": 2, "template": {
                     "metadata": {"labels": {"team": "ml-research"}},
                     "spec": {"nodeSelector": {
                                  "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
                              "containers": [{"name": "main", "resources": {
                                  "requests": gpus, "limits": gpus}}]}}}]},
        "status": status}


def cond(kind: str, at: str, status: str = "True") -> dict[str, str]:
    return {"type": kind, "status": status, "lastTransitionTime": at}


@pytest.mark.parametrize(("status", "queued", "admitted", "finished", "cq"), [
    ({}, 0.0, None, None, None),                                    # just created
    ({"conditions": [cond("QuotaReserved", T0, "False")]}, 0.0, None, None, None),  # waiting
    ({"conditions": [cond("QuotaReserved", "2026-11-16T01:00:00Z"),  # admitted after an hour
                     cond("Admitted", "2026-11-16T01:00:00Z")],
      "admission": {"clusterQueue": "research"}}, 0.0, 3600.0, None, "research"),
    ({"conditions": [cond("Requeued", "2026-11-16T02:00:00Z"),     # evicted, requeued
                     cond("Admitted", "2026-11-16T02:30:00Z")],
      "admission": {"clusterQueue": "research"}}, 7200.0, 9000.0, None, "research"),
    ({"conditions": [cond("Admitted", "2026-11-16T01:00:00Z", "False"),  # done
                     cond("Finished", "2026-11-16T05:00:00Z")]}, 0.0, None, 18000.0, None),
])
def test_workload_waits_as_kueue_measures_them(status: dict[str, Any], queued: float,
                                               admitted: float | None, finished: float | None,
                                               cq: str | None) -> None:
    w = workload_info(workload(**status))
    t0 = 1_794_787_200.0  # 2026-11-16T00:00:00Z
    assert w.queued_unix - t0 == queued
    assert (None if w.admitted_unix is None else w.admitted_unix - t0) == admitted
    assert (None if w.finished_unix is None else w.finished_unix - t0) == finished
    assert w.cluster_queue == cq
    assert (w.gpus, w.accelerator, w.owner_kind, w.owner_name) == (
        8, "nvidia-h100-80gb", "Job", "train-1")
    assert (w.priority, w.priority_class, w.labels) == (1000, "training-high",
                                                        {"team": "ml-research"})
    assert w.pending == (admitted is None and finished is None)


def test_the_v1beta1_names_read_the_same() -> None:
    obj = workload()
    del obj["spec"]["priorityClassRef"]
    obj["spec"]["priorityClassName"] = "training-high"
    assert workload_info(obj).priority_class == "training-high"
    cq = cluster_queue_info({"metadata": {"name": "research"}, "spec": {
        "cohort": "ml", "resourceGroups": [{"coveredResources": ["cpu", "nvidia.com/gpu"],
                                            "flavors": [{"name": "h100", "resources": [
                                                {"name": "cpu", "nominalQuota": "96"},
                                                {"name": "nvidia.com/gpu", "nominalQuota": 16,
                                                 "borrowingLimit": "8"}]}]}]},
        "status": {"pendingWorkloads": 3, "flavorsUsage": [{"name": "h100", "resources": [
            {"name": "nvidia.com/gpu", "total": "20", "borrowed": "4"}]}]}})
    assert cq.cohort == "ml" and cq.pending_workloads == 3
    f = cq.flavors["h100"]
    assert (f.nominal_gpus, f.borrowing_limit_gpus, f.used_gpus, f.borrowed_gpus) == (
        16, 8, 20, 4)
    lq = local_queue_info({"metadata": {"name": "research", "namespace": "ml"},
                           "spec": {"clusterQueue": "research"}, "status": {}})
    assert (lq.cluster_queue, lq.pending_workloads) == ("research", 0)


@pytest.mark.parametrize(("text", "value"), [(8, 8.0), ("8", 8.0), ("500m", 0.5),
                                             ("2Ki", 2048.0), ("1.5", 1.5)])
def test_quantities(text: object, value: float) -> None:
    assert quantity(text, "x") == value


@pytest.mark.parametrize("text", ["eight", "", None, True, "8 GPUs"])
def test_bad_quantities(text: object) -> None:
    with pytest.raises(SourceDataError):
        quantity(text, "x")


async def test_without_kueue_nothing_is_watched(sim: SimulatorServer, tmp_path: Path) -> None:
    async with open_source(sim, tmp_path) as src:
        assert src.kueue is False
        assert set(src.stats) == {"nodes", "pods", "namespaces", "events"}
        assert src.workloads == {}


async def test_kueues_objects_are_watched_and_a_bad_one_is_skipped(
        make_server: Callable[..., Any], tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(kueue_scenario())
    sim.cluster.submit("train", run_seconds=3600)
    sim.cluster.submit("train", run_seconds=3600)
    bad = workload()
    bad["metadata"] |= {"name": "broken", "namespace": "team-a", "uid": "broken"}
    bad["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "eight"}}
    sim.store.put("Workload", bad)
    async with open_source(sim, tmp_path) as src:
        assert src.kueue is True
        assert {"workloads", "clusterqueues", "localqueues"} <= set(src.stats)
        assert len(src.workloads) == 2 and "broken" not in src.workloads
        assert src.rejected_objects == {"workloads": 1}
        assert set(src.cluster_queues) == {"research", "batch"}
        assert src.cluster_queues["research"].flavors["nvidia-h100-80gb"].used_gpus == 8
        pending = [w for w in src.workloads.values() if w.pending]
        assert len(pending) == 1 and pending[0].local_queue == "research"
        sim.cluster.submit("half", run_seconds=600)   # a watch event: one more Workload
        await sim.advance(sim.cluster.step)
        async with asyncio.timeout(limit(10)):
            while len(src.workloads) < 3:  # noqa: ASYNC110 - polling the watch's effect
                await asyncio.sleep(0.02)
        assert {w.local_queue for w in src.workloads.values()} == {"research", "batch"}
