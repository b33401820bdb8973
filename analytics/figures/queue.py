"""How long pods waited for a GPU: wait percentiles and pending GPU-hours by team and GPU
model, Kueue's ClusterQueues, the longest waits, and the GPU models whose queue is long.

- queue wait (``waits_begun``): of the pods submitted in the week (a pod of a Job Kueue
  queued: from its Workload's creation or last requeue) and the Jobs Kueue never admitted
  (one wait each), from submission to scheduling, or, for one never scheduled, to its end
  unscheduled or the week's end (a lower bound: a queue that starves a team shows its waits
  rather than hiding them). The console's and ``whatif``'s percentiles are of the same waits.
- pending GPU-hours are the GPUs requested x the time pods waited within the week, until
  they were scheduled or ended unscheduled (deleted while pending: phase ``Deleted``,
  ``finished`` set).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import pandas as pd

from analytics.figures import HOUR, TOP, unix_seconds
from analytics.tables import columns
from analytics.week import Week
from analytics.workspace import Workspace


def _with_kueue(pod_states: pd.DataFrame) -> pd.DataFrame:
    """Pod states with ``queued`` and ``admission_wait_seconds`` (a warehouse from before
    Kueue's columns: its creation, and none)."""
    p = pod_states
    if "queued" not in p.columns:
        p = p.assign(queued=p.created)
    if "admission_wait_seconds" not in p.columns:
        p = p.assign(admission_wait_seconds=np.nan)
    return p


def _as_pod_states(awaiting: pd.DataFrame | None) -> pd.DataFrame:
    """Kueue Workloads awaiting admission (``queries.AWAITING_ADMISSION``) as pod states
    that were never scheduled: a Job waits as its pods would, from its submission (or last
    requeue) with all its GPUs, until it is admitted, deleted or the week ends."""
    if awaiting is None or awaiting.empty:
        return pd.DataFrame()
    never = pd.Series(pd.NaT, index=awaiting.index, dtype="datetime64[us, UTC]")
    return awaiting.assign(pod=awaiting.owner_name.fillna(awaiting.workload),
                           scheduled=never, queue_wait_seconds=np.nan,
                           admission_wait_seconds=np.nan)


def waits_begun(p: pd.DataFrame, week: Week) -> pd.DataFrame:
    """The waits that began in the week, ``p``'s rows (pod states, and Jobs awaiting
    admission as ``_as_pod_states`` gives them, with ``queued``) with ``wait_seconds``."""
    start, end = week.start.timestamp(), week.end.timestamp()
    queued = unix_seconds(p.queued)
    until = unix_seconds(p.scheduled).fillna(unix_seconds(p.finished)).fillna(end) \
        .clip(upper=end)
    keep = (queued >= start) & (queued < end) & p.gpus.fillna(0).gt(0)
    return p[keep].assign(wait_seconds=(until - queued)[keep].clip(lower=0))


def queued_pods(pod_states: pd.DataFrame, awaiting: pd.DataFrame | None) -> pd.DataFrame:
    """Pod states and the Jobs ``awaiting`` Kueue's admission as one frame of pod states."""
    frames = [f for f in (pod_states, _as_pod_states(awaiting)) if not f.empty]
    if not frames:
        return pd.DataFrame()
    return pd.concat([_with_kueue(f) for f in frames], ignore_index=True)


def queue(pod_states: pd.DataFrame, week: Week,
          awaiting: pd.DataFrame | None = None) -> pd.DataFrame:
    """Wait percentiles (seconds) by team and GPU model of the waits that began in the week
    (``waits_begun``), and the GPU-hours pods spent pending in the week, Jobs ``awaiting``
    Kueue's admission (no pod yet) included."""
    cols = columns("queue")
    p = queued_pods(pod_states, awaiting)
    if p.empty:
        return pd.DataFrame(columns=cols)
    p = p.assign(team=p.team.fillna("(none)"), gpu_model=p.gpu_model.fillna("(any)"))
    start, end = week.start.timestamp(), week.end.timestamp()
    created = unix_seconds(p.queued)
    # a wait ends when the pod is scheduled, or ends unscheduled (deleted while pending)
    until = unix_seconds(p.scheduled).fillna(unix_seconds(p.finished)).fillna(end) \
        .clip(upper=end)
    waited = (until.clip(lower=start) - created.clip(lower=start)).clip(lower=0)
    p = p.assign(pending_gpu_hours=waited * p.gpus.fillna(0) / HOUR)
    begun = waits_begun(p, week)
    rows = []
    for (team, model), grp in p.groupby(["team", "gpu_model"]):
        ours = begun[(begun.team == team) & (begun.gpu_model == model)]
        waits = ours.wait_seconds.to_numpy()
        pending = float(grp.pending_gpu_hours.sum())
        if not len(waits) and not pending:
            continue
        q = np.percentile(waits, [50, 90, 99]) if len(waits) else [np.nan] * 3
        mine = ours[ours.scheduled.notna()]
        total = float(mine.queue_wait_seconds.sum())
        share = float(mine.admission_wait_seconds.fillna(0).clip(upper=mine.queue_wait_seconds)
                      .sum()) / total if total > 0 and mine.admission_wait_seconds.notna().any() \
            else np.nan
        rows.append((team, model, len(waits), *q, pending, share))
    return pd.DataFrame(rows, columns=cols).sort_values(
        ["p90_seconds", "team"], ascending=[False, True], ignore_index=True)


KUEUE = """
WITH queued AS (SELECT * FROM pod_states WHERE cluster_queue IS NOT NULL),
run AS (SELECT * FROM queued WHERE scheduled >= $start AND scheduled < $end),
held AS (SELECT q.cluster_queue, sum(p.gpu_seconds) AS gpu_seconds
         FROM pods p JOIN queued q ON p.cluster = q.cluster AND p.pod_uid = q.pod_uid
         GROUP BY q.cluster_queue),
waits AS (SELECT cluster_queue,
                 count(DISTINCT (namespace, coalesce(workload, pod))) AS workloads,
                 count(*) AS pods,
                 quantile_cont(admission_wait_seconds, 0.5) AS admission_p50_seconds,
                 quantile_cont(admission_wait_seconds, 0.9) AS admission_p90_seconds,
                 quantile_cont(queue_wait_seconds, 0.5) AS p50_seconds,
                 quantile_cont(queue_wait_seconds, 0.9) AS p90_seconds
          FROM run GROUP BY cluster_queue)
SELECT cluster_queue, coalesce(w.workloads, 0) AS workloads, coalesce(w.pods, 0) AS pods,
       admission_p50_seconds, admission_p90_seconds, p50_seconds, p90_seconds,
       coalesce(h.gpu_seconds, 0) / 3600.0 AS gpu_hours,
       coalesce(h.gpu_seconds, 0) / $week_seconds AS mean_gpus
FROM waits w FULL JOIN held h USING (cluster_queue)
ORDER BY p90_seconds DESC NULLS LAST, cluster_queue
"""
"""Per ClusterQueue: the waits of the pods it admitted that were scheduled in the week,
and the GPU time of every pod it admitted (the ``pods`` table is the week's)."""


def kueue(ws: Workspace, week: Week, quotas: pd.DataFrame,
          awaiting: pd.DataFrame | None = None) -> pd.DataFrame:
    """``KUEUE``, with each ClusterQueue's GPU quota (``queries.QUOTAS``), the share of it
    its pods held, and the Jobs still ``awaiting`` its admission at the week's end; empty
    on a cluster without Kueue."""
    start, end = week.start, week.end
    out = ws.frame(KUEUE, {"start": start, "end": end,
                           "week_seconds": (end - start).total_seconds()})
    waiting = awaiting[awaiting.finished.isna()] if awaiting is not None \
        and not awaiting.empty else pd.DataFrame()
    if waiting.empty:
        out = out.assign(awaiting_workloads=0, awaiting_gpus=0)
    else:  # a ClusterQueue may hold Jobs back and have run none in the week
        held = waiting.assign(cluster_queue=waiting.cluster_queue.fillna("")) \
            .groupby("cluster_queue", as_index=False) \
            .agg(awaiting_workloads=("gpus", "size"), awaiting_gpus=("gpus", "sum"))
        out = out.merge(held, how="outer", on="cluster_queue").fillna(
            {"workloads": 0, "pods": 0, "gpu_hours": 0.0, "mean_gpus": 0.0,
             "awaiting_workloads": 0, "awaiting_gpus": 0}) \
            .sort_values(["p90_seconds", "cluster_queue"], ascending=[False, True],
                         na_position="last", ignore_index=True)
    nominal = quotas.set_index("cluster_queue").nominal_gpus.astype(float) \
        if not quotas.empty else pd.Series(dtype=float)
    out["nominal_gpus"] = out.cluster_queue.map(nominal).astype(float)
    out["quota_share"] = np.where(out.nominal_gpus > 0,
                                 out.mean_gpus / out.nominal_gpus.where(out.nominal_gpus > 0, 1),
                                 np.nan)
    return out.astype({"workloads": int, "pods": int, "awaiting_workloads": int,
                       "awaiting_gpus": int})[columns("kueue")]


QUEUE_STATES = """
SELECT team, gpu_model, queued, scheduled, finished, gpus, queue_wait_seconds,
       admission_wait_seconds
FROM pod_states
"""
"""What ``queue`` reads of every pod's latest state (in the workspace)."""


def longest_waits_of(chunks: Iterable[pd.DataFrame], week: Week, n: int = TOP,
                     awaiting: pd.DataFrame | None = None) -> pd.DataFrame:
    """``longest_waits`` of pod states that come in chunks: the longest of each chunk's
    (and of the Jobs ``awaiting`` Kueue's admission)."""
    tops = [t for c in (*chunks, _as_pod_states(awaiting))
            if not (t := longest_waits(c, week, n)).empty]
    if not tops:
        return longest_waits(pd.DataFrame(), week, n)
    out = pd.concat(tops, ignore_index=True)
    return out.sort_values(["wait_seconds", "pod"], ascending=[False, True]) \
        .head(n).reset_index(drop=True)


def longest_waits(pod_states: pd.DataFrame, week: Week, n: int = TOP) -> pd.DataFrame:
    """The longest waits that ended in the week, or are still going at its end."""
    cols = columns("longest_waits")
    if pod_states.empty:
        return pd.DataFrame(columns=cols)
    p = _with_kueue(pod_states)
    created = unix_seconds(p.queued)
    sched = unix_seconds(p.scheduled)
    end = week.end.timestamp()
    ended = p.scheduled.notna() & (sched >= week.start.timestamp()) & (sched < end)
    pending = p.scheduled.isna() & p.finished.isna() & (created < end)
    awaiting = p.workload_uid.notna() if "workload_uid" in p.columns else False
    out = p.assign(wait_seconds=np.where(ended, sched - created, end - created),
                   state=np.where(ended, "scheduled",
                                  np.where(awaiting, "awaiting admission", "still pending")))
    out = out[ended | pending].sort_values(["wait_seconds", "pod"], ascending=[False, True])
    return out[cols].head(n).reset_index(drop=True)


QUEUE_LONG_SECONDS = 1800.0
"""A GPU model's queue is long when its pods' 90th-percentile wait (the worst team's) is
over this: its unallocated capacity is not to be removed, and with none the pool is too
small."""


class LongQueue(NamedTuple):
    p90_seconds: float
    """The worst team's 90th-percentile wait."""
    pending_gpu_hours: float
    admission_share: float
    """Share of the waits spent waiting for Kueue's admission (0 without Kueue)."""

    @property
    def quota_bound(self) -> bool:
        """Most of the wait was for Kueue's quota, not for a node."""
        return self.admission_share >= 0.5


def long_queues(queue: pd.DataFrame) -> dict[str, LongQueue]:
    """GPU models with a long queue, the worst team's p90 wait over ``QUEUE_LONG_SECONDS``."""
    out: dict[str, LongQueue] = {}
    if queue.empty:
        return out
    for model, g in queue.groupby("gpu_model"):
        p90 = float(g.p90_seconds.max()) if g.p90_seconds.notna().any() else 0.0
        if p90 > QUEUE_LONG_SECONDS:
            weights = g.pods.astype(float) * g.p50_seconds.fillna(0).astype(float)
            shares = g.admission_share.fillna(0).astype(float)
            share = float((shares * weights).sum() / weights.sum()) if weights.sum() > 0 \
                else float(shares.max())
            out[str(model)] = LongQueue(p90, float(g.pending_gpu_hours.sum()), share)
    return out
