"""The report's tables are those ``analytics.tables`` declares: the columns a built report
has, the money the CSVs round, the columns ``report.json`` promises to keep."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from analytics import render
from analytics.report import SECTIONS
from analytics.tables import HEADLINE, PRICE_BASIS, TABLES, ReportTable
from tests.analytics.test_report import report

SCHEMA_1 = {
    "actions": ["action", "where", "weekly_saving_usd", "weekly_cost_usd", "why"],
    **{f"cost_by_{d}": [d, "cost_usd", "previous_cost_usd", "change_usd", "change", "gpu_hours",
                        "utilization_of_allocated", "share", "share_of_allocated"]
       for d in ("team", "namespace")},
    **{f"cost_by_{d}": [d, "cost_usd", "previous_cost_usd", "change_usd", "change", "gpu_hours",
                        "utilization_of_capacity", "share"]
       for d in ("node_pool", "gpu_model", "provisioning")},
    "daily_cost_by_team": ["day"],
    "idle_offenders": ["namespace", "pod", "workload", "team", "gpu_model", "idle_gpu_hours",
                       "idle_cost_usd", "utilization"],
    "unallocated_by_pool": ["node_pool", "gpu_model", "provisioning", "gpu_hours", "cost_usd"],
    "queue": ["team", "gpu_model", "pods", "p50_seconds", "p90_seconds", "p99_seconds",
              "pending_gpu_hours"],
    "longest_waits": ["namespace", "pod", "team", "gpu_model", "gpus", "wait_seconds", "state"],
    "availability": ["node_pool", "gpu_model", "availability", "target", "down_hours",
                     "error_budget_left", "meets_target"],
    "incidents": ["kind", "where", "gpus", "start", "end", "duration_seconds",
                  "gpu_hours_lost"],
    "bottleneck_summary": ["bottleneck", "workloads", "gpu_hours", "advice"],
    "bottlenecks": ["namespace", "workload", "team", "gpu_model", "bottleneck", "pods",
                    "gpu_hours", "evidence", "advice"],
    "rightsizing": ["namespace", "workload", "team", "gpu_model", "peak_memory_gib",
                    "gpu_memory_gib", "utilization", "suggested_model", "weekly_saving_usd"],
    "spot": ["namespace", "workload", "team", "gpu_model", "cost_usd", "spot_cost_usd",
             "weekly_saving_usd"],
    "savings": ["lever", "how", "weekly_saving_usd"],
}
"""The tables and columns of ``report.json`` schema version 1."""


OPTIONAL = {"reconciliation", "replayed", "settings"}
"""Tables only some platform reports have: with ``report.billing_table``
(``tests/bigquery/test_reconcile``), with replays (``tests/test_whatif_report.py``)."""


def test_a_built_report_has_the_declared_tables_and_columns(shared_warehouse: Path) -> None:
    r = report(shared_warehouse)  # two clusters: every table, cost by cluster too
    assert list(SECTIONS) == [t.name for t in TABLES]
    assert list(r.tables) == [t.name for t in TABLES if t.name not in OPTIONAL]
    for t in TABLES:
        if t.name in OPTIONAL:
            continue
        got = render._columns(t.name, r.tables[t.name])
        if t.more_columns:
            assert got[:len(t.columns)] == t.names, t.name
        else:
            assert got == t.names, t.name
    assert list(r.headline) == [c.name for c in HEADLINE]


def test_report_json_carries_the_declared_columns(shared_warehouse: Path) -> None:
    r = report(shared_warehouse)
    buf = io.StringIO()
    render.write_json(r, buf)
    doc = json.loads(buf.getvalue())
    assert list(doc["headline"]) == [c.name for c in HEADLINE]
    assert list(doc["price_basis"]) == [c.name for c in PRICE_BASIS]
    for t in TABLES:
        if t.more_columns or t.name in OPTIONAL:
            continue
        for row in doc["tables"][t.name]:
            assert list(row) == t.names, t.name


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_the_money_columns_are_those_rounded_to_the_cent(table: ReportTable) -> None:
    for c in (*table.columns, *HEADLINE, *PRICE_BASIS):
        assert render.is_money(c.name) == (c.unit == "usd"), c.name


def test_no_column_of_the_json_schema_goes_without_raising_its_version() -> None:
    assert render.JSON_SCHEMA_VERSION == 1, "a new version: pin its tables here"
    declared = {t.name: t.names for t in TABLES}
    for name, cols in SCHEMA_1.items():
        assert name in declared, f"table {name} went: raise render.JSON_SCHEMA_VERSION"
        gone = [c for c in cols if c not in declared[name]]
        assert not gone, f"{name} lost {gone}: raise render.JSON_SCHEMA_VERSION"


def test_every_column_says_what_it_holds() -> None:
    for t in TABLES:
        assert t.title and t.help, t.name
        assert len(set(t.names)) == len(t.names), t.name
        for c in t.columns:
            assert c.help.endswith("."), (t.name, c.name)
