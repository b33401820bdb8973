"""The demo's sample bill: a Cloud Billing detailed export made from the simulator's
ground truth and the price book, in the export's schema, whose GPU lines differ from the
truth in four known ways; ``report reconcile`` on it finds exactly those differences."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analytics import reconcile, reconcile_causes
from exporter.cli import main
from exporter.demo import demo_config, step_both, write_sample_bill
from exporter.model.prices import load_price_book
from exporter.runtime.app import open_exporter
from simulator import billing_export
from simulator.billing_export import Difference, SampleBill
from simulator.server import SimulatorServer
from tests.test_end_to_end import day_scenario
from tests.timing import limit

STEP = 600.0
HOURS = 26
"""A day and two hours: the export, a day behind, holds the first day only."""

DOCUMENTED = {
    "billing_account_id": None,
    "service": ["id", "description"],
    "sku": ["id", "description"],
    "usage_start_time": None, "usage_end_time": None,
    "project": ["id", "number", "name", "labels", "ancestry_numbers"],
    "labels": ["key", "value"],
    "system_labels": ["key", "value"],
    "location": ["location", "country", "region", "zone"],
    "resource": ["name", "global_name"],
    "export_time": None,
    "cost": None, "currency": None, "currency_conversion_rate": None,
    "usage": ["amount", "unit", "amount_in_pricing_units", "pricing_unit"],
    "credits": ["name", "amount", "full_name", "id", "type"],
    "invoice": ["month"],
    "cost_type": None,
    "price": ["effective_price", "tier_start_amount", "unit", "pricing_unit_quantity"],
}
"""The detailed usage cost export's columns the sample fills, and each record's fields
(Cloud Billing's documented schema of ``gcp_billing_export_resource_v1_<ACCOUNT>``)."""


@dataclass
class Run:
    out: Path
    bill: SampleBill
    note: str
    truth_cost_usd: float


async def run(out: Path) -> Run:
    scenario = day_scenario().model_copy(update={"step": STEP})
    async with SimulatorServer(scenario) as sim:
        cfg = demo_config(scenario, sim.write_outputs(out).kubeconfig, out)
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(limit(30)):
                await exporter.kube.wait_synced()
            await exporter.cycle(sim.cluster.now)
            await step_both(sim, exporter, round(HOURS * 3600 / STEP))
            wh = exporter.warehouse
            assert wh is not None
            wh.flush(sim.cluster.now, partial=True)
            bill, note = write_sample_bill(sim, exporter, out)
        c = sim.cluster
        prices = load_price_book(None, scenario.region).prices
        truth = c.truth.report(c.start, c.now, utilization=False)
        cost = sum(r.seconds / 3600 * prices[(r.accelerator, r.provisioning)]
                   for r in truth.gpu_seconds)
    return Run(out, bill, note, cost)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return asyncio.run(run(tmp_path_factory.mktemp("bill")))


@pytest.fixture(scope="module")
def reconciled(demo: Run, tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """``report reconcile`` on the demo's warehouse and bill, as a user runs it."""
    out = tmp_path_factory.mktemp("reconciled")
    assert main(["report", "reconcile", "--billing-file", str(demo.out / billing_export.FILE),
                 "--store", f"duckdb:{demo.out / 'warehouse.duckdb'}", "--week", "2026-W47",
                 "--cluster", "test", "--out", str(out)]) == 0
    return pd.read_csv(out / "reconcile.csv", keep_default_na=False)


def by_row(differences: tuple[Difference, ...]) -> dict[tuple[str, str], dict[str, Difference]]:
    rows: dict[tuple[str, str], dict[str, Difference]] = defaultdict(dict)
    for d in differences:
        rows[(d.day, d.namespace)][d.kind] = d
    return rows


def test_the_bill_is_written_in_the_detailed_exports_schema(demo: Run) -> None:
    schema = pq.read_schema(demo.out / billing_export.FILE)
    assert schema.names == list(DOCUMENTED)
    for name, fields in DOCUMENTED.items():
        t = schema.field(name).type
        if fields is None:
            continue
        record = t.value_type if pa.types.is_list(t) else t
        assert [record.field(i).name for i in range(record.num_fields)] == fields, name
    assert pa.types.is_list(schema.field("labels").type)
    assert pa.types.is_list(schema.field("credits").type)
    assert schema.field("usage_start_time").type == pa.timestamp("us", tz="UTC")


def test_the_bill_is_the_truth_at_list_price_plus_the_known_differences(demo: Run) -> None:
    """Made from the simulator's truth, not the warehouse: every dollar of the bill (net)
    is the truth's cost at the book's price, give or take the differences it names."""
    t = demo.bill.table.to_pandas()
    credits = sum(c["amount"] for cs in t.credits for c in cs)
    assert t.cost.sum() + credits == pytest.approx(
        demo.truth_cost_usd + sum(d.cost_usd for d in demo.bill.differences), abs=0.01)
    assert {d.kind for d in demo.bill.differences} == {
        "spot_price", "committed_use", "not_exported", "unmonitored_pool"}
    assert set(t.service.map(lambda s: s["description"])) == {"Compute Engine"}
    skus = set(t.sku.map(lambda s: s["description"]))
    assert "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas" in skus
    assert "Nvidia H100 80GB GPU running in Americas" in skus
    labels = {(kv["key"], kv["value"]) for ls in t.labels for kv in ls}
    assert ("goog-k8s-cluster-name", "test") in labels
    assert ("k8s-namespace", reconcile.UNALLOCATED) in labels
    assert "report reconcile --billing-file" in demo.note


def test_report_reconcile_finds_exactly_the_known_differences(
        demo: Run, reconciled: pd.DataFrame) -> None:
    known = by_row(demo.bill.differences)
    assert {(r.day, r.namespace) for r in reconciled.itertuples()} >= set(known)
    for r in reconciled.itertuples():
        kinds = known.get((r.day, r.namespace), {})
        where = f"{r.day} {r.namespace}: {sorted(kinds)}"
        assert r.gap_usd == pytest.approx(sum(d.cost_usd for d in kinds.values()), abs=0.02), \
            where
        assert r.billed_gpu_hours - r.gpu_hours == pytest.approx(
            sum(d.gpu_hours for d in kinds.values()), abs=0.02), where
        if not kinds:
            assert r.cause == "reconciled", where
        elif "unmonitored_pool" in kinds:
            hours = kinds["unmonitored_pool"].gpu_hours
            assert r.cause == (f"unmonitored GPUs: {hours:.1f} GPU-hours billed that the "
                               "exporter did not see"), where
        elif "not_exported" in kinds:
            hours = -kinds["not_exported"].gpu_hours
            assert r.cause.startswith(f"{hours:.1f} GPU-hours counted that the bill does "
                                      "not charge here"), where
        elif set(kinds) == {"committed_use"}:
            assert r.cause.startswith(
                f"credits of {kinds['committed_use'].cost_usd:,.2f} USD on the bill: "
                "committed use"), where
        elif set(kinds) == {"spot_price"}:
            assert r.cause.startswith("price drift: billed"), where
        else:  # a committed model and spot GPUs in one namespace: whichever dominates
            assert r.cause.startswith(("credits of", "price drift: billed")), where
    days = sorted(set(reconciled.day))
    assert days == ["2026-11-16", "2026-11-17"]
    assert all(known[(r.day, r.namespace)].keys() == {"not_exported"}
               for r in reconciled.itertuples() if r.day == days[-1])
    assert reconciled.gap_usd.sum() == pytest.approx(
        sum(d.cost_usd for d in demo.bill.differences), abs=0.05)
    totals = reconcile_causes.by_cause(reconciled).set_index("cause")
    assert totals.gap_usd.sum() == pytest.approx(reconciled.gap_usd.sum())
    assert int(totals.rows.sum()) == len(reconciled)
    assert {reconcile_causes.kind(c) for c in reconciled.cause} == set(totals.index)
    for name, rows in reconciled.groupby(reconciled.cause.map(reconcile_causes.kind)):
        assert totals.loc[name, "gap_usd"] == pytest.approx(rows.gap_usd.sum())
