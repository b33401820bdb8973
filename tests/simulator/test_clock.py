"""``Cluster.advance_to`` steps only to the times something can change, and leaves the same
truth as ``advance``, step by step: the shipped scenarios with random seeds, steps,
faults and stockouts, both ways."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cluster import Cluster
from simulator.scenario import Fault, Scenario, Stockout, load_scenario

SCENARIOS = {name: load_scenario(name) for name in ("default", "kueue", "europe")}


def truth_of(c: Cluster) -> dict[str, Any]:
    t = c.truth
    return {
        "segments": sorted((s.device.device_id, s.start, s.end, s.down,
                            tuple(p.uid for p in s.occupants), round(s.joules, 6))
                           for s in t.segments),
        "pods": sorted((p.uid, p.created_at, p.scheduled_at, p.finished_at, p.phase, p.reason,
                        p.node) for p in t.pods.values()),
        "workloads": sorted((w.uid, w.created_at, tuple(w.admissions), tuple(w.evictions))
                            for w in t.workloads.values()),
        "pending": sorted((p.uid, p.cause, p.start, p.end, p.gpus)
                          for p in t.pending_segments()),
        "free": sorted((f.pool, f.use, f.start, f.end, round(f.gpus, 9))
                       for f in t.free_segments()),
        "incidents": sorted((i.gpu_uuid, i.reason, i.start, i.end) for i in t.incidents),
        "interruptions": sorted((i.node, i.at, i.pod_uids) for i in t.interruptions),
    }


def both_ways(s: Scenario, seconds: float) -> tuple[dict[str, Any], dict[str, Any], int]:
    stepped = Cluster(s, headless=True)
    stepped.advance(seconds)
    stepped.close()
    jumped = Cluster(s, headless=True)
    taken = jumped.advance_to(jumped.start + seconds)
    jumped.close()
    assert jumped.now == stepped.now
    return truth_of(stepped), truth_of(jumped), taken


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Scenario, float]:
    base = SCENARIOS[draw(st.sampled_from(sorted(SCENARIOS)))]
    step = float(draw(st.sampled_from([7, 30, 60, 300])))
    hours = draw(st.integers(4, 16))
    pools = [p for p in base.pools]
    faults = []
    for _ in range(draw(st.integers(0, 4))):
        pool = draw(st.sampled_from(pools))
        at = draw(st.integers(0, hours * 3600))
        kind = draw(st.sampled_from(["xid", "node_not_ready", "spot_preemption"]))
        if kind == "spot_preemption":
            faults.append(Fault(at=at, kind=kind, pool=pool.name,
                                restart_cost=draw(st.sampled_from([0, 600]))))
        elif kind == "xid":
            faults.append(Fault(at=at, kind=kind, node=f"{pool.name}/0",
                                gpu=draw(st.integers(0, pool.gpus_per_node - 1)),
                                code=draw(st.sampled_from([79, 48, 63])),
                                duration=draw(st.integers(60, 7200))))
        else:
            faults.append(Fault(at=at, kind=kind, node=f"{pool.name}/0",
                                duration=draw(st.integers(60, 7200))))
    scaled = [p for p in pools if p.autoscaling is not None]
    stockouts = [Stockout(pool=draw(st.sampled_from(scaled)).name,
                          at=draw(st.integers(0, hours * 3600)),
                          duration=draw(st.integers(600, 4 * 3600)))
                 for _ in range(draw(st.integers(0, 2)))] if scaled else []
    s = base.model_copy(update={"seed": draw(st.integers(1, 10_000)), "step": step,
                                "faults": faults, "stockouts": stockouts})
    return s, hours * 3600.0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_advance_to_leaves_the_truth_advance_leaves(case: tuple[Scenario, float]) -> None:
    s, seconds = case
    stepped, jumped, _ = both_ways(s, seconds)
    for part in stepped:
        assert jumped[part] == stepped[part], part


@pytest.mark.parametrize("name", ["default", "kueue"])
def test_advance_to_skips_the_quiet_steps(name: str) -> None:
    """At 10-second steps a day of the demo changes in fewer than one step in eight."""
    s = SCENARIOS[name].model_copy(update={"step": 10.0})
    stepped, jumped, taken = both_ways(s, 86400.0)
    assert jumped == stepped
    assert taken < 8640 / 8


def test_a_headless_cluster_writes_no_api_objects() -> None:
    c = Cluster(SCENARIOS["default"], headless=True)
    c.advance_to(c.start + 3600)
    assert c.store.list_objects("Pod") == []
    assert c.store.list_objects("Event") == []
    assert c.truth.pods


class Forgetful(Cluster):
    """A cluster whose scheduler tries every pod afresh each pass."""

    def _schedule(self) -> None:
        self.freed += 1
        super()._schedule()


def told(c: Cluster) -> list[tuple[Any, ...]]:
    """What the scheduler last told each pod it could not place, and when."""
    return sorted((p.uid, p.unschedulable_since, p.unschedulable_message,
                   p.failed_scheduling_at) for p in c.pods.values())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_a_refused_pod_keeps_its_verdict_until_gpus_are_freed(case: tuple[Scenario, float]
                                                              ) -> None:
    """The scheduler carries a refusal over until GPUs are freed or the nodes change: the
    truth, and what each waiting pod is told, are those of a scheduler trying every pod
    afresh each pass (over two days, for queues to form)."""
    s, _ = case
    carried, fresh = Cluster(s, headless=True), Forgetful(s, headless=True)
    for c in (carried, fresh):
        c.advance(2 * 86400.0)
        c.close()
    assert truth_of(carried) == truth_of(fresh)
    assert told(carried) == told(fresh)
