"""The figures a what-if compares, read the same way from the week's warehouse and from
each replay's: what the report's queries read, summed over the week.

- cost, GPU-hours, utilisation and the fleet cost per utilised GPU-hour: the report's
  headline (``analytics.figures.headline``);
- per team: cost, GPU-hours held, utilisation, cost per utilised GPU-hour, and the queue
  wait of the pods submitted in the week: from submission (a Kueue Workload's creation) to
  scheduling, or, for a pod never scheduled, to its deletion or the week's end (a lower
  bound, so that a layout that starves a team shows its waits rather than hiding them);
  Jobs Kueue never admitted count as one wait each;
- GPU-hours waited by cause (``gpu_pending``), free GPU-hours no waiting pod could use
  (stranded: ``gpu_free`` rows not ``usable``) and their cost, per pool;
- availability per pool (1 - unavailable / all GPU-seconds) and the Spot reclaims: pods
  that ended ``Terminated`` in the week.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analytics import queries
from analytics.figures import HOUR, unix_seconds
from analytics.figures.headline import headline
from analytics.figures.queue import queued_pods, waits_begun
from analytics.store import Param, Store
from analytics.week import POD_LOOKBACK, Week

TEAM_COLUMNS = ("team", "gpu_hours", "cost_usd", "utilization", "cost_per_utilized_hour",
                "pods", "wait_p50_seconds", "wait_p90_seconds", "pending_gpu_hours")
POOL_COLUMNS = ("node_pool", "gpu_hours", "cost_usd", "availability", "stranded_gpu_hours",
                "stranded_cost_usd")


POOL_CAUSES = ("node_pool", "gpu_model", "cause", "gpu_hours")


@dataclass(frozen=True, slots=True)
class Measured:
    headline: dict[str, float | None]
    teams: pd.DataFrame
    """``TEAM_COLUMNS``, a row per team."""
    causes: pd.DataFrame | None
    """``cause``, ``gpu_hours``: GPU-hours pods waited for each cause; None: not recorded."""
    pools: pd.DataFrame
    """``POOL_COLUMNS``, a row per node pool."""
    reclaims: int | None
    """None: not recorded."""
    waits: pd.DataFrame
    """Each wait counted: ``team``, ``wait_seconds``, ``gpus``."""
    pool_causes: pd.DataFrame | None = None
    """``POOL_CAUSES``: GPU-hours waited for each cause by the pool the pods fit (empty
    where the warehouse does not say, as a replay's) and their GPU model; None: not
    recorded."""

    @property
    def stranded_gpu_hours(self) -> float | None:
        """None where no pool is known (a pods CSV's record)."""
        return float(self.pools.stranded_gpu_hours.sum()) if len(self.pools) else None

    @property
    def stranded_cost_usd(self) -> float | None:
        return float(self.pools.stranded_cost_usd.sum()) if len(self.pools) else None

    def wait_percentile(self, q: float) -> float | None:
        w = self.waits.wait_seconds.to_numpy()
        return float(np.percentile(w, q)) if len(w) else None


def measure(store: Store, week: Week, cluster: str | None = None) -> Measured:
    """The what-if's figures of ``week`` in ``store``."""
    base: dict[str, Param] = {"start": week.start, "end": week.end, "cluster": cluster,
                              "team": None, "lookback": week.start - POD_LOOKBACK}
    usage = store.query(queries.USAGE, base | {"prev_start": week.start})
    usage = usage[usage.this_week.astype(bool)]
    states = store.query(queries.POD_STATES, base)
    awaiting = store.query(queries.AWAITING_ADMISSION, base)
    pending = store.query(queries.PENDING, base)
    free = store.query(queries.FREE_HOURS, base)
    waits = pod_waits(states, awaiting, week)
    reclaimed = unix_seconds(states.finished)
    reclaims = int(((states.reason == "Terminated") & (reclaimed >= week.start.timestamp())
                    & (reclaimed < week.end.timestamp())).sum())
    return Measured(
        headline=_unknown_utilization(headline(usage.assign(this_week=True))),
        teams=_teams(usage, waits),
        causes=pending.groupby("cause", as_index=False).gpu_seconds.sum()
        .assign(gpu_hours=lambda f: f.gpu_seconds / HOUR)[["cause", "gpu_hours"]]
        if not pending.empty else pd.DataFrame(columns=["cause", "gpu_hours"]),
        pools=_pools(usage, free), reclaims=reclaims, waits=waits,
        pool_causes=pending.groupby(list(POOL_CAUSES[:3]), as_index=False).gpu_seconds.sum()
        .assign(gpu_hours=lambda f: f.gpu_seconds / HOUR)[list(POOL_CAUSES)]
        if not pending.empty else pd.DataFrame(columns=list(POOL_CAUSES)))


UTILIZATION_FIGURES = ("utilization", "fleet_cost_usd_per_utilized_hour", "idle_cost_usd",
                       "idle_share")
"""The headline's figures that need the GPUs' utilisation."""


def _unknown_utilization(h: dict[str, float | None]) -> dict[str, float | None]:
    """The headline with no utilisation measured (a trace without it): what needs it is
    unknown, not 0 (the idle cost is the measured GPU-hours' only)."""
    if h.get("utilization") is not None:
        return h
    return h | dict.fromkeys(UTILIZATION_FIGURES)


def without_utilization(m: Measured) -> Measured:
    """``m`` with what needs utilisation unknown: a full-loop replay of jobs whose
    utilisation the trace does not have draws it from their profiles, which is not a
    measurement."""
    return dataclasses.replace(
        m, headline=m.headline | dict.fromkeys(UTILIZATION_FIGURES),
        teams=m.teams.assign(utilization=np.nan, cost_per_utilized_hour=np.nan))


def recorded(pods: pd.DataFrame, week: Week) -> Measured:
    """The week as a record of its pods (a pods CSV) tells it, by the definitions of
    ``measure``: each team's GPU-hours held (scheduled to finished, in the week) and its
    queue waits (``pod_waits``), the fleet's, and the utilisation where recorded. What a
    record of pods does not hold — cost, capacity, pools, causes, reclaims — is unknown
    (None), not 0.

    ``pods``: ``team``, ``namespace``, ``created``, ``scheduled`` (NaT: never),
    ``finished`` (when it ended, or where the record ends for a pod that had not),
    ``gpus``, ``utilization`` (NaN: unknown)."""
    start, end = week.start.timestamp(), week.end.timestamp()
    began = unix_seconds(pods.scheduled).clip(lower=start)
    held = (unix_seconds(pods.finished).clip(upper=end) - began).clip(lower=0).fillna(0.0) \
        * pods.gpus.astype(float)
    util = pods.utilization.astype(float)
    usage = pd.DataFrame({
        "team": pods.team, "state": "allocated", "gpu_seconds": held,
        "utilized_seconds": (util * held).fillna(0.0),
        "measured_seconds": held.where(util.notna(), 0.0), "cost_usd": 0.0})
    waits = pod_waits(pods.assign(queued=pods.created), pods.iloc[0:0], week)
    teams = _teams(usage, waits).assign(cost_usd=np.nan, cost_per_utilized_hour=np.nan)
    measured = float(usage.measured_seconds.sum())
    return Measured(
        headline={"cost_usd": None, "gpu_hours": None,
                  "allocated_gpu_hours": float(held.sum()) / HOUR,
                  "utilization": float(usage.utilized_seconds.sum()) / measured
                  if measured > 0 else None,
                  "fleet_cost_usd_per_utilized_hour": None, "idle_cost_usd": None,
                  "unallocated_cost_usd": None},
        teams=teams, causes=None,
        pools=pd.DataFrame(columns=list(POOL_COLUMNS)), reclaims=None, waits=waits)


def pod_waits(states: pd.DataFrame, awaiting: pd.DataFrame, week: Week) -> pd.DataFrame:
    """Each wait that began in the week (``queries.POD_STATES``, and
    ``queries.AWAITING_ADMISSION`` for Jobs Kueue never admitted), in seconds: the report's
    queue waits (``analytics.figures.queue.waits_begun``)."""
    p = queued_pods(states, awaiting)
    if p.empty:
        return pd.DataFrame({"team": pd.Series(dtype=str), "wait_seconds": pd.Series(
            dtype=float), "gpus": pd.Series(dtype=float)})
    begun = waits_begun(p, week)
    return pd.DataFrame({"team": begun.team.fillna(begun.namespace),
                         "wait_seconds": begun.wait_seconds,
                         "gpus": begun.gpus.astype(float)}).reset_index(drop=True)


SUMMED = ["gpu_seconds", "utilized_seconds", "measured_seconds", "cost_usd"]


def _teams(usage: pd.DataFrame, waits: pd.DataFrame) -> pd.DataFrame:
    held = usage[usage.state == "allocated"]
    g = held[SUMMED].groupby(held.team.fillna("(none)").astype(object)).sum()
    team = waits.team.to_numpy(dtype=object)
    seconds = waits.wait_seconds.to_numpy(dtype=float)
    gpu_seconds = seconds * waits.gpus.to_numpy(dtype=float)
    rows = {}
    for name in sorted({t for t in team if isinstance(t, str)}):
        mine = team == name
        waited = seconds[mine]
        rows[name] = (len(waited), *np.quantile(waited, [0.5, 0.9]),
                      gpu_seconds[mine].sum() / HOUR)
    waited = pd.DataFrame.from_dict(rows, orient="index", columns=list(TEAM_COLUMNS[5:]))
    out = pd.DataFrame({
        "gpu_hours": g.gpu_seconds / HOUR, "cost_usd": g.cost_usd,
        "utilization": g.utilized_seconds / g.measured_seconds.where(g.measured_seconds > 0),
        "cost_per_utilized_hour": g.cost_usd / (g.utilized_seconds / HOUR).where(
            g.utilized_seconds > 0)})
    teams = out.join(waited, how="outer").reset_index(names="team")
    return teams.assign(pods=teams.pods.fillna(0).astype(int))[list(TEAM_COLUMNS)] \
        .sort_values(["cost_usd", "team"], ascending=[False, True], ignore_index=True)


def _pools(usage: pd.DataFrame, free: pd.DataFrame) -> pd.DataFrame:
    pool = usage.node_pool.astype(object)
    u = usage[["gpu_seconds", "cost_usd"]].groupby(pool).sum()
    down = usage.gpu_seconds.where(usage.state == "unavailable", 0.0).groupby(pool).sum()
    stranded = free[free.use != "usable"] if not free.empty else free
    s = stranded[["gpu_seconds", "cost_usd"]].astype(float).groupby(
        stranded.node_pool.astype(object)).sum().reindex(u.index).fillna(0.0)
    out = pd.DataFrame({
        "gpu_hours": u.gpu_seconds / HOUR, "cost_usd": u.cost_usd,
        "availability": 1 - down / u.gpu_seconds.where(u.gpu_seconds > 0),
        "stranded_gpu_hours": s.gpu_seconds / HOUR, "stranded_cost_usd": s.cost_usd})
    return out.reset_index(names="node_pool")[list(POOL_COLUMNS)]


def told_as(m: Measured, names: Mapping[str, str]) -> Measured:
    """``m`` with its teams under the names ``names`` gives them (a replay's DNS-label names
    of teams the trace named otherwise, back to the trace's)."""
    if not names:
        return m
    return dataclasses.replace(
        m, teams=m.teams.assign(team=m.teams.team.replace(dict(names))),
        waits=m.waits.assign(team=m.waits.team.replace(dict(names))))
