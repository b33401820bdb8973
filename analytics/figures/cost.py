"""Where the money went: cost by team, namespace, pool, model and provisioning, per day
and team, the pods that held GPUs and used them least, and the capacity no pod held.

- cost: what the GPU-seconds cost after discount. A team's or namespace's cost is what its
  pods held (``allocated``); pools, models and provisioning include idle capacity.
- utilisation: utilised / measured GPU-seconds (rows without a reading do not count).
- idle cost: allocated but unused — cost x (1 - utilisation) of each row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analytics.figures import HOUR, TOP, this_week
from analytics.tables import columns
from analytics.week import Week
from analytics.workspace import Workspace

COST_DIMENSIONS = ("team", "namespace", "node_pool", "gpu_model", "provisioning")


OWNED_BY = ("team", "namespace", "allocation")
"""The dimensions GPU time belongs to only while a pod holds it."""
POOLED = ("(unallocated)", "(unavailable)")
"""What a team or a namespace table calls the GPU time no pod held."""


def cost_by(usage: pd.DataFrame, dimension: str, previous: bool = True) -> pd.DataFrame:
    """Cost this week and last, the change, GPU-hours, utilisation and share, per value;
    last week's cost and the change unknown (NaN) without ``previous`` week's data.

    Every table sums to the headline. A team's or a namespace's row is its pods' GPU time,
    its utilisation that of the time allocated (``utilization_of_allocated``), its
    ``share_of_allocated`` its part of what pods held; the GPU time no pod held follows as
    ``(unallocated)`` and ``(unavailable)``, last. The other tables (pool, model,
    provisioning) count all of their GPUs' time, utilisation over capacity
    (``utilization_of_capacity``)."""
    owned = dimension in OWNED_BY
    key = usage[dimension].fillna("(none)")
    if owned:  # no Kubernetes name holds parentheses: these never meet a team's
        key = key.where(usage.state == "allocated", "(" + usage.state + ")")
    rows = usage.assign(key=key)
    g = rows.groupby(["key", "this_week"], dropna=False)[
        ["cost_usd", "gpu_seconds", "utilized_seconds", "measured_seconds"]].sum()
    g = g.astype(float).unstack("this_week", fill_value=0.0)
    out = pd.DataFrame({dimension: g.index})

    def cur(column: str, this_week: bool = True) -> np.ndarray:
        key = (column, this_week)
        return g[key].to_numpy(dtype=float) if key in g.columns else np.zeros(len(g))

    def prev(column: str) -> np.ndarray:
        return cur(column, False)

    out["cost_usd"] = cur("cost_usd")
    out["previous_cost_usd"] = prev("cost_usd")
    out["change_usd"] = out.cost_usd - out.previous_cost_usd
    out["change"] = np.where(out.previous_cost_usd > 0,
                             out.change_usd / out.previous_cost_usd.where(
                                 out.previous_cost_usd > 0, 1.0), np.nan)
    out["gpu_hours"] = cur("gpu_seconds") / HOUR
    measured = cur("measured_seconds")
    pooled = out[dimension].isin(POOLED).to_numpy() if owned \
        else np.zeros(len(out), dtype=bool)
    util = np.where(measured > 0, cur("utilized_seconds") / np.where(measured > 0, measured,
                                                                       1.0), np.nan)
    out["utilization_of_allocated" if owned else "utilization_of_capacity"] = \
        np.where(pooled, np.nan, util)
    total = out.cost_usd.sum()
    out["share"] = out.cost_usd / total if total else np.nan
    if owned:
        held = out.cost_usd[~pooled].sum()
        out["share_of_allocated"] = np.where(~pooled & (held > 0),
                                             out.cost_usd / (held or 1.0), np.nan)
    out = out.assign(_pooled=pooled)[(out.cost_usd > 0) | (out.previous_cost_usd > 0)]
    if not previous:
        out = out.assign(previous_cost_usd=np.nan, change_usd=np.nan, change=np.nan)
    return out.sort_values(["_pooled", "cost_usd", dimension], ascending=[True, False, True],
                           ignore_index=True)[columns(f"cost_by_{dimension}")]


def daily_by_team(daily: pd.DataFrame, week: Week) -> pd.DataFrame:
    """Cost per day (rows) and team (columns), every day of the week present."""
    if daily.empty:
        return pd.DataFrame(index=pd.Index([d.date() for d in week.days], name="day"))
    d = daily.assign(day=pd.to_datetime(daily["day"], utc=True).dt.date,
                     team=daily["team"].fillna("(none)"))
    table = d.pivot_table(index="day", columns="team", values="cost_usd", aggfunc="sum",
                          fill_value=0.0)
    table = table.reindex([x.date() for x in week.days], fill_value=0.0)
    table.index.name = "day"
    return table[sorted(table.columns, key=lambda t: (t in POOLED, -table[t].sum()))]


IDLE_CEILING = 0.5
"""A pod is an idle offender only under this utilisation."""

IDLE_OFFENDERS = """
SELECT * FROM pods
WHERE idle_cost_usd > 0 AND utilization < $ceiling
ORDER BY idle_seconds DESC, idle_cost_usd DESC, pod LIMIT $n
"""


def idle_offenders(ws: Workspace, n: int = TOP) -> pd.DataFrame:
    """The pods that held GPUs and used them least: utilisation under ``IDLE_CEILING``
    (a busy job's small idle share of a dear GPU is no waste to chase), the most idle
    GPU-hours first, then the most idle cost."""
    cols = columns("idle_offenders")
    pods = ws.frame(IDLE_OFFENDERS, {"n": n, "ceiling": IDLE_CEILING})
    if pods.empty:
        return pd.DataFrame(columns=cols)
    return pods.assign(idle_gpu_hours=pods.idle_seconds / HOUR)[cols]


def unallocated_by_pool(usage: pd.DataFrame) -> pd.DataFrame:
    rows = this_week(usage)
    rows = rows[rows.state == "unallocated"]
    g = rows.groupby(["node_pool", "gpu_model", "provisioning"], as_index=False)[
        ["gpu_seconds", "cost_usd"]].sum()
    g["gpu_hours"] = g.pop("gpu_seconds") / HOUR
    return g[columns("unallocated_by_pool")].sort_values(
        ["cost_usd", "node_pool"], ascending=[False, True], ignore_index=True)

