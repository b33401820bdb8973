"""Where a pod may run is what its served spec says: the filters match a pod's selector,
affinity and tolerations against a node's labels and taints as kube-scheduler does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from simulator.cluster import Cluster
from simulator.placement import (
    Constraints,
    Placement,
    filter_reason,
    labels_match,
    untolerated,
)
from simulator.scenario import EMBEDDED, Scenario, load_scenario, parse_scenario, pool_selects
from tests.conftest import scenario_data


@pytest.mark.parametrize("name", EMBEDDED)
def test_pods_may_run_where_their_pool_offers_what_they_ask(name: str) -> None:
    """Without a node selector or tolerations of their own, a workload's pods pass the
    filters on exactly the pools that offer its accelerator, provisioning, sharing and
    MIG profile: a plain pod never lands on a MIG or time-shared node."""
    s = load_scenario(name)
    placement = Placement(s)
    for w in s.workloads:
        if w.node_selector or w.tolerations:
            continue
        for pool in s.pools:
            assert placement.eligible(pool, w) == pool_selects(pool, w), (w.name, pool.name)


def test_a_plain_pod_asks_for_whole_gpus_by_affinity(
        make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    pods = {w: c.submit(w)[0] for w in ("half", "shared", "slice")}
    spec = {w: (c.store.get("Pod", f"{p.namespace}/{p.name}") or {})["spec"]
            for w, p in pods.items()}
    (term,) = spec["half"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "cloud.google.com/gke-gpu-partition-size", "operator": "DoesNotExist"},
        {"key": "cloud.google.com/gke-gpu-sharing-strategy", "operator": "DoesNotExist"}]
    assert "affinity" not in spec["shared"] and "affinity" not in spec["slice"]


def _affinity(*requirements: dict[str, Any]) -> Constraints:
    return Constraints({}, [list(requirements)])


LABELS = {"pool": "a100", "gpus": "8"}


@pytest.mark.parametrize(("constraints", "fits"), [
    (Constraints({"pool": "a100"}, []), True),
    (Constraints({"pool": "h100"}, []), False),
    (_affinity({"key": "pool", "operator": "In", "values": ["a100", "h100"]}), True),
    (_affinity({"key": "pool", "operator": "NotIn", "values": ["a100"]}), False),
    (_affinity({"key": "gpus", "operator": "Exists"}), True),
    (_affinity({"key": "spot", "operator": "DoesNotExist"}), True),
    (_affinity({"key": "gpus", "operator": "Gt", "values": ["4"]}), True),
    (_affinity({"key": "gpus", "operator": "Lt", "values": ["4"]}), False),
    (_affinity({"key": "missing", "operator": "Gt", "values": ["4"]}), False),
    (Constraints({}, [[{"key": "pool", "operator": "In", "values": ["x"]}],
                      [{"key": "gpus", "operator": "Exists"}]]), True),  # any one term
])
def test_node_selector_and_required_affinity(constraints: Constraints, fits: bool) -> None:
    assert labels_match(constraints, LABELS) is fits


DEDICATED = {"key": "dedicated", "value": "research", "effect": "NoSchedule"}


@pytest.mark.parametrize(("tolerations", "taints", "blocking"), [
    ([], [DEDICATED], "dedicated"),
    ([{"key": "dedicated", "operator": "Equal", "value": "research"}], [DEDICATED], None),
    ([{"key": "dedicated", "operator": "Equal", "value": "other"}], [DEDICATED], "dedicated"),
    ([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}], [DEDICATED],
     "dedicated"),
    ([{"operator": "Exists"}], [DEDICATED], None),  # tolerates every taint
    ([], [{"key": "soft", "value": "", "effect": "PreferNoSchedule"}], None),
])
def test_taints_and_tolerations(tolerations: list[dict[str, str]],
                                taints: list[dict[str, str]], blocking: str | None) -> None:
    taint = untolerated(Constraints({}, [], tolerations), taints)
    assert (taint["key"] if taint else None) == blocking


def test_the_taint_filter_speaks_first() -> None:
    c = Constraints({"pool": "h100"}, [])
    assert filter_reason(c, LABELS, [DEDICATED]) == \
        "node(s) had untolerated taint {dedicated: research}"
    assert filter_reason(c, LABELS, []) == "node(s) didn't match Pod's node affinity/selector"


def test_a_pools_taint_is_on_its_nodes_and_a_toleration_lets_pods_in() -> None:
    data = scenario_data()
    data["pools"][0]["taints"] = [{"key": "dedicated", "value": "research"}]
    data["workloads"][1]["tolerations"] = [{"key": "dedicated", "value": "research"}]
    c = Cluster(parse_scenario(data, "test"))
    node = next(n for n in c.live_nodes() if n.pool.name == "h100")
    obj = c.store.get("Node", node.name)
    assert obj is not None
    assert {"key": "dedicated", "value": "research", "effect": "NoSchedule"} in \
        obj["spec"]["taints"]
    assert c.submit("train")[0].phase == "Pending"
    assert c.submit("urgent")[0].phase == "Running"
