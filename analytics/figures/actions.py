"""What to do this week: the article's levers priced with the week's data, and the actions,
each with its dollars and its evidence, reconciled with the queues and the SLA."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from analytics import format as fmt
from analytics.figures.queue import long_queues
from analytics.figures.rightsizing import SHARING_UTILIZATION, sharing_cost
from analytics.tables import columns
from analytics.workspace import Table


def removable(unallocated: pd.DataFrame, queue: pd.DataFrame) -> pd.DataFrame:
    """The unallocated capacity an autoscaler could remove: that of GPU models without a
    long queue (the rest is what waiting pods could not reach)."""
    waiting = long_queues(queue)
    return unallocated[~unallocated.gpu_model.isin(list(waiting))]


def actions(unallocated: pd.DataFrame, queue: pd.DataFrame, availability: pd.DataFrame,
            levers: pd.DataFrame, prices: Mapping[tuple[str, str], float]) -> pd.DataFrame:
    """What to do this week, each with its dollars and its evidence, reconciled with the
    queues and the SLA: capacity that sat unallocated while pods waited for its GPU model
    is never offered as a saving (the pods could not reach it: that is to fix); a long
    queue with no unallocated capacity of its model says the pool is too small (its cost:
    the GPU-hours pending, on demand); a pool under the SLA target comes with its
    downtime. Problems first, then the savings, largest first."""
    fixes: list[tuple[str, str, float, float, str]] = []
    saves: list[tuple[str, str, float, float, str]] = []
    waiting = long_queues(queue)
    for r in unallocated.itertuples():
        where = f"{r.node_pool} ({r.gpu_model}, {r.provisioning})"
        if r.gpu_model in waiting and waiting[str(r.gpu_model)].quota_bound:
            q = waiting[str(r.gpu_model)]
            fixes.append((
                "raise the Kueue quota", where, np.nan, np.nan,
                f"{r.gpu_hours:,.0f} GPU-hours (${r.cost_usd:,.2f}) unallocated while "
                f"{r.gpu_model} Jobs waited {q.admission_share:.0%} of their wait for Kueue's "
                f"admission (p90 {fmt.duration(q.p90_seconds)}): the ClusterQueues' quota "
                "held them back, not the pool — raise their nominalQuota, or let them "
                "borrow in a cohort; do not remove this capacity"))
        elif r.gpu_model in waiting:
            p90, pending, _ = waiting[str(r.gpu_model)]
            fixes.append((
                "let the waiting pods use this pool", where, np.nan, np.nan,
                f"{r.gpu_hours:,.0f} GPU-hours (${r.cost_usd:,.2f}) unallocated while "
                f"{r.gpu_model} pods waited (p90 {fmt.duration(p90)}, {pending:,.0f} "
                "GPU-hours pending): check their node selectors, tolerations, zones and "
                "quotas against this pool; do not remove this capacity"))
        elif r.cost_usd > 0:
            saves.append((
                "scale this pool down", where, float(r.cost_usd), np.nan,
                f"{r.gpu_hours:,.0f} GPU-hours unallocated and no {r.gpu_model} queue: "
                "the cluster autoscaler (or a lower minimum) would have removed them"))
    have_capacity = set(unallocated.gpu_model)
    for model, q in sorted(waiting.items()):
        if model in have_capacity:
            continue
        price = prices.get((model, "on-demand"))
        quota = (f"; {q.admission_share:.0%} of the wait was for Kueue's admission: raise "
                 "the ClusterQueues' quota with it") if q.quota_bound else ""
        fixes.append((
            "add capacity", model, np.nan,
            q.pending_gpu_hours * price if price is not None else np.nan,
            f"p90 wait {fmt.duration(q.p90_seconds)}, {q.pending_gpu_hours:,.0f} GPU-hours "
            f"pending and no unallocated {model} capacity: the pool is too small — raise the "
            f"autoscaler's maximum, add nodes, or take spot or flex-start capacity{quota}"))
    for r in availability.itertuples():
        if not r.meets_target:
            fixes.append((
                "restore availability", f"{r.node_pool} ({r.gpu_model})", np.nan, np.nan,
                f"{r.availability:.2%} available against {r.target:.1%}, "
                f"{r.down_hours:,.1f} GPU-hours down (see Incidents)"))
    for r in levers.itertuples():
        if r.lever != "autoscaling" and r.weekly_saving_usd > 0:
            saves.append((LEVER_ACTIONS[str(r.lever)], "all pools", float(r.weekly_saving_usd),
                          np.nan, str(r.how)))
    saves.sort(key=lambda row: -row[2])
    return pd.DataFrame(fixes + saves, columns=columns("actions"))


LEVER_ACTIONS = {"spot": "move batch Jobs to spot", "sharing": "share lightly used GPUs",
                 "right-sizing": "right-size workloads"}


def savings(spot: Table, rightsize: Table, unallocated: pd.DataFrame, pods: Table,
            queue: pd.DataFrame) -> pd.DataFrame:
    """The article's levers, priced with this week's data (upper bounds); autoscaling
    counts only the capacity no long queue waited for (``removable``)."""
    scalable = removable(unallocated, queue)
    return pd.DataFrame([
        ("spot", "batch Jobs on on-demand GPUs moved to spot (with checkpoints)",
         spot.sum("weekly_saving_usd")),
        ("autoscaling", "unallocated capacity an autoscaler could have removed (none a "
                        "queue waited for)",
         float(scalable.cost_usd.sum())),
        ("sharing", f"idle cost of pods under {SHARING_UTILIZATION:.0%} utilisation, which "
                    "time-sharing or MIG could pack together",
         sharing_cost(pods)),
        ("right-sizing", "workloads on the cheapest GPU that fits",
         rightsize.sum("weekly_saving_usd")),
    ], columns=columns("savings"))
