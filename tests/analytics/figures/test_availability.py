"""Availability, error budget and incidents (``analytics.figures.availability``)."""

from __future__ import annotations

import pandas as pd
import pytest

from analytics.figures.availability import availability, incidents
from tests.analytics.figures.frames import WEEK, T, pod_state, states


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
