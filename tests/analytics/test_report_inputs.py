"""Every bad input to ``report weekly`` and ``report reconcile`` (a warehouse, a cluster, a
week, a bill that is not there or not what it should be) is one line on stderr naming
what exists instead, with exit status 2 for a bad name and 1 for a week without data."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exporter.cli import main
from simulator import billing_export


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with an empty bill in the export's schema, a Parquet file that is not
    a bill, and a text file."""
    d = tmp_path_factory.mktemp("inputs")
    pq.write_table(pa.Table.from_pylist([], schema=billing_export.SCHEMA), d / "bill.parquet")
    pq.write_table(pa.table({"cost": [1.0], "sku": ["x"]}), d / "other.parquet")
    (d / "notes.txt").write_text("not a warehouse\n")
    return d


WEEKLY = ["report", "weekly", "--week", "2026-W47"]
RECONCILE = ["report", "reconcile", "--week", "2026-W47"]
CASES = [
    ("weekly: a cluster the warehouse lacks", [*WEEKLY, "--cluster", "prod"], 2,
     "no cluster 'prod' in the warehouse; it has: c, d"),
    ("weekly: a week without data", ["report", "weekly", "--week", "2026-W10"], 1,
     "no data in 2026-W10; the warehouse has data for 2026-W46, 2026-W47; --force writes "
     "the report anyway"),
    ("weekly: a week without the cluster's data",
     ["report", "weekly", "--week", "2026-W46", "--cluster", "d"], 1,
     "no data of cluster 'd' in 2026-W46; the warehouse has data of cluster 'd' for "
     "2026-W47; --force writes the report anyway"),
    ("weekly: a week that does not exist", ["report", "weekly", "--week", "2026-W99"], 2,
     "no such week: '2026-W99'"),
    ("weekly: no warehouse file", [*WEEKLY, "--store", "duckdb:{files}/w.duckdb"], 2,
     "no warehouse at {files}/w.duckdb; {files}/ holds no warehouse"),
    ("weekly: a file that is not a warehouse",
     [*WEEKLY, "--store", "duckdb:{files}/notes.txt"], 2,
     "--store duckdb:{files}/notes.txt: not a duckdb warehouse: IO Error: The file "
     "\"{files}/notes.txt\" exists, but it is not a valid DuckDB database file!"),
    ("weekly: no snapshot directory", [*WEEKLY, "--store", "parquet:{files}/week"], 2,
     "no warehouse at {files}/week; {files}/ holds no warehouse"),
    ("weekly: a store of no known kind", [*WEEKLY, "--store", "sqlite:{files}/w.db"], 2,
     "--store 'sqlite:{files}/w.db': expected duckdb:PATH or parquet:DIR"),
    ("reconcile: a cluster the warehouse lacks",
     [*RECONCILE, "--cluster", "prod", "--billing-file", "{files}/bill.parquet"], 2,
     "no cluster 'prod' in the warehouse; it has: c, d"),
    ("reconcile: a week without data",
     ["report", "reconcile", "--week", "2026-W10", "--billing-file", "{files}/bill.parquet"],
     1, "no data in 2026-W10; the warehouse has data for 2026-W46, 2026-W47"),
    ("reconcile: no bill file", [*RECONCILE, "--billing-file", "{files}/billing.parquet"], 2,
     "no billing export at {files}/billing.parquet; {files}/ holds bill.parquet, "
     "other.parquet"),
    ("reconcile: no bill directory",
     [*RECONCILE, "--billing-file", "{files}/exports/bill.parquet"], 2,
     "no billing export at {files}/exports/bill.parquet: no directory {files}/exports"),
    ("reconcile: a bill that is not Parquet",
     [*RECONCILE, "--billing-file", "{files}/notes.txt"], 2,
     "{files}/notes.txt is not a Parquet file: Invalid Input Error: No magic bytes found at "
     "end of file '{files}/notes.txt'"),
    ("reconcile: Parquet that is not a billing export",
     [*RECONCILE, "--billing-file", "{files}/other.parquet"], 2,
     "{files}/other.parquet is not a Cloud Billing detailed export: no column service, "
     "usage_start_time, project, labels, credits, usage, currency, currency_conversion_rate"),
    ("reconcile: a billing table not named in full",
     [*RECONCILE, "--billing-table", "billing.gcp_billing_export_resource_v1_X"], 2,
     "billing table 'billing.gcp_billing_export_resource_v1_X' is not "
     "PROJECT.DATASET.TABLE"),
    ("reconcile: a billing table without credentials",
     [*RECONCILE, "--billing-table", "p.billing.gcp_billing_export_resource_v1_X"], 2,
     "no Google credentials for BigQuery: File {files}/adc.json was not found."),
]


@pytest.mark.parametrize(("args", "code", "line"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_naming_what_exists(
        shared_warehouse: Path, files: Path, tmp_path: Path, args: list[str], code: int,
        line: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(files / "adc.json"))
    argv = [a.format(files=files) for a in args]
    if "--store" not in argv:
        argv += ["--store", f"duckdb:{shared_warehouse}"]
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == code
    assert capsys.readouterr().err.splitlines() == [f"error: {line.format(files=files)}"]
    assert not out.exists()
