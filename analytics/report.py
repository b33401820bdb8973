"""The weekly cost and bottleneck report: built from the warehouse, for the whole
platform or one team's slice."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pandas as pd

from analytics import queries
from analytics.figures.actions import actions, savings, team_actions
from analytics.figures.availability import PREEMPTED, availability, incidents
from analytics.figures.bottlenecks import (
    bottleneck_summary,
    bottleneck_table,
    classify_arrow,
    with_evidence,
)
from analytics.figures.cost import (
    COST_DIMENSIONS,
    cost_by,
    daily_by_team,
    idle_offenders,
    unallocated_by_pool,
)
from analytics.figures.energy import energy_by, energy_headline
from analytics.figures.headline import PriceBasis, Pricing, coverage, headline, price_basis
from analytics.figures.queue import QUEUE_STATES, kueue, longest_waits_of, queue
from analytics.figures.rightsizing import prepare, rightsizing_table, spot_table
from analytics.figures.waits import (
    empty_note,
    pool_hours,
    stranded_by_pool,
    stranded_note,
    stuck_note,
    waited,
)
from analytics.store import Store
from analytics.tables import TABLES
from analytics.week import Week
from analytics.workspace import Table, Workspace

SECTIONS = {t.name: t.title for t in TABLES}
"""Tables in report order, with their titles (``analytics.tables``)."""


@dataclass(slots=True)
class WeeklyReport:
    week: Week
    cluster: str
    team: str | None
    """None: the whole platform; else the team's slice."""
    sla_target: float
    headline: dict[str, float | None]
    tables: dict[str, pd.DataFrame | Table] = field(default_factory=dict)
    """Small tables as frames; the per-workload ones (a row per workload, as many as the
    fleet runs) as ``Table``s kept in the report's workspace."""
    pods: pd.DataFrame | Table = field(default_factory=pd.DataFrame)
    """Each pod's week with its bottleneck class (not rendered; the tables summarise it)."""
    allocation: str | None = None
    """What ``cost_by_allocation`` is by (config: ``allocation``), for its heading."""
    basis: PriceBasis | None = None
    """What the costs are priced on (the line under the headline)."""
    empty: dict[str, str] = field(default_factory=dict)
    """What an empty table means, by table, where it says more than that nothing happened
    (the waits of a warehouse that does not record them)."""
    carbon: str | None = None
    """What the CO2e figures rest on: the carbon data, its year and basis, and the PUE."""

    def section_title(self, name: str) -> str:
        """A table's heading: ``SECTIONS``' title, the allocation's named."""
        if name == "cost_by_allocation" and self.allocation:
            return f"Cost by {self.allocation}"
        return SECTIONS[name]

    def frame(self, name: str) -> pd.DataFrame:
        """A table as a frame (a per-workload one read whole from the workspace)."""
        table = self.tables[name]
        return table.frame() if isinstance(table, Table) else table

    @property
    def title(self) -> str:
        scope = f"team {self.team}" if self.team else "all teams"
        return f"GPU cost and bottleneck report {self.week.label} — {self.cluster}, {scope}"


def build(store: Store, week: Week,
          prices: Pricing | Mapping[tuple[str, str], float], sla_target: float,
          cluster: str = "", team: str | None = None,
          progress: Callable[[str], None] = lambda _: None,
          only_cluster: str | None = None, allocation: str | None = None,
          carbon: str | None = None) -> WeeklyReport:
    """The report of the week's rows of ``only_cluster`` (None: of every cluster the store
    holds, side by side in ``cost_by_cluster`` when there are several), for the platform
    or ``team``'s slice. Its title names the cluster the rows are of; ``cluster`` when
    there are none. ``cost_by_allocation`` is there when the week's rows have an
    allocation, headed by ``allocation``'s name. ``prices``: the list prices with what the
    report knows of them (``Pricing.of``), or the list prices alone. ``carbon``: what the
    CO2e figures rest on, in words (``Carbon.basis``)."""
    pricing = prices if isinstance(prices, Pricing) else Pricing(prices)
    progress("reading the warehouse")
    f = queries.fetch(store, week, team, only_cluster)
    ws = Workspace()
    prepare(ws, pricing.list_prices)
    queries.load(store, week, ws, team, classify_arrow, only_cluster)
    progress("computing")
    usage = f["usage"]
    clusters = sorted({str(c) for c in usage.cluster.dropna()})
    covered = coverage(f["coverage"])
    pods = Table(ws, "pods", with_evidence)
    workloads = bottleneck_table(ws)
    unallocated = unallocated_by_pool(usage)
    rightsize = rightsizing_table(ws)
    spot = spot_table(ws)
    tables: dict[str, pd.DataFrame | Table] = {
        f"cost_by_{d}": cost_by(usage, d, covered[1] > 0)
        for d in ("cluster", *COST_DIMENSIONS) if d != "cluster" or len(clusters) > 1}
    if usage.allocation.notna().any():
        tables["cost_by_allocation"] = cost_by(usage, "allocation", covered[1] > 0)
    tables |= {
        "daily_cost_by_team": daily_by_team(f["daily"], week),
        "idle_offenders": idle_offenders(ws),
        "unallocated_by_pool": unallocated,
        "energy_by_team": energy_by(usage, "team", covered[1] > 0),
        "energy_by_node_pool": energy_by(usage, "node_pool", covered[1] > 0),
        "queue": queue(ws.frame(QUEUE_STATES), queries.as_far_as_it_goes(f["covered"], week),
                       f["awaiting_admission"]),
        "kueue": kueue(ws, week, f["quotas"], f["awaiting_admission"]),
        "longest_waits": longest_waits_of(ws.chunks("SELECT * FROM pod_states"), week,
                                          awaiting=f["awaiting_admission"]),
        "availability": availability(f["availability"], sla_target),
        "incidents": incidents(f["incidents"], ws.frame(PREEMPTED), week),
        "bottlenecks": workloads,
        "bottleneck_summary": bottleneck_summary(workloads),
        "rightsizing": rightsize,
        "spot": spot,
    }
    w = waited(f, ws)
    tables |= {"waits": w.waits, "stuck_workloads": w.stuck}
    if team is None:  # what to do with the platform's capacity, its queues and its SLA
        hours = pool_hours(w.free_hours, w.pending_hours)
        in_time = hours if w.recorded else None  # else matched over the week
        tables["stranded"] = stranded_by_pool(w.free_hours, hours, w.fragmentation)
        tables["savings"] = savings(spot, rightsize, unallocated, pods, tables["queue"],
                                    in_time)
        tables["actions"] = actions(unallocated, tables["queue"], tables["availability"],
                                    tables["savings"], w, in_time)
    else:  # a team's levers: for the causes its pods waited for, and its savings
        tables["savings"] = savings(spot, rightsize, unallocated, pods, tables["queue"])
        tables["actions"] = team_actions(tables["savings"], w)
    if tables["kueue"].empty:  # a cluster without Kueue
        tables.pop("kueue")
    if team is not None:  # capacity, availability and incidents are the platform's
        for name in ("unallocated_by_pool", "availability", "incidents"):
            tables.pop(name)
    ws.close()
    name = only_cluster or (", ".join(clusters) if clusters else cluster)
    return WeeklyReport(week, name, team, sla_target,
                        headline(usage, covered) | energy_headline(usage, covered[1] > 0),
                        {k: tables[k] for k in SECTIONS if k in tables}, pods, allocation,
                        price_basis(usage, pricing),
                        {"waits": empty_note(w.recorded, team),
                         "stuck_workloads": stuck_note(w.recorded, team),
                         "stranded": stranded_note(w.recorded)}, carbon)
