"""A scenario cut into the parts of its cluster that cannot touch each other
(``analytics.whatif.parts``), and the engine that plays each part once
(``analytics.whatif.engine.Engine``). ``tests/test_whatif_end_to_end.py`` holds the parts,
played alone, to the whole cluster played at once."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from analytics.week import Week
from analytics.whatif import engine, parts
from exporter.config import Commitment, Prices
from simulator.scenario import Scenario, load_scenario

DEMO = load_scenario()
DAY = Week(DEMO.start, DEMO.start + timedelta(days=1))


def pools(split: list[Scenario]) -> list[list[str]]:
    return [[p.name for p in part.pools] for part in split]


def workload(s: Scenario, name: str, **change: object) -> Scenario:
    return s.model_copy(update={"workloads": [
        w.model_copy(update=change) if w.name == name else w for w in s.workloads]})


def test_pools_no_workload_shares_are_parts_of_their_own() -> None:
    """The demo's on-demand workloads are kept off the Spot pool by its taint, its Spot
    workload off the on-demand pools by its selector, whole-GPU workloads off MIG and
    time-shared nodes by their labels: each pool is a part."""
    assert pools(parts.split(DEMO)) == [["a100-mig"], ["a100-ondemand"], ["h100-ondemand"],
                                         ["h100-spot"], ["l4-serving"], ["l4-shared"], ["t4"]]


@pytest.mark.parametrize(("name", "change", "bound"), [
    ("llm-pretrain", {"accelerators": ["nvidia-tesla-a100"], "accelerator_selector": False},
     ["a100-ondemand", "h100-ondemand"]),
    ("batch-embed", {"accelerators": ["nvidia-l4"], "accelerator_selector": False},
     ["l4-serving", "t4"]),
])
def test_a_workload_that_may_run_on_two_pools_binds_them(
        name: str, change: dict[str, object], bound: list[str]) -> None:
    split = parts.split(workload(DEMO, name, **change))
    assert bound in [sorted(p) for p in pools(split)]
    assert len(split) == len(DEMO.pools) - 1


def test_kueue_binds_the_cluster_into_one() -> None:
    kueue = load_scenario("kueue")
    assert parts.split(kueue) == [kueue]


def test_a_cluster_of_one_part_is_itself() -> None:
    one = DEMO.model_copy(update={
        "pools": [p for p in DEMO.pools if p.name == "t4"],
        "workloads": [w for w in DEMO.workloads if w.accelerator == "nvidia-tesla-t4"],
        "faults": [f for f in DEMO.faults if f.pool_name == "t4"], "stockouts": []})
    assert parts.split(one) == [one]


def test_each_part_has_its_pools_workloads_jobs_faults_and_stockouts() -> None:
    """Nothing is lost or played twice: every pool, fault and stockout is in one part, a
    workload in each part of a pool it may run on, and one no pool takes (``vit-eval``
    selects a pool the cluster lacks) in the first part only."""
    split = parts.split(DEMO)
    assert sorted(p.name for s in split for p in s.pools) == sorted(p.name for p in DEMO.pools)
    assert sorted(f.model_dump_json() for s in split for f in s.faults) == \
        sorted(f.model_dump_json() for f in DEMO.faults)
    assert sorted(o.model_dump_json() for s in split for o in s.stockouts) == \
        sorted(o.model_dump_json() for o in DEMO.stockouts)
    held = [w.name for s in split for w in s.workloads]
    assert sorted(held) == sorted(w.name for w in DEMO.workloads)
    assert [w.name for w in split[0].workloads if w.name == "vit-eval"] == ["vit-eval"]
    for s in split:
        for f in s.faults:
            assert f.pool_name in {p.name for p in s.pools}
        for o in s.stockouts:
            assert o.pool in {p.name for p in s.pools}


# ------------------------------------------------------------------------ the engine


@pytest.fixture(scope="module")
def day() -> Scenario:
    return DEMO.model_copy(update={"step": engine.RESOLUTION})


def play(player: engine.Engine, s: Scenario) -> engine.Played:
    return player.play(s, DAY)


def test_a_part_played_before_is_not_played_again(day: Scenario) -> None:
    """The same day twice: the second play takes no step, and measures the same. One pool
    more node: only its part plays again, as many steps as that part alone takes, and the
    other pools' figures are the first play's."""
    pricing = engine.Pricing.load(Prices(), DEMO.region)
    player = engine.Engine(pricing, {})
    try:
        first = play(player, day)
        figures = first.measured
        again = play(player, day)
        assert first.steps > 0 and again.steps == 0
        assert again.measured.headline == figures.headline
        pd.testing.assert_frame_equal(again.measured.teams, figures.teams)
        t4 = day.model_copy(update={"pools": [
            p.model_copy(update={"nodes": p.nodes + 1}) if p.name == "t4" else p
            for p in day.pools]})
        more = play(player, t4)
        alone = engine.play(parts.split(t4)[-1], DAY, pricing, {})
        alone.store.close()
        assert more.steps == alone.steps > 0
        others = figures.pools[figures.pools.node_pool != "t4"].reset_index(drop=True)
        pd.testing.assert_frame_equal(
            more.measured.pools[more.measured.pools.node_pool != "t4"]
            .reset_index(drop=True), others)
        assert more.measured.pools.set_index("node_pool").loc["t4", "gpu_hours"] == \
            pytest.approx(figures.pools.set_index("node_pool").loc["t4", "gpu_hours"] + 4 * 24)
    finally:
        player.close()


def test_the_parts_tables_are_one_warehouse(day: Scenario) -> None:
    """Each part numbers its pods from 0: their uids are marked with the part, so a uid is
    one pod's in every table; the row ids are the warehouse's own."""
    played = engine.play(day, DAY, engine.Pricing.load(Prices(), DEMO.region), {})
    try:
        pods = played.store.query("SELECT pod_uid, count(DISTINCT pod) AS n FROM gpu_pods "
                                  "GROUP BY 1")
        assert (pods.n == 1).all(), "a uid is one pod's"
        assert pods.pod_uid.str.endswith("-part1").any()
        known = set(pods.pod_uid)
        for table, uid in engine.POD_UIDS.items():
            held = played.store.query(f"SELECT DISTINCT {uid} AS uid FROM {table} "
                                      f"WHERE {uid} IS NOT NULL")
            assert len(held) and set(held.uid) <= known, table
        for table in ("gpu_usage", "gpu_pods", "gpu_pending", "gpu_free"):
            ids = played.store.query(f"SELECT count(*) AS n, count(DISTINCT id) AS d "
                                     f"FROM {table}")
            assert ids.n[0] == ids.d[0] > 0, table
    finally:
        played.store.close()


def test_a_commitment_is_priced_over_the_whole_cluster_not_each_part(day: Scenario) -> None:
    """Ten committed A100s: the on-demand A100 pools are two parts, and each pool's price
    per GPU-hour is the one the whole cluster's pools give it, not its part's alone."""
    committed = Prices(commitments=[Commitment(gpu="nvidia-tesla-a100", gpus=10,
                                               usd_per_gpu_hour=1.5, term="1y")])
    pricing = engine.Pricing.load(committed, DEMO.region)
    prices = {}
    for whole in (True, False):
        played = engine.play(day, DAY, pricing, {}, whole=whole)
        try:
            prices[whole] = played.store.query(
                "SELECT node_pool, max(price_usd_per_hour) AS price FROM gpu_usage "
                "GROUP BY 1 ORDER BY 1")
        finally:
            played.store.close()
    pd.testing.assert_frame_equal(prices[True], prices[False])
    assert prices[False].set_index("node_pool").price["a100-ondemand"] != \
        engine.Pricing.load(Prices(), DEMO.region).pools(day)["a100-ondemand"]
