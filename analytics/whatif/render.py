"""A what-if written out: Markdown, HTML (the chart inline), a CSV per table, the chart
as PNG, and the few lines a terminal shows. No arithmetic here: the figures are
``analytics.whatif.compare``'s."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analytics import format as fmt
from analytics.whatif.compare import Comparison

CHART = "whatif.png"
TABLES = {"summary": "Side by side", "fidelity": "Fidelity: the week replayed on its own "
          "layout", "teams": "By team", "causes": "GPU-hours waited, by cause",
          "pools": "By node pool"}


@dataclass(frozen=True, slots=True)
class Page:
    title: str
    lines: list[str]
    """What was replayed, on what, and how long it took."""
    comparison: Comparison
    notes: list[str] = field(default_factory=list)
    proposed: str = "proposed"
    """What the proposed layout is called (its file)."""
    actual: str = "the week"
    """What the week's column is called: "the week" (measured), "as recorded" (a pods
    CSV's record)."""


def value(v: object, unit: str) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "—"
    x = float(v)  # type: ignore[arg-type]
    if unit == "usd":
        return fmt.money(x)
    if unit == "ratio":
        return fmt.percent(x)
    if unit == "seconds":
        return fmt.duration(x)
    if unit == "count":
        return f"{x:,.0f}"
    return f"{x:,.1f}"


def delta(v: object, unit: str) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "—"
    x = float(v)  # type: ignore[arg-type]
    if x == 0:
        return "0"
    sign = fmt.MINUS if x < 0 else "+"
    if unit == "ratio":
        return f"{sign}{abs(x) * 100:.1f} pt"
    return sign + value(abs(x), unit)


def summary_rows(c: Comparison, proposed: bool, actual: str = "the week"
                 ) -> tuple[list[str], list[list[str]]]:
    """The summary's rows; a column with nothing in it (no week's own replay, no week
    recorded) left out."""
    s = c.summary
    replayed = bool(s.replay.notna().any()) or not proposed
    week = bool(s.actual.notna().any())
    head = [""] + ([actual] if week else []) + (["replayed"] if replayed else []) + \
        (["proposed", "change"] if proposed else [])
    rows = []
    for r in s.itertuples(index=False):
        row = [str(r.figure)] + ([value(r.actual, r.unit)] if week else []) + \
            ([value(r.replay, r.unit)] if replayed else [])
        if proposed:
            row += [value(r.proposed, r.unit), delta(r.delta, r.unit)]
        rows.append(row)
    return head, rows


def frame_rows(f: pd.DataFrame, actual: str = "the week"
               ) -> tuple[list[str], list[list[str]]]:
    cols = [c for c in f.columns if c != "unit"]
    head = [_heading(c, actual) for c in cols]
    return head, [[_cell(c, v) for c, v in zip(cols, row, strict=True)]
                  for row in f[cols].itertuples(index=False)]


def _heading(column: str, actual: str = "the week") -> str:
    week = "week" if actual == "the week" else actual
    for suffix, word in (("_actual", f" ({week})"), ("_replay", " (replayed)"),
                         ("_proposed", " (proposed)"), ("_delta", " (change)")):
        if column.endswith(suffix):
            return fmt.heading(column.removesuffix(suffix)) + word
    return fmt.heading(column)


def _cell(column: str, v: object) -> str:
    base = column.rsplit("_", 1)[0] if column.endswith(
        ("_actual", "_replay", "_proposed", "_delta")) else column
    if column.endswith("_delta") and isinstance(v, float) and not np.isnan(v):
        unit = "usd" if base.endswith("_usd") else "seconds" if base.endswith("_seconds") \
            else "hours"
        return delta(v, unit)
    return fmt.cell(base, v)


def _markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    return [line(head), "|" + "---|" * len(head), *(line(r) for r in rows)]


def _tables(page: Page) -> list[tuple[str, list[str], list[list[str]]]]:
    c = page.comparison
    proposed = page.proposed != "replayed"
    out = [("summary", *summary_rows(c, proposed, page.actual))]
    if not c.fidelity.empty:
        f = c.fidelity.assign(
            ok=c.fidelity.ok.map({True: "yes", False: "NO"}),
            error=[f"{e:.2%}" if "(s)" not in chk else fmt.duration(e)
                   for chk, e in zip(c.fidelity.check, c.fidelity.error, strict=True)],
            actual=[f"{v:,.2f}" for v in c.fidelity.actual],
            replay=[f"{v:,.2f}" for v in c.fidelity.replay])
        out.append(("fidelity", ["check", "the week", "replayed", "error", "bound", "within"],
                    [list(map(str, r)) for r in f.itertuples(index=False)]))
    for name in ("teams", "causes", "pools"):
        frame = getattr(c, name)
        if not frame.empty:
            out.append((name, *frame_rows(_without_proposed(frame) if not proposed
                                          else frame, page.actual)))
    return out


def _without_proposed(f: pd.DataFrame) -> pd.DataFrame:
    return f[[c for c in f.columns if not c.endswith(("_proposed", "_delta"))]]


def markdown(page: Page, chart: str | None = CHART) -> str:
    out = [f"# {page.title}", "", *page.lines, ""]
    if page.notes:
        out += ["What the replay left out or changed:", "", *(f"- {n}" for n in page.notes),
                ""]
    if chart:
        out += [f"![Cost and queue wait by team]({chart})", ""]
    for name, head, rows in _tables(page):
        out += [f"## {TABLES[name]}", "", *_markdown_table(head, rows), ""]
        if name == "summary" and page.comparison.unchecked:
            out += ["## Fidelity", "", unchecked(page.comparison), ""]
    return "\n".join(out)


def unchecked(c: Comparison) -> str:
    """The line that says there is no fidelity, and why."""
    return f"No fidelity check: {c.unchecked}."


def html_page(page: Page, png: bytes | None) -> str:
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(page.title)}"
             "</title><style>body{font-family:system-ui,sans-serif;margin:24px;color:#202124}"
             "table{border-collapse:collapse;margin:8px 0 20px}td,th{border-bottom:1px solid "
             "#dadce0;padding:4px 10px;text-align:right}td:first-child,th:first-child"
             "{text-align:left}th{background:#f1f3f4}</style></head><body>",
             f"<h1>{e(page.title)}</h1>", *(f"<p>{e(line)}</p>" for line in page.lines)]
    if page.notes:
        parts.append("<p>What the replay left out or changed:</p><ul>"
                     + "".join(f"<li>{e(n)}</li>" for n in page.notes) + "</ul>")
    if png:
        parts.append("<img alt='Cost and queue wait by team' src='data:image/png;base64,"
                     + base64.b64encode(png).decode() + "'>")
    for name, head, rows in _tables(page):
        parts.append(f"<h2>{e(TABLES[name])}</h2><table><tr>"
                     + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
                     + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>"
                               for r in rows) + "</table>")
        if name == "summary" and page.comparison.unchecked:
            parts.append(f"<h2>Fidelity</h2><p>{e(unchecked(page.comparison))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


UNALLOCATED = "(unallocated)"


def _with_unallocated(c: Comparison) -> pd.DataFrame:
    """The teams, and the cost of the GPUs no pod held (``UNALLOCATED``): a layout's new
    node costs what it costs whether a team uses it or not."""
    s = c.summary.set_index("figure")
    row = s.loc["Unallocated cost (free GPUs)"] if "Unallocated cost (free GPUs)" in s.index \
        else None
    if row is None or c.teams.empty:
        return c.teams
    extra = {"team": UNALLOCATED, **{f"cost_usd_{side}": row[side] for side in
                                     ("actual", "replay", "proposed")
                                     if f"cost_usd_{side}" in c.teams}}
    return pd.concat([c.teams, pd.DataFrame([extra])], ignore_index=True)


def team_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """Each team's cost and queue-wait p90, replayed and proposed: what a fleet figure
    hides."""
    t = c.teams
    base = "replay" if "cost_usd_replay" in t else "actual"
    head = ["team", "cost", "proposed", "change", "wait p90", "proposed", "change"]
    rows = []
    for r in t.itertuples(index=False):
        cost, new = getattr(r, f"cost_usd_{base}"), r.cost_usd_proposed
        p90, p90_new = getattr(r, f"wait_p90_seconds_{base}"), r.wait_p90_seconds_proposed
        rows.append([str(r.team), value(cost, "usd"), value(new, "usd"),
                     delta(_minus(new, cost), "usd"), value(p90, "seconds"),
                     value(p90_new, "seconds"), delta(_minus(p90_new, p90), "seconds")])
    return head, rows


def _minus(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or pd.isna(a) or pd.isna(b):
        return None
    d = float(a) - float(b)
    return 0.0 if abs(d) < 0.005 else d


def chart(c: Comparison, proposed: bool = True, actual: str = "the week") -> bytes | None:
    """Cost and queue-wait p90 by team (and the unallocated GPUs' cost): the week, its
    replay, the proposed layout."""
    t = _with_unallocated(c)
    if t.empty:
        return None
    sides = [(s, label) for s, label in (("actual", actual), ("replay", "replayed"),
                                         ("proposed", "proposed"))
             if f"cost_usd_{s}" in t and (proposed or s != "proposed")]
    fig = Figure(figsize=(9, 3.4))
    cost_ax, wait_ax = fig.subplots(1, 2)
    width = 0.8 / len(sides)
    for i, (side, label) in enumerate(sides):
        cost_ax.bar(np.arange(len(t)) + i * width, t[f"cost_usd_{side}"].fillna(0), width,
                    label=label)
        wait_ax.bar(np.arange(len(c.teams)) + i * width,
                    c.teams[f"wait_p90_seconds_{side}"].fillna(0) / 3600, width, label=label)
    for ax, title, unit, names in ((cost_ax, "Cost by team", "USD", t.team),
                                   (wait_ax, "Queue wait p90 by team", "hours", c.teams.team)):
        ax.set_xticks(np.arange(len(names)) + width * (len(sides) - 1) / 2,
                      [fmt.text(str(v)) for v in names], rotation=30, ha="right")
        ax.set_title(title)
        ax.set_ylabel(unit)
    cost_ax.legend(fontsize=8, frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def write(page: Page, out: Path) -> list[Path]:
    """Everything into ``out``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    png = chart(page.comparison, page.proposed != "replayed", page.actual)
    written = []
    if png:
        (out / CHART).write_bytes(png)
        written.append(out / CHART)
    (out / "whatif.md").write_text(markdown(page, CHART if png else None))
    (out / "whatif.html").write_text(html_page(page, png))
    written += [out / "whatif.md", out / "whatif.html"]
    c = page.comparison
    for name in TABLES:
        frame: pd.DataFrame = getattr(c, name)
        path = out / f"{name}.csv"
        frame.to_csv(path, index=False)
        written.append(path)
    return written


def _aligned(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in [head, *rows]]


def terminal(page: Page) -> str:
    """The summary and the fidelity, as a terminal shows them."""
    proposed = page.proposed != "replayed"
    lines = _aligned(*summary_rows(page.comparison, proposed, page.actual))
    teams = page.comparison.teams
    if proposed and "cost_usd_proposed" in teams and ("cost_usd_replay" in teams
                                                       or "cost_usd_actual" in teams):
        lines += ["", "By team (the replay on the week's layout, and on the proposed one):"
                  if "cost_usd_replay" in teams else
                  f"By team ({page.actual}, and the replay on the proposed layout):",
                  *_aligned(*team_rows(page.comparison))]
    if page.comparison.unchecked:
        lines += ["", unchecked(page.comparison)]
    f = page.comparison.fidelity
    if not f.empty:
        bad = f[~f.ok.astype(bool)]
        lines.append("")
        lines.append(f"Fidelity (the week replayed on its own layout): {int(f.ok.sum())} of "
                     f"{len(f)} checks within their bounds (cost 2%, GPU-hours 1%, each "
                     "team's wait p50/p90 10% or one interval)"
                     + ("." if bad.empty else "; outside: " + ", ".join(
                         f"{r.check} {r.actual:,.0f} vs {r.replay:,.0f}"
                         for r in bad.itertuples(index=False))))
    return "\n".join(lines)
