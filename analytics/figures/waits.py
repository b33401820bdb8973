"""Why jobs waited: the GPU-hours pods and Kueue's Jobs waited by cause, team and pool, the
workloads stuck longest with the evidence of their cause, and the free GPUs no waiting pod
could use (stranded), per pool.

- cause: the one reason a waiting pod (or a Kueue Workload with no pod yet) could not run in
  an interval, the first of ``exporter.model.pending.CAUSES`` that held, as the exporter
  wrote it (``gpu_pending``).
- time waited for a cause: a pod's (or Job's) seconds in the week's intervals with that
  cause; its whole wait: the longest its wait got in the week (``wait_seconds``), else its
  intervals' seconds summed.
- free GPU use: what a waiting pod could make of each free GPU in an interval
  (``exporter.model.pending.USES``, ``gpu_free``): the ``COMPATIBLE`` uses had a waiting
  pod that fits; the ``REMOVABLE`` ones had none, and an autoscaler could have removed them.
  Stranded: every use but ``usable``.
- an hour with demand, for a pool: an hour in which the pool had free GPUs of a
  ``COMPATIBLE`` use, or a pod that fits the pool waited (a ``gpu_pending`` row whose
  ``node_pool`` is the pool).
- fragmentation ratio of a pool, against waiting demand: of its free GPU-hours while a pod
  that fits it waited (``usable`` or ``fragment``), the share stranded as fragments (a
  waiting pod that fits the pool asked more than the node had free). No figure for a pool
  no pod that fits it waited for: its free GPUs were idle or of the wrong kind, not
  fragmented.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analytics.figures import HOUR
from analytics.tables import columns
from analytics.workspace import Workspace
from exporter.model.pending import STRANDED, USES, Use

COMPATIBLE: tuple[Use, ...] = tuple(u for u in USES if u in ("usable", "fragment", "quota"))
"""The uses of a free GPU with a waiting pod that fits its node: capacity demand waited for."""
REMOVABLE: tuple[Use, ...] = tuple(u for u in STRANDED if u not in COMPATIBLE)
"""The uses of a free GPU no waiting pod could take (``mismatch``, ``no_demand``): something
waited that does not fit, or nothing did."""

NO_POOL = "(none)"
"""The pool of a pod that fits none."""
ANY_MODEL = "(any)"
"""The GPU model of a pod that selects none."""


@dataclass(frozen=True, slots=True)
class Waited:
    """What the warehouse says of the week's waits, for the report and its actions."""

    recorded: bool
    """The warehouse records why pods waited in the week (else it was written by an
    exporter from before ``gpu_pending``, and every frame here is empty)."""
    waits: pd.DataFrame
    """The ``waits`` table (the scope's: the platform's or a team's)."""
    stuck: pd.DataFrame
    """The ``stuck_workloads`` table (the scope's)."""
    free_hours: pd.DataFrame
    """``queries.FREE_HOURS``: every pool's free GPU-seconds by hour and use."""
    pending_hours: pd.DataFrame
    """``queries.PENDING_HOURS`` (the scope's)."""
    fragmentation: pd.DataFrame
    """``queries.FRAGMENTATION``."""


WAITS = """
WITH each AS (
  SELECT *, coalesce(max(wait_seconds) OVER whole, sum(seconds) OVER whole) AS whole_seconds
  FROM pending WINDOW whole AS (PARTITION BY cluster, uid))
SELECT cause, coalesce(team, '(none)') AS team,
       CASE WHEN node_pool = '' THEN $no_pool ELSE node_pool END AS node_pool,
       CASE WHEN gpu_model = '' THEN $any_model ELSE gpu_model END AS gpu_model,
       cluster_queue,
       count(DISTINCT (cluster, uid)) AS waiting,
       sum(gpu_seconds) / 3600.0 AS gpu_hours,
       quantile_cont(seconds, 0.9) AS p90_seconds,
       quantile_cont(whole_seconds, 0.9) AS p90_wait_seconds
FROM each
GROUP BY ALL
ORDER BY gpu_hours DESC, cause, team, node_pool, gpu_model, cluster_queue
"""
"""Per cause, team, pool, model and ClusterQueue: what waited, its GPU-hours, and the 90th
percentiles of each one's time waited for the cause and of its whole wait."""


def waits_by_cause(ws: Workspace) -> pd.DataFrame:
    """The ``waits`` table, of the workspace's ``pending`` (``queries.PENDING``), the most
    GPU-hours first."""
    out = ws.frame(WAITS, {"no_pool": NO_POOL, "any_model": ANY_MODEL})
    return out.astype({"waiting": int})[columns("waits")]


def stuck_workloads(stuck: pd.DataFrame) -> pd.DataFrame:
    """The ``stuck_workloads`` table of ``queries.STUCK``'s rows (the longest waits first):
    GPU-hours, its pool and model named, when it last waited as a time."""
    cols = columns("stuck_workloads")
    if stuck.empty:
        return pd.DataFrame(columns=cols)
    s = stuck
    return s.assign(
        team=s.team.fillna("(none)"),
        gpu_model=s.gpu_model.fillna("").replace("", ANY_MODEL),
        node_pool=s.node_pool.fillna("").replace("", NO_POOL),
        gpu_hours=s.gpu_seconds.astype(float) / HOUR,
        source=s.evidence_source, message=s.evidence,
        last_waited=pd.to_datetime(s.last_unix.astype(float), unit="s", utc=True),
        expected_start=pd.to_datetime(s.expected_unix.astype(float), unit="s", utc=True),
    ).astype({"waiting": int})[cols].reset_index(drop=True)


HOUR_KEY = ["cluster", "node_pool", "hour_start"]
"""What an hourly row is of."""


def pool_hours(free_hours: pd.DataFrame, pending_hours: pd.DataFrame) -> pd.DataFrame:
    """Per cluster, pool and hour of the week: its free GPU-seconds (``free_seconds``),
    those of a ``COMPATIBLE`` use (``compatible_seconds``), those of each ``REMOVABLE`` use
    (``mismatch_seconds``, ``no_demand_seconds``) and what they cost
    (``removable_cost_usd``), the GPU-seconds pods that fit the pool waited
    (``pending_gpu_seconds``), and whether demand waited for the pool in the hour
    (``demand``: compatible free GPUs, or a pod that fits it waited).

    Input columns: ``free_hours`` as ``queries.FREE_HOURS`` (``gpu_seconds``: free
    physical GPU-seconds, ``cost_usd``: US dollars), ``pending_hours`` as
    ``queries.PENDING_HOURS`` (``gpu_seconds``: GPUs asked x seconds waited)."""
    f, p = free_hours, pending_hours[pending_hours.node_pool != ""]
    free = f.assign(
        free_seconds=f.gpu_seconds,
        compatible_seconds=f.gpu_seconds.where(f.use.isin(COMPATIBLE), 0.0),
        mismatch_seconds=f.gpu_seconds.where(f.use == "mismatch", 0.0),
        no_demand_seconds=f.gpu_seconds.where(f.use == "no_demand", 0.0),
        removable_cost_usd=f.cost_usd.where(f.use.isin(REMOVABLE), 0.0),
        pending_gpu_seconds=0.0)
    pending = p.assign(free_seconds=0.0, compatible_seconds=0.0, mismatch_seconds=0.0,
                       no_demand_seconds=0.0, removable_cost_usd=0.0,
                       pending_gpu_seconds=p.gpu_seconds, provisioning=None)
    sums = ["free_seconds", "compatible_seconds", "mismatch_seconds", "no_demand_seconds",
            "removable_cost_usd", "pending_gpu_seconds"]
    both = pd.concat([t[[*HOUR_KEY, "gpu_model", "provisioning", *sums]]
                      for t in (free, pending)], ignore_index=True)
    out = both.groupby(HOUR_KEY, as_index=False).agg(
        gpu_model=("gpu_model", "first"), provisioning=("provisioning", "first"),
        **{c: (c, "sum") for c in sums})
    pool = out.groupby(["cluster", "node_pool"])  # a pool's model, from its free GPUs first
    out["gpu_model"] = pool.gpu_model.transform("first")
    out["provisioning"] = pool.provisioning.transform("first")
    out["demand"] = (out.compatible_seconds > 0) | (out.pending_gpu_seconds > 0)
    return out.sort_values(HOUR_KEY, ignore_index=True)


def stranded_by_pool(free_hours: pd.DataFrame, hours: pd.DataFrame,
                     fragmentation: pd.DataFrame) -> pd.DataFrame:
    """The ``stranded`` table: per pool (model and provisioning), its free GPU-hours by use,
    the cost of those stranded and of those no waiting pod could use, the hours demand
    waited for it, and its mean fragmentation ratio; the most stranded cost first.

    Input columns: ``free_hours`` as ``queries.FREE_HOURS``, ``hours`` as ``pool_hours``,
    ``fragmentation`` as ``queries.FRAGMENTATION``."""
    cols = columns("stranded")
    if free_hours.empty:
        return pd.DataFrame(columns=cols)
    key = ["node_pool", "gpu_model", "provisioning"]
    f = free_hours.assign(gpu_hours=free_hours.gpu_seconds / HOUR)
    by_use = f.pivot_table(index=key, columns="use", values="gpu_hours", aggfunc="sum",
                           fill_value=0.0).reindex(columns=list(USES), fill_value=0.0)
    out = by_use.rename(columns={u: f"{u}_gpu_hours" for u in USES})
    out["free_gpu_hours"] = by_use.sum(axis=1)
    cost = f.groupby([*key, "use"]).cost_usd.sum()
    out["stranded_cost_usd"] = _cost_of(cost, list(STRANDED), out.index)
    out["removable_cost_usd"] = _cost_of(cost, list(REMOVABLE), out.index)
    demand = hours[hours.demand].groupby(key).size()
    out["hours_with_demand"] = demand.reindex(out.index, fill_value=0).astype(int)
    ratio = fragmentation.set_index(key).fragmentation_ratio if not fragmentation.empty \
        else pd.Series(dtype=float)
    out["fragmentation_ratio"] = ratio.reindex(out.index).astype(float)  # NaN: no figure
    return out.reset_index()[cols].sort_values(
        ["stranded_cost_usd", "node_pool"], ascending=[False, True], ignore_index=True)


def _cost_of(cost: pd.Series, uses: list[str], index: pd.Index) -> pd.Series:
    """The summed cost of ``uses``, per pool of ``index``."""
    mine = cost[cost.index.get_level_values("use").isin(uses)]
    return mine.groupby(level=[0, 1, 2]).sum().reindex(index, fill_value=0.0).astype(float)


def waited(f: dict[str, pd.DataFrame], ws: Workspace) -> Waited:
    """The week's waits from ``queries.fetch``'s frames and the workspace's ``pending``."""
    recorded = f["recorded"]
    rows = int(recorded.pending_rows.iloc[0] + recorded.free_rows.iloc[0]) \
        if not recorded.empty else 0
    return Waited(rows > 0, waits_by_cause(ws), stuck_workloads(f["stuck"]),
                  _timed(f["free_hours"]), _timed(f["pending_hours"]), f["fragmentation"])


def _timed(hours: pd.DataFrame) -> pd.DataFrame:
    """Hourly rows with their hour as UTC time, pools and models as text."""
    out = hours.assign(hour_start=pd.to_datetime(hours.hour_start, utc=True))
    for c in ("node_pool", "gpu_model"):
        out[c] = out[c].fillna("").astype(str)
    return out


def empty_note(recorded: bool, team: str | None) -> str:
    """What an empty waits table means: nothing waited, or the warehouse does not say."""
    if not recorded:
        return ("The warehouse records no cause of waiting for this week: the exporter that "
                "wrote it predates them (its gpu_pending and gpu_free tables are empty). "
                "The queue tables show how long pods waited.")
    return f"No pod of team {team} waited for a GPU this week." if team is not None else \
        "No pod waited for a GPU this week."


def stuck_note(recorded: bool, team: str | None) -> str:
    """What an empty stuck table means (the waits table says why, at length)."""
    return empty_note(recorded, team) if recorded else "None recorded: see Why jobs waited."


def stranded_note(recorded: bool) -> str:
    """What an empty stranded table means: no GPU sat free, or the warehouse does not say."""
    if not recorded:
        return ("The warehouse records no free GPUs for this week: the exporter that wrote "
                "it predates them (its gpu_free table is empty).")
    return "No GPU sat free this week."
