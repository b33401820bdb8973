"""How report values read: money, percentages, durations, by column name."""

from __future__ import annotations

import math
from datetime import date, datetime
from typing import Any

import pandas as pd

PERCENT = {"change", "share", "share_of_allocated", "utilization", "utilization_of_allocated",
           "utilization_of_capacity", "availability", "target", "error_budget_left",
           "fragmentation_ratio"}


MINUS = "\N{MINUS SIGN}"

_CONTROL = {c: None for c in [*range(0x20), *range(0x7F, 0xA0)]} | \
    dict.fromkeys(map(ord, "\t\n\v\f\r\x85"), " ")
"""C0 and C1 control characters and DEL: dropped, those that break a line or space
a column read as a space."""


def text(s: str) -> str:
    """Cluster-supplied text (a team, allocation, namespace, pod or model name, from labels
    and annotations anyone may set) with no control character: a NUL or an escape sequence
    never reaches a report, a table cell or a mail."""
    return s.translate(_CONTROL)


def money(v: float | None) -> str:
    return "—" if v is None or _nan(v) else f"${v:,.2f}"


def signed_money(v: float) -> str:
    """An amount with its sign ahead of the dollar (a minus sign, not a hyphen):
    ``+$12.00``."""
    return f"{MINUS if v < 0 else '+'}${abs(v):,.2f}"


def percent(v: float | None, signed: bool = False) -> str:
    if v is None or _nan(v):
        return "—"
    return f"{v:+.1%}" if signed else f"{v:.1%}"


def duration(seconds: float | None) -> str:
    if seconds is None or _nan(seconds):
        return "—"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _nan(v: object) -> bool:
    return isinstance(v, float) and math.isnan(v)


def evidence(ev: dict[str, float]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:.2f}" if abs(v) < 1000 else
                     f"{k.replace('_', ' ')} {v:.3g}" for k, v in sorted(ev.items()))


def cell(column: str, v: Any) -> str:
    """One table value as text."""
    if v is None or _nan(v) or v is pd.NaT:
        return "—"
    if isinstance(v, dict):
        return evidence(v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, pd.Timestamp | datetime):
        return v.strftime("%Y-%m-%d %H:%M")
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, float | int):
        if column.endswith("_usd"):
            return money(float(v))
        if column in PERCENT or column.endswith("_share"):
            return percent(float(v), signed=column == "change")
        if column.endswith("_seconds"):
            return duration(float(v))
        if column.endswith(("_hours", "_gib")):
            return f"{v:,.1f}"
        return f"{v:,}" if isinstance(v, int) else f"{v:,.2f}"
    return text(str(v))


def heading(column: str) -> str:
    return column.replace("_usd", " ($)").replace("_seconds", "").replace("_", " ")
