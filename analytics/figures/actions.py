"""What to do this week: the article's levers priced with the week's data, and the actions,
each with its dollars and its evidence.

- in time: where the warehouse records why pods waited (``figures.waits``), free capacity
  is matched against waiting demand interval by interval. A pool's scale-down saving is the
  cost of its free GPUs in the intervals no waiting pod could use them (uses ``mismatch``
  and ``no_demand``); its free GPUs a waiting pod could use (``usable``, ``fragment``,
  ``quota``) are never a saving, and they fall only in hours demand waited for the pool.
- a lever per cause: each cause pods waited for long (the worst team's p90 time waited for
  it over ``LONG_WAIT_SECONDS``) gets the lever that answers it (``LEVERS``), per pool (a
  ClusterQueue for ``quota``, the GPU model asked for ``unschedulable``), with the free
  GPUs of the same hours that bear on it.
- over the week: a warehouse that records no causes (an exporter from an earlier release)
  is reconciled per GPU model over the whole week, as before (``queue.long_queues``), and
  says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from analytics import format as fmt
from analytics.figures import HOUR
from analytics.figures.queue import QUEUE_LONG_SECONDS, long_queues
from analytics.figures.rightsizing import SHARING_UTILIZATION, sharing_cost
from analytics.figures.waits import ANY_MODEL, NO_POOL, REMOVABLE, Waited
from analytics.tables import columns
from analytics.workspace import Table
from exporter.model.pending import Cause


class Action(NamedTuple):
    """One row of the ``actions`` table."""

    action: str
    where: str
    weekly_saving_usd: float
    weekly_cost_usd: float
    why: str
    answers: str | None = None
    """The cause it answers, or the free GPUs' uses; None for a lever of the week's cost."""


class Lever(NamedTuple):
    """What answers a cause: the action, what the cause meant for the pods, the advice."""

    action: str
    waited: str
    advice: str


LEVERS: dict[Cause, Lever] = {
    "quota": Lever("raise the ClusterQueue quota or borrow in the cohort",
                   "held back by Kueue's quota",
                   "raise the ClusterQueue's nominalQuota, or let it borrow its cohort's "
                   "unused quota"),
    "fragmented": Lever("compact placement, fewer and larger nodes",
                        "enough GPUs free in the pools they fit, but not on one node",
                        "pack pods onto the fewest nodes (compact placement, the scheduler's "
                        "MostAllocated scoring) or use fewer, larger node shapes"),
    "scaling_up": Lever("keep minimum nodes or a reservation",
                        "for nodes being provisioned",
                        "keep a minimum of nodes in the pool, or a reservation, for the "
                        "demand that arrives"),
    "stockout": Lever("scale in another zone, region or on spot",
                      "the cluster autoscaler's scale-up failed",
                      "let the pool scale in more zones or another region, or take spot or "
                      "flex-start capacity"),
    "unschedulable": Lever("fix the manifests", "no pool offers what they ask",
                           "fix their node selector, tolerations or MIG profile, or add a pool "
                           "that offers it"),
    "no_capacity": Lever("add capacity (max nodes)",
                         "the pools they fit full, at their maximum",
                         "raise the pool's maximum nodes (the autoscaler's limit) or add "
                         "nodes"),
    "preempted": Lever("on-demand for restarts, or checkpointing",
                       "waiting again after an eviction or a spot reclaim",
                       "run restarts on on-demand capacity, or checkpoint often so that a "
                       "reclaim loses little"),
    "starting": Lever("speed up image pulls", "scheduled, not running yet (image pull, init)",
                      "smaller images, image streaming, or images cached on the nodes"),
}
"""The lever that answers each cause."""

SCALE_DOWN = "scale this pool down"
"""The action that removes a pool's free GPUs no waiting pod could use."""
LAYOUT_CAUSES: tuple[Cause, ...] = ("no_capacity", "fragmented", "quota", "stockout")
"""The causes whose levers change the cluster's layout (``analytics.whatif.levers``), so
that a replay can price them; with the scale-downs and the move to spot."""

LONG_WAIT_SECONDS = QUEUE_LONG_SECONDS
"""A cause calls for its lever when the worst team's 90th-percentile time waited for it, in
a pool, is over this."""
MESSAGE_CHARS = 160
"""How much of a scheduler's or autoscaler's message an action quotes."""


def _hours(gpu_hours: float) -> str:
    return f"{gpu_hours:,.0f}" if gpu_hours >= 10 else f"{gpu_hours:,.1f}"


def _teams(teams: Sequence[str]) -> str:
    if len(teams) > 3:
        return f"{len(teams)} teams"
    return ("team " if len(teams) == 1 else "teams ") + ", ".join(teams)


def _quote(message: object) -> str:
    text = " ".join(str(message).split())
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 1] + "…"


def _raw(value: str, none: str) -> str:
    """A pool or model as the hourly frames hold it (empty for none)."""
    return "" if value == none else value


# ---------------------------------------------------------------------------- in time


def scale_downs(hours: pd.DataFrame) -> list[Action]:
    """Per pool, the saving of scaling it down: the cost of its free GPUs in the intervals
    no waiting pod could use them (``pool_hours``' ``removable_cost_usd``); the free GPUs
    waiting pods could use, in the hours demand waited for it, are named and not counted."""
    out = []
    for (pool, model, prov), g in hours.groupby(["node_pool", "gpu_model", "provisioning"]):
        cost = float(g.removable_cost_usd.sum())
        if cost <= 0:
            continue
        nothing, mismatch = g.no_demand_seconds.sum() / HOUR, g.mismatch_seconds.sum() / HOUR
        idle = int(((g.mismatch_seconds + g.no_demand_seconds) > 0).sum())
        how = {(True, True): f"when no waiting pod could use them ({_hours(nothing)} with "
                             f"nothing waiting, {_hours(mismatch)} while only pods that do "
                             "not fit it waited)",
               (True, False): "with nothing waiting",
               (False, True): "while only pods that do not fit it waited"}
        why = (f"{_hours(nothing + mismatch)} GPU-hours free in {idle} hours of the week "
               f"{how[nothing > 0, mismatch > 0]}: the cluster autoscaler (or a lower minimum) "
               "would have removed them")
        kept = g.compatible_seconds.sum() / HOUR
        if kept > 0:
            why += (f"; {_hours(kept)} GPU-hours more sat free in the "
                    f"{int((g.compatible_seconds > 0).sum())} hours pods that fit it waited, "
                    "not counted")
        idle_by = {"mismatch": mismatch, "no_demand": nothing}
        uses = [u for u in REMOVABLE if idle_by[u] > 0]
        out.append(Action(SCALE_DOWN, f"{pool} ({model}, {prov})", cost, np.nan,
                          why, ", ".join(uses)))
    return out


def _long_causes(waits: pd.DataFrame) -> Iterable[tuple[Cause, str, pd.DataFrame]]:
    """Each cause, and where, that waited long: by ClusterQueue for ``quota`` (else by
    model), by GPU model for ``unschedulable``, else by pool and model."""
    for cause in LEVERS:
        rows = waits[waits.cause == cause]
        if cause == "quota":
            where = ("ClusterQueue " + rows.cluster_queue).where(rows.cluster_queue != "",
                                                                 rows.gpu_model)
        elif cause == "unschedulable":
            where = rows.gpu_model
        else:
            where = rows.node_pool + " (" + rows.gpu_model + ")"
        for place, g in rows.groupby(where, sort=True):
            if g.p90_seconds.max() > LONG_WAIT_SECONDS:
                yield cause, str(place), g


def _free_of(free_hours: pd.DataFrame, use: str, models: Iterable[str],
             when: pd.DataFrame, other_than: str | None = None) -> tuple[float, list[str]]:
    """GPU-hours of ``models`` free as ``use`` in the ``when`` hours of each cluster (in
    pools but ``other_than``), and the pools they were in."""
    f = _in(free_hours[(free_hours.use == use) & free_hours.gpu_model.isin(list(models))],
            when)
    if other_than is not None:
        f = f[f.node_pool != other_than]
    f = f[f.gpu_seconds > 0]
    pools = sorted({f"{p} ({v})" for p, v in zip(f.node_pool, f.provisioning, strict=True)})
    return float(f.gpu_seconds.sum()) / HOUR, pools


def _in(hourly: pd.DataFrame, when: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``hourly`` in the hours (of their cluster) of ``when``."""
    return hourly.merge(when[["cluster", "hour_start"]].drop_duplicates(),
                        on=["cluster", "hour_start"])


def _clause(cause: Cause, g: pd.DataFrame, w: Waited) -> str:
    """What the free GPUs and the evidence of the same hours add to a cause's lever."""
    models = sorted({_raw(m, ANY_MODEL) for m in g.gpu_model} - {""})
    pool = _raw(str(g.node_pool.iloc[0]), NO_POOL)
    p = w.pending_hours
    when = p[(p.cause == cause) & p.gpu_model.isin(models)]
    if cause != "quota":
        when = when[when.node_pool == pool]
    if cause == "fragmented":
        mine = _in(w.free_hours[w.free_hours.node_pool == pool], when)
        frag = float(mine[mine.use == "fragment"].gpu_seconds.sum()) / HOUR
        asked = float(mine[mine.use.isin(["fragment", "usable"])].gpu_seconds.sum()) / HOUR
        return (f"; in those hours the pool had {_hours(frag)} GPU-hours free as fragments "
                f"({frag / asked:.0%} of its free GPU-hours)") if frag > 0 else ""
    if cause == "quota":
        held, pools = _free_of(w.free_hours, "quota", models, when)
        return (f"; in the same hours {_hours(held)} GPU-hours of {', '.join(models)} sat free "
                f"in {', '.join(pools)}, which only the quota kept from them") if held > 0 \
            else ""
    if cause == "unschedulable":
        stuck = w.stuck[(w.stuck.cause == cause) & w.stuck.gpu_model.isin(list(g.gpu_model))]
        if stuck.empty:
            return ""
        first = stuck.iloc[0]
        names = ", ".join(f"{ns}/{wl}" for ns, wl in zip(stuck.namespace.head(3),
                                                          stuck.workload.head(3), strict=True))
        said = f' ({first.source}: "{_quote(first.message)}")' \
            if isinstance(first.message, str) and first.message else ""
        return f"; such as {names}{said}"
    text = ""
    if cause == "stockout":
        stuck = w.stuck[(w.stuck.cause == cause) & (w.stuck.node_pool == g.node_pool.iloc[0])]
        said = stuck.dropna(subset=["message"])
        if len(said):
            text += f' ({said.source.iloc[0]}: "{_quote(said.message.iloc[0])}")'
    if cause in ("stockout", "no_capacity", "scaling_up"):
        free, pools = _free_of(w.free_hours, "mismatch", models, when, other_than=pool)
        if free > 0:
            text += (f"; in the same hours {_hours(free)} GPU-hours of {', '.join(models)} sat "
                     f"free in {', '.join(pools)}, which these pods do not fit (their "
                     "selector, tolerations or MIG profile): with a spot toleration or a "
                     "wider selector they could have run there")
    return text


def cause_levers(w: Waited) -> list[Action]:
    """A lever for each cause, and where, that pods waited for long, most GPU-hours first.
    Waiting is told in hours, never priced: what a lever that changes the layout costs or
    saves is its replay's (``replayed_dollars``)."""
    out = []
    for cause, where, g in _long_causes(w.waits):
        lever = LEVERS[cause]
        gpu_hours = float(g.gpu_hours.sum())
        why = (f"{_teams(sorted(map(str, g.team.unique())))}: {_hours(gpu_hours)} GPU-hours "
               f"waited, {lever.waited} (p90 {fmt.duration(float(g.p90_seconds.max()))})"
               f"{_clause(cause, g, w)}: {lever.advice}")
        out.append((gpu_hours, Action(lever.action, where, np.nan, np.nan, why, cause)))
    return [a for _, a in sorted(out, key=lambda x: -x[0])]


# ---------------------------------------------------------------------------- over the week


def removable(unallocated: pd.DataFrame, queue: pd.DataFrame) -> pd.DataFrame:
    """Over the week: the unallocated capacity an autoscaler could remove, that of GPU
    models without a long queue (the rest is what waiting pods could not reach)."""
    waiting = long_queues(queue)
    return unallocated[~unallocated.gpu_model.isin(list(waiting))]


def _waited_for(model: str, queue: pd.DataFrame) -> str:
    """How the model's pods waited, as the queue table says (the worst team's)."""
    q = queue[queue.gpu_model == model] if not queue.empty else queue
    if q.empty:
        return f"no {model} pod waited"
    p90, p99 = q.p90_seconds.max(), q.p99_seconds.max()
    wait = "none scheduled" if pd.isna(p90) else \
        f"p90 {fmt.duration(float(p90))} at most (under {fmt.duration(QUEUE_LONG_SECONDS)}; " \
        f"p99 {fmt.duration(float(p99))})"
    return f"{model} pods waited {wait}, {_hours(float(q.pending_gpu_hours.sum()))} " \
        "GPU-hours pending in all"


def over_the_week(unallocated: pd.DataFrame, queue: pd.DataFrame
                  ) -> tuple[list[Action], list[Action]]:
    """The fixes and savings of a warehouse that records no causes: capacity that sat
    unallocated while pods of its GPU model waited long (over the week) is never offered as
    a saving; a long queue with no unallocated capacity of its model says the pool is too
    small (the GPU-hours pending told, not priced)."""
    fixes: list[Action] = []
    saves: list[Action] = []
    waiting = long_queues(queue)
    for r in unallocated.itertuples():
        where = f"{r.node_pool} ({r.gpu_model}, {r.provisioning})"
        if r.gpu_model in waiting and waiting[str(r.gpu_model)].quota_bound:
            q = waiting[str(r.gpu_model)]
            fixes.append(Action(
                "raise the Kueue quota", where, np.nan, np.nan,
                f"{r.gpu_hours:,.0f} GPU-hours (${r.cost_usd:,.2f}) unallocated while "
                f"{r.gpu_model} Jobs waited {q.admission_share:.0%} of their wait for Kueue's "
                f"admission (p90 {fmt.duration(q.p90_seconds)}): the ClusterQueues' quota "
                "held them back, not the pool — raise their nominalQuota, or let them "
                "borrow in a cohort; do not remove this capacity", "quota"))
        elif r.gpu_model in waiting:
            p90, pending, _ = waiting[str(r.gpu_model)]
            fixes.append(Action(
                "let the waiting pods use this pool", where, np.nan, np.nan,
                f"{r.gpu_hours:,.0f} GPU-hours (${r.cost_usd:,.2f}) unallocated while "
                f"{r.gpu_model} pods waited (p90 {fmt.duration(p90)}, {pending:,.0f} "
                "GPU-hours pending): check their node selectors, tolerations, zones and "
                "quotas against this pool; do not remove this capacity"))
        elif r.cost_usd > 0:
            saves.append(Action(
                SCALE_DOWN, where, float(r.cost_usd), np.nan,
                f"{r.gpu_hours:,.0f} GPU-hours unallocated; "
                f"{_waited_for(str(r.gpu_model), queue)}: the cluster autoscaler (or a lower "
                "minimum) would have removed them. Matched over the week, not hour by hour: "
                "this warehouse records no cause of waiting"))
    have_capacity = set(unallocated.gpu_model)
    for model, q in sorted(waiting.items()):
        if model in have_capacity:
            continue
        quota = (f"; {q.admission_share:.0%} of the wait was for Kueue's admission: raise "
                 "the ClusterQueues' quota with it") if q.quota_bound else ""
        fixes.append(Action(
            "add capacity", model, np.nan, np.nan,
            f"p90 wait {fmt.duration(q.p90_seconds)}, {q.pending_gpu_hours:,.0f} GPU-hours "
            f"pending and no unallocated {model} capacity: the pool is too small — raise the "
            f"autoscaler's maximum, add nodes, or take spot or flex-start capacity{quota}"))
    return fixes, saves


# ---------------------------------------------------------------------------- the table


LEVER_ACTIONS = {"spot": "move batch Jobs to spot", "sharing": "share lightly used GPUs",
                 "right-sizing": "right-size workloads"}
TO_SPOT = LEVER_ACTIONS["spot"]


def pool_of(where: str) -> str:
    """The node pool an action's ``where`` names (``h100 (nvidia-h100-80gb, spot)``)."""
    return where.split(" (", 1)[0]


def _cost_levers(levers: pd.DataFrame) -> list[Action]:
    return [Action(LEVER_ACTIONS[str(r.lever)], "all pools", float(r.weekly_saving_usd),
                   np.nan, str(r.how))
            for r in levers.itertuples()
            if r.lever != "autoscaling" and r.weekly_saving_usd > 0]


def _table(fixes: list[Action], saves: list[Action]) -> pd.DataFrame:
    saves = sorted(saves, key=lambda a: -a.weekly_saving_usd)
    return pd.DataFrame(fixes + saves, columns=list(Action._fields))[columns("actions")]


def actions(unallocated: pd.DataFrame, queue: pd.DataFrame, availability: pd.DataFrame,
            levers: pd.DataFrame, waited: Waited | None = None,
            hours: pd.DataFrame | None = None) -> pd.DataFrame:
    """What to do this week on the platform, each with its dollars and its evidence: where
    the warehouse records why pods waited (``waited``, its ``hours`` as
    ``waits.pool_hours``), a lever per cause waited for long and the scale-downs matched in
    time; else the reconciliation over the week (``over_the_week``). A pool under the SLA
    target comes with its downtime. Problems first, then the savings, largest first."""
    if waited is not None and waited.recorded and hours is not None:
        fixes, saves = cause_levers(waited), scale_downs(hours)
    else:
        fixes, saves = over_the_week(unallocated, queue)
    for r in availability.itertuples():
        if not r.meets_target:
            fixes.append(Action(
                "restore availability", f"{r.node_pool} ({r.gpu_model})", np.nan, np.nan,
                f"{r.availability:.2%} available against {r.target:.1%}, "
                f"{r.down_hours:,.1f} GPU-hours down (see Incidents)", "availability"))
    return _table(fixes, saves + _cost_levers(levers))


def team_actions(levers: pd.DataFrame, waited: Waited) -> pd.DataFrame:
    """What to do this week for a team: the levers for the causes its pods waited for long
    (from the same figures as the platform's), then its savings, largest first."""
    fixes = cause_levers(waited) if waited.recorded else []
    return _table(fixes, _cost_levers(levers))


def savings(spot: Table, rightsize: Table, unallocated: pd.DataFrame, pods: Table,
            queue: pd.DataFrame, hours: pd.DataFrame | None = None) -> pd.DataFrame:
    """The article's levers, priced with this week's data (upper bounds); autoscaling
    counts, with the ``hours`` of a warehouse that records why pods waited
    (``waits.pool_hours``), the free capacity no waiting pod could use, interval by
    interval; else the capacity no long queue waited for over the week (``removable``)."""
    if hours is not None:
        autoscaling = ("free capacity an autoscaler could have removed: in the intervals no "
                       "waiting pod could use it", float(hours.removable_cost_usd.sum()))
    else:
        autoscaling = ("unallocated capacity an autoscaler could have removed (none a queue "
                       "waited for)", float(removable(unallocated, queue).cost_usd.sum()))
    return pd.DataFrame([
        ("spot", "batch Jobs on on-demand GPUs moved to spot (with checkpoints)",
         spot.sum("weekly_saving_usd")),
        ("autoscaling", *autoscaling),
        ("sharing", f"idle cost of pods under {SHARING_UTILIZATION:.0%} utilisation, which "
                    "time-sharing or MIG could pack together",
         sharing_cost(pods)),
        ("right-sizing", "workloads on the cheapest GPU that fits",
         rightsize.sum("weekly_saving_usd")),
    ], columns=columns("savings"))
