"""How the replayed scheduler places pods of different sizes and priorities, worked by hand
on three nodes of 8 GPUs: compact placement (best fit, kube-scheduler's MostAllocated)
against spread (LeastAllocated).

Five Jobs of one pod each, submitted together: B and C (priority 900, 4 GPUs, 1 h), E
(priority 500, 2 GPUs, 2 h), A and D (priority 100; A 6 GPUs for 3 h, D 8 GPUs for 1 h). The
scheduler takes them by priority, then age, then name: B, C, E, A, D.

Compact, each on the node it leaves with the fewest GPUs free (ties: the first node)::

    B 4 -> node 0 (leaves 4)   C 4 -> node 0 (leaves 0)   E 2 -> node 1 (leaves 6)
    A 6 -> node 1 (leaves 0)   D 8 -> node 2 (leaves 0)        all start at once

Spread, each on the node it leaves with the most free::

    B 4 -> node 0 (leaves 4)   C 4 -> node 1 (leaves 4)   E 2 -> node 2 (leaves 6)
    A 6 -> node 2 (leaves 0: the only node with 6 free)   D 8 -> no node has 8 free

    at 1 h B and C end: nodes 0 and 1 are empty; D goes to node 0 (the first), 1 h late.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from analytics.whatif import layout, scenario
from simulator.cluster import Cluster
from tests.analytics.test_whatif import START, make_job, make_layout

H = 3600.0
JOBS = [make_job(job=name, gpus_per_pod=gpus, priority=priority,
                 priority_class=f"p{priority}", run_seconds=hours * H,
                 submitted=START + timedelta(minutes=10))
        for name, gpus, priority, hours in [("a", 6, 100, 3), ("b", 4, 900, 1),
                                            ("c", 4, 900, 1), ("d", 8, 100, 1),
                                            ("e", 2, 500, 2)]]
COMPACT = {"b": (0, 0.0), "c": (0, 0.0), "e": (1, 0.0), "a": (1, 0.0), "d": (2, 0.0)}
SPREAD = {"b": (0, 0.0), "c": (1, 0.0), "e": (2, 0.0), "a": (2, 0.0), "d": (0, H)}


@pytest.mark.parametrize(("placement", "expected"), [("compact", COMPACT),
                                                     ("spread", SPREAD)])
def test_three_nodes_by_hand(placement: str, expected: dict[str, tuple[int, float]]) -> None:
    """Each Job's node (by its order among the pool's nodes) and its wait."""
    lay = make_layout(pools=[{"name": "h100", "accelerator": "nvidia-h100-80gb",
                              "gpus_per_node": 8, "nodes": 3}], placement=placement)
    built = scenario.build(JOBS, layout.with_priorities(lay, JOBS), START,
                           START + timedelta(hours=6), 1.0)
    cluster = Cluster(built.scenario, headless=True)
    cluster.advance_to(cluster.start + 6 * H)
    nodes = sorted({n.name for n in cluster.nodes.values()})
    submitted = cluster.start + 600
    got = {}
    for rec in cluster.truth.pods.values():
        assert rec.node is not None and rec.scheduled_at is not None, rec.name
        got[rec.workload.split("-")[0]] = (nodes.index(rec.node), rec.scheduled_at - submitted)
    assert got == expected
