"""What the demo prints when its simulated days are done: per team the GPU-hours,
utilisation, cost, effective cost and queue wait (the waits begun in the week, as the
report and ``whatif`` count them), then the pools' availability, energy and carbon."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

import numpy as np

from analytics import queries
from analytics.store import DuckDBStore, Param
from analytics.week import POD_LOOKBACK, Week
from analytics.whatif.measure import pod_waits
from exporter.model import compute
from exporter.model.carbon import JOULES_PER_KWH
from exporter.runtime.service import Exporter


def summary_table(exporter: Exporter, week: Week) -> str:
    """Per-team GPU-hours, utilisation, cost, effective cost, queue wait (of the pods
    submitted in ``week``, as the report's), availability."""
    t = exporter.totals
    hours: dict[str, float] = defaultdict(float)
    used: dict[str, float] = defaultdict(float)
    cost: dict[str, float] = defaultdict(float)
    for key, secs in t.gpu_seconds.items():
        state, _, team = key[0], key[1], key[2]
        if state == "allocated":
            hours[team] += secs / 3600
            used[team] += t.utilized_seconds.get(key, 0.0)
            cost[team] += t.cost_usd.get(key, 0.0)
    waits = _queue_percentiles(exporter, week)
    lines = [f"{'team':<12} {'GPU-hours':>10} {'util':>6} {'cost $':>10} {'$/util-h':>9} "
             f"{'wait p50':>9} {'wait p90':>9}"]
    for team in sorted(hours.keys() | waits.keys(), key=lambda k: (-cost.get(k, 0.0), k)):
        util = used[team] / (hours[team] * 3600) if hours.get(team) else 0.0
        eff = compute.effective_cost_per_utilized_hour(cost[team], used[team])
        p50, p90 = (_wait(w) for w in waits[team]) if team in waits else ("—", "—")
        lines.append(f"{team:<12} {hours[team]:>10.1f} {util:>6.1%} {cost[team]:>10.2f} "
                     f"{eff if eff is not None else 0:>9.2f} {p50:>9} {p90:>9}")
    lines.append(f"wait: of the pods submitted in {week.label} by the run's end (one still "
                 "waiting counts until then), as whatif and the report count them (the "
                 "report by GPU model too)")
    idle = sum(v for k, v in t.cost_usd.items() if k[0] == "unallocated")
    down = sum(v for k, v in t.cost_usd.items() if k[0] == "unavailable")
    lines.append(f"unallocated capacity ${idle:,.2f}, unavailable GPUs ${down:,.2f}, "
                 f"{sum(t.interruptions.values())} spot interruptions")
    kwh = sum(t.energy_joules.values()) / JOULES_PER_KWH
    utilized = sum(v for k, v in t.utilized_seconds.items() if k[0] == "allocated")
    per = compute.per_utilized_hour(kwh, utilized)
    lines.append(f"energy {kwh:,.0f} kWh, {sum(t.co2e_grams.values()) / 1000:,.0f} kg CO2e"
                 + ("" if per is None else f", {per:.2f} kWh per utilised GPU-hour")
                 + (f" ({exporter.carbon.basis})" if exporter.carbon else ""))
    lines.append("")
    lines.append(f"{'node pool':<14} {'availability':>12}  (SLA target "
                 f"{exporter.config.sla.target:.1%})")
    up: dict[str, float] = defaultdict(float)
    downs: dict[str, float] = defaultdict(float)
    for key, secs in t.gpu_seconds.items():
        (downs if key[0] == "unavailable" else up)[key[3]] += secs
    for pool in sorted(up.keys() | downs.keys()):
        avail = compute.availability(up[pool], downs[pool])
        mark = "" if avail is None or avail >= exporter.config.sla.target else "  below target"
        lines.append(f"{pool:<14} {avail if avail is not None else 0:>12.3%}{mark}")
    return "\n".join(lines)


def _wait(seconds: float) -> str:
    return f"{seconds / 60:.1f}m" if seconds < 3600 else f"{seconds / 3600:.1f}h"


def _queue_percentiles(exporter: Exporter, week: Week) -> dict[str, tuple[float, float]]:
    """Queue wait p50 and p90 per team of the waits that began in ``week`` (up to the last
    cycle): the report's and ``whatif``'s waits (``analytics.figures.queue.waits_begun``)."""
    wh = exporter.warehouse
    if wh is None:
        return {}
    wh.flush(exporter.last_cycle_time, partial=True)
    ran = _ran(exporter, week)
    store = DuckDBStore(con=wh.con)
    base: dict[str, Param] = {"start": ran.start, "end": ran.end, "cluster": None,
                              "team": None, "lookback": ran.start - POD_LOOKBACK}
    waits = pod_waits(store.query(queries.POD_STATES, base),
                      store.query(queries.AWAITING_ADMISSION, base), ran)
    return {str(team): (float(np.percentile(w, 50)), float(np.percentile(w, 90)))
            for team, w in waits.groupby("team").wait_seconds}


def _ran(exporter: Exporter, week: Week) -> Week:
    """``week`` up to the last cycle."""
    last = datetime.fromtimestamp(exporter.last_cycle_time, UTC)
    return Week(week.start, min(week.end, max(last, week.start)))
