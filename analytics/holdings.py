"""What a warehouse holds: its clusters and the weeks with data, so that a report asked
for a cluster or a week it does not hold can say, in one line, what it holds instead."""

from __future__ import annotations

from datetime import UTC, datetime

from analytics.store import Store
from analytics.week import Week, week_containing

DAY_SECONDS = 86_400
CLUSTERS = "SELECT DISTINCT cluster FROM {gpu_usage} WHERE time IS NOT NULL ORDER BY 1"
"""Every cluster that wrote GPU time (the filter on the partition column lets BigQuery
run it on a table that requires one)."""
DAYS = f"""
SELECT DISTINCT DIV(UNIX_SECONDS(time), {DAY_SECONDS}) AS day
FROM {{gpu_usage}}
WHERE time IS NOT NULL AND (@cluster IS NULL OR cluster = @cluster)
"""
"""The UTC days with GPU time (of ``@cluster``; every cluster's when NULL), as whole days
since the epoch."""
IN_WEEK = """
SELECT COUNT(*) AS n FROM (
  SELECT 1 FROM {gpu_usage}
  WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
  LIMIT 1)
"""
SHOWN = 8
"""Weeks named in full; more are summarised as the first and last few."""


def clusters(store: Store) -> list[str]:
    """The clusters the warehouse holds GPU time of."""
    return [str(c) for c in store.query(CLUSTERS)["cluster"]]


def weeks(store: Store, cluster: str | None) -> list[str]:
    """The labels (``2026-W47``) of the weeks with GPU time, oldest first."""
    days = store.query(DAYS, {"cluster": cluster})["day"]
    return sorted({week_containing(datetime.fromtimestamp(int(d) * DAY_SECONDS, UTC)).label
                   for d in days})


def has_data(store: Store, week: Week, cluster: str | None) -> bool:
    """Whether the week holds any GPU time (of ``cluster``)."""
    found = store.query(IN_WEEK, {"start": week.start, "end": week.end, "cluster": cluster})
    return bool(len(found) and int(found["n"].iloc[0]))


def _names(items: list[str]) -> str:
    if len(items) <= SHOWN:
        return ", ".join(items)
    half = SHOWN // 2
    return (f"{', '.join(items[:half])}, ... {', '.join(items[-half:])} "
            f"({len(items)} weeks)")


def unknown_cluster(store: Store, cluster: str | None) -> str | None:
    """One line naming the clusters the warehouse holds, when ``cluster`` is not one of
    them; None when it is (or when no cluster is asked for)."""
    if cluster is None:
        return None
    held = clusters(store)
    if cluster in held:
        return None
    return (f"no cluster {cluster!r} in the warehouse; it has: "
            f"{', '.join(held) if held else 'no GPU time of any cluster'}")


def empty_week(store: Store, week: Week, cluster: str | None) -> str | None:
    """One line naming the weeks with data, when ``week`` has none (of ``cluster``);
    None when it has some."""
    if has_data(store, week, cluster):
        return None
    found = weeks(store, cluster)
    of = f" of cluster {cluster!r}" if cluster is not None else ""
    return (f"no data{of} in {week.label}; the warehouse has data{of} for "
            f"{_names(found) if found else 'no week at all'}")
