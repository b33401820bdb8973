"""One setting per pool (``analytics.whatif.search``): the candidates a pool gets, and the
rule that keeps one, as tables of cases."""

from __future__ import annotations

import pandas as pd
import pytest

from analytics.whatif import search
from analytics.whatif.measure import Measured
from simulator.scenario import Autoscaling, Pool
from tests.analytics.test_whatif import make_layout

H100 = Pool(name="h100", accelerator="nvidia-h100-80gb", gpus_per_node=8, nodes=2)


@pytest.mark.parametrize(("pool", "labels"), [
    (H100, ["as it is (2 nodes of 8 GPUs)", "autoscale 0-2 nodes of 8 GPUs",
            "autoscale 0-4 nodes of 8 GPUs", "autoscale 2-4 nodes of 8 GPUs",
            "autoscale 0-3 nodes of 8 GPUs"]),
    (H100.model_copy(update={"autoscaling": Autoscaling(min_nodes=0, max_nodes=2)}),
     ["as it is (autoscale 0-2 nodes of 8 GPUs)", "autoscale 0-4 nodes of 8 GPUs",
      "autoscale 0-3 nodes of 8 GPUs"]),
    (Pool(name="a100", accelerator="nvidia-tesla-a100", gpus_per_node=8, nodes=2),
     ["as it is (2 nodes of 8 GPUs)", "autoscale 0-2 nodes of 8 GPUs",
      "autoscale 0-4 nodes of 8 GPUs", "autoscale 2-4 nodes of 8 GPUs",
      "autoscale 0-3 nodes of 8 GPUs", "1 node of 16 GPUs (a2-megagpu-16g)"]),
], ids=["fixed nodes", "autoscaled already: no setting twice", "a larger shape"])
def test_a_pool_gets_its_setting_and_the_candidates_around_it(pool: Pool,
                                                              labels: list[str]) -> None:
    base = make_layout(pools=[pool])
    found = search.settings(base, pool)
    assert [s.label for s in found] == labels
    assert found[0].layout == base
    assert all(s.layout != base for s in found[1:]), "each candidate changes the layout"


A100 = Pool(name="a100", accelerator="nvidia-tesla-a100", gpus_per_node=8, nodes=2)


def replayed(causes: list[tuple[str, str, str, float]], stranded: dict[str, float]
             ) -> Measured:
    """A week's replay that waited ``causes`` (pool, model, cause, GPU-hours) and left
    ``stranded`` GPU-hours free per pool."""
    pools = pd.DataFrame({"node_pool": list(stranded),
                          "stranded_gpu_hours": list(stranded.values())})
    empty = pd.DataFrame()
    return Measured({}, empty, empty, pools, 0, empty, pd.DataFrame(
        causes, columns=["node_pool", "gpu_model", "cause", "gpu_hours"]))


@pytest.mark.parametrize(("week", "labels"), [
    (replayed([], {"a100": 40.0}), ["as it is (2 nodes of 8 GPUs)",
                                    "autoscale 0-2 nodes of 8 GPUs"]),
    (replayed([("a100", "nvidia-tesla-a100", "no_capacity", 30.0)], {"a100": 0.0}),
     ["as it is (2 nodes of 8 GPUs)", "autoscale 0-4 nodes of 8 GPUs",
      "autoscale 2-4 nodes of 8 GPUs", "autoscale 0-3 nodes of 8 GPUs",
      "1 node of 16 GPUs (a2-megagpu-16g)"]),
    # a replay does not say which pool a pod fit: the pods of the pool's GPU model
    (replayed([("", "nvidia-tesla-a100", "scaling_up", 3.0)], {"a100": 0.0}),
     ["as it is (2 nodes of 8 GPUs)", "autoscale 0-4 nodes of 8 GPUs",
      "autoscale 2-4 nodes of 8 GPUs", "autoscale 0-3 nodes of 8 GPUs",
      "1 node of 16 GPUs (a2-megagpu-16g)"]),
    (replayed([("t4", "nvidia-tesla-t4", "no_capacity", 30.0),
               ("", "nvidia-tesla-t4", "no_capacity", 30.0),
               ("a100", "nvidia-tesla-a100", "quota", 9.0)], {"a100": 0.0}),
     ["as it is (2 nodes of 8 GPUs)"]),
    (Measured({}, pd.DataFrame(), None, pd.DataFrame(), None, pd.DataFrame()),
     ["as it is (2 nodes of 8 GPUs)", "autoscale 0-2 nodes of 8 GPUs",
      "autoscale 0-4 nodes of 8 GPUs", "autoscale 2-4 nodes of 8 GPUs",
      "autoscale 0-3 nodes of 8 GPUs", "1 node of 16 GPUs (a2-megagpu-16g)"]),
], ids=["idle, nothing waited: fewer nodes only", "waited for nodes, never idle: more",
        "a replay's waits, by GPU model", "waits elsewhere or for quota: nothing to weigh",
        "no causes recorded: all"])
def test_a_pool_is_weighed_only_for_what_its_week_gives_reason_to(
        week: Measured, labels: list[str]) -> None:
    found = search.settings(make_layout(pools=[A100]), A100, search.evidence(week, A100))
    assert [s.label for s in found] == labels


def measured(cost: float, waits: dict[str, float]) -> Measured:
    teams = pd.DataFrame({"team": list(waits), "wait_p90_seconds": list(waits.values())})
    empty = pd.DataFrame()
    return Measured({"cost_usd": cost}, teams, empty, empty, 0, empty)


def target(team: str) -> float:
    return {"research": 4 * 3600.0}.get(team, 3600.0)


H = 3600.0
CASES = [
    # (cost, waits) per setting, the pool as it is first; the index kept
    ([(100.0, {"research": 26 * H}), (80.0, {"research": 26 * H}),
      (120.0, {"research": 3 * H}), (110.0, {"research": 8 * H})], 2),
    ([(100.0, {"research": 2 * H}), (80.0, {"research": 3 * H}),
      (70.0, {"research": 5 * H})], 1),
    ([(100.0, {"research": 26 * H}), (80.0, {"research": 26 * H + 30}),
      (90.0, {"research": 20 * H})], 2),
    ([(100.0, {"research": 26 * H}), (80.0, {"research": 26 * H + 30}),
      (90.0, {"research": 30 * H})], 1),
    ([(100.0, {"research": 2 * H}), (100.0 - 1e-9, {"research": 2 * H})], 0),
    ([(100.0, {"research": 2 * H, "ranking": 0.5 * H}),
      (60.0, {"research": 2 * H, "ranking": 2 * H})], 0),
]


@pytest.mark.parametrize(("weighed", "kept"), CASES, ids=[
    "the cheapest within every target", "a cheaper one within the target",
    "none within: the least past", "none within: a tie, then the cheapest",
    "the same cost to the cent: the pool as it is", "another team pushed past its target"])
def test_the_cheapest_within_every_target_is_kept(weighed: list[tuple[float, dict[str, float]]],
                                                  kept: int) -> None:
    base = make_layout(pools=[H100])
    settings = [search.Setting("h100", f"s{i}", base) for i in range(len(weighed))]
    ws = [search.weigh(s, measured(c, w), target) for s, (c, w) in zip(settings, weighed,
                                                                        strict=True)]
    assert search.choose(ws) is ws[kept]
