"""The report as Markdown, HTML (for email: inline styles, charts by Content-ID), JSON and
CSV. Every name that comes from the cluster is escaped for the format it lands in, and
rid of control characters in all of them (``format.text``)."""

from __future__ import annotations

import html
import io
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import pandas as pd
from jinja2 import Environment, PackageLoader, select_autoescape

from analytics import format as fmt
from analytics.charts import CHARTS, render_all
from analytics.figures.cost import IDLE_CEILING
from analytics.figures.headline import PriceBasis
from analytics.report import WeeklyReport
from analytics.workspace import Table
from exporter.model.bottleneck import RESTS_ON

ROWS = 15
"""Rows of a table shown in Markdown and HTML; CSV and JSON have them all."""
INTRO = {
    "actions": "Capacity is a saving only where no waiting pod could use it (hour by hour "
               "where the warehouse records why pods waited, else over the week); each "
               "lever answers a cause pods waited for. An action that changes the layout "
               "is worth what its replay moves (What the actions do, replayed); waiting is "
               "told in hours, never in dollars. The savings overlap.",
    "idle_offenders": f"Pods under {IDLE_CEILING:.0%} utilisation, the most idle GPU-hours "
                      "first (a busy job's idle share is not counted here).",
    "bottlenecks": "The largest workloads first; `healthy` ones are left out here.",
    "rightsizing": "Peak memory with 10 % headroom and compute need at most 80 % of the "
                   "suggested GPU; price ratio applied to this week's cost.",
    "spot": "Batch Jobs on on-demand GPUs: with checkpoints they could run on spot.",
    "savings": "Upper bounds; they overlap.",
    "waits": "Each interval's cause is the first that held: starting (image pull, init), "
             "preempted (waiting again after an eviction or a spot reclaim), quota (Kueue "
             "holds it back), unschedulable (no pool offers what it asks), stockout (the "
             "scale-up failed), fragmented (enough GPUs free, not on one node), scaling_up "
             "(nodes coming), no_capacity (the pools it fits full). p90: of the time each "
             "waited for the cause; p90 wait: of its whole wait.",
    "stuck_workloads": "The longest waits, each with the cause that cost it the most time "
                       "and the latest words that cause was decided on (the scheduler's, "
                       "the cluster autoscaler's, Kueue's or the kubelet's), and the cause "
                       "of its latest interval beside it.",
    "stranded": "Free GPUs by what a waiting pod could make of them, interval by interval: "
                "usable, fragment (one fits, asks more), quota (only Jobs Kueue holds back "
                "fit), mismatch (pods wait, none fits), no demand. All but usable are "
                "stranded; the removable cost is what scaling down would have saved.",
}
EMPTY = "Nothing this week."
"""What an empty table says, unless the report says more (``WeeklyReport.empty``)."""

_encode_str = json.encoder.encode_basestring_ascii
_env = Environment(loader=PackageLoader("analytics"), autoescape=select_autoescape(["html"]),
                   trim_blocks=True, lstrip_blocks=True,
                   finalize=lambda v: fmt.text(v) if isinstance(v, str) else v)


def headline_items(report: WeeklyReport) -> list[tuple[str, str]]:
    h = report.headline
    if h["cost_change"] is not None:
        change = f" ({fmt.percent(h['cost_change'], True)} week over week)"
    elif h["previous_cost_usd"] is None:
        change = " (week over week: n/a, no data for the week before)"
    else:
        change = ""
    return [
        ("Total cost", fmt.money(h["cost_usd"]) + change),
        ("Coverage", f"{fmt.percent(h['coverage'])} of the week's hours have data"),
        ("GPU-hours", f"{h['gpu_hours'] or 0:,.0f} capacity, "
                      f"{h['allocated_gpu_hours'] or 0:,.0f} allocated"),
        ("Utilisation of allocated GPUs", fmt.percent(h["utilization"])),
        ("Fleet cost per utilised GPU-hour",
         fmt.money(h["fleet_cost_usd_per_utilized_hour"])),
        ("Idle (allocated, unused)", f"{fmt.money(h['idle_cost_usd'])} "
                                     f"({fmt.percent(h['idle_share'])} of cost)"),
        ("Unallocated capacity", f"{fmt.money(h['unallocated_cost_usd'])} "
                                 f"({fmt.percent(h['unallocated_share'])} of cost)"),
        ("Energy and carbon", _energy(h)),
    ]


def _energy(h: Mapping[str, float | None]) -> str:
    if not h.get("metered_share"):
        return "not measured this week (no GPU energy in the warehouse)"
    if h["energy_change"] is not None:
        change = f" ({fmt.percent(h['energy_change'], True)} week over week)"
    else:
        change = ""
    per = h["kwh_per_utilized_gpu_hour"]
    per_hour = "" if per is None else \
        f"; {per:,.2f} kWh and {h['co2e_g_per_utilized_gpu_hour'] or 0:,.0f} g CO2e per " \
        "utilised GPU-hour"
    unmetered = "" if (h["metered_share"] or 0) >= 0.9995 else \
        f" (energy known for {fmt.percent(h['metered_share'])} of GPU-hours)"
    return (f"{h['energy_kwh'] or 0:,.1f} kWh{change}, {h['co2e_kg'] or 0:,.1f} kg CO2e; "
            f"{h['idle_energy_kwh'] or 0:,.1f} kWh idle, "
            f"{h['unallocated_energy_kwh'] or 0:,.1f} kWh unallocated{per_hour}{unmetered}")


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _dates(basis: PriceBasis) -> str:
    if not basis.as_of:
        return "an undated price book"
    first, last = basis.as_of[0], basis.as_of[-1]
    return f"the price book of {first}" if first == last else \
        f"the price book (prices of {first} to {last})"


def _list_prices(basis: PriceBasis) -> str:
    where = f" of {basis.region}" if basis.region else ""
    text = f"list prices{where} from Google's Cloud Billing catalogue where the exporter " \
        f"read it, else from {_dates(basis)} (the warehouse does not record which)" \
        if basis.catalog else f"list prices{where} from {_dates(basis)}"
    if basis.estimated:
        text += f" ({_and(basis.estimated)}: estimated, not Google's)"
    return text


def _discounts(basis: PriceBasis) -> str:
    off = basis.off_list_usd
    text = f" less {_and(basis.discounts)} discounts" if basis.discounts else \
        ", no discount configured"
    if off is None or (not off and not basis.discounts):
        return text
    if off > 0 and basis.discounts:
        return text + f" ({fmt.signed_money(-off)}, {fmt.percent(basis.off_list_share)} off list)"
    if not off:
        return text + " (none applied this week)"
    return (text + f", though the week's costs differ from them by {fmt.signed_money(-off)} "
            "(priced at other list prices: another book, or the catalogue)")


def _machines(basis: PriceBasis) -> str:
    if basis.basis != "gpu-component":
        return ""
    text = "; the machines the GPUs run in are not included"
    unknown = f"{_and(basis.machine_unknown)}, " \
        f"{fmt.percent(basis.machine_unknown_hour_share)} of GPU-hours" \
        if basis.machine_unknown else ""
    if basis.machine_usd is None or basis.machine_share is None:
        return text + (f", nor known (the book gives no machine share for {unknown})"
                       if unknown else "")
    (lo, hi), (lo_share, hi_share) = basis.machine_usd, basis.machine_share
    cost = f"about {fmt.money(lo)} more at list price, {fmt.percent(lo_share)}" \
        if lo == hi else f"{fmt.money(lo)} to {fmt.money(hi)} more at list price by " \
        f"machine type, {fmt.percent(lo_share)} to {fmt.percent(hi_share)}"
    if not unknown:
        return text + f" ({cost} of the total)"
    return text + (f" ({cost} of the total of {_and(basis.machine_models)}; not known for "
                   f"{unknown}, for which the book gives no machine share)")


def _spot(basis: PriceBasis) -> str:
    if not basis.spot_hour_share:
        return "; no spot GPUs"
    return f"; spot GPUs {fmt.percent(basis.spot_hour_share)} of GPU-hours, " \
        f"{fmt.percent(basis.spot_cost_share)} of cost"


def price_basis(basis: PriceBasis) -> str:
    """The line under the headline: what the costs are priced on and what they leave out."""
    what = "GPU component only" if basis.basis == "gpu-component" else \
        f"the book's basis {basis.basis!r}"
    unpriced = f"; {basis.unpriced_gpu_hours:,.1f} GPU-hours unpriced, not in the cost" \
        if basis.unpriced_gpu_hours >= 0.05 else ""
    return (f"Prices: {what}, at {_list_prices(basis)}{_discounts(basis)}{_machines(basis)}"
            f"{_spot(basis)}{unpriced}.")


def basis_line(report: WeeklyReport) -> str | None:
    prices = None if report.basis is None else price_basis(report.basis)
    carbon = None if report.carbon is None else f"CO2e: {report.carbon}."
    return " ".join(x for x in (prices, carbon) if x) or None


def shown(name: str, table: pd.DataFrame | Table) -> pd.DataFrame | Table:
    if isinstance(table, Table):
        if name == "bottlenecks":
            return table.view("bottleneck != 'healthy'", "gpu_hours DESC, workload",
                              drop=("advice",))
        return table
    if name == "bottlenecks" and not table.empty:
        table = table[table.bottleneck != "healthy"].sort_values(
            ["gpu_hours", "workload"], ascending=[False, True]).drop(columns="advice")
    if name == "daily_cost_by_team":
        table = table.reset_index()
    return table


def _rows(name: str, table: pd.DataFrame | Table) -> tuple[list[str], list[list[str]], int]:
    t = shown(name, table)
    head = t.head(ROWS)
    cols = [str(c) for c in head.columns]
    rows = [[fmt.cell(c if name != "daily_cost_by_team" or c == "day" else "cost_usd", v)
             for c, v in zip(cols, _rests_on(cols, r), strict=True)]
            for r in head.itertuples(index=False)]
    return cols, rows, max(0, len(t) - ROWS)


def _rests_on(cols: list[str], row: tuple[Any, ...]) -> tuple[Any, ...]:
    """The row with its evidence cut to what its class rests on."""
    if "evidence" not in cols or "bottleneck" not in cols:
        return row
    i = cols.index("evidence")
    ev, cls = row[i], row[cols.index("bottleneck")]
    if not isinstance(ev, dict):
        return row
    keys = RESTS_ON.get(cls, ())
    return (*row[:i], {k: v for k, v in ev.items() if k in keys}, *row[i + 1:])


def _numeric(name: str, table: pd.DataFrame | Table) -> list[bool]:
    """Which of the columns ``_rows`` shows hold numbers (set flush right)."""
    head = shown(name, table).head(0)
    # evidence is a dict per row, stored as an empty column until the rows are read
    return [pd.api.types.is_numeric_dtype(head[c]) and not pd.api.types.is_bool_dtype(head[c])
            and c != "evidence" for c in head.columns]


# ---------------------------------------------------------------------------- Markdown

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md(text: str) -> str:
    """Cluster-supplied text, inert in Markdown (and in the HTML Markdown may embed)."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(fmt.text(text), quote=False))


def markdown(report: WeeklyReport) -> str:
    out = [f"# {md(report.title)}", "",
           f"{report.week.start:%Y-%m-%d} to {report.week.end:%Y-%m-%d} (UTC).", ""]
    out += [f"- **{k}**: {v}" for k, v in headline_items(report)]
    if (basis := basis_line(report)) is not None:
        out += ["", md(basis)]
    for name, table in report.tables.items():
        out += ["", f"## {md(report.section_title(name))}", ""]
        if name in INTRO:
            out += [INTRO[name], ""]
        cols, rows, more = _rows(name, table)
        if not rows:
            out.append(md(report.empty.get(name, EMPTY)))
            continue
        out.append("| " + " | ".join(md(fmt.heading(c)) for c in cols) + " |")
        out.append("|" + "|".join("---:" if n else "---" for n in _numeric(name, table)) + "|")
        out += ["| " + " | ".join(md(v) for v in r) + " |" for r in rows]
        if more:
            out += ["", f"… and {more} more rows in `{name}.csv`."]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------- HTML


def html_page(report: WeeklyReport, image_src: dict[str, str]) -> str:
    """The HTML email body; ``image_src`` maps chart names to ``cid:…`` (email) or file
    names (a report on disk)."""
    sections = []
    for name, table in report.tables.items():
        cols, rows, more = _rows(name, table)
        sections.append({"title": report.section_title(name), "intro": INTRO.get(name, ""),
                         "columns": [fmt.heading(c) for c in cols], "rows": rows,
                         "align": ["right" if n else "left" for n in _numeric(name, table)],
                         "more": more, "csv": f"{name}.csv",
                         "empty": report.empty.get(name, EMPTY)})
    return _env.get_template("report.html").render(
        title=report.title, week=report.week, headline=headline_items(report),
        basis=basis_line(report),
        sections=sections, charts=[(CHARTS[k], image_src[k]) for k in CHARTS])


# ---------------------------------------------------------------------------- data


def _jsonable(v: Any) -> Any:
    if isinstance(v, pd.Timestamp):
        return v.isoformat()
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, float) and v != v:
        return None
    return v


def _chunks(name: str, table: pd.DataFrame | Table) -> Iterator[pd.DataFrame]:
    """A table's rows as files have them, a chunk at a time."""
    if isinstance(table, Table):
        yield from table.chunks()
    else:
        yield table.reset_index() if name == "daily_cost_by_team" else table


def _columns(name: str, table: pd.DataFrame | Table) -> list[str]:
    if isinstance(table, Table):
        return table.columns
    t = table.reset_index() if name == "daily_cost_by_team" else table
    return [str(c) for c in t.columns]


_INF = float("inf")
_ROW = "   "
"""Where a table's rows stand in the report's JSON (``indent=1``, three levels deep)."""


def _json_value(v: Any, pad: str) -> str:
    """One value as ``json.dumps(_jsonable(v), indent=1)`` writes it at ``pad``."""
    if v is None:
        return "null"
    if isinstance(v, str):
        return _encode_str(fmt.text(v))
    if type(v) is float:
        if v != v:
            return "null"
        return float.__repr__(v) if abs(v) != _INF else ("Infinity" if v > 0 else "-Infinity")
    if type(v) is int:
        return int.__repr__(v)
    if isinstance(v, dict) and v:
        inner = pad + " "
        return "{\n" + ",\n".join(f"{inner}{_encode_str(fmt.text(str(k)))}: "
                                  f"{_json_value(x, inner)}"
                                  for k, x in v.items()) + f"\n{pad}}}"
    return json.dumps(_texts(_jsonable(v)), default=_jsonable)


def _texts(v: Any) -> Any:
    """``v`` with ``format.text`` applied to every string in it, keys included."""
    if isinstance(v, str):
        return fmt.text(v)
    if isinstance(v, dict):
        return {_texts(k): _texts(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_texts(x) for x in v]
    return v


def _json_rows(chunk: pd.DataFrame) -> list[str]:
    """The rows of a chunk as the report's JSON has them, encoded column by column."""
    if not len(chunk.columns):
        return [_ROW + "{}"] * len(chunk)
    pad = _ROW + " "
    keys = [f"{pad}{_encode_str(fmt.text(str(c)))}: " for c in chunk.columns]
    columns = [[k + _json_value(v, pad) for v in chunk[c].tolist()]
               for k, c in zip(keys, chunk.columns, strict=True)]
    return [f"{_ROW}{{\n" + ",\n".join(values) + f"\n{_ROW}}}"
            for values in zip(*columns, strict=True)]


JSON_SCHEMA_VERSION = 1
"""``schema_version`` of ``report.json``: raised when a key or a table's column changes
meaning or goes."""


def write_json(report: WeeklyReport, out: IO[str]) -> None:
    """The report and every row of its tables as JSON, in ``json.dumps(..., indent=1)``'s
    layout, written a chunk of rows at a time."""
    head = json.dumps(_texts({"schema_version": JSON_SCHEMA_VERSION,
                              "week": report.week.label, "cluster": report.cluster,
                              "team": report.team, "sla_target": report.sla_target,
                              "headline": report.headline,
                              "price_basis": None if report.basis is None else
                              asdict(report.basis) | {"line": price_basis(report.basis)},
                              "carbon_basis": report.carbon,
                              "tables": {}}),
                      indent=1, default=_jsonable)
    if not report.tables:
        out.write(head)
        return
    out.write(head.removesuffix("{}\n}") + "{")
    for i, (name, table) in enumerate(report.tables.items()):
        out.write(("," if i else "") + f"\n  {_encode_str(name)}: [")
        first = True
        for chunk in _chunks(name, table):
            rows = _json_rows(chunk)
            if rows:
                out.write(("\n" if first else ",\n") + ",\n".join(rows))
                first = False
        out.write("]" if first else "\n  ]")
    out.write("\n }\n}")


def as_json(report: WeeklyReport) -> str:
    buf = io.StringIO()
    write_json(report, buf)
    return buf.getvalue()


def write_csv(report: WeeklyReport, name: str, table: pd.DataFrame | Table,
              path: Path) -> None:
    """One table as CSV, a chunk of rows at a time."""
    with open(path, "w", newline="") as f:
        _csv(report, name, table, f)


def _csv(report: WeeklyReport, name: str, table: pd.DataFrame | Table, f: IO[str]) -> None:
    """CSVs that concatenate: each row with its ``week`` and ``cluster`` first, money to
    the cent, the evidence as JSON."""
    header = True
    for chunk in _chunks(name, table):
        _csv_rows(chunk, report).to_csv(f, index=False, header=header)
        header = False
    if header:
        pd.DataFrame(columns=["week", "cluster", *map(fmt.text, _columns(name, table))]
                     ).to_csv(f, index=False)


def is_money(column: str) -> bool:
    """Whether a column holds US dollars (``cost_usd``, ``effective_cost_usd_per_…``)."""
    return column.endswith("_usd") or "_usd_" in column


def _csv_rows(chunk: pd.DataFrame, report: WeeklyReport) -> pd.DataFrame:
    out = chunk.copy()
    for c in out.columns:
        if is_money(str(c)) and pd.api.types.is_numeric_dtype(out[c]):
            out[c] = out[c].round(2)
    if "evidence" in out.columns:
        out["evidence"] = [json.dumps(_jsonable(e), default=_jsonable)
                           if isinstance(e, dict) else e for e in out["evidence"]]
    for c in out.columns:
        if pd.api.types.is_object_dtype(out[c]) or pd.api.types.is_string_dtype(out[c]):
            out[c] = [fmt.text(v) if isinstance(v, str) else v for v in out[c]]
    out.columns = [fmt.text(str(c)) for c in out.columns]  # teams, by day
    out.insert(0, "cluster", fmt.text(report.cluster))
    out.insert(0, "week", report.week.label)
    return out


def cited_csvs(report: WeeklyReport) -> dict[str, bytes]:
    """The CSVs the Markdown and HTML cite (``… and N more rows in name.csv``), by file
    name: those of the tables longer than what they show."""
    out = {}
    for name, table in report.tables.items():
        if _rows(name, table)[2]:
            buf = io.StringIO(newline="")
            _csv(report, name, table, buf)
            out[f"{name}.csv"] = buf.getvalue().encode()
    return out


def write(report: WeeklyReport, out: Path) -> dict[str, bytes]:
    """Every format into ``out``; returns the charts (for the email)."""
    out.mkdir(parents=True, exist_ok=True)
    charts = render_all(report)
    for name, png in charts.items():
        (out / f"{name}.png").write_bytes(png)
    (out / "report.md").write_text(markdown(report))
    (out / "report.html").write_text(html_page(report, {k: f"{k}.png" for k in charts}))
    with open(out / "report.json", "w") as f:
        write_json(report, f)
    for name, table in report.tables.items():
        write_csv(report, name, table, out / f"{name}.csv")
    for t in (*report.tables.values(), report.pods):
        if isinstance(t, Table):
            t.ws.close()
    return charts
