"""Reconciliation with the bill, on a real BigQuery API: a Cloud Billing detailed export
table built in Google's documented schema (the columns reconciliation reads, with their
documented types and nesting: ``service``, ``sku``, ``project`` and ``usage`` records,
``labels`` and ``credits`` repeated records; GKE cost allocation's labels
``goog-k8s-cluster-name`` and ``k8s-namespace``), against the exporter's warehouse."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from google.cloud import bigquery

from analytics import reconcile
from analytics.store import DuckDBStore
from analytics.week import parse_week
from analytics.weekly import run_weekly
from exporter.config import load_config
from exporter.google.bigquery_emulator import PROJECT, Emulator
from tests.analytics.conftest import HOSTILE, build_warehouse
from tests.bigquery.conftest import client_for
from tests.exporter.test_compute import PRICE
from tests.timing import limit

F = bigquery.SchemaField
EXPORT_SCHEMA = [
    F("billing_account_id", "STRING"),
    F("service", "RECORD", fields=[F("id", "STRING"), F("description", "STRING")]),
    F("sku", "RECORD", fields=[F("id", "STRING"), F("description", "STRING")]),
    F("usage_start_time", "TIMESTAMP"), F("usage_end_time", "TIMESTAMP"),
    F("project", "RECORD", fields=[F("id", "STRING"), F("number", "STRING"),
                                   F("name", "STRING")]),
    F("labels", "RECORD", mode="REPEATED", fields=[F("key", "STRING"), F("value", "STRING")]),
    F("location", "RECORD", fields=[F("location", "STRING"), F("region", "STRING"),
                                    F("zone", "STRING")]),
    F("cost", "FLOAT"), F("currency", "STRING"), F("currency_conversion_rate", "FLOAT"),
    F("usage", "RECORD", fields=[F("amount", "FLOAT"), F("unit", "STRING"),
                                 F("amount_in_pricing_units", "FLOAT"),
                                 F("pricing_unit", "STRING")]),
    F("credits", "RECORD", mode="REPEATED", fields=[
        F("name", "STRING"), F("amount", "FLOAT"), F("full_name", "STRING"), F("id", "STRING"),
        F("type", "STRING")]),
    F("cost_type", "STRING"),
]
WEEK = parse_week("2026-W47")
L4 = 0.7
"""The small warehouse's L4 price (``tests.exporter.test_compute.PRICE``)."""
NAMESPACES = ("ns-a", HOSTILE, reconcile.UNALLOCATED)
"""What each of the small warehouse's three L4 GPUs does every hour: the training pod's,
the hostile pod's, and one no pod holds."""


def line(hour: datetime, namespace: str | None, cost: float, cluster: str = "c",
         credits: float = 0.0, sku: str = "Nvidia L4 GPU running in Americas") -> dict[str, Any]:
    labels = [{"key": "goog-k8s-cluster-name", "value": cluster}]
    if namespace is not None:
        labels.append({"key": "k8s-namespace", "value": namespace})
    return {
        "billing_account_id": "012345-6789AB-CDEF01",
        "service": {"id": "6F81-5844-456A", "description": "Compute Engine"},
        "sku": {"id": "1D2E-3F4A-5B6C", "description": sku},
        "usage_start_time": hour.isoformat(),
        "usage_end_time": (hour + timedelta(hours=1)).isoformat(),
        "project": {"id": "gpu-prod", "number": "123456789012", "name": "gpu-prod"},
        "labels": labels,
        "location": {"location": "us-central1", "region": "us-central1", "zone": "us-central1-a"},
        "cost": cost, "currency": "USD", "currency_conversion_rate": 1.0,
        "usage": {"amount": 3600.0, "unit": "seconds", "amount_in_pricing_units": 1.0,
                  "pricing_unit": "hour"},
        "credits": [{"name": "Committed use discount: GPU", "amount": credits,
                     "full_name": None, "id": "CUD-1", "type": "COMMITTED_USAGE_DISCOUNT"}]
        if credits else [],
        "cost_type": "regular",
    }


def hours() -> Iterable[datetime]:
    start = WEEK.start
    return (start + timedelta(hours=h) for h in range(7 * 24))


def export(client: bigquery.Client, rows: list[dict[str, Any]]) -> str:
    dataset = f"billing_{uuid.uuid4().hex[:10]}"
    client.create_dataset(dataset)
    table = client.create_table(bigquery.Table(
        f"{PROJECT}.{dataset}.gcp_billing_export_resource_v1_012345_6789AB_CDEF01",
        schema=EXPORT_SCHEMA))
    client.load_table_from_json(rows, table).result()
    return f"{table.project}.{table.dataset_id}.{table.table_id}"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_warehouse(tmp_path_factory.mktemp("reconcile") / "w.duckdb")


def compared(client: bigquery.Client, warehouse: Path, rows: list[dict[str, Any]],
             cluster: str | None = "c") -> Any:
    bill = reconcile.BillingExport(client, export(client, rows))
    store = DuckDBStore(warehouse)
    try:
        checked = reconcile.check(bill.gpu_lines(WEEK.start, WEEK.end, cluster,
                                                 reconcile.cost_bound({("l4", "x"): L4})))
        return reconcile.compare(reconcile.ours(store, WEEK.start, WEEK.end, cluster),
                                 checked.lines)
    finally:
        store.close()


def test_a_bill_at_the_same_prices_reconciles_to_the_cent(
        bq: bigquery.Client, warehouse: Path) -> None:
    t = compared(bq, warehouse, [line(h, ns, L4) for h in hours() for ns in NAMESPACES])
    assert len(t) == 7 * 3
    assert set(t.cause) == {"reconciled"}
    assert t.gap_usd.abs().max() < 0.005
    assert t.cost_usd.sum() == pytest.approx(7 * 24 * 3 * L4, abs=0.01)
    assert set(t.project) == {"gpu-prod"}


def test_a_committed_use_discount_is_the_expected_gap(
        bq: bigquery.Client, warehouse: Path) -> None:
    """The training namespace's GPU under a 30 % commitment credit: its gap is the credit,
    and its cause says so; the rest reconciles."""
    rows = [line(h, ns, L4, credits=-0.3 * L4 if ns == "ns-a" else 0.0)
            for h in hours() for ns in NAMESPACES]
    t = compared(bq, warehouse, rows)
    ns_a = t[t.namespace == "ns-a"]
    assert ns_a.gap_usd.tolist() == pytest.approx([-0.3 * L4 * 24] * 7)
    assert all(c.startswith("credits of -5.04 USD on the bill: committed use") for c in ns_a.cause)
    assert set(t[t.namespace != "ns-a"].cause) == {"reconciled"}
    s = reconcile.summary(t)
    assert s["gap_usd"] == pytest.approx(-0.3 * L4 * 24 * 7)
    assert s["billed_cost_usd"] == pytest.approx(s["cost_usd"])


def test_unmonitored_gpus_other_clusters_and_other_skus(
        bq: bigquery.Client, warehouse: Path) -> None:
    rows = [line(h, ns, L4) for h in hours() for ns in NAMESPACES]
    rows += [line(h, "ns-x", L4) for h in hours()]  # a GPU the exporter never saw
    rows += [line(h, "ns-a", 9.9, cluster="other") for h in hours()]  # another cluster's
    rows += [line(h, "ns-a", 0.5, sku="N1 Predefined Instance Core running in Americas")
             for h in hours()]  # not a GPU line
    t = compared(bq, warehouse, rows)
    x = t[t.namespace == "ns-x"]
    assert len(x) == 7 and x.cost_usd.sum() == 0
    assert all(c == "unmonitored GPUs: 24.0 GPU-hours billed that the exporter did not see"
               for c in x.cause)
    assert set(t[t.namespace != "ns-x"].cause) == {"reconciled"}
    every = compared(bq, warehouse, rows, cluster=None)  # both clusters' bill, one warehouse
    assert set(every[every.namespace == "ns-a"].cause) == {
        "unmonitored GPUs: 24.0 GPU-hours billed that the exporter did not see"}


def test_price_drift(bq: bigquery.Client, warehouse: Path) -> None:
    t = compared(bq, warehouse, [line(h, ns, 0.75 if ns == "ns-a" else L4)
                                 for h in hours() for ns in NAMESPACES])
    ns_a = t[t.namespace == "ns-a"]
    assert ns_a.gap_usd.tolist() == pytest.approx([0.05 * 24] * 7)
    assert set(ns_a.cause) == {"price drift: billed 0.7500 USD a GPU-hour before credits, "
                               "the exporter 0.7000 (prices.book, prices.negotiated)"}


def test_a_bill_without_cost_allocation_has_no_namespace(
        bq: bigquery.Client, warehouse: Path) -> None:
    t = compared(bq, warehouse, [line(h, None, 3 * L4) for h in hours()])
    none = t[t.namespace == reconcile.NO_NAMESPACE]
    assert none.billed_net_usd.sum() == pytest.approx(7 * 24 * 3 * L4)
    assert t.gap_usd.sum() == pytest.approx(0, abs=0.01)  # in total, not per namespace


def test_a_bill_in_euros_is_converted_and_implausible_lines_left_out(
        bq: bigquery.Client, warehouse: Path) -> None:
    """The export's own currency_conversion_rate (EUR per USD) converts each line; a line of
    negative usage and one of 1e12 are not reconciled."""
    rows = [{**line(h, ns, L4 * 0.92), "currency": "EUR", "currency_conversion_rate": 0.92}
            for h in hours() for ns in NAMESPACES]
    rows.append({**line(WEEK.start, "ns-a", 1e12), "currency": "EUR",
                 "currency_conversion_rate": 0.92})
    rows.append({**line(WEEK.start, "ns-a", L4), "usage": {
        "amount": -3600.0, "unit": "seconds", "amount_in_pricing_units": -1.0,
        "pricing_unit": "hour"}})
    bill = reconcile.BillingExport(bq, export(bq, rows))
    checked = reconcile.check(bill.gpu_lines(WEEK.start, WEEK.end, "c",
                                             reconcile.cost_bound({("l4", "x"): L4})))
    assert checked.currencies == ("EUR",)
    assert dict(zip(checked.excluded.reason, checked.excluded.lines, strict=True)) == {
        "implausible_cost": 1, "negative_usage": 1}
    store = DuckDBStore(warehouse)
    try:
        t = reconcile.compare(reconcile.ours(store, WEEK.start, WEEK.end, "c"), checked.lines)
    finally:
        store.close()
    assert set(t.cause) == {"reconciled"}
    assert t.billed_net_usd.sum() == pytest.approx(7 * 24 * 3 * L4, abs=0.01)


def test_report_reconcile_command(emulator: Emulator, warehouse: Path, tmp_path: Path) -> None:
    client = client_for(emulator)
    table = export(client, [line(h, ns, L4, credits=-0.2 if ns == "ns-a" else 0.0)
                            for h in hours() for ns in NAMESPACES])
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"warehouse:\n  bigquery:\n    endpoint: {emulator.url}\n    anonymous: true\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "report", "reconcile", "--billing-table", table,
         "--store", f"duckdb:{warehouse}", "--week", "2026-W47", "--cluster", "c",
         "--config", str(cfg), "--out", str(out)],
        capture_output=True, text=True, timeout=limit(120), check=False)
    assert done.returncode == 0, done.stderr
    assert "gap -33.60" in done.stdout
    assert "7 of 21 rows unreconciled" in done.stdout
    text = (out / "reconcile.md").read_text()
    assert text.startswith("# GPU cost against the bill 2026-W47 — c")
    assert (out / "reconcile.csv").read_text().splitlines()[0] == ",".join(reconcile.COLUMNS)


def test_a_billing_table_is_named_in_full() -> None:
    with pytest.raises(ValueError, match=r"is not PROJECT\.DATASET\.TABLE"):
        reconcile.BillingExport(None, "dataset.table; DROP TABLE x")  # type: ignore[arg-type]




def weekly_with_bill(emulator: Emulator, warehouse: Path, out: Path, table: str) -> Any:
    """The platform report of the week with ``report.billing_table`` set, written to
    ``out``."""
    cfg = load_config(None, overrides={
        "report": {"billing_table": table, "min_coverage": 0.0},
        "warehouse": {"bigquery": {"endpoint": emulator.url, "anonymous": True}}})
    store = DuckDBStore(warehouse)
    try:
        platform, _ = run_weekly(store, WEEK, cfg, PRICE, out, email=False)
    finally:
        store.close()
    return platform


def test_the_weekly_report_reconciles_with_the_configured_bill(
        emulator: Emulator, warehouse: Path, tmp_path: Path) -> None:
    client = client_for(emulator)
    table = export(client, [line(h, ns, L4, credits=-0.2 if ns == "ns-a" else 0.0)
                            for h in hours() for ns in NAMESPACES])
    platform = weekly_with_bill(emulator, warehouse, tmp_path / "out", table)
    found = platform.frame("reconciliation")
    assert list(found.columns) == list(reconcile.COLUMNS)
    assert found.gap_usd.sum() == pytest.approx(-0.2 * 24 * 7)
    assert list(platform.tables)[-1] == "reconciliation"
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## GPU cost against the bill" in text
    assert "credits of -4.80 USD on the bill" in text
    assert (tmp_path / "out" / "reconciliation.csv").exists()
    team = next((tmp_path / "out" / "teams").iterdir())
    assert "GPU cost against the bill" not in (team / "report.md").read_text()


def test_an_unreadable_bill_leaves_the_report_without_its_reconciliation(
        emulator: Emulator, warehouse: Path, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    platform = weekly_with_bill(emulator, warehouse, tmp_path / "out",
                                f"{PROJECT}.no_such_dataset.gcp_billing_export_v1_X")
    assert "reconciliation" not in platform.tables
    assert (tmp_path / "out" / "report.md").exists()
    assert [r for r in caplog.records if r.getMessage().startswith("report without "
                                                                   "reconciliation")]


@pytest.mark.parametrize(("table", "said"), [
    (f"{PROJECT}.no_such_dataset.gcp_billing_export_resource_v1_X",
     f"no dataset 'no_such_dataset' in project {PROJECT}; it has: "),
    (f"{PROJECT}.{{dataset}}.gcp_billing_export_resource_v1_X",
     f"no table 'gcp_billing_export_resource_v1_X' in dataset {PROJECT}.{{dataset}}; it has: "
     "gcp_billing_export_resource_v1_012345_6789AB_CDEF01"),
], ids=["no dataset", "no table"])
def test_report_reconcile_names_the_datasets_and_tables_that_exist(
        emulator: Emulator, warehouse: Path, tmp_path: Path, table: str, said: str) -> None:
    """A billing table that is not there: one line naming what the project or dataset
    holds instead, not a traceback."""
    client = client_for(emulator)
    dataset = export(client, [line(WEEK.start, "ns-a", L4)]).split(".")[1]
    datasets = sorted(d.dataset_id for d in client.list_datasets(PROJECT))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"warehouse:\n  bigquery:\n    endpoint: {emulator.url}\n    anonymous: true\n")
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "report", "reconcile", "--billing-table",
         table.format(dataset=dataset), "--store", f"duckdb:{warehouse}", "--week", "2026-W47",
         "--config", str(cfg), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=limit(120), check=False)
    assert done.returncode == 2
    expected = said.format(dataset=dataset)
    if "no dataset" in expected:
        expected += ", ".join(datasets)
    assert done.stderr.splitlines() == [f"error: {expected}"]


def test_report_weekly_names_the_datasets_of_the_project(
        emulator: Emulator, tmp_path: Path) -> None:
    client = client_for(emulator)
    datasets = sorted(d.dataset_id for d in client.list_datasets(PROJECT))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"warehouse:\n  bigquery:\n    endpoint: {emulator.url}\n    anonymous: true\n")
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "report", "weekly", "--bigquery",
         f"{PROJECT}.no_such_dataset", "--week", "2026-W47", "--config", str(cfg),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=limit(120), check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: no dataset 'no_such_dataset' in project {PROJECT}; it has: "
        f"{', '.join(datasets)}"]
