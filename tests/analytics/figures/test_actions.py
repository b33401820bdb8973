"""The levers and what to do this week (``analytics.figures.actions``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analytics.figures.actions import (
    actions,
    cause_levers,
    savings,
    scale_downs,
    team_actions,
)
from analytics.figures.cost import unallocated_by_pool
from analytics.figures.waits import NO_POOL as FITS_NONE
from analytics.figures.waits import Waited, pool_hours
from analytics.tables import columns
from analytics.workspace import Table
from tests.analytics.figures.frames import T, U, pods, table, workspace


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
     [("add capacity", None, None), ("move batch Jobs to spot", 50.0, None),
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
    t = actions(unallocated, waits, SLA.iloc[1:], LEVERS)
    got = [(r.action, None if math.isnan(r.weekly_saving_usd) else r.weekly_saving_usd,
            None if math.isnan(r.weekly_cost_usd) else r.weekly_cost_usd)
           for r in t.itertuples()]
    assert got == expected
    assert not t.why.str.len().eq(0).any()
    if expected[0][0] == "scale this pool down":  # no causes recorded: over the week
        assert "Matched over the week, not hour by hour" in t.why.iloc[0]
    ws = workspace(pods=pods().iloc[0:0])
    none = table(ws, "none", pd.DataFrame({"weekly_saving_usd": pd.Series(dtype=float)}))
    scaled = savings(none, none, unallocated, Table(ws, "pods"), waits)
    assert scaled.set_index("lever").weekly_saving_usd["autoscaling"] == sum(
        row[1] for row in expected if row[0] == "scale this pool down")


def test_what_to_do_names_a_pool_under_its_sla_first() -> None:
    t = actions(NO_POOL, _queue(), SLA, LEVERS)
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


# ---------------------------------------------------------------------------- in time

H = 3600.0
MODEL = "nvidia-h100-80gb"


def _waits(*rows: tuple[Any, ...]) -> pd.DataFrame:
    """(cause, team, pool, model, GPU-hours, p90 s[, ClusterQueue]) as ``waits_by_cause``."""
    return pd.DataFrame([(c, t, p, m, q[0] if q else "", 1, g, p90, p90)
                         for c, t, p, m, g, p90, *q in rows], columns=columns("waits"))


def _hourly(kind: str, *rows: tuple[Any, ...]) -> pd.DataFrame:
    """``free``: (pool, provisioning, hour, use, GPU-hours[, fragmentation]);
    ``pending``: (pool, hour, cause, GPU-hours), as ``queries.FREE_HOURS`` and
    ``queries.PENDING_HOURS``."""
    def hour(h: int) -> pd.Timestamp:
        return T("2026-11-18", tz="UTC") + pd.Timedelta(hours=h)

    if kind == "free":
        return pd.DataFrame([("c", p, MODEL, v, hour(h), u, g * H, g * 10.0,
                              f[0] if f else 0.0) for p, v, h, u, g, *f in rows],
                            columns=["cluster", "node_pool", "gpu_model", "provisioning",
                                     "hour_start", "use", "gpu_seconds", "cost_usd",
                                     "fragmentation_ratio"])
    return pd.DataFrame([("c", p, MODEL, c, hour(h), g * H, 1) for p, h, c, g in rows],
                        columns=["cluster", "node_pool", "gpu_model", "cause", "hour_start",
                                 "gpu_seconds", "waiting"])


def _waited(waits: pd.DataFrame, free: pd.DataFrame | None = None,
            waiting: pd.DataFrame | None = None, stuck: pd.DataFrame | None = None) -> Waited:
    return Waited(True, waits, stuck if stuck is not None else
                  pd.DataFrame(columns=columns("stuck_workloads")),
                  free if free is not None else _hourly("free"),
                  waiting if waiting is not None else _hourly("pending"),
                  pd.DataFrame(columns=["node_pool", "gpu_model", "provisioning",
                                        "fragmentation_ratio"]))


LONG, SHORT = 2 * H, 29 * 60.0
LEVER_CASES = [
    # cause, where it waited, p90: the lever, where, what it answers
    (("quota", "a", FITS_NONE, MODEL, 40, LONG, "research"),
     ("raise the ClusterQueue quota or borrow in the cohort", "ClusterQueue research")),
    (("quota", "a", FITS_NONE, MODEL, 40, LONG), ("raise the ClusterQueue quota or borrow in "
                                                "the cohort", MODEL)),
    (("fragmented", "a", "h100", MODEL, 40, LONG),
     ("compact placement, fewer and larger nodes", f"h100 ({MODEL})")),
    (("scaling_up", "a", "h100", MODEL, 40, LONG),
     ("keep minimum nodes or a reservation", f"h100 ({MODEL})")),
    (("stockout", "a", "h100", MODEL, 40, LONG),
     ("scale in another zone, region or on spot", f"h100 ({MODEL})")),
    (("unschedulable", "a", FITS_NONE, "nvidia-tesla-t4", 40, LONG),
     ("fix the manifests", "nvidia-tesla-t4")),
    (("no_capacity", "a", "h100", MODEL, 40, LONG),
     ("add capacity (max nodes)", f"h100 ({MODEL})")),
    (("preempted", "a", "h100-spot", MODEL, 40, LONG),
     ("on-demand for restarts, or checkpointing", f"h100-spot ({MODEL})")),
    (("starting", "a", "h100", MODEL, 40, LONG), ("speed up image pulls", f"h100 ({MODEL})")),
    (("starting", "a", "h100", MODEL, 40, SHORT), None),   # a short wait calls for nothing
]


@pytest.mark.parametrize(("wait", "lever"), LEVER_CASES,
                         ids=[w[0] + ("" if lever else " (short)") +
                              (" by queue" if len(w) > 6 else "") for w, lever in LEVER_CASES])
def test_each_cause_waited_for_long_gets_the_lever_that_answers_it(
        wait: tuple[Any, ...], lever: tuple[str, str] | None) -> None:
    got = cause_levers(_waited(_waits(wait)))
    assert [(a.action, a.where) for a in got] == ([lever] if lever else [])
    for a in got:
        assert a.answers == wait[0]
        assert "team a: 40 GPU-hours waited" in a.why and "(p90 2.0h)" in a.why
        assert math.isnan(a.weekly_saving_usd)
        assert math.isnan(a.weekly_cost_usd), "waiting is told in hours, never priced"


def test_the_worst_team_decides_and_every_team_is_named() -> None:
    got = cause_levers(_waited(_waits(("fragmented", "a", "h100", MODEL, 30, SHORT),
                                      ("fragmented", "b", "h100", MODEL, 10, LONG))))
    assert len(got) == 1 and got[0].why.startswith("teams a, b: 40 GPU-hours waited")


@pytest.mark.parametrize(("cause", "spot_hours", "says"), [
    ("no_capacity", [1, 2], "in the same hours 20 GPU-hours of nvidia-h100-80gb sat free in "
                            "h100-spot (spot), which these pods do not fit"),
    ("stockout", [1], "in the same hours 10 GPU-hours"),
    ("scaling_up", [1], "in the same hours 10 GPU-hours"),
    ("no_capacity", [5], None),     # free spot GPUs in other hours are no help
    ("preempted", [1], None),
], ids=["no capacity", "stockout", "scaling up", "other hours", "another cause"])
def test_free_gpus_of_the_model_elsewhere_count_only_in_the_hours_the_pods_waited(
        cause: str, spot_hours: list[int], says: str | None) -> None:
    free = _hourly("free", *(("h100-spot", "spot", h, "mismatch", 10) for h in spot_hours))
    waiting = _hourly("pending", ("h100", 1, cause, 8), ("h100", 2, cause, 8))
    got, = cause_levers(_waited(_waits((cause, "a", "h100", MODEL, 16, LONG)), free,
                                waiting))
    assert (says in got.why) if says else "sat free in" not in got.why


def test_quota_and_fragment_levers_name_the_free_gpus_of_their_hours() -> None:
    free = _hourly("free", ("a100", "on-demand", 1, "quota", 4),
                   ("a100", "on-demand", 9, "quota", 4),        # no Job held back then
                   ("h100", "on-demand", 1, "fragment", 2, 0.5),
                   ("h100", "on-demand", 1, "usable", 6, 0.5))
    waiting = _hourly("pending", ("", 1, "quota", 4), ("h100", 1, "fragmented", 8))
    quota, frag = cause_levers(_waited(_waits(
        ("quota", "a", FITS_NONE, MODEL, 40, LONG, "research"),
        ("fragmented", "a", "h100", MODEL, 30, LONG)), free, waiting))
    assert "in the same hours 4.0 GPU-hours of nvidia-h100-80gb sat free in a100 (on-demand), " \
           "which only the quota kept from them" in quota.why
    assert "in those hours the pool had 2.0 GPU-hours free as fragments (25% of its free " \
        "GPU-hours)" in frag.why


@pytest.mark.parametrize(("uses", "saving", "answers", "kept"), [
    ({"no_demand": 8}, 80.0, "no_demand", None),
    ({"mismatch": 8}, 80.0, "mismatch", None),
    ({"mismatch": 2, "no_demand": 6}, 80.0, "mismatch, no_demand", None),
    ({"usable": 2, "fragment": 2, "quota": 2, "no_demand": 2}, 20.0, "no_demand",
     "6.0 GPU-hours more sat free in the 1 hours pods that fit it waited, not counted"),
    ({"fragment": 8}, None, None, None),
], ids=["nothing waited", "nothing that fits waited", "both", "some could be used",
        "all could be used"])
def test_a_scale_down_counts_only_the_free_gpus_no_waiting_pod_could_use(
        uses: dict[str, float], saving: float | None, answers: str | None,
        kept: str | None) -> None:
    free = _hourly("free", *(("h100", "on-demand", 1, u, g) for u, g in uses.items()))
    got = scale_downs(pool_hours(free, _hourly("pending")))
    assert [(a.weekly_saving_usd, a.answers) for a in got] == \
        ([(saving, answers)] if saving else [])
    for a in got:
        assert (kept in a.why) if kept else "not counted" not in a.why
        assert "do not remove" not in a.why


def test_in_time_actions_replace_the_reconciliation_over_the_week() -> None:
    """A pool free on Monday while its model's pods waited on Wednesday is a saving: the
    hours, not the week, decide."""
    free = _hourly("free", ("h100", "on-demand", -48, "no_demand", 8))
    waited = _waited(_waits(("no_capacity", "a", "other", MODEL, 300, 22 * H)), free,
                     _hourly("pending", ("other", 1, "no_capacity", 300)))
    hours = pool_hours(waited.free_hours, waited.pending_hours)
    t = actions(IDLE_H100, _queue(("a", MODEL, 22 * 3600, 300)), SLA.iloc[1:], LEVERS,
                waited, hours)
    assert list(zip(t.action, t.answers.fillna("—"), strict=True)) == [
        ("add capacity (max nodes)", "no_capacity"), ("scale this pool down", "no_demand"),
        ("move batch Jobs to spot", "—"), ("right-size workloads", "—")]
    assert t.weekly_saving_usd.iloc[1] == 80.0
    assert not t.why.str.contains("do not remove").any()


def test_a_team_gets_the_levers_of_its_own_waits_and_its_savings() -> None:
    t = team_actions(LEVERS, _waited(_waits(("quota", "a", FITS_NONE, MODEL, 40, LONG))))
    assert list(t.action) == ["raise the ClusterQueue quota or borrow in the cohort",
                              "move batch Jobs to spot", "right-size workloads"]
    assert list(t.columns) == columns("actions")
