"""The queue forecast (``exporter.model.forecast``), case by case: each case a small
cluster worked by hand, and the start each waiting unit gets."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.model.forecast import (
    Busy,
    Expected,
    PoolBounds,
    Queued,
    Quota,
    expected_starts,
)
from exporter.model.records import NodeInfo, PodConstraints, Toleration

NOW = 1_800_000_000.0
H = 3600.0
ANY = PodConstraints({}, (), (Toleration(None, "Exists", "", None),))
A100 = PodConstraints({"cloud.google.com/gke-accelerator": "a100"}, (),
                      (Toleration(None, "Exists", "", None),))


def node(name: str, gpus: int = 8, pool: str = "a100", model: str = "a100") -> NodeInfo:
    labels = {"cloud.google.com/gke-accelerator": model, "cloud.google.com/gke-nodepool": pool}
    return NodeInfo(name=name, pool=pool, accelerator=model, provisioning="on-demand",
                    zone="us-central1-b", instance_type="a2-highgpu-8g", ready=True,
                    capacity_gpus=gpus, allocatable_gpus=gpus, clients_per_gpu=1,
                    mig_profile=None, address="10.0.0.1", labels=labels)


def queued(uid: str, gpus: int, *, pods: int = 1, priority: int = 0, since: float = 0.0,
           runs: float | None = 2 * H, quota: str | None = None, bound: bool = False,
           constraints: PodConstraints = ANY) -> Queued:
    return Queued(uid, pods, gpus, constraints, priority, NOW - 60 + since, runs, bound,
                  quota)


@dataclass
class Case:
    nodes: dict[str, NodeInfo]
    free: dict[str, int]
    busy: list[Busy]
    queue: list[Queued]
    expected: dict[str, tuple[float | None, str]]
    """uid -> (hours from now, basis)."""
    pools: dict[str, PoolBounds] = field(default_factory=dict)
    quotas: dict[str, Quota] = field(default_factory=dict)


N1, N2 = node("n1"), node("n2")
CASES = {
    "room now": Case({"n1": N1}, {"n1": 8}, [], [queued("a", 4)], {"a": (0.0, "forecast")}),
    "bound pods start now": Case({"n1": N1}, {"n1": 0}, [Busy("n1", 8, NOW + H)],
                                 [queued("a", 8, bound=True)], {"a": (0.0, "starting")}),
    "waits for a running pod's end": Case(
        {"n1": N1}, {"n1": 0}, [Busy("n1", 8, NOW + 2 * H)], [queued("a", 4)],
        {"a": (2.0, "forecast")}),
    # the higher priority goes first though it came later; the other runs after it
    "priority, then age": Case(
        {"n1": N1}, {"n1": 0}, [Busy("n1", 8, NOW + H)],
        [queued("low", 8, since=-600), queued("high", 8, priority=100)],
        {"high": (1.0, "forecast"), "low": (3.0, "forecast")}),
    # 3 and 5 free on two nodes: the 3-GPU pod takes the fuller node, the 5 still fits
    "best fit keeps the larger hole": Case(
        {"n1": N1, "n2": N2}, {"n1": 3, "n2": 5}, [Busy("n1", 5, NOW + 9 * H),
                                                   Busy("n2", 3, NOW + 9 * H)],
        [queued("three", 3), queued("five", 5, since=1)],
        {"three": (0.0, "forecast"), "five": (0.0, "forecast")}),
    "a pool grows to its maximum": Case(
        {"n1": N1}, {"n1": 0}, [Busy("n1", 8, NOW + 5 * H)],
        [queued("a", 8), queued("b", 8, since=1), queued("c", 8, since=2)],
        {"a": (0.25, "forecast"), "b": (0.25, "forecast"), "c": (2.25, "forecast")},
        pools={"a100": PoolBounds(N1, 3, 900.0)}),
    "a pool stocking out does not grow": Case(
        {"n1": N1}, {"n1": 0}, [Busy("n1", 8, NOW + 5 * H)], [queued("a", 8)],
        {"a": (5.0, "forecast")}, pools={"a100": PoolBounds(N1, 3, 900.0, True)}),
    "a pool with no known maximum does not grow": Case(
        {"n1": N1}, {"n1": 0}, [Busy("n1", 8, NOW + 5 * H)], [queued("a", 8)],
        {"a": (5.0, "forecast")}, pools={"a100": PoolBounds(N1, None, 900.0)}),
    "a gang starts when all its pods fit": Case(
        {"n1": N1, "n2": N2}, {"n1": 8, "n2": 4}, [Busy("n2", 4, NOW + 3 * H)],
        [queued("gang", 8, pods=2)], {"gang": (3.0, "forecast")}),
    "no node nor pool fits": Case(
        {"n1": N1}, {"n1": 8}, [], [queued("big", 16),
                                    queued("h100", 1, constraints=PodConstraints(
                                        {"cloud.google.com/gke-accelerator": "h100"}))],
        {"big": (None, "no_room"), "h100": (None, "no_room")}),
    "behind a pod that never ends": Case(
        {"n1": N1}, {"n1": 0}, [], [queued("a", 8)], {"a": (None, "beyond_horizon")}),
    "quota frees when its Workload's pods end": Case(
        {"n1": N1}, {"n1": 4}, [Busy("n1", 4, NOW + 2 * H, quota="cq")],
        [queued("w", 4, quota="cq")], {"w": (2.0, "forecast")},
        quotas={"cq": Quota(4.0, 4.0)}),
    "a ClusterQueue borrows what its cohort leaves": Case(
        {"n1": N1}, {"n1": 8}, [], [queued("w", 8, quota="a")], {"w": (0.0, "forecast")},
        quotas={"a": Quota(0.0, 0.0, None, "lab"), "b": Quota(8.0, 0.0, None, "lab")}),
    "up to its borrowing limit": Case(
        {"n1": N1}, {"n1": 8}, [], [queued("w", 8, quota="a")], {"w": (None, "no_room")},
        quotas={"a": Quota(0.0, 0.0, 4.0, "lab"), "b": Quota(8.0, 0.0, None, "lab")}),
    # the pods of an admitted Workload give its quota back when they end
    "a waiting pod of an admitted Workload frees its quota": Case(
        {"n1": N1}, {"n1": 8}, [],
        [Queued("pod", 1, 8, ANY, 0, NOW - 60, 1 * H, holds="cq"),
         queued("next", 8, quota="cq", since=1)],
        {"pod": (0.0, "forecast"), "next": (1.0, "forecast")}, quotas={"cq": Quota(8.0, 8.0)}),
    "a gang larger than its pool can grow to never starts": Case(
        {"n1": N1}, {"n1": 8}, [], [queued("gang", 8, pods=4)], {"gang": (None, "no_room")},
        pools={"a100": PoolBounds(N1, 2, 900.0)}),
    "a node not Ready yet comes up as a new node would": Case(
        {"n1": N1, "n2": replace(N2, ready=False)}, {"n1": 0, "n2": 0},
        [Busy("n1", 8, NOW + 5 * H)], [queued("a", 8)], {"a": (0.25, "forecast")},
        pools={"a100": PoolBounds(N1, 2, 900.0)}),
    "quota held by the first admitted": Case(
        {"n1": N1, "n2": N2}, {"n1": 8, "n2": 8}, [],
        [queued("w1", 8, quota="cq"), queued("w2", 8, quota="cq", since=1)],
        {"w1": (0.0, "forecast"), "w2": (2.0, "forecast")}, quotas={"cq": Quota(8.0, 0.0)}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_expected_starts(case: Case) -> None:
    got = expected_starts(NOW, case.nodes, case.free, case.busy, case.queue, case.pools,
                          case.quotas)
    want = {uid: Expected(None if h is None else NOW + h * H, basis)  # type: ignore[arg-type]
            for uid, (h, basis) in case.expected.items()}
    assert got == want


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 2), st.integers(0, 3)),
                min_size=1, max_size=12),
       st.lists(st.integers(0, 8), min_size=1, max_size=4))
def test_every_unit_gets_one_answer_and_none_starts_before_now(
        items: list[tuple[int, int, int]], ends: list[int]) -> None:
    """Whatever the queue: one answer per unit, never before now, and a unit the play
    started started on room the nodes had (no node over its GPUs: checked by replaying the
    answers in time order)."""
    nodes = {f"n{i}": node(f"n{i}") for i in range(len(ends))}
    busy = [Busy(f"n{i}", 8, NOW + h * H) for i, h in enumerate(ends)]
    queue = [queued(f"q{i}", g, priority=p, since=i, runs=(r + 1) * H)
             for i, (g, p, r) in enumerate(items)]
    got = expected_starts(NOW, nodes, dict.fromkeys(nodes, 0), busy, queue, {}, {})
    assert set(got) == {q.uid for q in queue}
    for e in got.values():
        assert e.start is None or e.start >= NOW
    # GPUs in use at each start never exceed the cluster's
    runs = [(NOW, NOW + h * H, 8) for h in ends]
    runs += [(got[q.uid].start, got[q.uid].start + q.runs_seconds, q.gpus)  # type: ignore[operator]
             for q in queue if got[q.uid].start is not None and q.runs_seconds]
    for t, _, _ in runs:
        assert sum(g for s, e, g in runs if s <= t < e) <= 8 * len(nodes)
