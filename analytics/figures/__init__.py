"""The weekly report's figures, one module per section of the report: pure functions of the
frames ``analytics.queries`` returns and, for the per-pod and per-workload ones, SQL over
the report's workspace (``analytics.workspace``), where the week's pods are.

- ``headline``: the share of the week with data, the headline, and the price basis (what
  the costs are priced on: ``Pricing``, ``PriceBasis``).
- ``cost``: cost by team, namespace, pool, model and provisioning, per day and team, the
  idle offenders and the unallocated capacity by pool.
- ``queue``: queue waits and pending GPU-hours, Kueue's ClusterQueues, the longest waits
  and the GPU models with a long queue.
- ``availability``: availability and error budget per pool, and the incidents.
- ``bottlenecks``: each pod's bottleneck class and evidence (``exporter.model.bottleneck``'s
  rules over every pod at once), the per-workload table and its summary per class.
- ``rightsizing``: the cheapest GPU that fits each workload, the batch Jobs that could run
  on spot, and the idle cost GPU sharing could take back.
- ``actions``: what the levers would save, and what to do this week, reconciled with the
  queues and the SLA.

Each definition is stated in its module's docstring; its tests are in the module of the same
name under ``tests/analytics/figures/``. What every part shares is here: ``HOUR``, ``TOP``,
``this_week`` and ``unix_seconds``.
"""

from __future__ import annotations

import pandas as pd

HOUR = 3600.0
TOP = 10
"""Rows of a top table (the idle offenders, the longest waits)."""


def this_week(usage: pd.DataFrame, this: bool = True) -> pd.DataFrame:
    """The rows of the week (``this``), or of the week before it."""
    return usage[usage["this_week"] == this]


def unix_seconds(t: pd.Series) -> pd.Series:
    """Unix seconds (NaN where missing)."""
    return (pd.to_datetime(t, utc=True) - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
