"""The weekly report's figures: pure functions of the frames ``analytics.queries`` returns,
and, for the per-pod and per-workload ones, SQL over the report's workspace
(``analytics.workspace``), where the week's pods are.

Definitions (each next to its test in ``tests/analytics/test_figures.py``):

- cost: what the GPU-seconds cost after discount. A team's or namespace's cost is what its
  pods held (``allocated``); pools, models and provisioning include idle capacity.
- utilisation: utilised / measured GPU-seconds (rows without a reading do not count).
- idle cost: allocated but unused — cost x (1 - utilisation) of each row.
- fleet cost per utilised GPU-hour: all spend (idle and unavailable capacity included) /
  utilised GPU-hours; not the effective cost of ``/metrics``, which is allocated cost /
  allocated utilised GPU-hours.
- queue wait: creation to scheduling, of the pods scheduled in the week; pending GPU-hours
  are the GPUs requested x the time pods waited within the week, until they were scheduled
  or ended unscheduled (deleted while pending: phase ``Deleted``, ``finished`` set).
- availability: up / (up + down) GPU-seconds; the error budget is (1 - target) of the
  GPU-seconds, and what is left of it is 1 - down / budget.
- right-sizing: the cheapest GPU model that holds the workload's peak memory with 10 %
  headroom and its compute need (utilisation x the current model's tensor throughput) at
  no more than 80 % — the article's choice, argmax of memory fit x compute match, made
  concrete — and NVLink if the workload uses it. Saving: cost x (1 - price ratio).
- spot: batch workloads (Jobs) on on-demand GPUs could tolerate preemption with
  checkpoints; saving: cost x (1 - spot / on-demand price).
- sharing: the idle cost of pods under ``SHARING_UTILIZATION``, which time-sharing or MIG
  could pack together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa

from analytics import format as fmt
from analytics.tables import columns
from analytics.week import Week
from analytics.workspace import Table, Workspace
from exporter.bottleneck import (
    BUSY_GR,
    COMM_GR_MIN,
    COMM_LINK_SHARE,
    COMM_SM_MAX,
    DRAM_BUSY,
    EVIDENCE,
    FILL_MIN,
    IDLE_GPU_UTIL,
    IDLE_GR,
    MEMORY_DRAM_MIN,
    MEMORY_TENSOR_MAX,
    RUNNING_GR,
    STALL_SHARE,
    TENSOR_BUSY,
    THROTTLED_SHARE,
    THROTTLED_TEMP_C,
    WARPS_MIN,
)
from exporter.catalog import GPU_MODELS
from exporter.config import Prices as PricesConfig
from exporter.prices import PriceBook

HOUR = 3600.0
GIB = 1024.0 ** 3
MEMORY_HEADROOM = 0.9
COMPUTE_HEADROOM = 0.8
NVLINK_USE_SHARE = 0.05
"""NVLink traffic, as a share of the link, above which a workload needs NVLink."""
BATCH_KINDS = ("Job", "JobSet")
"""The owners of the pods that run to completion: they can checkpoint and restart."""
SHARING_UTILIZATION = 0.3
"""Pods below this mean utilisation could share a GPU (time-sharing or MIG)."""
TOP = 10
IDLE_CEILING = 0.5
"""A pod is an idle offender only under this utilisation."""

ADVICE = {
    "idle": "Held but unused: release it when done (scale to zero, cull idle notebooks) or "
            "share it (GPU time-sharing, MIG).",
    "input_bound": "Waits for data: more data-loader workers, pinned memory and prefetch, "
                   "faster storage (local SSD), preprocessing off the GPU's critical path.",
    "small_batch": "Kernel-launch bound: larger batches, CUDA graphs or torch.compile, "
                   "fused small operations.",
    "comm_bound": "Waits on collectives: overlap communication with compute, larger "
                  "gradient buckets or accumulation, compact placement on fewer nodes.",
    "memory_bound": "Memory-bandwidth bound: mixed precision (bf16/fp8), fused kernels "
                    "(FlashAttention), larger tiles.",
    "throttled": "Thermal or power throttling: check the node's cooling, power caps and "
                 "health; spread the hottest jobs.",
    "healthy": "Compute-bound: nothing to fix here; a faster GPU only if time matters.",
    "insufficient_signal": "The counters collected cannot tell this class apart: add "
                           "DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_PROF_SM_OCCUPANCY, "
                           "DCGM_FI_PROF_NVLINK_TX_BYTES, DCGM_FI_PROF_NVLINK_RX_BYTES and "
                           "DCGM_FI_DEV_CLOCKS_EVENT_REASONS to dcgm-exporter's counters "
                           "file (its defaults lack them; GR engine, tensor, DRAM and PCIe "
                           "are there).",
}


def _ratio(a: float, b: float) -> float | None:
    return None if not b else a / b


def _week(usage: pd.DataFrame, this_week: bool = True) -> pd.DataFrame:
    return usage[usage["this_week"] == this_week]


# ---------------------------------------------------------------------------- headline


WEEK_HOURS = 7 * 24


def coverage(hours: pd.DataFrame) -> tuple[float, float]:
    """The share of this week's hours, and of the previous week's, with any GPU time in the
    warehouse (``queries.COVERAGE``)."""
    by_week = {bool(w): float(h) for w, h in zip(hours.this_week, hours.hours, strict=True)}
    return by_week.get(True, 0.0) / WEEK_HOURS, by_week.get(False, 0.0) / WEEK_HOURS


def headline(usage: pd.DataFrame, covered: tuple[float, float] = (1.0, 1.0)
             ) -> dict[str, float | None]:
    """The week's figures; with no data for the previous week (``covered``: this week's and
    the previous week's ``coverage``), its cost and the change are unknown (None), not 0."""
    now, before = _week(usage), _week(usage, False)
    cost, prev = float(now.cost_usd.sum()), float(before.cost_usd.sum())
    allocated = now[now.state == "allocated"]
    utilized = float(allocated.utilized_seconds.sum())
    known = covered[1] > 0
    return {
        "coverage": covered[0],
        "previous_coverage": covered[1],
        "cost_usd": cost,
        "previous_cost_usd": prev if known else None,
        "cost_change": _ratio(cost - prev, prev) if known else None,
        "gpu_hours": float(now.gpu_seconds.sum()) / HOUR,
        "allocated_gpu_hours": float(allocated.gpu_seconds.sum()) / HOUR,
        "utilization": _ratio(utilized, float(allocated.measured_seconds.sum())),
        "fleet_cost_usd_per_utilized_hour": _ratio(cost, utilized / HOUR),
        "idle_cost_usd": float(allocated.idle_cost_usd.sum()),
        "idle_share": _ratio(float(allocated.idle_cost_usd.sum()), cost),
        "unallocated_cost_usd": float(now[now.state == "unallocated"].cost_usd.sum()),
        "unallocated_share": _ratio(float(now[now.state == "unallocated"].cost_usd.sum()), cost),
    }


# ---------------------------------------------------------------------------- price basis

MACHINE_SHARE_SPREAD = 0.001
"""Machine types whose shares of a GPU-hour differ by less than this fraction share one."""


@dataclass(frozen=True, slots=True)
class Pricing:
    """What the report knows of the prices the warehouse's costs were computed with: the
    list prices in use (``Pricing.of``: a book's, with what the configuration takes off),
    or only the list prices (a plain mapping: undated, no discount, no machine known)."""

    list_prices: Mapping[tuple[str, str], float]
    """(GPU model, provisioning) -> list price of a GPU-hour."""
    region: str = ""
    basis: str = "gpu-component"
    """What a GPU's price covers (the book's ``basis``): ``gpu-component``, the GPU alone."""
    as_of: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(GPU model, provisioning) -> the date of its list price (YYYY-MM-DD)."""
    estimated: frozenset[tuple[str, str]] = frozenset()
    """The list prices that are estimates, not prices Google published."""
    machine_usd_per_gpu_hour: Mapping[tuple[str, str], tuple[float, float]] = field(
        default_factory=dict)
    """(GPU model, provisioning) -> the least and the most its machine adds to a GPU-hour
    over the machine types of the book that hold it (equal where they all add the same);
    absent where no machine type of the book fixes its GPU count."""
    discounts: tuple[str, ...] = ()
    """What the configuration takes off the list prices, in words."""
    catalog: bool = False
    """The exporter refreshes list prices from Google's Cloud Billing catalogue."""

    @classmethod
    def of(cls, book: PriceBook, cfg: PricesConfig | None = None) -> Pricing:
        """The book's list prices, dates and machine shares, and ``cfg``'s discounts."""
        shares: dict[tuple[str, str], list[float]] = {}
        for (_, provisioning), m in book.machines.items():
            shares.setdefault((m.accelerator, provisioning), []).append(m.per_gpu)
        machine = {k: (min(v), max(v)) if max(v) - min(v) > MACHINE_SHARE_SPREAD * max(v)
                   else (min(v), min(v)) for k, v in shares.items()}
        discounts: list[str] = []
        if cfg is not None and cfg.negotiated:
            discounts.append("negotiated")
        if cfg is not None and cfg.commitments:
            discounts.append("committed-use")
        if cfg is not None and (cfg.discounts or cfg.default_discount):
            discounts.append("node-pool")
        return cls(dict(book.prices), book.region, book.basis,
                   {k: p.as_of for k, p in book.provenance.items() if p.as_of},
                   book.estimated, machine, tuple(discounts),
                   cfg is not None and cfg.catalog.enabled)


@dataclass(frozen=True, slots=True)
class PriceBasis:
    """What the week's costs are: which prices, what came off them, what they leave out."""

    basis: str
    """The book's ``basis``: ``gpu-component``, the GPU alone, machine excluded."""
    region: str
    as_of: tuple[str, ...]
    """The dates of the list prices the week's GPU-hours are priced at, oldest first (of
    every price when the week has none); empty when undated."""
    estimated: tuple[str, ...]
    """The week's list prices that are estimates (``model provisioning``)."""
    catalog: bool
    """List prices may be the Cloud Billing catalogue's: the warehouse does not say which."""
    discounts: tuple[str, ...]
    """What the configuration takes off the list prices."""
    cost_usd: float
    """The week's cost."""
    list_cost_usd: float | None
    """The week's priced GPU-hours at the list prices (those the list prices cover); None
    when they cover none."""
    off_list_usd: float | None
    """``list_cost_usd`` less what those GPU-hours cost, to the cent: what discounts took
    off (or, with none configured, what other list prices made of them)."""
    off_list_share: float | None
    """``off_list_usd`` over ``list_cost_usd``."""
    machine_usd: tuple[float, float] | None
    """The least and the most the machines of the priced GPUs whose models' machine types
    fix their GPU count add to the cost, at list price; None when no such GPU ran."""
    machine_share: tuple[float, float] | None
    """``machine_usd`` over those GPUs' cost plus it: the machines' share of their total."""
    machine_models: tuple[str, ...]
    """The GPU models ``machine_usd`` covers."""
    machine_unknown: tuple[str, ...]
    """The GPU models whose machine the book does not price per GPU."""
    machine_unknown_hour_share: float | None
    """Their share of the week's GPU-hours."""
    spot_hour_share: float | None
    """Spot GPUs' share of the week's GPU-hours; None without GPU-hours."""
    spot_cost_share: float | None
    """Their share of the week's cost; None without cost."""
    unpriced_gpu_hours: float
    """GPU-hours no price covered: not in the cost."""


def price_basis(usage: pd.DataFrame, pricing: Pricing) -> PriceBasis:
    """The basis of the week's costs (``queries.USAGE``'s rows: ``gpu_model``,
    ``provisioning``, ``this_week``, ``gpu_seconds``, ``priced_seconds`` (GPU-seconds with a
    cost), ``cost_usd``).

    What discounts took off is the priced GPU-hours at the list prices less what they cost,
    over the (model, provisioning) the list prices cover. A machine's share is the least
    and the most a GPU-hour carries of its machine types (``Pricing.machine_usd_per_gpu_
    hour``), at list price, over the priced GPU-hours of those models."""
    now = _week(usage)
    g = now.assign(gpu_model=now.gpu_model.fillna(""), provisioning=now.provisioning.fillna("")
                   ).groupby(["gpu_model", "provisioning"])[
        ["gpu_seconds", "priced_seconds", "cost_usd"]].sum().astype(float)
    keys = [(str(m), str(p)) for m, p in g.index]
    hours = g.gpu_seconds.to_numpy() / HOUR
    priced = g.priced_seconds.to_numpy() / HOUR
    cost = g.cost_usd.to_numpy()
    listed = np.array([k in pricing.list_prices for k in keys], dtype=bool)
    list_cost = float(sum(priced[i] * pricing.list_prices[k]
                          for i, k in enumerate(keys) if listed[i]))
    off = round(list_cost - float(cost[listed].sum()), 2) if listed.any() else None
    machine = np.array([k in pricing.machine_usd_per_gpu_hour for k in keys], dtype=bool)
    lo = float(sum(priced[i] * pricing.machine_usd_per_gpu_hour[k][0]
                   for i, k in enumerate(keys) if machine[i]))
    hi = float(sum(priced[i] * pricing.machine_usd_per_gpu_hour[k][1]
                   for i, k in enumerate(keys) if machine[i]))
    gpus_cost = float(cost[machine].sum())
    used = {k for i, k in enumerate(keys) if priced[i] > 0}
    dates = {d for k, d in pricing.as_of.items() if k in used} or set(pricing.as_of.values())
    total_hours, total_cost = float(hours.sum()), float(cost.sum())
    spot = np.array([p == "spot" for _, p in keys], dtype=bool)
    unknown = sorted({m for i, (m, _) in enumerate(keys)
                      if not machine[i] and hours[i] > 0 and m})
    return PriceBasis(
        basis=pricing.basis, region=pricing.region, as_of=tuple(sorted(dates)),
        estimated=tuple(f"{m} {p}" for m, p in sorted(used & pricing.estimated)),
        catalog=pricing.catalog, discounts=pricing.discounts, cost_usd=total_cost,
        list_cost_usd=list_cost if listed.any() else None, off_list_usd=off,
        off_list_share=None if off is None else _ratio(off, list_cost),
        machine_usd=(lo, hi) if lo > 0 else None,
        machine_share=(lo / (gpus_cost + lo), hi / (gpus_cost + hi)) if lo > 0 else None,
        machine_models=tuple(sorted({k[0] for i, k in enumerate(keys)
                                     if machine[i] and priced[i] > 0})),
        machine_unknown=tuple(unknown),
        machine_unknown_hour_share=_ratio(float(hours[~machine].sum()), total_hours)
        if unknown else None,
        spot_hour_share=_ratio(float(hours[spot].sum()), total_hours),
        spot_cost_share=_ratio(float(cost[spot].sum()), total_cost),
        unpriced_gpu_hours=float((hours - priced).sum()),
    )


# ---------------------------------------------------------------------------- cost

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


# ---------------------------------------------------------------------------- waste


def unallocated_by_pool(usage: pd.DataFrame) -> pd.DataFrame:
    rows = _week(usage)
    rows = rows[rows.state == "unallocated"]
    g = rows.groupby(["node_pool", "gpu_model", "provisioning"], as_index=False)[
        ["gpu_seconds", "cost_usd"]].sum()
    g["gpu_hours"] = g.pop("gpu_seconds") / HOUR
    return g[columns("unallocated_by_pool")].sort_values(
        ["cost_usd", "node_pool"], ascending=[False, True], ignore_index=True)


# ---------------------------------------------------------------------------- queue


def _seconds(t: pd.Series) -> pd.Series:
    """Unix seconds (NaN where missing)."""
    return (pd.to_datetime(t, utc=True) - pd.Timestamp(0, tz="UTC")).dt.total_seconds()


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


def queue(pod_states: pd.DataFrame, week: Week,
          awaiting: pd.DataFrame | None = None) -> pd.DataFrame:
    """Wait percentiles (seconds) by team and GPU model, of the pods scheduled in the week,
    and the GPU-hours pods spent pending in the week, Jobs ``awaiting`` Kueue's admission
    (no pod yet) included."""
    cols = columns("queue")
    frames = [f for f in (pod_states, _as_pod_states(awaiting)) if not f.empty]
    if not frames:
        return pd.DataFrame(columns=cols)
    p = pd.concat([_with_kueue(f) for f in frames], ignore_index=True)
    p = p.assign(team=p.team.fillna("(none)"), gpu_model=p.gpu_model.fillna("(any)"))
    start, end = week.start.timestamp(), week.end.timestamp()
    created = _seconds(p.queued)
    # a wait ends when the pod is scheduled, or ends unscheduled (deleted while pending)
    until = _seconds(p.scheduled).fillna(_seconds(p.finished)).fillna(end).clip(upper=end)
    waited = (until.clip(lower=start) - created.clip(lower=start)).clip(lower=0)
    p = p.assign(pending_gpu_hours=waited * p.gpus.fillna(0) / HOUR)
    sched = p[p.scheduled.notna()]
    in_week = sched[(_seconds(sched.scheduled) >= start) & (_seconds(sched.scheduled) < end)]
    rows = []
    for (team, model), grp in p.groupby(["team", "gpu_model"]):
        waits = in_week[(in_week.team == team) & (in_week.gpu_model == model)] \
            .queue_wait_seconds.dropna().to_numpy()
        pending = float(grp.pending_gpu_hours.sum())
        if not len(waits) and not pending:
            continue
        q = np.percentile(waits, [50, 90, 99]) if len(waits) else [np.nan] * 3
        mine = in_week[(in_week.team == team) & (in_week.gpu_model == model)]
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
    created = _seconds(p.queued)
    sched = _seconds(p.scheduled)
    end = week.end.timestamp()
    ended = p.scheduled.notna() & (sched >= week.start.timestamp()) & (sched < end)
    pending = p.scheduled.isna() & p.finished.isna() & (created < end)
    awaiting = p.workload_uid.notna() if "workload_uid" in p.columns else False
    out = p.assign(wait_seconds=np.where(ended, sched - created, end - created),
                   state=np.where(ended, "scheduled",
                                  np.where(awaiting, "awaiting admission", "still pending")))
    out = out[ended | pending].sort_values(["wait_seconds", "pod"], ascending=[False, True])
    return out[cols].head(n).reset_index(drop=True)


# ---------------------------------------------------------------------------- availability


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
        fin = _seconds(pre.finished)
        pre = pre[(fin >= week.start.timestamp()) & (fin < week.end.timestamp())]
        rows += [("spot_preemption", f"{p.namespace}/{p.pod}", None, p.finished, p.finished,
                  0.0, None) for p in pre.itertuples()]
    out = pd.DataFrame(rows, columns=cols)
    if not out.empty:
        out["start"] = pd.to_datetime(out.start, utc=True)
        out["end"] = pd.to_datetime(out.end, utc=True)
    return out.sort_values(["start", "where"], ignore_index=True)


# ---------------------------------------------------------------------------- bottlenecks


def _col(pods: pd.DataFrame, name: str) -> np.ndarray:
    values: np.ndarray = pd.to_numeric(pods[name], errors="coerce").to_numpy(
        dtype=float, na_value=np.nan)
    return values


def pod_classes(pods: pd.DataFrame) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``exporter.bottleneck.decide`` over every pod at once: each pod's class and its
    evidence columns (NaN where absent). Missing fields are NaN, which every comparison
    reads as false, so each rule names what it needs."""
    gr, sm, occ, tensor, dram, util, temp = (_col(pods, c) for c in (
        "gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
        "gpu_util_percent", "temperature_celsius"))
    nv_tx, nv_rx, pc_tx, pc_rx = (_col(pods, f"{link}_{d}_bytes_per_second")
                                  for link in ("nvlink", "pcie") for d in ("tx", "rx"))
    stalled = np.nan_to_num(_col(pods, "stalled_share"), nan=0.0)
    max_gr = np.nan_to_num(_col(pods, "max_gr"), nan=0.0)
    throttled_share = _col(pods, "throttled_share")
    found = [GPU_MODELS.get(a or "") for a in pods["gpu_model"].astype(object).to_numpy()]
    nvlink_bw = np.array([m.nvlink_bytes_per_second if m else 0.0 for m in found], dtype=float)
    pcie_bw = np.array([m.pcie_bytes_per_second if m else np.nan for m in found], dtype=float)
    def known(values: np.ndarray) -> np.ndarray:
        return ~np.isnan(values)

    has_gr, has_sm = known(gr), known(sm)
    with np.errstate(divide="ignore", invalid="ignore"):
        fill = np.where(has_gr & (gr > 0), sm / gr, np.nan)
        warps = np.where(known(occ) & (sm > 0), occ / sm, np.nan)
        nvlink = np.where((nvlink_bw > 0) & known(nv_tx) & known(nv_rx),
                          np.fmax(nv_tx, nv_rx) / nvlink_bw, np.nan)
        pcie = np.where(known(pc_tx) & known(pc_rx), np.fmin(pc_tx, pc_rx) / pcie_bw, np.nan)
    # quiet SMs: known where SM active is, or else tensor and DRAM both are
    quiet_known = has_sm | (known(tensor) & known(dram))
    quiet = np.where(has_sm, sm < COMM_SM_MAX, (tensor < TENSOR_BUSY) & (dram < DRAM_BUSY))
    maybe_quiet = ~quiet_known | quiet
    link_busy = np.fmax(nvlink, pcie) >= COMM_LINK_SHARE
    busy = (tensor >= TENSOR_BUSY) | (dram >= DRAM_BUSY)
    mig = _col(pods, "mig") > 0 if "mig" in pods.columns else np.zeros(len(gr), dtype=bool)
    nvlink_gpu = (nvlink_bw > 0) & ~mig

    classes = np.full(len(gr), "healthy", dtype=object)
    open_ = np.ones(len(gr), dtype=bool)

    def first(rule: np.ndarray, cls: str) -> None:
        hit = open_ & rule
        classes[hit] = cls
        open_[hit] = False

    util_idle = ~has_gr & (util < IDLE_GPU_UTIL)
    first(util_idle, "idle")
    first(~has_gr, "insufficient_signal")
    first(gr < IDLE_GR, "idle")
    first(np.where(np.isnan(throttled_share), temp >= THROTTLED_TEMP_C,
                   throttled_share >= THROTTLED_SHARE), "throttled")
    first(maybe_quiet & link_busy & quiet_known, "comm_bound")
    first(maybe_quiet & link_busy, "insufficient_signal")
    first(maybe_quiet & (gr >= COMM_GR_MIN) & nvlink_gpu & np.isnan(nvlink),
          "insufficient_signal")
    first((stalled >= STALL_SHARE) & (max_gr >= RUNNING_GR), "input_bound")
    first(~busy & (warps < WARPS_MIN), "small_batch")
    low_gr = gr < BUSY_GR
    first(low_gr & ~has_sm, "insufficient_signal")
    first(low_gr & (fill >= FILL_MIN), "input_bound")
    first(low_gr, "small_batch")
    first(~busy & ~has_sm, "insufficient_signal")
    first(~busy & (fill < FILL_MIN), "small_batch")
    first((dram >= MEMORY_DRAM_MIN) & (tensor < MEMORY_TENSOR_MAX), "memory_bound")

    columns = {
        "gr_engine_active": gr, "sm_active": sm, "sm_occupancy": occ, "tensor_active": tensor,
        "dram_active": dram, "gpu_util_percent": util, "gpu_temp_celsius": temp,
        "throttled_share": throttled_share,
        "stalled_share": np.where(has_gr, stalled, np.nan), "sm_fill": fill,
        "warps_per_active_sm": warps, "nvlink_share": nvlink, "pcie_share": pcie,
    }
    evidence = {k: columns[k] for k in EVIDENCE}
    return classes, evidence


def _evidence_dicts(ev: pd.DataFrame) -> list[dict[str, float]]:
    cols = [c for c in EVIDENCE if f"ev_{c}" in ev.columns]
    values = ev[[f"ev_{c}" for c in cols]].to_numpy(dtype=float, na_value=np.nan)
    return [{k: float(v) for k, v in zip(cols, row, strict=True) if v == v}
            for row in values.tolist()]


def with_evidence(frame: pd.DataFrame) -> pd.DataFrame:
    """The ``ev_*`` columns as one ``evidence`` dict per row, where the evidence column
    stands (or at the end)."""
    ev_cols = [c for c in frame.columns if str(c).startswith("ev_")]
    if not ev_cols:
        return frame
    out = frame.drop(columns=ev_cols)
    dicts = _evidence_dicts(frame)
    if "evidence" in out.columns:
        out["evidence"] = dicts
    else:
        out = out.assign(evidence=dicts)
    return out


def classify_arrow(batch: pa.Table) -> pa.Table:
    """A batch of pods with each pod's class and evidence columns added."""
    frame = batch.select([c for c in _SIGNAL_COLUMNS if c in batch.column_names]).to_pandas()
    for c in _SIGNAL_COLUMNS:
        if c not in frame.columns:
            frame[c] = np.nan
    classes, evidence = pod_classes(frame)
    out = batch.append_column("bottleneck", pa.array(classes, type=pa.string()))
    for k in EVIDENCE:
        out = out.append_column(f"ev_{k}", pa.array(evidence[k], type=pa.float64(),
                                                    from_pandas=True))
    return out


_SIGNAL_COLUMNS = ("gpu_model", "mig", "gr_engine_active", "sm_active", "sm_occupancy",
                   "tensor_active", "dram_active", "gpu_util_percent", "temperature_celsius",
                   "nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second",
                   "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second",
                   "stalled_share", "max_gr", "throttled_share")


# The per-workload tables, in the workspace's SQL (DuckDB) over its ``pods`` table (the
# PODS query's columns, each pod's class and ``ev_*`` columns, and ``seq``, the order
# pods arrived in), ``pod_states`` (the POD_STATES query's), ``prices`` and ``models``.

_ORDER = "list_position([" + ", ".join(f"'{c}'" for c in ADVICE) + "], bottleneck)"

BOTTLENECKS = f"""
WITH c AS (
    SELECT COALESCE(namespace, '') AS namespace, COALESCE(workload, '') AS workload, team,
           gpu_model, pod_uid, gpu_seconds, bottleneck, seq,
           {", ".join(f"ev_{k}" for k in EVIDENCE)}
    FROM pods),
per_class AS (
    SELECT namespace, workload, bottleneck, SUM(gpu_seconds) AS gpu_seconds
    FROM c GROUP BY namespace, workload, bottleneck),
winner AS (
    SELECT namespace, workload, bottleneck FROM per_class
    QUALIFY row_number() OVER (PARTITION BY namespace, workload
                               ORDER BY gpu_seconds DESC NULLS LAST, bottleneck) = 1),
totals AS (
    SELECT namespace, workload,
           arg_min(team, seq) FILTER (WHERE team IS NOT NULL) AS team,
           arg_min(gpu_model, seq) FILTER (WHERE gpu_model IS NOT NULL) AS gpu_model,
           count(pod_uid) AS pods, SUM(gpu_seconds) AS gpu_seconds
    FROM c GROUP BY namespace, workload),
ev AS (
    SELECT namespace, workload,
           {", ".join(f"SUM(ev_{k} * gpu_seconds) / NULLIF(SUM(CASE WHEN ev_{k} IS NOT NULL "
                      f"THEN gpu_seconds ELSE 0 END), 0) AS ev_{k}" for k in EVIDENCE)}
    FROM c JOIN winner USING (namespace, workload, bottleneck)
    GROUP BY namespace, workload)
SELECT t.namespace, t.workload, t.team, t.gpu_model, w.bottleneck, t.pods,
       t.gpu_seconds / {HOUR} AS gpu_hours, NULL AS evidence,
       {", ".join(f"ev.ev_{k}" for k in EVIDENCE)}
FROM totals t JOIN winner w USING (namespace, workload)
LEFT JOIN ev USING (namespace, workload)
ORDER BY {_ORDER.replace("bottleneck", "w.bottleneck")}, gpu_hours DESC, t.workload
"""

RIGHTSIZING = f"""
WITH w AS (
    SELECT row_number() OVER () AS wid, *
    FROM (SELECT namespace, workload, team, gpu_model, provisioning,
                 SUM(cost_usd) AS cost_usd,
                 SUM(COALESCE(utilization, 0) * gpu_seconds) AS util_x,
                 SUM(CASE WHEN utilization IS NOT NULL THEN gpu_seconds ELSE 0 END) AS util_w,
                 MAX(peak_memory_bytes) AS peak, MAX(memory_total_bytes) AS total,
                 MAX(GREATEST(nvlink_tx_bytes_per_second, nvlink_rx_bytes_per_second))
                     AS nvlink,
                 BOOL_OR(mig) AS mig
          FROM pods GROUP BY namespace, workload, team, gpu_model, provisioning)),
x AS (
    SELECT w.*, w.util_x / w.util_w AS util, cur.tensor_tflops AS cur_tflops,
           cp.price AS cur_price,
           COALESCE(cur.nvlink_bytes_per_second > 0
                    AND w.nvlink >= {NVLINK_USE_SHARE} * cur.nvlink_bytes_per_second, false)
               AS uses_nvlink
    FROM w JOIN models cur ON cur.accelerator = w.gpu_model
    JOIN prices cp ON cp.gpu_model = w.gpu_model AND cp.provisioning = w.provisioning
    WHERE NOT COALESCE(w.mig, false) AND w.peak IS NOT NULL AND w.util_w <> 0),
fit AS (
    SELECT x.*, m.accelerator AS suggested_model, p.price AS fit_price
    FROM x JOIN prices p ON p.provisioning = x.provisioning AND p.price < x.cur_price
    JOIN models m ON m.accelerator = p.gpu_model
    WHERE NOT (x.uses_nvlink AND m.nvlink_bytes_per_second <= 0)
      AND x.peak <= {MEMORY_HEADROOM} * m.memory_mib * 1024 * 1024
      AND x.util * x.cur_tflops <= {COMPUTE_HEADROOM} * m.tensor_tflops
    QUALIFY row_number() OVER (PARTITION BY x.wid ORDER BY p.price, m.idx) = 1)
SELECT namespace, workload, team, gpu_model, COALESCE(peak, 0) / {GIB} AS peak_memory_gib,
       COALESCE(total, 0) / {GIB} AS gpu_memory_gib, util AS utilization, suggested_model,
       cost_usd * (1 - fit_price / cur_price) AS weekly_saving_usd
FROM fit
ORDER BY weekly_saving_usd DESC, workload
"""

SPOT = f"""
WITH p AS (
    SELECT p.namespace, p.workload, p.team, p.gpu_model, p.cost_usd
    FROM pods p JOIN (SELECT DISTINCT cluster, pod_uid, owner_kind FROM pod_states) s
      ON s.cluster = p.cluster AND s.pod_uid = p.pod_uid
    WHERE p.provisioning = 'on-demand'
      AND s.owner_kind IN ({", ".join(f"'{k}'" for k in BATCH_KINDS)})),
g AS (
    SELECT namespace, workload, team, gpu_model, SUM(cost_usd) AS cost_usd
    FROM p GROUP BY namespace, workload, team, gpu_model),
r AS (
    SELECT g.*, s.price / o.price AS ratio
    FROM g JOIN prices o ON o.gpu_model = g.gpu_model AND o.provisioning = 'on-demand'
    JOIN prices s ON s.gpu_model = g.gpu_model AND s.provisioning = 'spot'
    WHERE o.price > 0)
SELECT namespace, workload, team, gpu_model, cost_usd, cost_usd * ratio AS spot_cost_usd,
       cost_usd * (1 - ratio) AS weekly_saving_usd
FROM r
ORDER BY weekly_saving_usd DESC, workload
"""

IDLE_OFFENDERS = """
SELECT * FROM pods
WHERE idle_cost_usd > 0 AND utilization < $ceiling
ORDER BY idle_seconds DESC, idle_cost_usd DESC, pod LIMIT $n
"""

def _finish_workloads(f: pd.DataFrame) -> pd.DataFrame:
    f = with_evidence(f)
    return f.assign(advice=f.bottleneck.map(ADVICE))


def prepare(ws: Workspace, prices: Mapping[tuple[str, str], float]) -> None:
    """The price book and the GPU catalog as workspace tables."""
    ws.con.execute("CREATE OR REPLACE TABLE prices (gpu_model VARCHAR, provisioning VARCHAR, "
                   "price DOUBLE)")
    ws.con.execute("CREATE OR REPLACE TABLE models (idx INTEGER, accelerator VARCHAR, "
                   "memory_mib DOUBLE, tensor_tflops DOUBLE, "
                   "nvlink_bytes_per_second DOUBLE)")
    if prices:
        ws.con.executemany("INSERT INTO prices VALUES (?, ?, ?)",
                           [[m, p, float(v)] for (m, p), v in prices.items()])
    ws.con.executemany("INSERT INTO models VALUES (?, ?, ?, ?, ?)",
                       [[i, m.accelerator, float(m.memory_mib), float(m.tensor_tflops),
                         float(m.nvlink_bytes_per_second)]
                        for i, m in enumerate(GPU_MODELS.values())])


def bottleneck_table(ws: Workspace) -> Table:
    """Per workload: the class of most of its GPU-hours, the evidence (GPU-hour-weighted
    means over its pods of that class) and what to try."""
    return ws.table(BOTTLENECKS, _finish_workloads)


def rightsizing_table(ws: Workspace) -> Table:
    """Per workload: the cheapest GPU model that fits it, and what it would have saved."""
    return ws.table(RIGHTSIZING)


def spot_table(ws: Workspace) -> Table:
    """Per workload of batch Jobs on on-demand GPUs: its cost on spot, and the saving."""
    return ws.table(SPOT)


def idle_offenders(ws: Workspace, n: int = TOP) -> pd.DataFrame:
    """The pods that held GPUs and used them least: utilisation under ``IDLE_CEILING``
    (a busy job's small idle share of a dear GPU is no waste to chase), the most idle
    GPU-hours first, then the most idle cost."""
    cols = columns("idle_offenders")
    pods = ws.frame(IDLE_OFFENDERS, {"n": n, "ceiling": IDLE_CEILING})
    if pods.empty:
        return pd.DataFrame(columns=cols)
    return pods.assign(idle_gpu_hours=pods.idle_seconds / HOUR)[cols]


def bottleneck_summary(workloads: Table) -> pd.DataFrame:
    """Per class: how many workloads, their GPU-hours, and what to try."""
    cols = columns("bottleneck_summary")
    if workloads.empty:
        return pd.DataFrame(columns=cols)
    g = workloads.ws.frame(f"SELECT bottleneck, count(workload) AS workloads, "
                           f"SUM(gpu_hours) AS gpu_hours FROM {workloads.name} "
                           f"GROUP BY bottleneck")
    g["advice"] = g.bottleneck.map(ADVICE)
    order = {c: i for i, c in enumerate(ADVICE)}
    return g.sort_values("bottleneck", key=lambda s: s.map(order), ignore_index=True)[cols]


def sharing_cost(pods: Table) -> float:
    """The idle cost of pods under ``SHARING_UTILIZATION``."""
    return pods.view(f"utilization < {SHARING_UTILIZATION}").sum("idle_cost_usd")


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
