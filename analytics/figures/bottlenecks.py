"""Why a workload is slow: each pod's bottleneck class over the week and its evidence
(``exporter.model.bottleneck``'s rules, over every pod at once), the class of most of each
workload's GPU-hours with the evidence and what to try, and the workloads per class.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from analytics.figures import HOUR
from analytics.tables import columns
from analytics.workspace import Table, Workspace
from exporter.model.bottleneck import (
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
from exporter.model.catalog import GPU_MODELS

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


def _col(pods: pd.DataFrame, name: str) -> np.ndarray:
    values: np.ndarray = pd.to_numeric(pods[name], errors="coerce").to_numpy(
        dtype=float, na_value=np.nan)
    return values


def pod_classes(pods: pd.DataFrame) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``exporter.model.bottleneck.decide`` over every pod at once: each pod's class and its
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

    limit = np.array([m.power_limit_watts if m else np.nan for m in found], dtype=float)
    columns = {
        "power_limit_share": _col(pods, "power_watts") / limit,
        "watts_per_utilized_gpu": _col(pods, "watts_per_utilized_gpu"),
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
                   "stalled_share", "max_gr", "throttled_share", "power_watts",
                   "watts_per_utilized_gpu")


# The per-workload table, in the workspace's SQL (DuckDB) over its ``pods`` table (the
# PODS query's columns, each pod's class and ``ev_*`` columns, and ``seq``, the order
# pods arrived in).

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


def _finish_workloads(f: pd.DataFrame) -> pd.DataFrame:
    f = with_evidence(f)
    return f.assign(advice=f.bottleneck.map(ADVICE))


def bottleneck_table(ws: Workspace) -> Table:
    """Per workload: the class of most of its GPU-hours, the evidence (GPU-hour-weighted
    means over its pods of that class) and what to try."""
    return ws.table(BOTTLENECKS, _finish_workloads)


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
