"""What cheaper GPUs the workloads could run on: the cheapest GPU model that fits each
workload, the batch Jobs that could run on spot, and the idle cost GPU sharing could take
back.

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

from collections.abc import Mapping

from analytics.workspace import Table, Workspace
from exporter.model.catalog import GPU_MODELS

GIB = 1024.0 ** 3
MEMORY_HEADROOM = 0.9
COMPUTE_HEADROOM = 0.8
NVLINK_USE_SHARE = 0.05
"""NVLink traffic, as a share of the link, above which a workload needs NVLink."""
SHARING_UTILIZATION = 0.3
"""Pods below this mean utilisation could share a GPU (time-sharing or MIG)."""
BATCH_KINDS = ("Job", "JobSet")
"""The owners of the pods that run to completion: they can checkpoint and restart."""


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


# The tables, in the workspace's SQL (DuckDB) over its ``pods`` table (the PODS query's
# columns), ``pod_states`` (the POD_STATES query's), ``prices`` and ``models``
# (``prepare``).

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


def rightsizing_table(ws: Workspace) -> Table:
    """Per workload: the cheapest GPU model that fits it, and what it would have saved."""
    return ws.table(RIGHTSIZING)


def spot_table(ws: Workspace) -> Table:
    """Per workload of batch Jobs on on-demand GPUs: its cost on spot, and the saving."""
    return ws.table(SPOT)


def sharing_cost(pods: Table) -> float:
    """The idle cost of pods under ``SHARING_UTILIZATION``."""
    return pods.view(f"utilization < {SHARING_UTILIZATION}").sum("idle_cost_usd")
