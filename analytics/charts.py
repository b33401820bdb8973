"""The report's charts, as PNG bytes (matplotlib, no display needed)."""

from __future__ import annotations

import io
from collections.abc import Iterable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
from PIL import Image

from analytics import format as fmt
from analytics.figures.cost import POOLED
from analytics.report import WeeklyReport
from analytics.workspace import Table
from exporter.model.pending import CAUSES

CHARTS = {
    "daily_cost": "Daily cost by team",
    "utilization": "Utilisation of GPU pods (GPU-hours)",
    "queue_wait": "Queue wait percentiles",
    "waits": "GPU-hours waited by cause",
}


def _png(fig: Figure) -> bytes:
    """The figure as a PNG of 256 colours at most: a chart has a few, and a third of the
    bytes of full colour keeps the email small."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    out = io.BytesIO()
    with Image.open(buf) as image:
        image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT) \
            .save(out, format="PNG", optimize=True)
    return out.getvalue()


TEAMS_SHOWN = 10
"""Teams the daily cost tells apart, the costliest, in its chart (the rest summed as one
``other teams``) and in Markdown and HTML (its CSV has them all)."""


def _fewer_teams(table: pd.DataFrame) -> pd.DataFrame:
    """The daily cost with the teams past ``TEAMS_SHOWN`` summed as ``other teams``."""
    teams = [t for t in table.columns if t not in POOLED]
    if len(teams) <= TEAMS_SHOWN:
        return table
    others = table[teams[TEAMS_SHOWN:]].sum(axis=1).rename("other teams")
    return pd.concat([table[teams[:TEAMS_SHOWN]], others,
                      table[[t for t in table.columns if t in POOLED]]], axis=1)


def daily_cost(report: WeeklyReport) -> bytes:
    table = _fewer_teams(report.frame("daily_cost_by_team"))
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    bottom = np.zeros(len(table))
    x = np.arange(len(table))
    greys = {"(unallocated)": "#bdc1c6", "(unavailable)": "#5f6368"}  # the pool's, not a team's
    for team in table.columns:
        ax.bar(x, table[team].to_numpy(), bottom=bottom, label=fmt.text(str(team)),
               color=greys.get(str(team)))
        bottom += table[team].to_numpy()
    ax.set_xticks(x, [d.strftime("%a %d") for d in table.index])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:,.0f}"))
    ax.set_ylabel("cost a day")
    ax.set_title(CHARTS["daily_cost"])
    if len(table.columns):
        ax.legend(fontsize=8, ncols=min(5, len(table.columns)), loc="upper center",
                  bbox_to_anchor=(0.5, -0.12), frameon=False)
    return _png(fig)


BINS = [i / 20 for i in range(21)]


def _utilization_hours(pods: pd.DataFrame | Table) -> np.ndarray:
    """GPU-hours of pods by mean utilisation, in ``BINS``."""
    if isinstance(pods, Table):
        chunks: Iterable[pd.DataFrame] = pods.ws.chunks(
            f"SELECT utilization, gpu_seconds FROM {pods.name} WHERE utilization IS NOT NULL")
    else:
        chunks = [pods[pods.utilization.notna()]] if not pods.empty else []
    hours = np.zeros(len(BINS) - 1)
    for c in chunks:
        hours += np.histogram(c.utilization.to_numpy(dtype=float), bins=BINS,
                              weights=c.gpu_seconds.to_numpy(dtype=float) / 3600)[0]
    return hours


def utilization(report: WeeklyReport) -> bytes:
    fig = Figure(figsize=(7, 3.0))
    ax = fig.subplots()
    if not report.pods.empty:
        ax.hist(BINS[:-1], bins=BINS, weights=_utilization_hours(report.pods))
    ax.set_xlabel("mean utilisation over the week")
    ax.set_ylabel("GPU-hours")
    ax.set_title(CHARTS["utilization"])
    return _png(fig)


def wait_unit(longest_seconds: float) -> tuple[str, float]:
    """The unit a chart of waits reads in: hours where the longest is two hours or more,
    minutes below; and its seconds."""
    return ("hours", 3600.0) if longest_seconds >= 2 * 3600 else ("minutes", 60.0)


def queue_wait(report: WeeklyReport) -> bytes:
    """Each group of the queue table (team and GPU model) that had a pod wait, its p50, p90
    and p99 in hours where the longest wait is hours, in minutes otherwise."""
    q = report.frame("queue")
    q = q[q.pods > 0]
    fig = Figure(figsize=(max(7.0, 0.8 * len(q)), 3.4))
    ax = fig.subplots()
    labels = [f"{fmt.text(str(t))}\n{fmt.text(str(m)).removeprefix('nvidia-')}"
              for t, m in zip(q.team, q.gpu_model, strict=True)]
    x = np.arange(len(q))
    longest = float(q[["p50_seconds", "p90_seconds", "p99_seconds"]].max().max()) \
        if len(q) else 0.0
    unit, per = wait_unit(longest)
    for i, p in enumerate(("p50", "p90", "p99")):
        ax.bar(x + (i - 1) * 0.27, q[f"{p}_seconds"].to_numpy() / per, width=0.27, label=p)
    ax.set_xticks(x, labels, fontsize=7)
    # one group's day-long p99 would flatten every other bar on a linear axis
    ax.set_yscale("symlog", linthresh=1.0)
    if longest:
        ax.set_ylim(0, longest / per * 2.0)  # room above the longest bar
    ax.set_ylabel(f"{unit} (log scale above 1)")
    ax.set_title(CHARTS["queue_wait"])
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return _png(fig)


CAUSE_LABELS = {"no_capacity": "pools full", "scaling_up": "nodes coming",
                "stockout": "no nodes to be had", "fragmented": "free, not on one node",
                "quota": "held for quota", "unschedulable": "no pool can run it",
                "preempted": "preempted, waiting again", "starting": "starting"}
"""Why pods waited, in a few words a reader knows (the CSVs keep the codes)."""

POOLS_SHOWN = 6
"""Pools a chart tells apart; the rest are one ``other pools``."""


def waits(report: WeeklyReport) -> bytes:
    """GPU-hours waited per cause (in ``CAUSES``' order), stacked by pool."""
    w = report.frame("waits")
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    by_pool = w.groupby("node_pool").gpu_hours.sum().sort_values(ascending=False)
    shown = list(by_pool.index[:POOLS_SHOWN])
    pool = w.node_pool.where(w.node_pool.isin(shown), "other pools")
    table = w.assign(pool=pool).pivot_table(index="cause", columns="pool", values="gpu_hours",
                                            aggfunc="sum", fill_value=0.0) \
        .reindex(index=[c for c in CAUSES if c in set(w.cause)]) if len(w) else pd.DataFrame()
    y = np.arange(len(table))
    left = np.zeros(len(table))
    for name in [*shown, "other pools"]:
        if name in table.columns:
            ax.barh(y, table[name].to_numpy(), left=left, label=fmt.text(str(name)))
            left += table[name].to_numpy()
    ax.set_yticks(y, [CAUSE_LABELS.get(str(c), str(c)) for c in table.index], fontsize=8)
    ax.invert_yaxis()
    if len(table):
        ax.set_xlim(0, float(left.max()) * 1.05)  # every bar inside the frame
    ax.set_xlabel("GPU-hours")
    ax.set_title(CHARTS["waits"])
    if len(table.columns):  # beside the bars, never over them
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    else:
        ax.text(0.5, 0.5, "no wait recorded this week", ha="center", va="center",
                fontsize=9, transform=ax.transAxes)
    return _png(fig)


def render_all(report: WeeklyReport) -> dict[str, bytes]:
    return {"daily_cost": daily_cost(report), "utilization": utilization(report),
            "queue_wait": queue_wait(report), "waits": waits(report)}
