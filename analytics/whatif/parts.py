"""A scenario cut into the parts of its cluster that cannot touch each other.

A pod runs only on the pools its workload's filters let it (``simulator.placement``), so
the pools its workloads share bind them into one part; a workload no pool takes goes with
the first part, where it waits as it would anywhere. Parts share no node and no pod: each
plays alone (``analytics.whatif.engine``) and their tables add up to the cluster's. A
layout that changes one pool changes one part, and only that part needs to play again.

What binds the whole cluster into one part: Kueue (its quotas and cohorts span flavours
and queues). Faults and stockouts go with their pool's part.

What playing parts alone changes: the cluster autoscaler scales one node group per loop,
so a part's scale-up waits a loop behind another's in the same second; played alone, each
part scales up at once (the real autoscaler's loop is ten seconds). And nodes are named in
the order they are made, so a part alone names its nodes otherwise, and a pod may be bound
to the other of two equal nodes (the first by name). On the demo week's layouts this
moves cost by at most 0.12 % and a team's p50 or p90 wait by at most 300 s, one step of
the measured week; ``tests/test_whatif_end_to_end.py`` holds parts to the whole cluster.
"""

from __future__ import annotations

from simulator.placement import Placement
from simulator.scenario import Scenario


def split(scenario: Scenario) -> list[Scenario]:
    """``scenario``'s parts, in the order of their first pool's name: itself alone where
    Kueue binds the cluster, or where it has one part."""
    if scenario.kueue is not None:
        return [scenario]
    place = Placement(scenario)
    parent = {p.name: p.name for p in scenario.pools}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    takes: dict[str, list[str]] = {}
    for w in scenario.workloads:
        pools = takes[w.name] = [p.name for p in scenario.pools if place.eligible(p, w)]
        for name in pools[1:]:
            parent[root(name)] = root(pools[0])
    groups: dict[str, list[str]] = {}
    for p in scenario.pools:
        groups.setdefault(root(p.name), []).append(p.name)
    if len(groups) == 1:
        return [scenario]
    parts = sorted((frozenset(g) for g in groups.values()), key=min)
    return [_part(scenario, pools, takes, first=i == 0) for i, pools in enumerate(parts)]


def _part(scenario: Scenario, pools: frozenset[str], takes: dict[str, list[str]],
          first: bool) -> Scenario:
    """The scenario of the pools ``pools``: their workloads (with the first part, those no
    pool takes), those workloads' traced jobs, the pools' faults and stockouts."""
    workloads = [w for w in scenario.workloads
                 if pools.intersection(takes[w.name]) or (first and not takes[w.name])]
    named = {w.name for w in workloads}
    return scenario.model_copy(update={
        "pools": [p for p in scenario.pools if p.name in pools],
        "workloads": workloads,
        "jobs": [j for j in scenario.jobs if j.workload in named],
        "faults": [f for f in scenario.faults if f.pool_name in pools],
        "stockouts": [s for s in scenario.stockouts if s.pool in pools]})

