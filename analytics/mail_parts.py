"""What the report's email carries besides its pages, so that it arrives whole: under each
table longer than the email shows, a line that says how many rows the table has and where
they all are (the CSV in the report folder, the attachment); and, attached, each such
table's header and first rows, within a budget that keeps the message small (the folder
has every row)."""

from __future__ import annotations

import csv
from dataclasses import dataclass

from analytics import render
from analytics.render import Cut
from analytics.report import WeeklyReport

ROWS = 10
"""Rows of a table the email shows (the report's own pages show ``render.ROWS``)."""
ATTACHED_ROWS = 100
"""The most rows of a table attached to the email."""
ATTACHMENTS_BYTES = 100_000
"""What the attachments hold at most, together, shared evenly by the tables cut; the
message, charts and both alternatives included, stays under 500 KB."""


@dataclass(frozen=True, slots=True)
class Attachment:
    """A table's CSV attached to the email: its header and its first ``rows`` rows."""

    filename: str
    data: bytes
    rows: int
    whole: bool
    """Whether it holds every row, as the report folder's CSV does."""


def first_records(text: str, most: int, budget: int) -> tuple[str, int, bool]:
    """A CSV's header and its first records, at most ``most`` of them and within
    ``budget`` bytes (whole records only, however many lines one spans): the text, how
    many records, and whether they are all the CSV's records."""
    lines = text.splitlines(keepends=True)
    reader = csv.reader(lines)
    ends = [reader.line_num for _ in reader]  # the line each record ends on
    if not ends:
        return "", 0, True
    size = [0]
    for line in lines:
        size.append(size[-1] + len(line.encode()))
    kept = 0
    while kept < min(most, len(ends) - 1) and size[ends[kept + 1]] <= budget:
        kept += 1
    return "".join(lines[:ends[kept]]), kept, kept == len(ends) - 1


def attachments(report: WeeklyReport, cuts: dict[str, Cut]) -> dict[str, Attachment]:
    """The first rows of each table cut (``render.cuts``), by table: those that fit."""
    budget = ATTACHMENTS_BYTES // max(1, len(cuts))
    out = {}
    for name in cuts:
        # a row more than attached: whether the table has more shows in what is read
        text, rows, whole = first_records(render.csv_text(report, name, ATTACHED_ROWS + 1),
                                          ATTACHED_ROWS, budget)
        if rows:
            filename = f"{name}.csv" if whole else f"{name}-first-{rows}.csv"
            out[name] = Attachment(filename, text.encode(), rows, whole)
    return out


def notes(cuts: dict[str, Cut], attached: dict[str, Attachment], folder: str | None,
          quote: str = "") -> dict[str, str]:
    """The line under each table cut, by table: how much of it the email shows, and where
    the rest is (file names between ``quote`` marks)."""
    out = {}
    for name, cut in cuts.items():
        line = f"{cut.shown} of {cut.total:,} {cut.unit} shown"
        a = attached.get(name)
        csv_name = f"{quote}{name}.csv{quote}"
        if a is not None and a.whole:
            line += f"; all of them in the attached {csv_name}" + \
                (" and in the report folder." if folder else ".")
        elif a is not None:
            line += f"; the first {a.rows:,} rows in the attached {quote}{a.filename}{quote}" \
                + (f", all of them in {csv_name} in the report folder." if folder else ".")
        else:
            line += f"; all of them in {csv_name} in the report folder." if folder else "."
        out[name] = line
    return out
