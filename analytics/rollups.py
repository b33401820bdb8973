"""Usage rollups computed in the warehouse: GPU-hours, utilisation, cost and effective
cost per hour or day, by any of the warehouse's dimensions.

``effective_cost_usd_per_utilized_hour`` is cost / utilised GPU-hours: the price of a
useful GPU-hour (``exporter.model.compute.effective_cost_per_utilized_hour`` of the rows' sums);
it is null where nothing was utilised.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pandas as pd

from analytics.store import Param, Store

GRAINS = {"hour": 3600, "day": 86400}
"""Periods in seconds; UTC days (integer arithmetic: the same on every engine, and fast)."""
DIMENSIONS = ("cluster", "team", "namespace", "node_pool", "gpu_model", "provisioning",
              "state", "pod", "workload")
"""Columns a rollup may group or filter by (identifiers cannot be parameters: they are
checked against this list)."""


def usage(store: Store, start: datetime, end: datetime, grain: str = "day",
          by: Sequence[str] = ("team",), **where: str) -> pd.DataFrame:
    """One row per period and group: gpu_hours, utilized_gpu_hours, utilization, cost_usd,
    effective_cost_usd_per_utilized_hour. ``where`` filters on dimensions by equality."""
    if grain not in GRAINS:
        raise ValueError(f"grain must be one of {sorted(GRAINS)}, not {grain!r}")
    for column in (*by, *where):
        if column not in DIMENSIONS:
            raise ValueError(f"cannot group or filter by {column!r}: one of {DIMENSIONS}")
    group = "".join(f", {c}" for c in by)
    filters = "".join(f" AND {c} = @{c}" for c in where)
    sql = f"""
        SELECT TIMESTAMP_SECONDS(DIV(UNIX_SECONDS(time), @grain) * @grain) AS period{group},
               SUM(gpu_seconds) / 3600 AS gpu_hours,
               SUM(utilization * gpu_seconds) / 3600 AS utilized_gpu_hours,
               SAFE_DIVIDE(SUM(utilization * gpu_seconds),
                           SUM(IF(utilization IS NULL, NULL, gpu_seconds))) AS utilization,
               SUM(cost_usd) AS cost_usd,
               SAFE_DIVIDE(SUM(cost_usd), SUM(utilization * gpu_seconds) / 3600)
                   AS effective_cost_usd_per_utilized_hour
        FROM {{gpu_usage}}
        WHERE time >= @start AND time < @end{filters}
        GROUP BY period{group}
        ORDER BY period{group}"""
    params: dict[str, Param] = {"start": start, "end": end, "grain": GRAINS[grain], **where}
    return store.query(sql, params)
