"""Report weeks: ISO weeks, Monday 00:00 UTC to the next Monday, and what of the warehouse
a week's report reads. Light on purpose: the exporter imports it to snapshot a week without
loading the report stack."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True, slots=True)
class Week:
    start: datetime
    end: datetime

    @property
    def label(self) -> str:
        year, week, _ = self.start.isocalendar()
        return f"{year}-W{week:02d}"

    @property
    def previous(self) -> Week:
        return Week(self.start - timedelta(days=7), self.start)

    @property
    def days(self) -> list[datetime]:
        return [self.start + timedelta(days=i) for i in range(7)]


POD_LOOKBACK = timedelta(days=35)
"""How far back a pod's latest state is looked for (a pod pending since before the week)."""


QUOTA_LOOKBACK = timedelta(days=1)
"""Kueue quotas are written daily: the day before the week holds the quota it began with."""


def reads(week: Week) -> dict[str, tuple[datetime, datetime]]:
    """The rows of each warehouse table the week's report reads, as a range of the table's
    partition time (``time``, ``updated``, ``end_time``): the week and the week before it
    for the week-over-week figures, pods and Kueue Workloads seen up to ``POD_LOOKBACK``
    before it, and what waited and what sat free in the week."""
    return {"gpu_usage": (week.previous.start, week.end),
            "gpu_pods": (week.start - POD_LOOKBACK, week.end),
            "availability_events": (week.start, week.end),
            "kueue_quotas": (week.start - QUOTA_LOOKBACK, week.end),
            "kueue_workloads": (week.start - POD_LOOKBACK, week.end),
            "gpu_pending": (week.start, week.end),
            "gpu_free": (week.start, week.end)}


def parse_week(text: str) -> Week:
    """``2026-W47`` to that ISO week."""
    m = re.fullmatch(r"(\d{4})-W(\d{2})", text)
    if not m:
        raise ValueError(f"not an ISO week (YYYY-Www): {text!r}")
    try:
        start = datetime.fromisocalendar(int(m.group(1)), int(m.group(2)), 1)
    except ValueError as exc:
        raise ValueError(f"no such week: {text!r}") from exc
    start = start.replace(tzinfo=UTC)
    return Week(start, start + timedelta(days=7))


def week_containing(t: datetime) -> Week:
    t = t.astimezone(UTC)
    monday = (t - timedelta(days=t.weekday())).replace(hour=0, minute=0, second=0,
                                                       microsecond=0)
    return Week(monday, monday + timedelta(days=7))


def last_complete_week(now: datetime) -> Week:
    """The most recent ISO week that has ended by ``now``."""
    return week_containing(now).previous
