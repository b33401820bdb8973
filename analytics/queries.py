"""What the weekly report reads from the warehouse: each query aggregates in the
warehouse (DuckDB or BigQuery) and returns a frame small enough for pandas — groups, pods,
incidents — never the raw ``gpu_usage`` rows.

Every query takes ``@start``/``@end`` (and partition filters BigQuery requires),
``@cluster`` (NULL for every cluster the warehouse holds) and ``@team`` (NULL for the whole
platform).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC

import pandas as pd
import pyarrow as pa

from analytics.figures import TOP
from analytics.store import Param, Store, batches
from analytics.week import POD_LOOKBACK, QUOTA_LOOKBACK, Week
from analytics.workspace import Workspace
from exporter.model.bottleneck import STALL_GR, THROTTLE_BITS


def _mean(column: str) -> str:
    """GPU-second-weighted mean of a column, over the rows that have it."""
    return (f"SAFE_DIVIDE(SUM({column} * gpu_seconds), "
            f"SUM(IF({column} IS NULL, 0, gpu_seconds))) AS {column}")


USAGE = """
SELECT cluster, team, namespace, node_pool, gpu_model, provisioning, state, allocation,
       time >= @start AS this_week,
       SUM(gpu_seconds) AS gpu_seconds,
       SUM(IF(utilization IS NULL, 0, utilization * gpu_seconds)) AS utilized_seconds,
       SUM(IF(utilization IS NULL, 0, gpu_seconds)) AS measured_seconds,
       SUM(COALESCE(cost_usd, 0)) AS cost_usd,
       SUM(IF(cost_usd IS NULL, 0, gpu_seconds)) AS priced_seconds,
       SUM(IF(state = 'allocated' AND utilization IS NOT NULL,
              (1 - utilization) * gpu_seconds, 0)) AS idle_seconds,
       SUM(IF(state = 'allocated' AND utilization IS NOT NULL,
              (1 - utilization) * COALESCE(cost_usd, 0), 0)) AS idle_cost_usd,
       SUM(COALESCE(energy_joules, 0)) AS energy_joules,
       SUM(IF(energy_joules IS NULL, 0, gpu_seconds)) AS metered_seconds,
       SUM(IF(energy_basis = 'counter', 0, COALESCE(energy_joules, 0))) AS estimated_joules,
       SUM(COALESCE(idle_energy_joules, 0)) AS idle_joules,
       SUM(COALESCE(co2e_grams, 0)) AS co2e_grams,
       SUM(IF(co2e_grams IS NULL, 0, COALESCE(energy_joules, 0))) AS carbon_joules
FROM {gpu_usage}
WHERE time >= @prev_start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
  AND (@team IS NULL OR team = @team)
GROUP BY cluster, team, namespace, node_pool, gpu_model, provisioning, state, allocation,
         this_week
"""

COVERAGE = """
SELECT time >= @start AS this_week, COUNT(DISTINCT DIV(UNIX_SECONDS(time), 3600)) AS hours
FROM {gpu_usage}
WHERE time >= @prev_start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
GROUP BY this_week
"""
"""Hours of the week (and of the week before) with any GPU time in the warehouse, every
team's: how much of the week the report can speak for."""

DAILY = """
SELECT TIMESTAMP_SECONDS(DIV(UNIX_SECONDS(time), 86400) * 86400) AS day,
       IF(state = 'allocated', team, CONCAT('(', state, ')')) AS team,
       SUM(COALESCE(cost_usd, 0)) AS cost_usd
FROM {gpu_usage}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
  AND (@team IS NULL OR team = @team)
GROUP BY 1, 2
ORDER BY 1, 2
"""
"""Each day's cost by team, the GPU time no pod held as ``(unallocated)`` and
``(unavailable)``: the days add up to the week's cost."""

PODS = f"""
SELECT cluster, namespace, pod_uid, ANY_VALUE(pod) AS pod, ANY_VALUE(workload) AS workload,
       ANY_VALUE(team) AS team, ANY_VALUE(gpu_model) AS gpu_model,
       ANY_VALUE(provisioning) AS provisioning,
       LOGICAL_OR(mig_profile IS NOT NULL) AS mig,
       SUM(gpu_seconds) AS gpu_seconds, SUM(COALESCE(cost_usd, 0)) AS cost_usd,
       SUM(IF(utilization IS NULL, 0, utilization * gpu_seconds)) AS utilized_seconds,
       SUM(IF(utilization IS NULL, 0, (1 - utilization) * gpu_seconds)) AS idle_seconds,
       SUM(IF(utilization IS NULL, 0, (1 - utilization) * COALESCE(cost_usd, 0)))
           AS idle_cost_usd,
       {", ".join(_mean(c) for c in ("utilization", "gr_engine_active", "sm_active",
                                     "sm_occupancy", "tensor_active", "dram_active",
                                     "gpu_util_percent", "temperature_celsius",
                                     "nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second",
                                     "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"))},
       SAFE_DIVIDE(SUM(IF(gr_engine_active < @stall_gr, gpu_seconds, 0)),
                   SUM(IF(gr_engine_active IS NULL, 0, gpu_seconds))) AS stalled_share,
       MAX(gr_engine_active) AS max_gr,
       SAFE_DIVIDE(SUM(IF((clock_event_reasons & @throttle_bits) != 0, gpu_seconds, 0)),
                   SUM(IF(clock_event_reasons IS NULL, 0, gpu_seconds))) AS throttled_share,
       MAX(memory_used_bytes) AS peak_memory_bytes,
       MAX(memory_total_bytes) AS memory_total_bytes,
       {_mean("power_watts")},
       SAFE_DIVIDE(SUM(energy_joules),
                   SUM(IF(energy_joules IS NULL OR utilization IS NULL, 0,
                          utilization * gpu_seconds))) AS watts_per_utilized_gpu
FROM {{gpu_usage}}
WHERE time >= @start AND time < @end AND state = 'allocated' AND pod_uid IS NOT NULL
  AND (@cluster IS NULL OR cluster = @cluster) AND (@team IS NULL OR team = @team)
GROUP BY cluster, namespace, pod_uid
"""

POD_STATES = """
SELECT cluster, pod_uid, namespace, pod, team, workload, owner_kind, gpu_model, gpus,
       created, scheduled, finished, queue_wait_seconds, phase, reason, priority_class,
       COALESCE(queued, created) AS queued, admission_wait_seconds, cluster_queue
FROM {gpu_pods}
WHERE updated >= @lookback AND updated < @end AND (@cluster IS NULL OR cluster = @cluster)
  AND (@team IS NULL OR team = @team)
QUALIFY ROW_NUMBER() OVER (PARTITION BY cluster, pod_uid ORDER BY updated DESC) = 1
"""

AWAITING_ADMISSION = """
SELECT cluster, workload_uid, namespace, workload, owner_name, team, gpu_model, gpus,
       queued, finished, cluster_queue
FROM (SELECT * FROM {kueue_workloads}
      WHERE updated >= @lookback AND updated < @end AND (@cluster IS NULL OR cluster = @cluster)
        AND (@team IS NULL OR team = @team)
      QUALIFY ROW_NUMBER() OVER (PARTITION BY cluster, workload_uid ORDER BY updated DESC) = 1)
WHERE admitted IS NULL AND gpus > 0 AND (finished IS NULL OR finished >= @start)
"""
"""The Kueue Workloads that were waiting for admission in the week and not admitted by its
end, as last seen by then: Jobs that have no pod yet, whose wait no pod row shows."""

QUOTAS = """
SELECT cluster_queue, SUM(nominal_gpus) AS nominal_gpus
FROM (SELECT cluster, cluster_queue, flavor, nominal_gpus FROM {kueue_quotas}
      WHERE updated >= @quota_since AND updated < @end
        AND (@cluster IS NULL OR cluster = @cluster)
      QUALIFY ROW_NUMBER() OVER (PARTITION BY cluster, cluster_queue, flavor
                                 ORDER BY updated DESC) = 1)
GROUP BY cluster_queue
"""
"""Each Kueue ClusterQueue's GPU quota (all flavors) as last seen in the week."""

AVAILABILITY = """
SELECT node_pool, gpu_model,
       SUM(IF(state = 'unavailable', gpu_seconds, 0)) AS down_seconds,
       SUM(gpu_seconds) AS gpu_seconds
FROM {gpu_usage}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
GROUP BY node_pool, gpu_model
"""

INCIDENTS = """
SELECT node, node_pool, gpu_uuid, reason, start_time, end_time, seconds
FROM {availability_events}
WHERE end_time >= @start AND end_time < @end AND (@cluster IS NULL OR cluster = @cluster)
ORDER BY start_time, gpu_uuid
"""


PENDING = """
SELECT cluster, uid, ANY_VALUE(kind) AS kind, cause, team, COALESCE(node_pool, '') AS node_pool,
       COALESCE(gpu_model, '') AS gpu_model, COALESCE(cluster_queue, '') AS cluster_queue,
       SUM(gpu_seconds) AS gpu_seconds, SUM(seconds) AS seconds,
       MAX(wait_seconds) AS wait_seconds
FROM {gpu_pending}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
  AND (@team IS NULL OR team = @team)
GROUP BY 1, 2, 4, 5, 6, 7, 8
"""
"""Each pod (or Kueue Workload with no pod yet) that waited in the week, once per cause,
team, pool, model and ClusterQueue it waited with: the GPU-seconds and seconds it waited
for that cause in the week, and the longest its whole wait got (``wait_seconds``)."""

PENDING_HOURS = """
SELECT cluster, COALESCE(node_pool, '') AS node_pool, COALESCE(gpu_model, '') AS gpu_model,
       cause, TIMESTAMP_SECONDS(DIV(UNIX_SECONDS(time), 3600) * 3600) AS hour_start,
       SUM(gpu_seconds) AS gpu_seconds, COUNT(DISTINCT uid) AS waiting
FROM {gpu_pending}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
  AND (@team IS NULL OR team = @team)
GROUP BY 1, 2, 3, 4, 5
"""
"""The GPU-seconds that waited in each hour of the week, by cluster, the pool the waiting
pods fit (empty: none), the GPU model they ask for and the cause."""

FREE_HOURS = """
SELECT cluster, node_pool, ANY_VALUE(gpu_model) AS gpu_model,
       ANY_VALUE(provisioning) AS provisioning,
       TIMESTAMP_SECONDS(DIV(UNIX_SECONDS(time), 3600) * 3600) AS hour_start, use,
       SUM(gpu_seconds) AS gpu_seconds, SUM(COALESCE(cost_usd, 0)) AS cost_usd,
       AVG(fragmentation_ratio) AS fragmentation_ratio
FROM {gpu_free}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
GROUP BY 1, 2, 5, 6
"""
"""Each pool's free GPU-seconds and their cost in each hour of the week, by use (what a
waiting pod could make of them, decided interval by interval), and its mean fragmentation
ratio in the hour; every team's."""

FRAGMENTATION = """
SELECT node_pool, ANY_VALUE(gpu_model) AS gpu_model, ANY_VALUE(provisioning) AS provisioning,
       SUM(IF(use = 'fragment', gpu_seconds, 0))
       / NULLIF(SUM(IF(use IN ('fragment', 'usable'), gpu_seconds, 0)), 0)
       AS fragmentation_ratio
FROM {gpu_free}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
GROUP BY node_pool
"""
"""Each pool's fragmentation over the week, against the pods waiting for it: of its free
GPU-hours while a pod that fits it waited (``usable`` or ``fragment``), the share stranded
as fragments; NULL where no such pod waited. Read from the GPU-hours by use, so a week
written by any release reads alike."""

STUCK = f"""
WITH waited AS (
  SELECT cluster, COALESCE(namespace, '') AS namespace,
         COALESCE(NULLIF(workload, ''), name, uid) AS what, uid, team, gpu_model, node_pool,
         cause, evidence, evidence_source, gpus, gpu_seconds, seconds, wait_seconds, time,
         interval_seconds, expected_start, MAX(time) OVER (PARTITION BY cluster) AS newest
  FROM {{gpu_pending}}
  WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
    AND (@team IS NULL OR team = @team)),
longest AS (
  SELECT cluster, namespace, what, COUNT(DISTINCT uid) AS waiting, MAX(gpus) AS gpus,
         SUM(gpu_seconds) AS gpu_seconds,
         COALESCE(MAX(wait_seconds), SUM(seconds)) AS wait_seconds,
         MAX(UNIX_SECONDS(time) + COALESCE(interval_seconds, seconds)) AS last_unix
  FROM waited
  GROUP BY cluster, namespace, what),
latest AS (
  SELECT cluster, namespace, what, team, gpu_model, node_pool, cause AS latest_cause,
         MAX(CASE WHEN time = newest THEN UNIX_SECONDS(expected_start) END)
           OVER (PARTITION BY cluster, namespace, what) AS expected_unix
  FROM waited
  WHERE TRUE
  QUALIFY ROW_NUMBER() OVER (PARTITION BY cluster, namespace, what
                             ORDER BY time DESC, uid, cause) = 1),
by_cause AS (
  SELECT cluster, namespace, what, cause, SUM(seconds) AS cause_seconds,
         MAX_BY(evidence, CONCAT(CAST(UNIX_SECONDS(time) AS STRING), '/', uid)) AS evidence,
         MAX_BY(evidence_source, CONCAT(CAST(UNIX_SECONDS(time) AS STRING), '/', uid))
           AS evidence_source
  FROM waited
  GROUP BY cluster, namespace, what, cause),
main AS (
  SELECT cluster, namespace, what, cause, evidence, evidence_source
  FROM by_cause
  WHERE TRUE
  QUALIFY ROW_NUMBER() OVER (PARTITION BY cluster, namespace, what
                             ORDER BY cause_seconds DESC, cause) = 1)
SELECT namespace, what AS workload, team, gpu_model, node_pool, waiting, gpus, gpu_seconds,
       wait_seconds, cause, latest_cause, evidence_source, evidence, last_unix,
       expected_unix
FROM longest JOIN latest USING (cluster, namespace, what)
  JOIN main USING (cluster, namespace, what)
ORDER BY wait_seconds DESC, namespace, workload
LIMIT {TOP}
"""
"""The workloads (a pod's controller, the Job a Workload queues; else the pod) that waited
longest in the week: how long, how many of their pods waited and with how many GPUs, the
cause that cost them the most time (its evidence, from its latest interval) and the cause
of their latest interval waiting. (The latest interval by its time as ten digits of unix
seconds, then the pod's uid: the same order as numbers until 2286.)"""

RECORDED = """
SELECT (SELECT COUNT(*) FROM {gpu_pending}
        WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster))
           AS pending_rows,
       (SELECT COUNT(*) FROM {gpu_free}
        WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster))
           AS free_rows
"""
"""Whether the warehouse records why pods waited in the week (every team's): an exporter
from before ``gpu_pending`` and ``gpu_free`` writes neither."""


COVERED = """
SELECT MAX(TIMESTAMP_ADD(time, INTERVAL CAST(interval_seconds AS INT64) SECOND)) AS last
FROM {gpu_usage}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
"""
"""The end of the week's last GPU rows: where a week not over yet (or a warehouse that
stops short of its end) stops."""


def as_far_as_it_goes(found: pd.DataFrame, week: Week) -> Week:
    """``week`` up to the end of its last rows (``COVERED``'s answer)."""
    last = found["last"].iloc[0] if not found.empty else None
    if last is None or pd.isna(last):
        return week
    end = min(week.end, pd.Timestamp(last).to_pydatetime().astimezone(UTC))
    return Week(week.start, end) if end > week.start else week


def covered(store: Store, week: Week, cluster: str | None) -> Week:
    """The week up to the end of its last rows: a week not over yet (or a warehouse that
    stops short of its end) is measured as far as it goes."""
    return as_far_as_it_goes(store.query(COVERED, {"start": week.start, "end": week.end,
                                                  "cluster": cluster}), week)


def fetch(store: Store, week: Week, team: str | None = None,
          cluster: str | None = None) -> dict[str, pd.DataFrame]:
    """Every summary frame the report is built from (the per-pod rows go to ``load``)."""
    platform: dict[str, Param] = {"start": week.start, "end": week.end, "cluster": cluster}
    base = platform | {"team": team}
    return {
        "usage": store.query(USAGE, base | {"prev_start": week.previous.start}),
        "coverage": store.query(COVERAGE, platform | {"prev_start": week.previous.start}),
        "covered": store.query(COVERED, platform),
        "daily": store.query(DAILY, base),
        "availability": store.query(AVAILABILITY, platform),
        "incidents": store.query(INCIDENTS, platform),
        "quotas": store.query(QUOTAS, platform | {"quota_since": week.start - QUOTA_LOOKBACK}),
        "awaiting_admission": store.query(AWAITING_ADMISSION,
                                          base | {"lookback": week.start - POD_LOOKBACK}),
        "recorded": store.query(RECORDED, platform),
        "pending_hours": store.query(PENDING_HOURS, base),
        "free_hours": store.query(FREE_HOURS, platform),
        "fragmentation": store.query(FRAGMENTATION, platform),
        "stuck": store.query(STUCK, base),
    }


def load(store: Store, week: Week, ws: Workspace, team: str | None = None,
         classify: Callable[[pa.Table], pa.Table] = lambda t: t,
         cluster: str | None = None) -> None:
    """The week's pods (each classified on its way in, numbered in ``seq``), their latest
    states and what waited (``PENDING``) into the workspace's ``pods``, ``pod_states`` and
    ``pending``, a batch at a time."""
    base: dict[str, Param] = {"start": week.start, "end": week.end, "team": team,
                              "cluster": cluster}
    seen = 0

    def numbered(t: pa.Table) -> pa.Table:
        nonlocal seen
        t = classify(t).append_column("seq", pa.array(range(seen, seen + t.num_rows),
                                                      type=pa.int64()))
        seen += t.num_rows
        return t

    ws.load("pods", batches(store, PODS, base | {"stall_gr": STALL_GR,
                                                 "throttle_bits": THROTTLE_BITS}), numbered)
    ws.load("pod_states", batches(store, POD_STATES,
                                  base | {"lookback": week.start - POD_LOOKBACK}))
    ws.load("pending", batches(store, PENDING, base))
