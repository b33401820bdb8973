"""Why jobs waited (``analytics.figures.waits``): waits by cause, the stuck workloads, the
free GPUs by use, and the hours demand waited for a pool."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from analytics.figures.waits import (
    ANY_MODEL,
    NO_POOL,
    empty_note,
    pool_hours,
    stranded_by_pool,
    stuck_workloads,
    waits_by_cause,
)
from analytics.tables import columns
from analytics.workspace import Workspace
from tests.analytics.figures.frames import T

H = 3600.0


def pending(*rows: tuple[Any, ...]) -> pd.DataFrame:
    """(uid, cause, team, pool, model, seconds[, whole wait s, gpus]) as
    ``queries.PENDING`` gives them, one row per pod and cause."""
    return pd.DataFrame(
        [("c", uid, "pod", cause, team, pool, model, "", (r[1] if len(r) > 1 else 1) * s, s,
          r[0] if r else None)
         for uid, cause, team, pool, model, s, *r in rows],
        columns=["cluster", "uid", "kind", "cause", "team", "node_pool", "gpu_model",
                 "cluster_queue", "gpu_seconds", "seconds", "wait_seconds"])


def waits_of(frame: pd.DataFrame) -> pd.DataFrame:
    ws = Workspace()
    ws.put("pending", frame)
    out = waits_by_cause(ws)
    ws.close()
    return out


def test_waits_are_by_cause_team_and_pool_with_each_one_s_percentiles() -> None:
    """The p90 is of each pod's time for the cause (its rows summed in the warehouse), not
    of interval rows; the whole wait is each pod's longest, every cause."""
    t = waits_of(pending(
        *((f"u{i}", "fragmented", "a", "h100", "nvidia-h100-80gb", (i + 1) * H, 12 * H, 4)
          for i in range(10)),
        ("u0", "no_capacity", "a", "h100", "nvidia-h100-80gb", 2 * H, 12 * H, 4),
        ("w1", "quota", "b", "", "nvidia-tesla-a100", 5 * H, None, 8),
        ("n1", "unschedulable", None, "", "", H),
    ))
    assert list(t.columns) == columns("waits")
    rows = {(r.cause, r.team, r.node_pool, r.gpu_model): r for r in t.itertuples()}
    frag = rows["fragmented", "a", "h100", "nvidia-h100-80gb"]
    assert (frag.waiting, frag.gpu_hours) == (10, 4 * 55)
    assert frag.p90_seconds == pytest.approx(9.1 * H)       # of 1 h .. 10 h
    assert frag.p90_wait_seconds == pytest.approx(12 * H)
    # without wait_seconds, the whole wait is the time summed over its causes
    assert rows["quota", "b", NO_POOL, "nvidia-tesla-a100"].p90_wait_seconds == 5 * H
    assert rows["unschedulable", "(none)", NO_POOL, ANY_MODEL].waiting == 1
    assert list(t.gpu_hours) == sorted(t.gpu_hours, reverse=True)


def test_no_wait_is_an_empty_table_of_the_declared_columns() -> None:
    t = waits_of(pending(("u", "quota", "a", "", "", H)).iloc[0:0])
    assert t.empty and list(t.columns) == columns("waits")


def _free(*rows: tuple[Any, ...]) -> pd.DataFrame:
    """(pool, hour, use, GPU-hours[, cost $, fragmentation]) as ``queries.FREE_HOURS``."""
    return pd.DataFrame(
        [("c", pool, "nvidia-h100-80gb", "on-demand", T(f"2026-11-16 {h:02d}:00", tz="UTC"),
          use, g * H, r[0] if r else g * 10.0, r[1] if len(r) > 1 else 0.0)
         for pool, h, use, g, *r in rows],
        columns=["cluster", "node_pool", "gpu_model", "provisioning", "hour_start", "use",
                 "gpu_seconds", "cost_usd", "fragmentation_ratio"])


def _pending_hours(*rows: tuple[Any, ...]) -> pd.DataFrame:
    """(pool, hour, cause, GPU-hours) as ``queries.PENDING_HOURS``."""
    return pd.DataFrame(
        [("c", pool, "nvidia-h100-80gb", cause, T(f"2026-11-16 {h:02d}:00", tz="UTC"),
          g * H, 1) for pool, h, cause, g in rows],
        columns=["cluster", "node_pool", "gpu_model", "cause", "hour_start", "gpu_seconds",
                 "waiting"])


@pytest.mark.parametrize(("free", "waiting", "demand"), [
    (_free(("h100", 1, "no_demand", 8)), _pending_hours(), False),
    (_free(("h100", 1, "usable", 1), ("h100", 1, "no_demand", 7)), _pending_hours(), True),
    (_free(("h100", 1, "fragment", 2)), _pending_hours(), True),
    (_free(("h100", 1, "quota", 2)), _pending_hours(), True),
    (_free(("h100", 1, "mismatch", 8)), _pending_hours(("l4", 1, "no_capacity", 4)), False),
    (_free(("h100", 1, "mismatch", 8)), _pending_hours(("h100", 1, "starting", 1)), True),
    (_free(("h100", 1, "mismatch", 8)), _pending_hours(("", 1, "unschedulable", 1)), False),
    (_free(("h100", 1, "no_demand", 8)), _pending_hours(("h100", 2, "no_capacity", 4)), False),
], ids=["nothing waits", "a pod could use a GPU", "a fragment", "quota-held",
        "pods wait for another pool", "a pod that fits the pool waits",
        "a pod that fits no pool", "a pod waits an hour later"])
def test_an_hour_has_demand_for_a_pool_only_when_a_pod_that_fits_it_waits(
        free: pd.DataFrame, waiting: pd.DataFrame, demand: bool) -> None:
    hours = pool_hours(free, waiting)
    first = hours[(hours.node_pool == "h100") & (hours.hour_start == T("2026-11-16 01:00",
                                                                      tz="UTC"))]
    assert list(first.demand) == [demand]


def test_pool_hours_split_the_free_gpus_by_what_could_use_them() -> None:
    hours = pool_hours(_free(("h100", 1, "usable", 1, 10.0), ("h100", 1, "fragment", 2, 20.0),
                             ("h100", 1, "mismatch", 3, 30.0), ("h100", 1, "no_demand", 4, 40.0)),
                       _pending_hours(("h100", 3, "no_capacity", 8)))
    one, three = hours.iloc[0], hours.iloc[1]
    assert (one.free_seconds, one.compatible_seconds, one.mismatch_seconds,
            one.no_demand_seconds, one.removable_cost_usd) == (10 * H, 3 * H, 3 * H, 4 * H, 70)
    # an hour the pool had no free GPU but a pod that fits it waited: demand, its model known
    assert (three.free_seconds, three.pending_gpu_seconds, three.demand,
            three.provisioning) == (0.0, 8 * H, True, "on-demand")


def test_stranded_gpus_by_pool() -> None:
    free = _free(("h100", 1, "usable", 1, 10.0), ("h100", 1, "fragment", 2, 20.0, 0.5),
                 ("h100", 2, "mismatch", 3, 30.0), ("h100", 3, "no_demand", 4, 40.0),
                 ("spot", 1, "quota", 1, 2.0))
    frag = pd.DataFrame([("h100", "nvidia-h100-80gb", "on-demand", 0.25)],
                        columns=["node_pool", "gpu_model", "provisioning",
                                 "fragmentation_ratio"])
    t = stranded_by_pool(free, pool_hours(free, _pending_hours()), frag)
    assert list(t.columns) == columns("stranded")
    h100 = t.set_index("node_pool").loc["h100"]
    assert h100[["free_gpu_hours", "usable_gpu_hours", "fragment_gpu_hours",
                 "mismatch_gpu_hours", "no_demand_gpu_hours"]].tolist() == [10, 1, 2, 3, 4]
    assert (h100.stranded_cost_usd, h100.removable_cost_usd) == (90.0, 70.0)
    assert (h100.hours_with_demand, h100.fragmentation_ratio) == (1, 0.25)
    assert list(t.node_pool) == ["h100", "spot"]  # the most stranded cost first


def test_stuck_workloads_name_their_pool_model_and_last_wait() -> None:
    stuck = pd.DataFrame([("ns", "train", None, "", "", 2, 4, 8 * H, 4 * H, "unschedulable",
                           "starting", "default-scheduler", "0/3 nodes are available",
                           T("2026-11-16 04:00", tz="UTC").timestamp(),
                           T("2026-11-16 09:30", tz="UTC").timestamp())],
                         columns=["namespace", "workload", "team", "gpu_model", "node_pool",
                                  "waiting", "gpus", "gpu_seconds", "wait_seconds", "cause",
                                  "latest_cause", "evidence_source", "evidence", "last_unix",
                                  "expected_unix"])
    row = stuck_workloads(stuck).iloc[0]
    assert (row.team, row.gpu_model, row.node_pool, row.gpu_hours) == \
        ("(none)", ANY_MODEL, NO_POOL, 8.0)
    assert (row.source, row.message) == ("default-scheduler", "0/3 nodes are available")
    assert row.last_waited == T("2026-11-16 04:00", tz="UTC")
    assert row.expected_start == T("2026-11-16 09:30", tz="UTC")


@pytest.mark.parametrize(("recorded", "team", "says"), [
    (False, None, "the exporter that wrote it predates them"),
    (True, None, "No pod waited for a GPU this week."),
    (True, "alpha", "No pod of team alpha waited for a GPU this week."),
])
def test_an_empty_waits_table_says_why(recorded: bool, team: str | None, says: str) -> None:
    assert says in empty_note(recorded, team)
