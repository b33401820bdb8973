"""``report reconcile`` checks the bill it reads: a bill in another currency is converted to
USD with the export's own ``currency_conversion_rate`` or refused in one line, and lines no
bill should hold (NULLs, negative usage, a cost no GPU-hour costs) are counted, left out
and shown. Bills are Parquet files in the detailed export's schema (``simulator.
billing_export.SCHEMA``), against the small warehouse (three L4 GPUs every hour of W47, at
0.70 USD a GPU-hour)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analytics import reconcile
from analytics.week import parse_week
from exporter.cli import main
from simulator import billing_export
from tests.analytics.conftest import HOSTILE

WEEK = parse_week("2026-W47")
L4 = 0.7
NAMESPACES = ("ns-a", HOSTILE, reconcile.UNALLOCATED)
EUR_PER_USD = 0.92


def line(hour: datetime, namespace: str, cost: float | None = L4, currency: str | None = "USD",
         rate: float | None = 1.0, hours: float | None = 1.0,
         sku: str | None = "Nvidia L4 GPU running in Americas") -> dict[str, Any]:
    return {
        "service": {"id": "6F81-5844-456A", "description": "Compute Engine"},
        "sku": {"id": "1D2E-3F4A-5B6C", "description": sku},
        "usage_start_time": hour, "usage_end_time": hour + timedelta(hours=1),
        "project": {"id": "gpu-prod", "number": "123456789012", "name": "gpu-prod",
                    "labels": [], "ancestry_numbers": None},
        "labels": [{"key": "goog-k8s-cluster-name", "value": "c"},
                   {"key": "k8s-namespace", "value": namespace}],
        "cost": cost, "currency": currency, "currency_conversion_rate": rate,
        "usage": {"amount": None if hours is None else hours * 3600, "unit": "seconds",
                  "amount_in_pricing_units": hours, "pricing_unit": "hour"},
        "credits": [],
    }


def week_of(**kw: Any) -> list[dict[str, Any]]:
    """The whole week, every GPU's hour as its own line, as the warehouse has it."""
    return [line(WEEK.start + timedelta(hours=h), ns, **kw)
            for h in range(7 * 24) for ns in NAMESPACES]


NOON = WEEK.start + timedelta(hours=12)
Bill = Callable[[], list[dict[str, Any]]]
CASES: list[tuple[str, Bill, str, int, dict[str, int]]] = [
    ("a USD bill", week_of, "", 0, {}),
    ("a EUR bill with its rates",
     lambda: week_of(cost=L4 * EUR_PER_USD, currency="EUR", rate=EUR_PER_USD),
     "bill in EUR converted to USD at the export's currency_conversion_rate", 0, {}),
    ("a 1e12 cost", lambda: [*week_of(), line(NOON, "ns-a", cost=1e12)],
     "1 bill line left out (1 cost beyond 1000x the highest list price of its GPU-hours)",
     0, {"implausible_cost": 1}),
    ("a refund of 1e12", lambda: [*week_of(), line(NOON, "ns-a", cost=-1e12)],
     "1 bill line left out (1 cost beyond", 0, {"implausible_cost": 1}),
    ("negative usage", lambda: [*week_of(), line(NOON, "ns-a", hours=-5.0),
                                line(NOON, HOSTILE, hours=-1.0)],
     "2 bill lines left out (2 negative usage)", 0, {"negative_usage": 2}),
    ("NULL cost, usage and SKU",
     lambda: [*week_of(), line(NOON, "ns-a", cost=None), line(NOON, "ns-a", hours=None),
              line(NOON, "ns-a", sku=None)],
     "3 bill lines left out (3 no cost, usage or SKU (NULL))", 0, {"missing": 3}),
    ("each kind at once",
     lambda: [*week_of(), line(NOON, "ns-a", cost=None), line(NOON, "ns-a", hours=-1.0),
              line(NOON, "ns-a", hours=-2.0), line(NOON, "ns-a", cost=5e9)],
     "4 bill lines left out (2 negative usage, 1 cost beyond 1000x the highest list price "
     "of its GPU-hours, 1 no cost, usage or SKU (NULL))",
     0, {"negative_usage": 2, "implausible_cost": 1, "missing": 1}),
]


@pytest.mark.parametrize(("bill", "note", "code", "excluded"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_reconcile_checks_its_bill(small_warehouse: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str], bill: Bill, note: str,
                                   code: int, excluded: dict[str, int]) -> None:
    file = tmp_path / "bill.parquet"
    pq.write_table(pa.Table.from_pylist(bill(), schema=billing_export.SCHEMA), file)
    out = tmp_path / "out"
    assert main(["report", "reconcile", "--billing-file", str(file), "--store",
                 f"duckdb:{small_warehouse}", "--week", WEEK.label, "--cluster", "c",
                 "--out", str(out)]) == code
    printed = capsys.readouterr()
    assert printed.err == ""
    (said,) = printed.out.splitlines()
    assert note in said
    if not note:
        assert "left out" not in said and "converted" not in said
    # what is left reconciles to the cent: nothing implausible reached the comparison
    table = pd.read_csv(out / "reconcile.csv", keep_default_na=False)
    assert set(table.cause) == {"reconciled"}
    assert table.billed_net_usd.sum() == pytest.approx(7 * 24 * 3 * L4, abs=0.01)
    assert "gap 0.00" in said or "gap -0.00" in said
    page = (out / "reconcile.md").read_text()
    assert note in page and ("Note:" in page) == bool(note)
    assert ("## Bill lines left out" in page) == bool(excluded)
    for reason, n in excluded.items():
        assert f"| {reconcile.describe(reason)} | {n} |" in page


@pytest.mark.parametrize(("currency", "rate"), [
    ("EUR", None), ("EUR", 0.0), ("JPY", -1.0), (None, 1.0)])
def test_a_bill_that_cannot_be_converted_is_refused_in_one_line(
        small_warehouse: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        currency: str | None, rate: float | None) -> None:
    file = tmp_path / "bill.parquet"
    rows = [*week_of(), line(NOON, "ns-a", cost=L4 * 100, currency=currency, rate=rate)]
    pq.write_table(pa.Table.from_pylist(rows, schema=billing_export.SCHEMA), file)
    out = tmp_path / "out"
    assert main(["report", "reconcile", "--billing-file", str(file), "--store",
                 f"duckdb:{small_warehouse}", "--week", WEEK.label, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: reconciling {WEEK.label}: 1 GPU line of the bill in "
                   f"{currency or '(none)'} carries no usable currency_conversion_rate: "
                   "the cost cannot be converted to USD; export the bill with its rates "
                   "(Cloud Billing's BigQuery export has them) or in USD\n")
    assert not out.exists()


@pytest.mark.parametrize(("prices", "bound"), [
    ({("nvidia-l4", "on-demand"): 0.7, ("nvidia-h200", "on-demand"): 10.0}, 10_000.0),
    ({("nvidia-l4", "spot"): 0.25}, 250.0)])
def test_the_cost_bound_follows_the_dearest_gpu_hour(prices: dict[tuple[str, str], float],
                                                      bound: float) -> None:
    assert reconcile.cost_bound(prices) == pytest.approx(bound)
