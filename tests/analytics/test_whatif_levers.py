"""The layout each action implies (``analytics.whatif.levers``)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from analytics.figures.actions import LAYOUT_CAUSES
from analytics.whatif import levers
from tests.analytics.test_whatif import make_layout


def actions(*rows: tuple[str, str, str | None]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["action", "where", "answers"])


KUEUE: dict[str, Any] = {"cluster_queues": [{"name": "research", "flavors": [
    {"accelerator": "nvidia-h100-80gb", "nominal_gpus": 8}]}]}


@pytest.mark.parametrize(("row", "change", "check"), [
    (("scale this pool down", "h100 (nvidia-h100-80gb, on-demand)", "mismatch, no_demand"),
     "h100 autoscaled from 0 to 2 nodes",
     lambda lay: (lay.pool("h100").autoscaling.min_nodes,
                  lay.pool("h100").autoscaling.max_nodes) == (0, 2)),
    (("add capacity (max nodes)", "h100 (nvidia-h100-80gb)", "no_capacity"),
     "h100's maximum from 2 to 4 nodes",
     lambda lay: (lay.pool("h100").nodes, lay.pool("h100").autoscaling.min_nodes,
                  lay.pool("h100").autoscaling.max_nodes) == (2, 2, 4)),
    (("compact placement, fewer and larger nodes", "t4-spot (nvidia-tesla-t4)", "fragmented"),
     "t4-spot in n1-standard-32 nodes (4 GPUs each, 2 nodes)", None),
    (("raise the ClusterQueue quota or borrow in the cohort", "research", "quota"),
     "ClusterQueue research's quota to nvidia-h100-80gb 16 GPUs",
     lambda lay: lay.kueue.cluster_queues[0].flavors[0].nominal_gpus == 16),
    (("scale in another zone, region or on spot", "h100 (nvidia-h100-80gb)", "stockout"),
     "h100 without its stockouts (capacity in another zone)",
     lambda lay: lay.stockouts == []),
])
def test_each_action_replays_on_the_layout_it_implies(row: tuple[str, str, str], change: str,
                                                       check: Any) -> None:
    base = make_layout(kueue=KUEUE, pools=[
        {"name": "h100", "accelerator": "nvidia-h100-80gb", "gpus_per_node": 8, "nodes": 2,
         "autoscaling": {"min_nodes": 2, "max_nodes": 2}},
        {"name": "t4-spot", "accelerator": "nvidia-tesla-t4", "gpus_per_node": 4,
         "nodes": 2, "spot": True}],
        stockouts=[{"pool": "h100", "at": "1h", "duration": "2h"}])
    found = levers.layouts(actions(row), base, [])
    if check is None:  # t4's largest shape is 4 GPUs already, and placement is compact
        assert found == []
        return
    [lever] = found
    assert lever.change == change
    assert check(lever.layout)
    assert lever.layout != base


def test_a_larger_shape_keeps_the_gpus() -> None:
    base = make_layout(pools=[{"name": "a100", "accelerator": "nvidia-tesla-a100",
                               "gpus_per_node": 4, "nodes": 3}])
    [lever] = levers.layouts(actions(("compact placement, fewer and larger nodes",
                                      "a100 (nvidia-tesla-a100)", "fragmented")), base, [])
    pool = lever.layout.pool("a100")
    assert pool is not None and (pool.gpus_per_node, pool.nodes) == (16, 1)
    assert "a2-megagpu-16g" in lever.change


def test_spot_candidates_move_to_a_spot_twin_and_leave_the_on_demand_pool_autoscaled() -> None:
    base = make_layout()
    [lever] = levers.layouts(actions(("move batch Jobs to spot", "all pools", None)), base,
                             [("ml", "nvidia-h100-80gb"), ("ml", "nvidia-tesla-t4")])
    lay = lever.layout
    twin, left = lay.pool("h100-spot"), lay.pool("h100")
    assert twin is not None and twin.spot and twin.autoscaling is not None
    assert (twin.nodes, twin.autoscaling.max_nodes) == (0, 2)
    assert left is not None and left.autoscaling is not None and left.autoscaling.min_nodes == 0
    assert lay.pool("t4-spot-spot") is None, "no on-demand T4 pool to leave"
    assert [(m.match.namespace, m.match.gpu_model, m.to.spot) for m in lay.moves] == [
        ("ml", "nvidia-h100-80gb", True)]
    assert "reclaimed 0.1 times a node-day, 30 min lost each" in lever.change


@pytest.mark.parametrize("row", [
    ("fix the manifests", "nvidia-tesla-a100", "unschedulable"),
    ("speed up image pulls", "h100 (nvidia-h100-80gb)", "starting"),
    ("scale this pool down", "gone (nvidia-l4, on-demand)", "no_demand"),
    ("raise the ClusterQueue quota or borrow in the cohort", "research", "quota"),  # no Kueue
])
def test_an_action_that_changes_no_layout_is_not_replayed(row: tuple[str, str, str]) -> None:
    assert levers.layouts(actions(row), make_layout(), []) == []


def test_the_causes_a_replay_prices_are_those_a_layout_answers() -> None:
    assert set(levers.BY_CAUSE) == set(LAYOUT_CAUSES)
