"""Reconciliation with the bill: the GPU cost this product attributed, per day and
namespace, beside what the Cloud Billing detailed export charged for GPU SKUs.

The bill is the detailed usage cost export to BigQuery (``gcp_billing_export_resource_v1_
<BILLING_ACCOUNT_ID>``) of a billing account whose GKE clusters have cost allocation on:
each GPU line then carries the labels ``goog-k8s-cluster-name`` and ``k8s-namespace``
(``kube:unallocated`` for the GPUs no pod requested). A GPU line is a Compute Engine SKU
whose description names a GPU (``Nvidia L4 GPU running in Americas``, ``H200 141GB GPU
running in Netherlands``, ``... B200 (1 gpu slice) ...``, ``RTX 6000 96GB running in
Belgium``); its GPU-hours are its usage in pricing units (hours), its net cost its cost
plus its credits (committed-use, sustained-use and negotiated discounts arrive as negative
credits).

The bill is read where it is: the BigQuery table (``BillingExport``), or a copy of its
rows in Parquet files (``BillingFile``: an export of the table, or the demo's sample bill),
with the same query.

The exporter's side comes from the warehouse (DuckDB or BigQuery): its ``gpu_usage`` cost
and GPU-hours per day and namespace, the GPU time no pod held as ``kube:unallocated``, as
GKE's cost allocation bills it. ``compare`` puts both side by side and names each gap's
likely cause (``analytics.reconcile_causes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import duckdb
import pandas as pd

from analytics.reconcile_causes import (
    by_cause,
    cause,
)
from analytics.store import DuckDBStore, Param, Store
from analytics.tables import columns
from exporter import duck
from exporter.config import billing_table_problem

if TYPE_CHECKING:
    from google.cloud import bigquery

UNALLOCATED = "kube:unallocated"
"""GKE cost allocation's namespace for the resources no pod requested."""
NO_NAMESPACE = "(none)"
"""A bill line without a ``k8s-namespace`` label (cost allocation off)."""

OURS = f"""
SELECT TIMESTAMP_SECONDS(DIV(UNIX_SECONDS(time), 86400) * 86400) AS day,
       IF(state = 'allocated', namespace, '{UNALLOCATED}') AS namespace,
       SUM(COALESCE(cost_usd, 0)) AS cost_usd, SUM(gpu_seconds) / 3600 AS gpu_hours
FROM {{gpu_usage}}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
GROUP BY 1, 2
"""
"""The exporter's GPU cost and GPU-hours per day (UTC) and namespace."""

BILLED = """
WITH line AS (
  SELECT TIMESTAMP_SECONDS(DIV(UNIX_SECONDS(usage_start_time), 86400) * 86400) AS day,
         project.id AS project,
         IFNULL((SELECT l.value FROM UNNEST(labels) AS l WHERE l.key = 'k8s-namespace'),
                '{none}') AS namespace,
         sku.description AS sku, currency,
         IF(currency = 'USD', 1.0, currency_conversion_rate) AS rate, cost,
         IFNULL((SELECT SUM(c.amount) FROM UNNEST(credits) AS c), 0) AS credits,
         IF(usage.pricing_unit = 'hour', usage.amount_in_pricing_units,
            usage.amount / 3600) AS hours
  FROM `{table}`
  WHERE service.description = 'Compute Engine'
    AND (sku.description IS NULL OR LOWER(sku.description) LIKE '%gpu%'
         OR sku.description LIKE '%RTX %')
    AND usage_start_time >= @start AND usage_start_time < @end
    AND (@cluster IS NULL OR (SELECT l.value FROM UNNEST(labels) AS l
                              WHERE l.key = 'goog-k8s-cluster-name') = @cluster)
), checked AS (
  SELECT *, CASE
      WHEN cost IS NULL OR hours IS NULL OR sku IS NULL THEN 'missing'
      WHEN hours < 0 THEN 'negative_usage'
      WHEN currency IS NULL OR rate IS NULL OR rate <= 0 THEN 'unconvertible'
      WHEN ABS(cost / rate) > @max_usd_per_gpu_hour * GREATEST(hours, 1) THEN 'implausible_cost'
      ELSE '{ok}' END AS problem
  FROM line
)
SELECT day, project, namespace, IFNULL(currency, '(none)') AS currency, problem,
       COUNT(*) AS lines,
       SUM(cost / rate) AS billed_cost_usd, SUM(credits / rate) AS credits_usd,
       SUM(hours) AS billed_gpu_hours
FROM checked
GROUP BY 1, 2, 3, 4, 5
"""
"""The GPU lines of the bill per day (UTC), project, namespace, currency and ``problem``
(``PROBLEMS``; ``ok`` for a line to reconcile), in USD: a line in another currency
converted with the export's own ``currency_conversion_rate`` (its currency per US dollar:
``cost / currency_conversion_rate`` is USD)."""

OK = "ok"
PROBLEMS = {
    "missing": "no cost, usage or SKU (NULL)",
    "negative_usage": "negative usage",
    "implausible_cost": "cost beyond {factor:g}x the highest list price of its GPU-hours",
    "unconvertible": "a currency without a conversion rate to USD",
}
"""Why a bill line is left out of the reconciliation: what the reconciliation shows."""
PLAUSIBLE_FACTOR = 1000.0
"""A line costing more than this many times the price book's highest GPU-hour price for
its GPU-hours (at least one) is not a price anyone pays: a damaged or hand-edited bill."""

COLUMNS = tuple(columns("reconciliation"))
"""The comparison's columns, as the report declares them (``analytics.tables``)."""

READS = ("service", "sku", "usage_start_time", "project", "labels", "cost", "credits",
         "usage", "currency", "currency_conversion_rate")
"""The export's columns ``BILLED`` reads."""


class BillNotFound(ValueError):
    """The bill named is not there; the message says what is, in one line."""


class BillCurrencyError(ValueError):
    """Bill lines in a currency that cannot be converted to USD; the message says which."""


class Bill(Protocol):
    def gpu_lines(self, start: datetime, end: datetime, cluster: str | None,
                  max_usd_per_gpu_hour: float) -> pd.DataFrame:
        """The bill's GPU lines (``BILLED``) of ``[start, end)``, of ``cluster``."""
        ...


def cost_bound(prices: Mapping[tuple[str, str], float]) -> float:
    """The most a bill line may cost per GPU-hour before it is left out as implausible:
    ``PLAUSIBLE_FACTOR`` times the highest price of the book (``(model, provisioning) ->
    USD per GPU-hour``)."""
    return PLAUSIBLE_FACTOR * max(prices.values(), default=100.0)


@dataclass(frozen=True, slots=True)
class CheckedBill:
    """The bill's GPU lines once checked: those to reconcile, in USD, and those left out."""

    lines: pd.DataFrame
    """``BILLED``'s rows whose problem is ``ok``."""
    excluded: pd.DataFrame
    """One row per reason (``PROBLEMS``' key): ``reason``, ``lines``, ``billed_cost_usd``
    (NaN where unknown), ``billed_gpu_hours``; the most lines first."""
    currencies: tuple[str, ...]
    """The currencies of the lines reconciled (USD alone for most bills)."""

    def note(self) -> str:
        """One line on what was converted and left out; empty for a clean USD bill."""
        parts = []
        foreign = [c for c in self.currencies if c != "USD"]
        if foreign:
            parts.append(f"bill in {', '.join(foreign)} converted to USD at the export's "
                         "currency_conversion_rate")
        if len(self.excluded):
            n = int(self.excluded.lines.sum())
            why = ", ".join(f"{int(r.lines)} {describe(str(r.reason))}"
                            for r in self.excluded.itertuples())
            parts.append(f"{n} bill line{'s' if n != 1 else ''} left out ({why})")
        return "; ".join(parts)


def describe(reason: str) -> str:
    return PROBLEMS[reason].format(factor=PLAUSIBLE_FACTOR)


def check(billed: pd.DataFrame) -> CheckedBill:
    """``BILLED``'s rows split into those to reconcile and those left out, counted by
    reason; ``BillCurrencyError`` when lines carry a currency with no rate to USD, since
    leaving them out would make the bill look cheaper than it is."""
    bad = billed[billed.problem == "unconvertible"]
    if len(bad):
        held = ", ".join(sorted({str(c) for c in bad.currency}))
        n = int(bad.lines.sum())
        raise BillCurrencyError(
            f"{n} GPU line{'s' if n != 1 else ''} of the bill in {held} "
            f"{'carry' if n != 1 else 'carries'} no usable currency_conversion_rate: "
            "the cost cannot be converted to USD; export the bill with its rates (Cloud "
            "Billing's BigQuery export has them) or in USD")
    ok = billed[billed.problem == OK].reset_index(drop=True)
    out = billed[billed.problem != OK]
    excluded = (out.groupby("problem", as_index=False)
                .agg(lines=("lines", "sum"),
                     billed_cost_usd=("billed_cost_usd", lambda c: c.sum(min_count=1)),
                     billed_gpu_hours=("billed_gpu_hours", "sum"))
                .rename(columns={"problem": "reason"})
                .sort_values(["lines", "reason"], ascending=[False, True])
                .reset_index(drop=True))
    return CheckedBill(ok, excluded, tuple(sorted({str(c) for c in ok.currency})))


def _listing(names: list[str], what: str) -> str:
    return f"{what}: {', '.join(names)}" if names else f"no {what}"


def table_id(table: str) -> str:
    """``table``, when it names a table in full (``PROJECT.DATASET.TABLE``); else
    ``ValueError``."""
    problem = billing_table_problem(table)
    if problem is not None:
        raise ValueError(f"billing table {problem}")
    return table


class BillingExport:
    """The detailed billing export table in BigQuery, read with typed query parameters."""

    def __init__(self, client: bigquery.Client, table: str) -> None:
        self.client, self.table = client, table_id(table)

    def check(self, timeout: float = 60.0) -> None:
        """Raise ``BillNotFound`` naming the datasets or tables that exist when the table
        or its dataset does not."""
        from google.api_core.exceptions import NotFound

        project, dataset, table = self.table.rsplit(".", 2)
        try:
            self.client.get_table(self.table, timeout=timeout)
            return
        except NotFound:
            pass
        try:
            tables = sorted(t.table_id for t in self.client.list_tables(
                f"{project}.{dataset}", timeout=timeout))
        except NotFound:
            datasets = sorted(d.dataset_id for d in self.client.list_datasets(
                project, timeout=timeout))
            raise BillNotFound(f"no dataset {dataset!r} in project {project}; "
                               f"{_listing(datasets, 'it has')}") from None
        raise BillNotFound(f"no table {table!r} in dataset {project}.{dataset}; "
                           f"{_listing(tables, 'it has')}")

    def gpu_lines(self, start: datetime, end: datetime, cluster: str | None,
                  max_usd_per_gpu_hour: float, timeout: float = 300.0) -> pd.DataFrame:
        """The bill's GPU lines (``BILLED``) of ``[start, end)``, of ``cluster`` (None:
        every cluster's)."""
        from google.cloud import bigquery

        rows = self.client.query_and_wait(
            BILLED.format(table=self.table, none=NO_NAMESPACE, ok=OK),
            job_config=bigquery.QueryJobConfig(query_parameters=[
                bigquery.ScalarQueryParameter("start", "TIMESTAMP", start),
                bigquery.ScalarQueryParameter("end", "TIMESTAMP", end),
                bigquery.ScalarQueryParameter("cluster", "STRING", cluster),
                bigquery.ScalarQueryParameter("max_usd_per_gpu_hour", "FLOAT64",
                                              max_usd_per_gpu_hour)]),
            wait_timeout=timeout)
        frame: pd.DataFrame = rows.to_arrow(create_bqstorage_client=False).to_pandas()
        return frame


class BillingFile:
    """A copy of the export's rows in Parquet (the columns and nesting of the BigQuery
    table): one file, or a directory or glob of them, read with ``BILLED`` in DuckDB."""

    VIEW = "billing_export"

    def __init__(self, path: Path | str) -> None:
        path = Path(path)
        files = sorted(path.glob("*.parquet")) if path.is_dir() else \
            sorted(path.parent.glob(path.name)) if any(c in path.name for c in "*?[") else \
            [path] if path.is_file() else []
        if not files:
            raise BillNotFound(_missing(path))
        self.path = path
        self.con = duckdb.connect()
        self.con.execute("SET TimeZone = 'UTC'")
        listed = "[" + ", ".join(duck.quote(str(f)) for f in files) + "]"
        try:
            held = {str(r[0]) for r in self.con.execute(
                f"SELECT DISTINCT name FROM parquet_schema({listed})").fetchall()}
            self.con.execute(f"CREATE VIEW {self.VIEW} AS SELECT * FROM read_parquet("
                             f"{listed}, union_by_name = true)")
        except duckdb.Error as exc:
            self.con.close()
            raise ValueError(f"{path} is not a Parquet file: {_first_line(exc)}") from None
        lacking = [c for c in READS if c not in held]
        if lacking:
            self.con.close()
            raise ValueError(f"{path} is not a Cloud Billing detailed export: no column "
                             f"{', '.join(lacking)}")

    def gpu_lines(self, start: datetime, end: datetime, cluster: str | None,
                  max_usd_per_gpu_hour: float) -> pd.DataFrame:
        """The bill's GPU lines (``BILLED``) of ``[start, end)``, of ``cluster`` (None:
        every cluster's)."""
        return DuckDBStore(con=self.con).query(
            BILLED.format(table=self.VIEW, none=NO_NAMESPACE, ok=OK),
            {"start": start, "end": end, "cluster": cluster,
             "max_usd_per_gpu_hour": max_usd_per_gpu_hour})

    def close(self) -> None:
        self.con.close()


def _missing(path: Path) -> str:
    """One line: ``path`` is not there, and what its directory holds instead."""
    where = path if path.is_dir() else path.parent
    if not where.is_dir():
        return f"no billing export at {path}: no directory {where}"
    held = sorted(p.name for p in where.iterdir() if p.suffix == ".parquet")
    holds = f"it holds {', '.join(held)}" if held else "it holds no Parquet file"
    if path.is_dir():
        return f"no Parquet file in {path}"
    return f"no billing export at {path}; {where}/ {holds.removeprefix('it ')}"


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()),
                type(exc).__name__)


def ours(store: Store, start: datetime, end: datetime, cluster: str | None) -> pd.DataFrame:
    params: Mapping[str, Param] = {"start": start, "end": end, "cluster": cluster}
    return store.query(OURS, params)


def compare(ours_frame: pd.DataFrame, billed: pd.DataFrame) -> pd.DataFrame:
    """Both sides per day and namespace (a namespace on one side only has zeros on the
    other), with the gap (bill net less the exporter's) and its likely cause; the
    largest gaps first within each day."""
    o = ours_frame.assign(day=pd.to_datetime(ours_frame["day"], utc=True))
    b = billed.assign(day=pd.to_datetime(billed["day"], utc=True))
    projects = b.groupby(["day", "namespace"])["project"].agg(
        lambda p: ", ".join(sorted({str(x) for x in p if x is not None}))).rename("project")
    b = b.groupby(["day", "namespace"])[
        ["billed_cost_usd", "credits_usd", "billed_gpu_hours"]].sum().join(projects)
    o = o.groupby(["day", "namespace"])[["cost_usd", "gpu_hours"]].sum()
    both = o.join(b, how="outer")
    for col in ("cost_usd", "gpu_hours", "billed_cost_usd", "credits_usd", "billed_gpu_hours"):
        both[col] = both[col].astype(float).fillna(0.0)
    both["project"] = both["project"].fillna("")
    both["billed_net_usd"] = both.billed_cost_usd + both.credits_usd
    both["gap_usd"] = both.billed_net_usd - both.cost_usd
    both["cause"] = [cause(r.gpu_hours, r.billed_gpu_hours, r.cost_usd, r.billed_cost_usd,
                           r.credits_usd) for r in both.itertuples()]
    out = both.reset_index()
    out["day"] = out["day"].dt.strftime("%Y-%m-%d")
    out = out.assign(order=-out.gap_usd.abs()).sort_values(["day", "order", "namespace"])
    return out[list(COLUMNS)].reset_index(drop=True)


def summary(table: pd.DataFrame) -> dict[str, float]:
    """The totals: the exporter's cost, the bill's before and after credits, the gap."""
    return {"cost_usd": float(table.cost_usd.sum()),
            "billed_cost_usd": float(table.billed_cost_usd.sum()),
            "credits_usd": float(table.credits_usd.sum()),
            "billed_net_usd": float(table.billed_net_usd.sum()),
            "gap_usd": float(table.gap_usd.sum()),
            "unreconciled_rows": float((table.cause != "reconciled").sum())}


def markdown(table: pd.DataFrame, title: str, bill: CheckedBill | None = None) -> str:
    """The comparison as a Markdown page: the totals, the gap by the kind of its cause, the
    bill lines left out and why, then every row."""
    s = summary(table)
    note = bill.note() if bill is not None else ""
    lines = [f"# {title}", "",
             f"The exporter attributed {s['cost_usd']:,.2f} USD of GPU cost; the bill charged "
             f"{s['billed_cost_usd']:,.2f} USD before credits and {s['billed_net_usd']:,.2f} "
             f"after ({s['credits_usd']:,.2f} of credits): a gap of {s['gap_usd']:,.2f} USD, "
             f"{int(s['unreconciled_rows'])} of {len(table)} rows unreconciled."
             + (f" Note: {note}." if note else ""), ""]
    if len(table):
        lines += ["## The gap by cause", "", "| cause | rows | gap_usd |", "|---|---:|---:|"]
        lines += [f"| {r.cause} | {int(r.rows)} | {r.gap_usd:,.2f} |"
                  for r in by_cause(table).itertuples()]
        lines.append("")
    if bill is not None and len(bill.excluded):
        lines += ["## Bill lines left out", "", "| reason | lines | billed_cost_usd | "
                  "billed_gpu_hours |", "|---|---:|---:|---:|"]
        lines += [f"| {describe(str(r.reason))} | {int(r.lines)} | "
                  f"{'n/a' if pd.isna(r.billed_cost_usd) else f'{r.billed_cost_usd:,.2f}'} | "
                  f"{r.billed_gpu_hours:,.2f} |" for r in bill.excluded.itertuples()]
        lines.append("")
    lines += [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---:" if c.endswith(("_usd", "_hours")) else "---"
                       for c in COLUMNS) + "|"]
    for r in table.itertuples(index=False):
        cells = [f"{v:,.2f}" if isinstance(v, float) else str(v).replace("|", "\\|")
                 for v in r]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
