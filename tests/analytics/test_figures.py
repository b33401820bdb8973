"""Every report figure on small hand-built frames."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from analytics.figures.actions import actions, savings
from analytics.figures.availability import availability, incidents
from analytics.figures.bottlenecks import bottleneck_table, classify_arrow, with_evidence
from analytics.figures.cost import cost_by, daily_by_team, idle_offenders, unallocated_by_pool
from analytics.figures.headline import Pricing, price_basis
from analytics.figures.headline import headline as headline_of
from analytics.figures.queue import longest_waits, longest_waits_of, queue
from analytics.figures.rightsizing import prepare, rightsizing_table, spot_table
from analytics.week import Week, last_complete_week, parse_week
from analytics.workspace import Table, Workspace
from exporter.bottleneck import Signals, decide

WEEK = parse_week("2026-W47")
T = pd.Timestamp


def usage(*rows: tuple[Any, ...]) -> pd.DataFrame:
    cols = ["team", "namespace", "node_pool", "gpu_model", "provisioning", "state",
            "this_week", "gpu_seconds", "utilized_seconds", "measured_seconds", "cost_usd",
            "idle_seconds", "idle_cost_usd"]
    return pd.DataFrame(list(rows), columns=cols)


U = usage(
    # team, ns, pool, model, prov, state, this week, secs, utilized, measured, cost, idle s, idle $
    ("a", "ns-a", "h100", "nvidia-h100-80gb", "on-demand", "allocated", True,
     7200, 5400, 7200, 20.0, 1800, 5.0),
    ("b", "ns-b", "l4", "nvidia-l4", "spot", "allocated", True, 3600, 0, 0, 1.0, 0, 0.0),
    (None, None, "h100", "nvidia-h100-80gb", "on-demand", "unallocated", True,
     3600, 0, 0, 10.0, 0, 0.0),
    ("a", "ns-a", "h100", "nvidia-h100-80gb", "on-demand", "allocated", False,
     3600, 3600, 3600, 10.0, 0, 0.0),
)


def test_weeks() -> None:
    assert (WEEK.start, WEEK.end) == (datetime(2026, 11, 16, tzinfo=UTC),
                                      datetime(2026, 11, 23, tzinfo=UTC))
    assert WEEK.label == "2026-W47" and WEEK.previous.label == "2026-W46"
    assert last_complete_week(datetime(2026, 11, 25, 12, tzinfo=UTC)) == WEEK
    assert last_complete_week(datetime(2026, 11, 23, tzinfo=UTC)) == WEEK
    for bad in ("2026-47", "2026-W54", "W47"):
        with pytest.raises(ValueError, match="week"):
            parse_week(bad)


def test_headline() -> None:
    h = headline_of(U)
    assert h["cost_usd"] == 31.0 and h["previous_cost_usd"] == 10.0
    assert h["cost_change"] == pytest.approx(2.1)
    assert h["gpu_hours"] == 4.0 and h["allocated_gpu_hours"] == 3.0
    assert h["utilization"] == pytest.approx(0.75)     # team b's GPU had no reading
    assert h["fleet_cost_usd_per_utilized_hour"] == pytest.approx(31.0 / 1.5)
    assert h["idle_cost_usd"] == 5.0 and h["idle_share"] == pytest.approx(5 / 31)
    assert h["unallocated_share"] == pytest.approx(10 / 31)


def test_headline_of_an_empty_week_has_no_ratios() -> None:
    h = headline_of(usage())
    assert h["cost_usd"] == 0 and h["cost_change"] is None and h["utilization"] is None


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


def pods(**over: Any) -> pd.DataFrame:
    base: dict[str, Any] = dict(
        cluster="c", namespace="ns", pod_uid="u1", pod="p1", workload="w", team="t",
        gpu_model="nvidia-h100-80gb", provisioning="on-demand", mig=False,
        gpu_seconds=3600.0, cost_usd=10.0, utilized_seconds=900.0, idle_seconds=2700.0,
        idle_cost_usd=7.5, utilization=0.25, gr_engine_active=0.25, sm_active=0.2,
        sm_occupancy=0.1, tensor_active=0.1, dram_active=0.1, gpu_util_percent=90.0,
        temperature_celsius=60.0, nvlink_tx_bytes_per_second=0.0,
        nvlink_rx_bytes_per_second=0.0, pcie_tx_bytes_per_second=1e9,
        pcie_rx_bytes_per_second=2e9,
        stalled_share=0.0, max_gr=0.3, throttled_share=0.0, peak_memory_bytes=8 * 2**30,
        memory_total_bytes=80 * 2**30)
    rows = over.pop("rows", [{}])
    return pd.DataFrame([base | over | r for r in rows])


def workspace(prices: Mapping[tuple[str, str], float] | None = None, *,
              pods: pd.DataFrame | None = None,
              pod_states: pd.DataFrame | None = None) -> Workspace:
    """A report's workspace with ``pods`` loaded as the report loads the week's (each
    classified on its way in, numbered in ``seq``), and ``pod_states``."""
    ws = Workspace()
    prepare(ws, prices or {})
    if pods is not None:
        rows = pa.Table.from_pandas(pods, preserve_index=False)
        ws.load("pods", rows.to_batches() or [pa.RecordBatch.from_pylist([], rows.schema)],
                lambda t: classify_arrow(t).append_column(
                    "seq", pa.array(range(t.num_rows), type=pa.int64())))
    if pod_states is not None:
        ws.put("pod_states", pod_states)
    return ws


def table(ws: Workspace, name: str, frame: pd.DataFrame) -> Table:
    """``frame`` as a report table kept in ``ws``."""
    ws.put(name, frame)
    return Table(ws, name)


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


def test_unallocated_by_pool() -> None:
    t = unallocated_by_pool(U)
    assert t.to_dict("records") == [{"node_pool": "h100", "gpu_model": "nvidia-h100-80gb",
                                     "provisioning": "on-demand", "gpu_hours": 1.0,
                                     "cost_usd": 10.0}]


def states(*rows: tuple[Any, ...]) -> pd.DataFrame:
    cols = ["cluster", "pod_uid", "namespace", "pod", "team", "workload", "owner_kind",
            "gpu_model", "gpus", "created", "scheduled", "finished", "queue_wait_seconds",
            "phase", "reason", "priority_class"]
    return pd.DataFrame(list(rows), columns=cols)


def pod_state(uid: str, created: str, scheduled: str | None, gpus: int = 1,
              team: str = "t", **kw: Any) -> tuple[Any, ...]:
    c = T(created, tz="UTC")
    s = T(scheduled, tz="UTC") if scheduled else None
    wait = (s - c).total_seconds() if s is not None else None
    return ("c", uid, "ns", uid, team, "w", kw.get("kind", "Job"), "nvidia-l4", gpus, c, s,
            kw.get("finished"), wait, kw.get("phase", "Running"), kw.get("reason"), "")


def test_queue_percentiles_and_pending_gpu_hours() -> None:
    s = states(*[pod_state(f"p{i}", "2026-11-17 00:00", f"2026-11-17 00:{i:02d}")
                 for i in range(11)],                       # waits 0..10 minutes
               pod_state("old", "2026-11-10", "2026-11-10 01:00"),  # scheduled last week
               pod_state("stuck", "2026-11-22 22:00", None, gpus=2))  # pending at the end
    (row,) = queue(s, WEEK).itertuples()
    assert row.pods == 11
    assert row.p50_seconds == 300 and row.p90_seconds == 540
    assert row.p99_seconds == pytest.approx(594)
    # 0+1+...+10 minutes of 1 GPU, plus 2 h x 2 GPUs still pending
    assert row.pending_gpu_hours == pytest.approx(55 / 60 + 4)
    longest = longest_waits(s, WEEK)
    assert list(longest.pod[:2]) == ["stuck", "p10"]
    assert list(longest.state[:2]) == ["still pending", "scheduled"]


WAITS = [
    # (case, the pod's last state, its pending GPU-hours in the week, its longest-waits state)
    ("pending at the week's end", pod_state("p", "2026-11-22 22:00", None, gpus=2),
     4.0, "still pending"),
    ("deleted while pending", pod_state("p", "2026-11-22 20:00", None, gpus=2,
                                        phase="Deleted", finished=T("2026-11-22 21:00")),
     2.0, None),
    ("scheduled after waiting", pod_state("p", "2026-11-22 20:00", "2026-11-22 21:30",
                                          gpus=2),
     3.0, "scheduled"),
]


@pytest.mark.parametrize(("case", "pod", "pending_gpu_hours", "longest"), WAITS,
                         ids=[c[0] for c in WAITS])
def test_a_wait_ends_when_scheduled_or_deleted(case: str, pod: tuple[Any, ...],
                                               pending_gpu_hours: float,
                                               longest: str | None) -> None:
    s = states(pod)
    (row,) = queue(s, WEEK).itertuples()
    assert row.pending_gpu_hours == pytest.approx(pending_gpu_hours)
    assert list(longest_waits(s, WEEK).state) == ([longest] if longest else [])


def awaiting(job: str, queued: str, gpus: int, finished: str | None = None,
             team: str = "t") -> pd.DataFrame:
    """A Kueue Workload not admitted by the week's end, as ``AWAITING_ADMISSION`` reads it."""
    return pd.DataFrame([{
        "cluster": "c", "workload_uid": f"wl-{job}", "namespace": "ns",
        "workload": f"job-{job}-1a2b3", "owner_name": job, "team": team,
        "gpu_model": "nvidia-l4", "gpus": gpus, "queued": T(queued, tz="UTC"),
        "finished": T(finished, tz="UTC") if finished else None, "cluster_queue": "cq"}])


AWAITING = [
    # (case, the Workload, its pending GPU-hours in the week, its longest-waits state)
    ("awaiting admission at the week's end", awaiting("train", "2026-11-22 20:00", 8),
     32.0, "awaiting admission"),
    ("deleted before admission", awaiting("train", "2026-11-22 20:00", 8,
                                          finished="2026-11-22 21:00"),
     8.0, None),
    ("submitted before the week", awaiting("train", "2026-11-09 00:00", 1),
     168.0, "awaiting admission"),
]


@pytest.mark.parametrize(("case", "workload", "pending_gpu_hours", "longest"), AWAITING,
                         ids=[c[0] for c in AWAITING])
def test_a_job_awaiting_admission_waits_with_all_its_gpus(
        case: str, workload: pd.DataFrame, pending_gpu_hours: float,
        longest: str | None) -> None:
    """A Job Kueue has not admitted has no pod: its wait counts from its submission (or
    last requeue), with every GPU it asks for, beside the pods' of its team and model."""
    pods = states(pod_state("p", "2026-11-22 22:00", None, gpus=2))  # 2 h x 2 GPUs
    (row,) = queue(pods, WEEK, workload).itertuples()
    assert row.pending_gpu_hours == pytest.approx(4.0 + pending_gpu_hours)
    assert row.pods == 0  # percentiles are of waits that ended in a scheduling
    (alone,) = queue(states(), WEEK, workload).itertuples()
    assert alone.pending_gpu_hours == pytest.approx(pending_gpu_hours)
    top = longest_waits_of([pods], WEEK, awaiting=workload)
    if longest is None:
        assert list(top.pod) == ["p"]
    else:
        assert list(top.pod) == ["train", "p"]
        assert top.state[0] == longest and top.gpus[0] == workload.gpus[0]
        assert top.wait_seconds[0] == (WEEK.end - workload.queued[0]).total_seconds()


@pytest.mark.parametrize(("down", "available", "budget_left", "meets"), [
    (0.0, 1.0, 1.0, True),
    (0.0025 * 86400, 0.9975, 0.5, True),        # half the 0.5 % budget spent
    (0.01 * 86400, 0.99, -1.0, False),          # twice the budget
])
def test_availability_and_error_budget(down: float, available: float, budget_left: float,
                                       meets: bool) -> None:
    a = pd.DataFrame({"node_pool": ["p"], "gpu_model": ["m"], "down_seconds": [down],
                      "gpu_seconds": [86400.0]})
    (row,) = availability(a, 0.995).itertuples()
    assert row.availability == pytest.approx(available)
    assert row.error_budget_left == pytest.approx(budget_left)
    assert row.meets_target == meets


def test_incidents_include_spot_preemptions() -> None:
    events = pd.DataFrame({"node": ["n"], "node_pool": ["p"], "gpu_uuid": ["GPU-1"],
                           "reason": ["xid"], "start_time": [T("2026-11-18 10:00", tz="UTC")],
                           "end_time": [T("2026-11-18 11:00", tz="UTC")],
                           "seconds": [3600.0]})
    s = states(pod_state("pre", "2026-11-18", "2026-11-18", phase="Failed",
                         reason="Terminated", finished=T("2026-11-19", tz="UTC")),
               pod_state("done", "2026-11-18", "2026-11-18", phase="Succeeded",
                         finished=T("2026-11-19", tz="UTC")))
    t = incidents(events, s, WEEK)
    assert list(t.kind) == ["xid", "spot_preemption"]
    assert t.duration_seconds.iloc[0] == 3600


def test_a_node_down_is_one_incident_of_all_its_gpus() -> None:
    start, end = T("2026-11-18 10:00", tz="UTC"), T("2026-11-18 10:30", tz="UTC")
    events = pd.DataFrame({
        "node": ["n"] * 9, "node_pool": ["p"] * 9,
        "gpu_uuid": [f"GPU-{i}" for i in range(8)] + ["GPU-0"],
        "reason": ["node_not_ready"] * 8 + ["xid"],
        "start_time": [start] * 8 + [T("2026-11-19 08:00", tz="UTC")],
        "end_time": [end] * 8 + [T("2026-11-19 09:00", tz="UTC")],
        "seconds": [1800.0] * 8 + [3600.0]})
    t = incidents(events, pd.DataFrame(), WEEK)
    assert t[["kind", "where", "gpus", "duration_seconds", "gpu_hours_lost"]].values.tolist() \
        == [["node_not_ready", "p/n (8 GPUs)", 8, 1800.0, 4.0],
            ["xid", "p/n GPU-0", 1, 3600.0, 1.0]]


def nvlink(tx: float, rx: float) -> dict[str, float]:
    """NVLink bytes per second sent and received, as ``Signals`` takes them."""
    return {"nvlink_tx_bytes_per_second": tx, "nvlink_rx_bytes_per_second": rx}


def pcie(tx: float, rx: float) -> dict[str, float]:
    """PCIe bytes per second sent and received, as ``Signals`` takes them."""
    return {"pcie_tx_bytes_per_second": tx, "pcie_rx_bytes_per_second": rx}


@pytest.mark.parametrize(("signals", "model", "cls"), [
    (Signals(gr=None, gpu_util_percent=40.0), "nvidia-l4", "insufficient_signal"),
    (Signals(gr=None, gpu_util_percent=4.0), "nvidia-l4", "idle"),
    (Signals(gr=0.049), "nvidia-l4", "idle"),
    (Signals(gr=0.8, throttled_share=0.5), "nvidia-l4", "throttled"),
    (Signals(gr=0.8, temp_celsius=85.0), "nvidia-l4", "throttled"),
    # DCGM says how much it throttled: a hot GPU below half is not throttled
    (Signals(gr=0.8, temp_celsius=90.0, throttled_share=0.0), "nvidia-l4",
     "insufficient_signal"),
    (Signals(gr=0.8, sm=0.7, temp_celsius=90.0, throttled_share=0.49), "nvidia-l4",
     "healthy"),
    # a link 30 % busy while the SMs are quiet; PCIe by its quieter direction
    (Signals(gr=0.5, sm=0.3, **nvlink(135e9, 10e9)), "nvidia-h100-80gb", "comm_bound"),
    (Signals(gr=0.5, sm=0.45, **nvlink(135e9, 10e9)), "nvidia-h100-80gb", "input_bound"),
    (Signals(gr=0.8, sm=0.3, **pcie(9.6e9, 9.6e9)), "nvidia-l4", "comm_bound"),
    (Signals(gr=0.8, sm=0.3, **pcie(1e9, 30e9)), "nvidia-l4", "small_batch"),
    (Signals(gr=0.8, tensor=0.1, dram=0.2, **pcie(9.6e9, 9.6e9)), "nvidia-l4", "comm_bound"),
    (Signals(gr=0.8, **pcie(9.6e9, 9.6e9)), "nvidia-l4", "insufficient_signal"),
    # an NVLink GPU without NVLink bytes: busy engine, quiet pipes
    (Signals(gr=0.8, tensor=0.1, dram=0.2), "nvidia-h100-80gb", "insufficient_signal"),
    (Signals(gr=0.8, tensor=0.5, dram=0.2), "nvidia-h100-80gb", "healthy"),
    (Signals(gr=0.5, stalled_share=0.15, max_gr=0.6), "nvidia-l4", "input_bound"),
    # the engine busy under 60 % of the time: waiting for input, or small kernels
    (Signals(gr=0.59, sm=0.3), "nvidia-l4", "input_bound"),
    (Signals(gr=0.59, sm=0.29), "nvidia-l4", "small_batch"),
    (Signals(gr=0.59, tensor=0.3, dram=0.3), "nvidia-l4", "insufficient_signal"),
    # few warps per active SM while tensor and DRAM are quiet
    (Signals(gr=0.9, sm=0.6, occupancy=0.11, tensor=0.1, dram=0.2), "nvidia-l4",
     "small_batch"),
    (Signals(gr=0.9, sm=0.6, occupancy=0.11, tensor=0.2, dram=0.2), "nvidia-l4", "healthy"),
    (Signals(gr=0.9, sm=0.44), "nvidia-l4", "small_batch"),
    (Signals(gr=0.9, sm=0.45), "nvidia-l4", "healthy"),
    (Signals(gr=0.9, tensor=0.1, dram=0.2), "nvidia-l4", "insufficient_signal"),
    (Signals(gr=0.8, sm=0.7, tensor=0.1, dram=0.7), "nvidia-l4", "memory_bound"),
    (Signals(gr=0.8, tensor=0.1, dram=0.7), "nvidia-h100-80gb", "memory_bound"),
    (Signals(gr=0.9, sm=0.8, tensor=0.6, dram=0.4, gpu_util_percent=99.0), "nvidia-l4",
     "healthy"),
])
def test_bottleneck_rules(signals: Signals, model: str, cls: str) -> None:
    assert decide(signals, model).bottleneck == cls


def test_a_workload_takes_the_class_of_most_of_its_gpu_hours() -> None:
    ws = workspace(pods=pods(rows=[
        {"pod_uid": "a", "gpu_seconds": 7200.0, "gr_engine_active": 0.01},
        {"pod_uid": "b", "gpu_seconds": 3600.0, "gr_engine_active": 0.9, "sm_active": 0.8,
         "tensor_active": 0.6, "dram_active": 0.3, "max_gr": 0.9}]))
    assert list(Table(ws, "pods").bottleneck) == ["idle", "healthy"]
    (row,) = bottleneck_table(ws).frame().itertuples()
    assert (row.bottleneck, row.pods, row.gpu_hours) == ("idle", 2, 3.0)
    assert row.evidence["gr_engine_active"] == pytest.approx(0.01)
    assert "release" in row.advice


PRICES = {("nvidia-h100-80gb", "on-demand"): 11.0, ("nvidia-tesla-a100", "on-demand"): 2.9,
          ("nvidia-l4", "on-demand"): 0.7, ("nvidia-tesla-t4", "on-demand"): 0.35,
          ("nvidia-h100-80gb", "spot"): 2.2, ("nvidia-l4", "spot"): 0.28}


def rightsizing(p: pd.DataFrame) -> pd.DataFrame:
    """The right-sizing table of the pods, at ``PRICES``."""
    return rightsizing_table(workspace(PRICES, pods=p)).frame()


@pytest.mark.parametrize(("model", "peak_gib", "util", "nvlink", "fit"), [
    ("nvidia-h100-80gb", 8, 0.25, False, "nvidia-tesla-a100"),   # L4: 0.25x989 > 0.8x121
    ("nvidia-h100-80gb", 8, 0.05, False, "nvidia-tesla-t4"),     # 49 TFLOPS fits a T4
    ("nvidia-h100-80gb", 70, 0.9, False, None),                  # needs the H100
    ("nvidia-h100-80gb", 8, 0.25, True, "nvidia-tesla-a100"),    # A100 has NVLink too
    ("nvidia-l4", 20, 0.1, False, None),                         # 20 GiB > 90 % of a T4
    ("nvidia-l4", 10, 0.1, False, "nvidia-tesla-t4"),
    ("nvidia-l4", None, 0.1, False, None),                       # memory unknown
])
def test_cheapest_fit(model: str, peak_gib: float | None, util: float, nvlink: bool,
                      fit: str | None) -> None:
    peak = None if peak_gib is None else peak_gib * 2**30
    p = pods(gpu_model=model, peak_memory_bytes=peak, utilization=util,
             nvlink_tx_bytes_per_second=0.1 * 450e9 if nvlink else 0.0)
    assert list(rightsizing(p).suggested_model) == ([fit] if fit else [])


def test_rightsizing_saving_is_the_price_ratio() -> None:
    t = rightsizing(pods(utilization=0.05))
    (row,) = t.itertuples()
    assert row.suggested_model == "nvidia-tesla-t4"
    assert row.weekly_saving_usd == pytest.approx(10.0 * (1 - 0.35 / 11.0))
    assert rightsizing(pods(mig=True, utilization=0.05)).empty


def test_spot_candidates_are_on_demand_batch_jobs() -> None:
    p = pods(rows=[{"pod_uid": "job", "workload": "train"},
                   {"pod_uid": "svc", "workload": "serve"},
                   {"pod_uid": "already", "workload": "cheap", "provisioning": "spot"}])
    s = states(("c", "job", "ns", "job", "t", "train", "Job", "", 1, None, None, None, None,
                "", None, ""),
               ("c", "svc", "ns", "svc", "t", "serve", "ReplicaSet", "", 1, None, None, None,
                None, "", None, ""),
               ("c", "already", "ns", "a", "t", "cheap", "Job", "", 1, None, None, None,
                None, "", None, ""))
    t = spot_table(workspace(PRICES, pods=p, pod_states=s)).frame()
    assert list(t.workload) == ["train"]
    assert t.weekly_saving_usd.iloc[0] == pytest.approx(10.0 * (1 - 2.2 / 11.0))


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


def test_empty_inputs_give_empty_tables() -> None:
    empty = pd.DataFrame()
    week = Week(WEEK.start, WEEK.end)
    ws = workspace(PRICES, pods=pods().iloc[0:0])
    assert idle_offenders(ws).empty and rightsizing_table(ws).empty
    assert queue(empty, week).empty and longest_waits(empty, week).empty


def test_spot_candidates_of_a_team_without_batch_jobs() -> None:
    s = states(("c", "u1", "ns", "p1", "t", "w", "ReplicaSet", "", 1, None, None, None, None,
                "", None, ""))
    assert spot_table(workspace(PRICES, pods=pods(), pod_states=s)).empty


def _opt(v: object) -> float | None:
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)  # type: ignore[arg-type]


def pod_signals(row: Any) -> Signals:
    """A pod's week, as the warehouse aggregates it, as the classifier's signals."""
    def g(name: str) -> float | None:
        return _opt(getattr(row, name))

    return Signals(gr=g("gr_engine_active"), sm=g("sm_active"), occupancy=g("sm_occupancy"),
                   tensor=g("tensor_active"), dram=g("dram_active"),
                   gpu_util_percent=g("gpu_util_percent"), temp_celsius=g("temperature_celsius"),
                   nvlink_tx_bytes_per_second=g("nvlink_tx_bytes_per_second"),
                   nvlink_rx_bytes_per_second=g("nvlink_rx_bytes_per_second"),
                   pcie_tx_bytes_per_second=g("pcie_tx_bytes_per_second"),
                   pcie_rx_bytes_per_second=g("pcie_rx_bytes_per_second"),
                   stalled_share=g("stalled_share") or 0.0, max_gr=g("max_gr") or 0.0,
                   throttled_share=g("throttled_share"))


def test_the_pods_are_classified_by_the_exporters_rules() -> None:
    """The report classifies every pod at once; each pod gets what ``decide`` gives it."""
    rng = np.random.default_rng(7)
    n = 4000

    def maybe(values: np.ndarray, missing: float = 0.2) -> np.ndarray:
        return np.where(rng.random(n) < missing, np.nan, values)

    edges = np.array([0.0, 0.05, 0.15, 0.2, 0.3, 0.35, 0.45, 0.5, 0.6, 0.7, 1.0])
    p = pods(rows=[{} for _ in range(n)]).assign(
        gpu_model=rng.choice(["nvidia-h100-80gb", "nvidia-l4", "nvidia-tesla-a100",
                              "nvidia-tesla-t4", "other"], n),
        mig=rng.random(n) < 0.2,
        gr_engine_active=maybe(rng.choice(np.r_[edges, rng.random(20)], n)),
        sm_active=maybe(rng.choice(np.r_[edges, rng.random(20)], n)),
        sm_occupancy=maybe(rng.choice(np.r_[edges, rng.random(20)] / 3, n)),
        tensor_active=maybe(rng.choice(np.r_[edges, rng.random(20)], n)),
        dram_active=maybe(rng.choice(np.r_[edges, rng.random(20)], n)),
        gpu_util_percent=maybe(rng.choice([0.0, 50.0, 80.0, 99.0], n)),
        temperature_celsius=maybe(rng.choice([40.0, 85.0, 90.0], n)),
        nvlink_tx_bytes_per_second=maybe(rng.choice([0.0, 100e9, 135e9, 200e9], n)),
        nvlink_rx_bytes_per_second=maybe(rng.choice([0.0, 90e9, 135e9], n)),
        pcie_tx_bytes_per_second=maybe(rng.choice([0.0, 5e9, 9.6e9, 20e9], n)),
        pcie_rx_bytes_per_second=maybe(rng.choice([0.0, 9.6e9, 30e9], n)),
        stalled_share=maybe(rng.choice([0.0, 0.15, 0.3], n)),
        max_gr=maybe(rng.choice([0.0, 0.6, 0.9], n)),
        throttled_share=maybe(rng.choice([0.0, 0.5, 0.9], n)))
    got = with_evidence(classify_arrow(pa.Table.from_pandas(p, preserve_index=False))
                        .to_pandas())
    want = [decide(pod_signals(r), r.gpu_model, mig=r.mig) for r in p.itertuples()]
    assert list(got.bottleneck) == [d.bottleneck for d in want]
    for mine, theirs in zip(got.evidence, want, strict=True):
        assert list(mine) == list(theirs.evidence)
        assert mine == pytest.approx(theirs.evidence)
    assert len(set(got.bottleneck)) == 8


# ---------------------------------------------------------------------------- price basis

H100, L4, T4 = "nvidia-h100-80gb", "nvidia-l4", "nvidia-tesla-t4"
LIST = {(H100, "on-demand"): 10.0, (H100, "spot"): 2.0, (L4, "on-demand"): 0.5,
        (T4, "on-demand"): 0.35}
MACHINES = {(H100, "on-demand"): (1.2, 1.2), (H100, "spot"): (0.3, 0.3),
            (L4, "on-demand"): (0.15, 1.15)}


def priced(*rows: tuple[str, str, bool, float, float, float]) -> pd.DataFrame:
    """(model, provisioning, this week, GPU-hours, priced GPU-hours, cost) as
    ``queries.USAGE`` has them."""
    return pd.DataFrame([(m, p, w, h * 3600, ph * 3600, c) for m, p, w, h, ph, c in rows],
                        columns=["gpu_model", "provisioning", "this_week", "gpu_seconds",
                                 "priced_seconds", "cost_usd"])


def pricing(**overrides: Any) -> Pricing:
    return Pricing(**({"list_prices": LIST, "region": "us-central1",
                               "as_of": dict.fromkeys(LIST, "2026-02-24"),
                               "machine_usd_per_gpu_hour": MACHINES} | overrides))


BASES = [
    ("list prices, no discount", priced((H100, "on-demand", True, 10, 10, 100.0)), pricing(),
     {"off_list_usd": 0.0, "list_cost_usd": 100.0, "machine_usd": (12.0, 12.0),
      "machine_share": (12 / 112, 12 / 112), "machine_models": (H100,),
      "machine_unknown": (), "spot_hour_share": 0.0, "as_of": ("2026-02-24",)}),
    ("a negotiated discount took 10 %",
     priced((H100, "on-demand", True, 10, 10, 90.0)), pricing(discounts=("negotiated",)),
     {"discounts": ("negotiated",), "off_list_usd": 10.0, "off_list_share": 0.1,
      "machine_share": (12 / 102, 12 / 102)}),
    ("a discount configured that took nothing off",
     priced((T4, "on-demand", True, 10, 10, 3.5)), pricing(discounts=("negotiated",)),
     {"off_list_usd": 0.0, "off_list_share": 0.0}),
    ("other list prices than these, no discount",
     priced((H100, "on-demand", True, 10, 10, 110.0)), pricing(),
     {"discounts": (), "off_list_usd": -10.0}),
    ("spot: its share of GPU-hours and of cost",
     priced((H100, "on-demand", True, 10, 10, 100.0), (H100, "spot", True, 30, 30, 60.0)),
     pricing(),
     {"spot_hour_share": 0.75, "spot_cost_share": 60 / 160, "machine_usd": (21.0, 21.0),
      "off_list_usd": 0.0}),
    ("machine types that share a GPU-hour differently: a range",
     priced((L4, "on-demand", True, 100, 100, 50.0)), pricing(),
     {"machine_usd": (15.0, 115.0), "machine_share": (15 / 65, 115 / 165)}),
    ("the machine share known for some models only",
     priced((H100, "on-demand", True, 10, 10, 100.0), (T4, "on-demand", True, 30, 30, 10.5)),
     pricing(),
     {"machine_usd": (12.0, 12.0), "machine_share": (12 / 112, 12 / 112),
      "machine_models": (H100,), "machine_unknown": (T4,),
      "machine_unknown_hour_share": 0.75}),
    ("the machine share known for none",
     priced((T4, "on-demand", True, 10, 10, 3.5)), pricing(),
     {"machine_usd": None, "machine_share": None, "machine_unknown": (T4,),
      "machine_unknown_hour_share": 1.0}),
    ("unpriced GPU-hours: no cost, no list cost, no machine",
     priced((H100, "on-demand", True, 10, 10, 100.0), ("nvidia-h200-141gb", "spot", True,
                                                       5, 0, 0.0)),
     pricing(),
     {"unpriced_gpu_hours": 5.0, "list_cost_usd": 100.0, "off_list_usd": 0.0,
      "spot_hour_share": 1 / 3, "spot_cost_share": 0.0}),
    ("the week before does not count",
     priced((H100, "on-demand", True, 10, 10, 100.0), (H100, "spot", False, 99, 99, 1.0)),
     pricing(), {"spot_hour_share": 0.0, "cost_usd": 100.0, "off_list_usd": 0.0}),
    ("the dates of the prices the week used",
     priced((H100, "on-demand", True, 10, 10, 100.0), (H100, "spot", True, 10, 10, 20.0)),
     pricing(as_of={(H100, "on-demand"): "2026-02-24", (H100, "spot"): "2026-03-20",
                    (T4, "on-demand"): "2025-01-01"}, estimated=frozenset({(H100, "spot")})),
     {"as_of": ("2026-02-24", "2026-03-20"), "estimated": (f"{H100} spot",)}),
    ("prices the list does not have: nothing to compare",
     priced(("nvidia-h200-141gb", "on-demand", True, 10, 10, 90.0)), pricing(),
     {"list_cost_usd": None, "off_list_usd": None, "as_of": ("2026-02-24",)}),
    ("a week without GPU-hours",
     priced(), pricing(), {"spot_hour_share": None, "spot_cost_share": None,
                           "machine_usd": None, "unpriced_gpu_hours": 0.0}),
]


def _numbers(v: object) -> bool:
    return isinstance(v, float) or (isinstance(v, tuple) and bool(v)
                                    and all(isinstance(x, float) for x in v))


@pytest.mark.parametrize(("case", "usage_rows", "given", "expected"), BASES,
                         ids=[b[0] for b in BASES])
def test_price_basis(case: str, usage_rows: pd.DataFrame, given: Pricing,
                     expected: dict[str, Any]) -> None:
    b = price_basis(usage_rows, given)
    for k, v in expected.items():
        assert getattr(b, k) == (pytest.approx(v) if _numbers(v) else v), k


def test_pricing_of_the_shipped_book_and_a_configuration() -> None:
    """A machine share where the machine types of a model all give one (A3), a range where
    they differ (G2), none where no machine type fixes the GPU count (N1's T4); the
    discounts and the catalogue as configured."""
    from exporter.config import load_config
    from exporter.prices import load_price_book

    book = load_price_book(None, "us-central1")
    cfg = load_config(None, {"cluster": "c", "prices": {
        "negotiated": {"a3": 0.05}, "default_discount": 0.1, "catalog": {"enabled": True},
        "commitments": [{"gpu": H100, "gpus": 8, "usd_per_gpu_hour": 6.0, "term": "1y"}]}})
    p = Pricing.of(book, cfg.prices)
    h100 = p.machine_usd_per_gpu_hour[H100, "on-demand"]
    assert h100[0] == h100[1] == pytest.approx(
        book.machine_share("a3-highgpu-8g", "on-demand"))
    low, high = p.machine_usd_per_gpu_hour[L4, "on-demand"]
    assert low == pytest.approx(book.machine_share("g2-standard-4", "on-demand"))
    assert high == pytest.approx(book.machine_share("g2-standard-32", "on-demand"))
    assert (T4, "on-demand") not in p.machine_usd_per_gpu_hour
    assert p.discounts == ("negotiated", "committed-use", "node-pool") and p.catalog
    assert p.as_of[H100, "spot"] == book.provenance[H100, "spot"].as_of
    assert p.list_prices == book.prices and p.region == "us-central1"
    bare = Pricing.of(book)
    assert bare.discounts == () and not bare.catalog
