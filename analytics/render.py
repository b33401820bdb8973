"""The report as Markdown, HTML (one page for a browser and for email: charts by file name
or Content-ID), JSON and CSV. Every name that comes from the cluster is escaped for the
format it lands in, and rid of control characters in all of them (``format.text``)."""

from __future__ import annotations

import html
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Literal

import pandas as pd
from jinja2 import Environment, PackageLoader, select_autoescape

from analytics import format as fmt
from analytics.charts import CHARTS, TEAMS_SHOWN, render_all
from analytics.figures.cost import IDLE_CEILING, POOLED
from analytics.headline_text import basis_line, headline_items, price_basis
from analytics.report import WeeklyReport
from analytics.story import slug, story
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
PROSE = 60
"""A column with a value longer than this is prose: in HTML it keeps a reading width on a
narrow screen (its table scrolls instead)."""
EMPTY = "Nothing this week."
"""What an empty table says, unless the report says more (``WeeklyReport.empty``)."""

_encode_str = json.encoder.encode_basestring_ascii
_env = Environment(loader=PackageLoader("analytics"), autoescape=select_autoescape(["html"]),
                   trim_blocks=True, lstrip_blocks=True,
                   finalize=lambda v: fmt.text(v) if isinstance(v, str) else v)


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
        teams = [c for c in table.columns if c not in POOLED]
        table = table[[*teams[:TEAMS_SHOWN], *(c for c in table.columns if c in POOLED)]] \
            .reset_index()
    return table


@dataclass(frozen=True, slots=True)
class Cut:
    """What a table shows in Markdown and HTML of what its CSV holds."""

    shown: int
    total: int
    unit: Literal["rows", "teams"]
    """``teams`` for the daily cost, a column a team."""


def _rows(name: str, table: pd.DataFrame | Table, most: int | None = None
          ) -> tuple[list[str], list[list[str]], Cut | None]:
    """The columns and rows shown (``most`` rows, default ``ROWS``), as text; and the
    cut, if the table holds more."""
    most = ROWS if most is None else most
    t = shown(name, table)
    head = t.head(most)
    cols = [str(c) for c in head.columns]
    rows = [[fmt.cell(c if name != "daily_cost_by_team" or c == "day" else "cost_usd", v)
             for c, v in zip(cols, _rests_on(cols, r), strict=True)]
            for r in head.itertuples(index=False)]
    if name == "daily_cost_by_team":
        teams = len(table.columns)
        cut = Cut(len(cols) - 1, teams, "teams") if len(cols) - 1 < teams else None
    else:
        cut = Cut(len(rows), len(table), "rows") if len(t) > most else None
    return cols, rows, cut


def more_rows(name: str, cut: Cut, quote: str = "") -> str:
    """The line under a table longer than it shows, beside its CSV (its file name between
    ``quote`` marks)."""
    return f"… and {cut.total - cut.shown} more {cut.unit} in {quote}{name}.csv{quote}."


def cuts(report: WeeklyReport, rows: int | None = None) -> dict[str, Cut]:
    """The tables that hold more than Markdown and HTML show (``rows`` of each, default
    ``ROWS``), by name."""
    return {name: cut for name, table in report.tables.items()
            if (cut := _rows(name, table, rows)[2]) is not None}


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


def code(text: str) -> str:
    """Text set as code in Markdown (a path, a file name), or escaped where it cannot be."""
    return md(text) if "`" in text else f"`{fmt.text(text)}`"


def markdown(report: WeeklyReport, notes: Mapping[str, str] | None = None,
             folder: str | None = None, rows: int | None = None) -> str:
    """The report in Markdown; ``notes``, ``folder`` and ``rows`` as for ``html_page``."""
    out = [f"# {md(report.title)}", "",
           f"{report.week.start:%Y-%m-%d} to {report.week.end:%Y-%m-%d} (UTC).", ""]
    if folder:
        out += [f"Every row of every table, as CSV: {code(folder)}", ""]
    if said := story(report):
        out += [md(" ".join(said)), ""]
    out += ["Contents: " + " · ".join(
        f"[{md(report.section_title(n))}](#{slug(report.section_title(n))})"
        for n in report.tables), ""]
    out += [f"- **{k}**: {v}" for k, v in headline_items(report)]
    if (basis := basis_line(report)) is not None:
        out += ["", md(basis)]
    for name, table in report.tables.items():
        out += ["", f"## {md(report.section_title(name))}", ""]
        if name in INTRO:
            out += [INTRO[name], ""]
        cols, lines, cut = _rows(name, table, rows)
        if not lines:
            out.append(md(report.empty.get(name, EMPTY)))
            continue
        out.append("| " + " | ".join(md(fmt.heading(c)) for c in cols) + " |")
        out.append("|" + "|".join("---:" if n else "---" for n in _numeric(name, table)) + "|")
        out += ["| " + " | ".join(md(v) for v in r) + " |" for r in lines]
        if cut:
            out += ["", (notes or {}).get(name) or
                    more_rows(name, cut, "`")]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------- HTML


def html_page(report: WeeklyReport, image_src: dict[str, str],
              notes: Mapping[str, str] | None = None, folder: str | None = None,
              rows: int | None = None) -> str:
    """The HTML page, as written beside the report's files and as the email's body:
    ``image_src`` maps chart names to ``cid:…`` (email) or file names (a report on disk);
    ``notes`` replaces the line under a table longer than it shows (``more_rows``), by
    table; ``folder`` is named under the title as where every row is; ``rows``: of each
    table (default ``ROWS``)."""
    sections = []
    for name, table in report.tables.items():
        cols, lines, cut = _rows(name, table, rows)
        sections.append({"title": report.section_title(name),
                         "anchor": slug(report.section_title(name)),
                         "intro": INTRO.get(name, ""),
                         "columns": [fmt.heading(c) for c in cols], "rows": lines,
                         "right": _numeric(name, table),
                         "prose": [any(len(r[i]) > PROSE for r in lines)
                                   for i in range(len(cols))],
                         "more": "" if cut is None else
                         (notes or {}).get(name) or more_rows(name, cut),
                         "empty": report.empty.get(name, EMPTY)})
    return _env.get_template("report.html").render(
        title=report.title, week=report.week, headline=headline_items(report),
        story=" ".join(story(report)),
        basis=basis_line(report), folder=folder,
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


def _csv(report: WeeklyReport, name: str, table: pd.DataFrame | Table, f: IO[str],
         rows: int | None = None) -> None:
    """CSVs that concatenate: each row with its ``week`` and ``cluster`` first, money to
    the cent, the evidence as JSON. ``rows``: the first rows only."""
    header = True
    for chunk in _chunks(name, table):
        if rows is not None:
            chunk, rows = chunk.head(rows), rows - min(rows, len(chunk))
        _csv_rows(chunk, report).to_csv(f, index=False, header=header)
        header = False
        if rows == 0:
            break
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


def csv_text(report: WeeklyReport, name: str, rows: int | None = None) -> str:
    """A table as its CSV file holds it; ``rows``: its header and first rows only."""
    buf = io.StringIO(newline="")
    _csv(report, name, report.tables[name], buf, rows)
    return buf.getvalue()


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
