"""The levers and what to do this week (``analytics.figures.actions``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analytics.figures.actions import actions, savings
from analytics.figures.cost import unallocated_by_pool
from analytics.workspace import Table
from tests.analytics.figures.frames import U, pods, table, workspace


def _queue(*rows: tuple[Any, ...]) -> pd.DataFrame:
    """(team, model, p90 wait s, pending GPU-hours[, share of the wait for Kueue's
    admission]) as ``queue`` gives them."""
    return pd.DataFrame([(t, m, 10, p90 / 2, p90, p90, pending, share[0] if share else np.nan)
                         for t, m, p90, pending, *share in rows],
                        columns=["team", "gpu_model", "pods", "p50_seconds", "p90_seconds",
                                 "p99_seconds", "pending_gpu_hours", "admission_share"])


IDLE_H100 = pd.DataFrame([("h100", "nvidia-h100-80gb", "on-demand", 100.0, 1000.0)],
                         columns=["node_pool", "gpu_model", "provisioning", "gpu_hours",
                                  "cost_usd"])
NO_POOL = IDLE_H100.iloc[0:0]
LEVERS = pd.DataFrame([("spot", "to spot", 50.0), ("autoscaling", "scaled", 1000.0),
                       ("sharing", "shared", 0.0), ("right-sizing", "smaller", 20.0)],
                      columns=["lever", "how", "weekly_saving_usd"])
SLA = pd.DataFrame([("h100", "nvidia-h100-80gb", 0.99, 0.995, 8.0, -1.0, False),
                    ("l4", "nvidia-l4", 1.0, 0.995, 0.0, 1.0, True)],
                   columns=["node_pool", "gpu_model", "availability", "target", "down_hours",
                            "error_budget_left", "meets_target"])


@pytest.mark.parametrize(("unallocated", "waits", "expected"), [
    # capacity no one waited for: a saving
    (IDLE_H100, _queue(("a", "nvidia-h100-80gb", 600, 1)),
     [("scale this pool down", 1000.0, None), ("move batch Jobs to spot", 50.0, None),
      ("right-size workloads", 20.0, None)]),
    # the same capacity while H100 pods waited 22 h: never a saving, a thing to fix
    (IDLE_H100, _queue(("a", "nvidia-h100-80gb", 22 * 3600, 300)),
     [("let the waiting pods use this pool", None, None),
      ("move batch Jobs to spot", 50.0, None), ("right-size workloads", 20.0, None)]),
    # a long queue and no capacity of its model left: the pool is too small
    (NO_POOL, _queue(("a", "nvidia-h100-80gb", 22 * 3600, 300), ("b", "nvidia-l4", 60, 0)),
     [("add capacity", None, 300 * 10.0), ("move batch Jobs to spot", 50.0, None),
      ("right-size workloads", 20.0, None)]),
    # idle GPUs while Kueue held the Jobs for quota: the quota is the fix, not the pool
    (IDLE_H100, _queue(("a", "nvidia-h100-80gb", 22 * 3600, 300, 0.9)),
     [("raise the Kueue quota", None, None),
      ("move batch Jobs to spot", 50.0, None), ("right-size workloads", 20.0, None)]),
    # Kueue waits a little, the nodes most: still the pool
    (IDLE_H100, _queue(("a", "nvidia-h100-80gb", 22 * 3600, 300, 0.2)),
     [("let the waiting pods use this pool", None, None),
      ("move batch Jobs to spot", 50.0, None), ("right-size workloads", 20.0, None)]),
], ids=["idle pool", "idle pool while its model queues", "pool too small",
        "idle pool while Kueue holds Jobs for quota", "Kueue admits, the nodes lack"])
def test_what_to_do_reconciles_levers_with_queues(unallocated: pd.DataFrame,
                                                  waits: pd.DataFrame,
                                                  expected: list[tuple[Any, ...]]) -> None:
    prices = {("nvidia-h100-80gb", "on-demand"): 10.0}
    t = actions(unallocated, waits, SLA.iloc[1:], LEVERS, prices)
    got = [(r.action, None if math.isnan(r.weekly_saving_usd) else r.weekly_saving_usd,
            None if math.isnan(r.weekly_cost_usd) else r.weekly_cost_usd)
           for r in t.itertuples()]
    assert got == expected
    assert not t.why.str.len().eq(0).any()
    ws = workspace(pods=pods().iloc[0:0])
    none = table(ws, "none", pd.DataFrame({"weekly_saving_usd": pd.Series(dtype=float)}))
    scaled = savings(none, none, unallocated, Table(ws, "pods"), waits)
    assert scaled.set_index("lever").weekly_saving_usd["autoscaling"] == sum(
        row[1] for row in expected if row[0] == "scale this pool down")


def test_what_to_do_names_a_pool_under_its_sla_first() -> None:
    t = actions(NO_POOL, _queue(), SLA, LEVERS, {})
    assert t.action.iloc[0] == "restore availability" and t["where"].iloc[0] == \
        "h100 (nvidia-h100-80gb)"
    assert "99.00% available against 99.5%, 8.0 GPU-hours down" in t.why.iloc[0]


def test_savings_levers() -> None:
    p = pods(rows=[{"pod_uid": "low", "utilization": 0.1, "idle_cost_usd": 9.0},
                   {"pod_uid": "high", "utilization": 0.9, "idle_cost_usd": 1.0}])
    ws = workspace(pods=p)
    spot = table(ws, "spot", pd.DataFrame({"weekly_saving_usd": [4.0]}))
    right = table(ws, "rightsizing", pd.DataFrame({"weekly_saving_usd": [2.0, 1.0]}))
    t = savings(spot, right, unallocated_by_pool(U), Table(ws, "pods"), _queue()) \
        .set_index("lever")
    assert t.weekly_saving_usd.to_dict() == {"spot": 4.0, "autoscaling": 10.0,
                                             "sharing": 9.0, "right-sizing": 3.0}
