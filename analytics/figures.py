"""The weekly report's figures: pure functions of the frames ``analytics.queries`` returns.

Definitions (each next to its test in ``tests/analytics/test_figures.py``):

- cost: what the GPU-seconds cost after discount. A team's or namespace's cost is what its
  pods held (``allocated``); pools, models and provisioning include idle capacity.
- utilisation: utilised / measured GPU-seconds (rows without a reading do not count).
- idle cost: allocated but unused — cost x (1 - utilisation) of each row.
- effective cost per utilised GPU-hour: all spend / utilised GPU-hours.
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
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from analytics.week import Week
from exporter.bottleneck import Signals, decide
from exporter.catalog import GPU_MODELS

HOUR = 3600.0
GIB = 1024.0 ** 3
MEMORY_HEADROOM = 0.9
COMPUTE_HEADROOM = 0.8
NVLINK_USE_SHARE = 0.05
"""NVLink traffic, as a share of the link, above which a workload needs NVLink."""
SHARING_UTILIZATION = 0.3
"""Pods below this mean utilisation could share a GPU (time-sharing or MIG)."""
TOP = 10

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
    "insufficient_signal": "Enable the profiling counters in dcgm-exporter's counters file: "
                           "DCGM_FI_PROF_GR_ENGINE_ACTIVE, DCGM_FI_PROF_SM_ACTIVE, "
                           "DCGM_FI_PROF_SM_OCCUPANCY, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, "
                           "DCGM_FI_PROF_DRAM_ACTIVE, DCGM_FI_PROF_NVLINK_TX_BYTES, "
                           "DCGM_FI_PROF_NVLINK_RX_BYTES.",
}


def _ratio(a: float, b: float) -> float | None:
    return None if not b else a / b


def _week(usage: pd.DataFrame, this_week: bool = True) -> pd.DataFrame:
    return usage[usage["this_week"] == this_week]


# ---------------------------------------------------------------------------- headline


def headline(usage: pd.DataFrame) -> dict[str, float | None]:
    now, before = _week(usage), _week(usage, False)
    cost, prev = float(now.cost_usd.sum()), float(before.cost_usd.sum())
    allocated = now[now.state == "allocated"]
    utilized = float(allocated.utilized_seconds.sum())
    return {
        "cost_usd": cost,
        "previous_cost_usd": prev,
        "cost_change": _ratio(cost - prev, prev),
        "gpu_hours": float(now.gpu_seconds.sum()) / HOUR,
        "allocated_gpu_hours": float(allocated.gpu_seconds.sum()) / HOUR,
        "utilization": _ratio(utilized, float(allocated.measured_seconds.sum())),
        "effective_cost_usd_per_utilized_hour": _ratio(cost, utilized / HOUR),
        "idle_cost_usd": float(allocated.idle_cost_usd.sum()),
        "idle_share": _ratio(float(allocated.idle_cost_usd.sum()), cost),
        "unallocated_cost_usd": float(now[now.state == "unallocated"].cost_usd.sum()),
        "unallocated_share": _ratio(float(now[now.state == "unallocated"].cost_usd.sum()), cost),
    }


# ---------------------------------------------------------------------------- cost

COST_DIMENSIONS = ("team", "namespace", "node_pool", "gpu_model", "provisioning")


def cost_by(usage: pd.DataFrame, dimension: str) -> pd.DataFrame:
    """Cost this week and last, the change, GPU-hours, utilisation and share, per value."""
    rows = usage[usage.state == "allocated"] if dimension in ("team", "namespace") else usage
    rows = rows.assign(key=rows[dimension].fillna("(none)"))
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
    out["utilization"] = np.where(measured > 0, cur("utilized_seconds") /
                                  np.where(measured > 0, measured, 1.0), np.nan)
    total = out.cost_usd.sum()
    out["share"] = out.cost_usd / total if total else np.nan
    out = out[(out.cost_usd > 0) | (out.previous_cost_usd > 0)]
    return out.sort_values(["cost_usd", dimension], ascending=[False, True],
                           ignore_index=True)


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
    return table[sorted(table.columns, key=lambda t: -table[t].sum())]


# ---------------------------------------------------------------------------- waste


def idle_offenders(pods: pd.DataFrame, n: int = TOP) -> pd.DataFrame:
    cols = ["namespace", "pod", "workload", "team", "gpu_model", "idle_gpu_hours",
            "idle_cost_usd", "utilization"]
    if pods.empty:
        return pd.DataFrame(columns=cols)
    out = pods.assign(idle_gpu_hours=pods.idle_seconds / HOUR)
    out = out[out.idle_cost_usd > 0].sort_values(["idle_cost_usd", "pod"],
                                                  ascending=[False, True])
    return out[cols].head(n).reset_index(drop=True)


def unallocated_by_pool(usage: pd.DataFrame) -> pd.DataFrame:
    rows = _week(usage)
    rows = rows[rows.state == "unallocated"]
    g = rows.groupby(["node_pool", "gpu_model", "provisioning"], as_index=False)[
        ["gpu_seconds", "cost_usd"]].sum()
    g["gpu_hours"] = g.pop("gpu_seconds") / HOUR
    return g[["node_pool", "gpu_model", "provisioning", "gpu_hours", "cost_usd"]].sort_values(
        ["cost_usd", "node_pool"], ascending=[False, True], ignore_index=True)


# ---------------------------------------------------------------------------- queue


def _seconds(t: pd.Series) -> pd.Series:
    """Unix seconds (NaN where missing)."""
    return (pd.to_datetime(t, utc=True) - pd.Timestamp(0, tz="UTC")).dt.total_seconds()


def queue(pod_states: pd.DataFrame, week: Week) -> pd.DataFrame:
    """Wait percentiles (seconds) by team and GPU model, of the pods scheduled in the week,
    and the GPU-hours pods spent pending in the week."""
    cols = ["team", "gpu_model", "pods", "p50_seconds", "p90_seconds", "p99_seconds",
            "pending_gpu_hours"]
    if pod_states.empty:
        return pd.DataFrame(columns=cols)
    p = pod_states.assign(team=pod_states.team.fillna("(none)"),
                          gpu_model=pod_states.gpu_model.fillna("(any)"))
    start, end = week.start.timestamp(), week.end.timestamp()
    created = _seconds(p.created)
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
        rows.append((team, model, len(waits), *q, pending))
    return pd.DataFrame(rows, columns=cols).sort_values(
        ["p90_seconds", "team"], ascending=[False, True], ignore_index=True)


def longest_waits(pod_states: pd.DataFrame, week: Week, n: int = TOP) -> pd.DataFrame:
    """The longest waits that ended in the week, or are still going at its end."""
    cols = ["namespace", "pod", "team", "gpu_model", "gpus", "wait_seconds", "state"]
    if pod_states.empty:
        return pd.DataFrame(columns=cols)
    p = pod_states
    created = _seconds(p.created)
    sched = _seconds(p.scheduled)
    end = week.end.timestamp()
    ended = p.scheduled.notna() & (sched >= week.start.timestamp()) & (sched < end)
    pending = p.scheduled.isna() & p.finished.isna() & (created < end)
    out = p.assign(wait_seconds=np.where(ended, sched - created, end - created),
                   state=np.where(ended, "scheduled", "still pending"))
    out = out[ended | pending].sort_values(["wait_seconds", "pod"], ascending=[False, True])
    return out[cols].head(n).reset_index(drop=True)


# ---------------------------------------------------------------------------- availability


def availability(avail: pd.DataFrame, target: float) -> pd.DataFrame:
    cols = ["node_pool", "gpu_model", "availability", "target", "down_hours",
            "error_budget_left", "meets_target"]
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


def incidents(events: pd.DataFrame, pod_states: pd.DataFrame, week: Week) -> pd.DataFrame:
    """GPU incidents (XID, NotReady, GPU lost) that ended in the week, and spot
    preemptions in it, with their durations."""
    cols = ["kind", "where", "start", "end", "duration_seconds"]
    rows = [(e.reason, f"{e.node_pool}/{e.node} {e.gpu_uuid}", e.start_time, e.end_time,
             e.seconds) for e in events.itertuples()]
    if not pod_states.empty:
        pre = pod_states[(pod_states.reason == "Terminated") & (pod_states.phase == "Failed")
                         & pod_states.finished.notna()]
        fin = _seconds(pre.finished)
        pre = pre[(fin >= week.start.timestamp()) & (fin < week.end.timestamp())]
        rows += [("spot_preemption", f"{p.namespace}/{p.pod}", p.finished, p.finished, 0.0)
                 for p in pre.itertuples()]
    out = pd.DataFrame(rows, columns=cols)
    if not out.empty:
        out["start"] = pd.to_datetime(out.start, utc=True)
        out["end"] = pd.to_datetime(out.end, utc=True)
    return out.sort_values(["start", "where"], ignore_index=True)


# ---------------------------------------------------------------------------- bottlenecks


def _opt(v: object) -> float | None:
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)  # type: ignore[arg-type]


def pod_signals(row: object) -> Signals:
    """A pod's week, aggregated in the warehouse, as the classifier's signals."""
    def g(name: str) -> float | None:
        return _opt(getattr(row, name))

    return Signals(gr=g("gr_engine_active"), sm=g("sm_active"), tensor=g("tensor_active"),
                   dram=g("dram_active"), gpu_util_percent=g("gpu_util_percent"),
                   temp=g("temperature_celsius"), nvlink_tx=g("nvlink_tx_bytes_per_second"),
                   nvlink_rx=g("nvlink_rx_bytes_per_second"),
                   stalled_share=g("stalled_share") or 0.0, max_gr=g("max_gr") or 0.0,
                   throttled_share=g("throttled_share"))


def classify_pods(pods: pd.DataFrame) -> pd.DataFrame:
    """Each pod's class over the week (``exporter.bottleneck``'s rules) and evidence."""
    if pods.empty:
        return pods.assign(bottleneck=pd.Series(dtype=str), evidence=pd.Series(dtype=object))
    found = [decide(pod_signals(r), r.gpu_model) for r in pods.itertuples()]
    return pods.assign(bottleneck=[d.bottleneck for d in found],
                       evidence=[d.evidence for d in found])


def bottlenecks(classified: pd.DataFrame) -> pd.DataFrame:
    """Per workload: the class of most of its GPU-hours, the evidence (GPU-hour-weighted
    means over its pods of that class) and what to try."""
    cols = ["namespace", "workload", "team", "gpu_model", "bottleneck", "pods", "gpu_hours",
            "evidence", "advice"]
    if classified.empty:
        return pd.DataFrame(columns=cols)
    key = ["namespace", "workload"]
    c = classified.assign(namespace=classified.namespace.fillna(""),
                          workload=classified.workload.fillna(""))
    per_class = c.groupby([*key, "bottleneck"], as_index=False).gpu_seconds.sum()
    winner = per_class.sort_values(["gpu_seconds", "bottleneck"], ascending=[False, True]) \
        .drop_duplicates(key)[[*key, "bottleneck"]]
    totals = c.groupby(key, as_index=False).agg(
        team=("team", "first"), gpu_model=("gpu_model", "first"), pods=("pod_uid", "count"),
        gpu_seconds=("gpu_seconds", "sum"))
    mine = c.merge(winner, on=[*key, "bottleneck"])
    ev = pd.DataFrame(list(mine.evidence), index=mine.index, dtype=float)
    w = mine.gpu_seconds
    weighted = ev.mul(w, axis=0).assign(**{k: mine[k] for k in key}).groupby(key).sum()
    weights = ev.notna().mul(w, axis=0).assign(**{k: mine[k] for k in key}).groupby(key).sum()
    means = (weighted / weights.where(weights > 0)).reset_index()
    evidence = [{k: float(v) for k, v in row.items() if k not in key and pd.notna(v)}
                for row in means.to_dict("records")]
    means = means[key].assign(evidence=evidence)
    out = totals.merge(winner, on=key).merge(means, on=key, how="left")
    out["gpu_hours"] = out.pop("gpu_seconds") / HOUR
    out["advice"] = out.bottleneck.map(ADVICE)
    order = {cls: i for i, cls in enumerate(ADVICE)}
    out = out.assign(_order=out.bottleneck.map(order)).sort_values(
        ["_order", "gpu_hours", "workload"], ascending=[True, False, True])
    return out[cols].reset_index(drop=True)


def bottleneck_summary(workloads: pd.DataFrame) -> pd.DataFrame:
    """Per class: how many workloads, their GPU-hours, and what to try."""
    cols = ["bottleneck", "workloads", "gpu_hours", "advice"]
    if workloads.empty:
        return pd.DataFrame(columns=cols)
    g = workloads.groupby("bottleneck", as_index=False).agg(
        workloads=("workload", "count"), gpu_hours=("gpu_hours", "sum"))
    g["advice"] = g.bottleneck.map(ADVICE)
    order = {c: i for i, c in enumerate(ADVICE)}
    return g.sort_values("bottleneck", key=lambda s: s.map(order), ignore_index=True)[cols]


# ---------------------------------------------------------------------------- right-sizing


def cheapest_fit(model: str, provisioning: str, peak_memory_bytes: float | None,
                 utilization: float | None, uses_nvlink: bool,
                 prices: Mapping[tuple[str, str], float]) -> str | None:
    """The cheapest model that holds the memory and the compute (see module docstring);
    None when nothing cheaper fits or the need is unknown."""
    current = GPU_MODELS.get(model)
    price = prices.get((model, provisioning))
    if current is None or price is None or peak_memory_bytes is None or utilization is None:
        return None
    need_tflops = utilization * current.tensor_tflops
    best, best_price = None, price
    for m in GPU_MODELS.values():
        p = prices.get((m.accelerator, provisioning))
        if p is None or p >= best_price or (uses_nvlink and not m.has_nvlink):
            continue
        if peak_memory_bytes <= MEMORY_HEADROOM * m.memory_mib * 1024 * 1024 and \
                need_tflops <= COMPUTE_HEADROOM * m.tensor_tflops:
            best, best_price = m.accelerator, p
    return best


def _per_workload(pods: pd.DataFrame) -> pd.DataFrame:
    agg = pods.assign(nvlink=pods[["nvlink_tx_bytes_per_second",
                                   "nvlink_rx_bytes_per_second"]].max(axis=1))
    agg = agg.assign(util_x=agg.utilization.fillna(0) * agg.gpu_seconds,
                     util_w=agg.gpu_seconds.where(agg.utilization.notna(), 0.0))
    return agg.groupby(["namespace", "workload", "team", "gpu_model", "provisioning"],
                       as_index=False, dropna=False).agg(
        pods=("pod_uid", "count"), gpu_seconds=("gpu_seconds", "sum"),
        cost_usd=("cost_usd", "sum"), util_x=("util_x", "sum"), util_w=("util_w", "sum"),
        peak_memory_bytes=("peak_memory_bytes", "max"),
        memory_total_bytes=("memory_total_bytes", "max"), nvlink=("nvlink", "max"),
        mig=("mig", "max"))


def rightsizing(pods: pd.DataFrame, prices: Mapping[tuple[str, str], float]) -> pd.DataFrame:
    cols = ["namespace", "workload", "team", "gpu_model", "peak_memory_gib",
            "gpu_memory_gib", "utilization", "suggested_model", "weekly_saving_usd"]
    if pods.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for w in _per_workload(pods).itertuples():
        if w.mig:
            continue  # already a fraction of a GPU
        util = w.util_x / w.util_w if w.util_w else None
        model = GPU_MODELS.get(w.gpu_model)
        uses_nvlink = bool(model and model.has_nvlink and _opt(w.nvlink) is not None
                           and w.nvlink >= NVLINK_USE_SHARE * model.nvlink_bytes_per_second)
        peak = _opt(w.peak_memory_bytes)
        fit = cheapest_fit(w.gpu_model, w.provisioning, peak, util, uses_nvlink, prices)
        if fit is None:
            continue
        ratio = prices[(fit, w.provisioning)] / prices[(w.gpu_model, w.provisioning)]
        rows.append((w.namespace, w.workload, w.team, w.gpu_model,
                     (peak or 0.0) / GIB, (_opt(w.memory_total_bytes) or 0.0) / GIB, util, fit,
                     w.cost_usd * (1 - ratio)))
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["weekly_saving_usd", "workload"], ascending=[False, True],
                           ignore_index=True)


BATCH_KINDS = ("Job", "JobSet")


def spot_candidates(pods: pd.DataFrame, pod_states: pd.DataFrame,
                    prices: Mapping[tuple[str, str], float]) -> pd.DataFrame:
    cols = ["namespace", "workload", "team", "gpu_model", "cost_usd", "spot_cost_usd",
            "weekly_saving_usd"]
    if pods.empty or pod_states.empty:
        return pd.DataFrame(columns=cols)
    kinds = pod_states[["cluster", "pod_uid", "owner_kind"]]
    p = pods.merge(kinds, on=["cluster", "pod_uid"], how="left")
    p = p[(p.provisioning == "on-demand") & p.owner_kind.isin(BATCH_KINDS)]
    g = p.groupby(["namespace", "workload", "team", "gpu_model"], as_index=False,
                  dropna=False).cost_usd.sum()
    on_demand = g.gpu_model.map(lambda m: prices.get((m, "on-demand"))).astype(float)
    spot = g.gpu_model.map(lambda m: prices.get((m, "spot"))).astype(float)
    g = g[on_demand.notna() & spot.notna() & (on_demand > 0)]
    ratio = (spot / on_demand)[g.index]
    g = g.assign(spot_cost_usd=g.cost_usd * ratio, weekly_saving_usd=g.cost_usd * (1 - ratio))
    return g[cols].sort_values(["weekly_saving_usd", "workload"], ascending=[False, True],
                               ignore_index=True)


def savings(spot: pd.DataFrame, rightsize: pd.DataFrame, unallocated: pd.DataFrame,
            pods: pd.DataFrame) -> pd.DataFrame:
    """The article's levers, priced with this week's data (upper bounds)."""
    sharing = pods[pods.utilization < SHARING_UTILIZATION] if not pods.empty else pods
    return pd.DataFrame([
        ("spot", "batch Jobs on on-demand GPUs moved to spot (with checkpoints)",
         float(spot.weekly_saving_usd.sum()) if not spot.empty else 0.0),
        ("autoscaling", "unallocated capacity an autoscaler would have removed",
         float(unallocated.cost_usd.sum()) if not unallocated.empty else 0.0),
        ("sharing", f"idle cost of pods under {SHARING_UTILIZATION:.0%} utilisation, which "
                    "time-sharing or MIG could pack together",
         float(sharing.idle_cost_usd.sum()) if not sharing.empty else 0.0),
        ("right-sizing", "workloads on the cheapest GPU that fits",
         float(rightsize.weekly_saving_usd.sum()) if not rightsize.empty else 0.0),
    ], columns=["lever", "how", "weekly_saving_usd"])
