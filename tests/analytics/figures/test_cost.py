"""Cost tables, idle offenders and unallocated capacity (``analytics.figures.cost``)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from analytics.figures.cost import cost_by, daily_by_team, idle_offenders, unallocated_by_pool
from analytics.figures.headline import headline as headline_of
from tests.analytics.figures.frames import WEEK, T, U, pods, usage, workspace


@pytest.mark.parametrize(("dimension", "expected"), [
    # value, cost, previous, change
    ("team", [("a", 20.0, 10.0, 1.0), ("b", 1.0, 0.0, None), ("(unallocated)", 10.0, 0.0, None)]),
    ("node_pool", [("h100", 30.0, 10.0, 2.0), ("l4", 1.0, 0.0, None)]),
    ("provisioning", [("on-demand", 30.0, 10.0, 2.0), ("spot", 1.0, 0.0, None)]),
])
def test_cost_by(dimension: str, expected: list[tuple[Any, ...]]) -> None:
    t = cost_by(U, dimension)
    got = [(r[dimension], r.cost_usd, r.previous_cost_usd,
            None if math.isnan(r.change) else r.change) for _, r in t.iterrows()]
    assert got == expected
    assert t.share.sum() == pytest.approx(1.0)
    assert t.cost_usd.sum() == headline_of(U)["cost_usd"]  # every table: the headline


def test_a_team_table_reconciles_and_says_what_its_utilisation_is_of() -> None:
    down = usage(*U.itertuples(index=False),
                 (None, None, "l4", "nvidia-l4", "spot", "unavailable", True, 1800, 0, 0, 0.5,
                  0, 0.0))
    teams = cost_by(down, "team").set_index("team")
    assert list(teams.index) == ["a", "b", "(unallocated)", "(unavailable)"]
    assert teams.cost_usd.sum() == headline_of(down)["cost_usd"] == 31.5
    assert teams.utilization_of_allocated.to_dict() == pytest.approx(
        {"a": 0.75, "b": math.nan, "(unallocated)": math.nan, "(unavailable)": math.nan},
        nan_ok=True)
    assert teams.share_of_allocated[["a", "b"]].sum() == pytest.approx(1.0)
    assert teams.share_of_allocated[["(unallocated)", "(unavailable)"]].isna().all()
    pools = cost_by(down, "node_pool").set_index("node_pool")
    assert "utilization_of_allocated" not in pools and "share_of_allocated" not in pools
    assert pools.utilization_of_capacity["h100"] == pytest.approx(5400 / 7200)


def test_daily_by_team_has_every_day() -> None:
    daily = pd.DataFrame({"day": [T("2026-11-17", tz="UTC")] * 2, "team": ["a", "b"],
                          "cost_usd": [3.0, 5.0]})
    t = daily_by_team(daily, WEEK)
    assert len(t) == 7 and list(t.columns) == ["b", "a"]
    assert t.loc[WEEK.days[1].date(), "a"] == 3.0 and t.iloc[0].sum() == 0


def test_idle_offenders_rank_by_idle_gpu_hours_under_a_utilisation_ceiling() -> None:
    """A notebook idle all week comes first; a pretraining job's idle share of a dear GPU
    is no offender at all, however much it costs."""
    p = pods(rows=[
        {"pod": "pretrain", "utilization": 0.9, "idle_seconds": 0.1 * 168 * 3600,
         "idle_cost_usd": 200.0},
        {"pod": "notebook", "gpu_model": "nvidia-l4", "utilization": 0.008,
         "idle_seconds": 0.992 * 168 * 3600, "idle_cost_usd": 120.0},
        {"pod": "small", "utilization": 0.2, "idle_seconds": 2700.0, "idle_cost_usd": 1.0},
        {"pod": "dear", "utilization": 0.2, "idle_seconds": 2700.0, "idle_cost_usd": 9.0},
        {"pod": "unmeasured", "utilization": math.nan, "idle_seconds": 0.0,
         "idle_cost_usd": 0.0}])
    assert list(idle_offenders(workspace(pods=p)).pod) == ["notebook", "dear", "small"]


def test_no_pods_no_idle_offenders() -> None:
    assert idle_offenders(workspace(pods=pods().iloc[0:0])).empty


def test_unallocated_by_pool() -> None:
    t = unallocated_by_pool(U)
    assert t.to_dict("records") == [{"node_pool": "h100", "gpu_model": "nvidia-h100-80gb",
                                     "provisioning": "on-demand", "gpu_hours": 1.0,
                                     "cost_usd": 10.0}]
