"""Whether the GPUs were up: availability and error budget per pool, and the incidents.

- availability: up / (up + down) GPU-seconds; the error budget is (1 - target) of the
  GPU-seconds, and what is left of it is 1 - down / budget.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analytics.figures import HOUR, unix_seconds
from analytics.tables import columns
from analytics.week import Week


def availability(avail: pd.DataFrame, target: float) -> pd.DataFrame:
    cols = columns("availability")
    if avail.empty:
        return pd.DataFrame(columns=cols)
    a = avail[avail.gpu_seconds > 0]
    up = a.gpu_seconds - a.down_seconds
    budget = (1 - target) * a.gpu_seconds
    out = pd.DataFrame({
        "node_pool": a.node_pool, "gpu_model": a.gpu_model,
        "availability": up / a.gpu_seconds, "target": target,
        "down_hours": a.down_seconds / HOUR,
        "error_budget_left": 1 - a.down_seconds / budget,
    })
    out["meets_target"] = out.availability >= target
    return out.sort_values(["availability", "node_pool"], ignore_index=True)


PREEMPTED = """
SELECT * FROM pod_states
WHERE reason = 'Terminated' AND phase = 'Failed' AND finished IS NOT NULL
"""
"""The pod states ``incidents`` reads (spot preemptions), in the workspace."""


def incidents(events: pd.DataFrame, pod_states: pd.DataFrame, week: Week) -> pd.DataFrame:
    """GPU incidents (XID, NotReady, GPU lost) that ended in the week, and spot
    preemptions in it, with their durations: one row per event, however many GPUs it
    took down (a NotReady node is one incident of its 8 GPUs, with their GPU-hours lost)."""
    cols = columns("incidents")
    rows: list[tuple[Any, ...]] = []
    keys = ["reason", "node_pool", "node", "start_time", "end_time"]
    for (reason, pool, node, start, end), g in events.groupby(keys, sort=False, dropna=False):
        gpus = g.gpu_uuid.nunique()
        where = f"{pool}/{node} " + (str(g.gpu_uuid.iloc[0]) if gpus == 1 else f"({gpus} GPUs)")
        rows.append((reason, where, gpus, start, end, float(g.seconds.max()),
                     float(g.seconds.sum()) / HOUR))
    if not pod_states.empty:
        pre = pod_states[(pod_states.reason == "Terminated") & (pod_states.phase == "Failed")
                         & pod_states.finished.notna()]
        fin = unix_seconds(pre.finished)
        pre = pre[(fin >= week.start.timestamp()) & (fin < week.end.timestamp())]
        rows += [("spot_preemption", f"{p.namespace}/{p.pod}", None, p.finished, p.finished,
                  0.0, None) for p in pre.itertuples()]
    out = pd.DataFrame(rows, columns=cols)
    if not out.empty:
        out["start"] = pd.to_datetime(out.start, utc=True)
        out["end"] = pd.to_datetime(out.end, utc=True)
    return out.sort_values(["start", "where"], ignore_index=True)
