"""The report's first lines: what the week cost and who spent it, what was paid for and not
used, what waited and why, and the change worth the most — a few sentences written from the
report's own tables, so that they say what the tables say.

Each sentence is left out where its table is empty (a first week, a team's slice without
waits); none invents a figure the tables do not hold.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from analytics.report import WeeklyReport

CAUSE_WORDS = {
    "no_capacity": "the pools they fit were full",
    "scaling_up": "nodes were being added for them",
    "stockout": "the autoscaler could not get the nodes (stockout or quota)",
    "fragmented": "GPUs were free, but not enough of them on one node",
    "quota": "Kueue held them back for quota",
    "unschedulable": "no pool of the cluster could ever run them",
    "preempted": "they had been preempted or reclaimed and waited again",
    "starting": "they were starting (image pulls, init containers)",
}
"""Why pods waited (``exporter.model.pending``'s causes), in a reader's words."""


def _usd(x: float) -> str:
    return f"${x:,.0f}"


def _number(x: object) -> float | None:
    """A figure of a table or the headline; None where it is unknown."""
    if x is None or isinstance(x, str):
        return None
    try:
        value = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def story(report: WeeklyReport) -> list[str]:
    """The sentences, in order."""
    return [s for s in (_spent(report), _unused(report), _waited(report), _change(report))
            if s]


def _spent(report: WeeklyReport) -> str | None:
    h = report.headline
    cost, hours = _number(h.get("cost_usd")), _number(h.get("gpu_hours"))
    if cost is None or hours is None:
        return None
    util = _number(h.get("utilization"))
    scope = f"Team {report.team}'s GPUs" if report.team else "The cluster's GPUs"
    said = f"{scope} cost {_usd(cost)} this week for {hours:,.0f} GPU-hours"
    said += f", {util:.0%} of the held ones busy." if util is not None else "."
    teams = report.frame("cost_by_team") if "cost_by_team" in report.tables else None
    if not report.team and teams is not None and len(teams) > 1:
        top = teams.sort_values("cost_usd", ascending=False).iloc[0]
        share = _number(top.get("share"))
        said += f" {top.team} spent the most: {_usd(float(top.cost_usd))}" + (
            f" ({share:.0%})." if share is not None else ".")
    coverage = _number(h.get("coverage"))
    if coverage is not None and coverage < 0.995:
        said += f" The warehouse holds {coverage:.0%} of the week's hours."
    return said


def _unused(report: WeeklyReport) -> str | None:
    h = report.headline
    unallocated, idle = _number(h.get("unallocated_cost_usd")), _number(h.get("idle_cost_usd"))
    parts = []
    if unallocated and not report.team:
        parts.append(f"{_usd(unallocated)} for GPUs no pod held")
    if idle:
        parts.append(f"{_usd(idle)} for the unused time of GPUs pods held")
    return ("Paid for and not used: " + " and ".join(parts) + ".") if parts else None


def _waited(report: WeeklyReport) -> str | None:
    if "waits" not in report.tables:
        return None
    waits = report.frame("waits")
    if waits.empty or "gpu_hours" not in waits:
        return None
    by_cause = waits.groupby("cause").gpu_hours.sum().sort_values(ascending=False)
    total = float(by_cause.sum())
    if total <= 0:
        return None
    cause, hours = str(by_cause.index[0]), float(by_cause.iloc[0])
    why = CAUSE_WORDS.get(cause, cause.replace("_", " "))
    return (f"Pods waited {total:,.0f} GPU-hours for GPUs; {hours / total:.0%} of that "
            f"because {why}.")


def _change(report: WeeklyReport) -> str | None:
    if "actions" not in report.tables:
        return None
    actions = report.frame("actions")
    if actions.empty or "weekly_saving_usd" not in actions:
        return None
    saving = pd.to_numeric(actions.weekly_saving_usd, errors="coerce")
    if not (saving > 0).any():
        return None
    best = actions.loc[saving.idxmax()]
    what = re.sub(r"\s+", " ", str(best.action)).strip()
    where = str(best.get("where") or "").strip()
    replayed = "replayed" in str(best.get("why") or "")
    return (f"The change worth the most: {what}" + (f" ({where})" if where and where not in
                                                    what else "")
            + f", saving {_usd(float(saving.max()))} a week"
            + (" (its replay's figure)." if replayed else " (an estimate: not replayed)."))


def slug(title: str) -> str:
    """A section title as an anchor (GitHub's way: lower case, punctuation out, spaces to
    hyphens), the same in the Markdown and the HTML."""
    text = re.sub(r"[^\w\- ]", "", title.lower())
    return text.replace(" ", "-")
