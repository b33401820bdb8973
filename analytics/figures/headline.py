"""The headline and the price basis under it.

- cost: what the GPU-seconds cost after discount.
- utilisation: utilised / measured GPU-seconds (rows without a reading do not count).
- idle cost: allocated but unused — cost x (1 - utilisation) of each row.
- fleet cost per utilised GPU-hour: all spend (idle and unavailable capacity included) /
  utilised GPU-hours; not the effective cost of ``/metrics``, which is allocated cost /
  allocated utilised GPU-hours.
- price basis: what the week's costs are priced on, and what discounts took off the list
  prices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analytics.figures import HOUR, this_week
from exporter.config import Prices as PricesConfig
from exporter.model.prices import PriceBook


def _ratio(a: float, b: float) -> float | None:
    return None if not b else a / b


WEEK_HOURS = 7 * 24


def coverage(hours: pd.DataFrame) -> tuple[float, float]:
    """The share of this week's hours, and of the previous week's, with any GPU time in the
    warehouse (``queries.COVERAGE``)."""
    by_week = {bool(w): float(h) for w, h in zip(hours.this_week, hours.hours, strict=True)}
    return by_week.get(True, 0.0) / WEEK_HOURS, by_week.get(False, 0.0) / WEEK_HOURS


def headline(usage: pd.DataFrame, covered: tuple[float, float] = (1.0, 1.0)
             ) -> dict[str, float | None]:
    """The week's figures; with no data for the previous week (``covered``: this week's and
    the previous week's ``coverage``), its cost and the change are unknown (None), not 0."""
    now, before = this_week(usage), this_week(usage, False)
    cost, prev = float(now.cost_usd.sum()), float(before.cost_usd.sum())
    allocated = now[now.state == "allocated"]
    utilized = float(allocated.utilized_seconds.sum())
    known = covered[1] > 0
    return {
        "coverage": covered[0],
        "previous_coverage": covered[1],
        "cost_usd": cost,
        "previous_cost_usd": prev if known else None,
        "cost_change": _ratio(cost - prev, prev) if known else None,
        "gpu_hours": float(now.gpu_seconds.sum()) / HOUR,
        "allocated_gpu_hours": float(allocated.gpu_seconds.sum()) / HOUR,
        "utilization": _ratio(utilized, float(allocated.measured_seconds.sum())),
        "fleet_cost_usd_per_utilized_hour": _ratio(cost, utilized / HOUR),
        "idle_cost_usd": float(allocated.idle_cost_usd.sum()),
        "idle_share": _ratio(float(allocated.idle_cost_usd.sum()), cost),
        "unallocated_cost_usd": float(now[now.state == "unallocated"].cost_usd.sum()),
        "unallocated_share": _ratio(float(now[now.state == "unallocated"].cost_usd.sum()), cost),
    }


MACHINE_SHARE_SPREAD = 0.001
"""Machine types whose shares of a GPU-hour differ by less than this fraction share one."""


@dataclass(frozen=True, slots=True)
class Pricing:
    """What the report knows of the prices the warehouse's costs were computed with: the
    list prices in use (``Pricing.of``: a book's, with what the configuration takes off),
    or only the list prices (a plain mapping: undated, no discount, no machine known)."""

    list_prices: Mapping[tuple[str, str], float]
    """(GPU model, provisioning) -> list price of a GPU-hour."""
    region: str = ""
    basis: str = "gpu-component"
    """What a GPU's price covers (the book's ``basis``): ``gpu-component``, the GPU alone."""
    as_of: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(GPU model, provisioning) -> the date of its list price (YYYY-MM-DD)."""
    estimated: frozenset[tuple[str, str]] = frozenset()
    """The list prices that are estimates, not prices Google published."""
    machine_usd_per_gpu_hour: Mapping[tuple[str, str], tuple[float, float]] = field(
        default_factory=dict)
    """(GPU model, provisioning) -> the least and the most its machine adds to a GPU-hour
    over the machine types of the book that hold it (equal where they all add the same);
    absent where no machine type of the book fixes its GPU count."""
    discounts: tuple[str, ...] = ()
    """What the configuration takes off the list prices, in words."""
    catalog: bool = False
    """The exporter refreshes list prices from Google's Cloud Billing catalogue."""

    @classmethod
    def of(cls, book: PriceBook, cfg: PricesConfig | None = None) -> Pricing:
        """The book's list prices, dates and machine shares, and ``cfg``'s discounts."""
        shares: dict[tuple[str, str], list[float]] = {}
        for (_, provisioning), m in book.machines.items():
            shares.setdefault((m.accelerator, provisioning), []).append(m.per_gpu)
        machine = {k: (min(v), max(v)) if max(v) - min(v) > MACHINE_SHARE_SPREAD * max(v)
                   else (min(v), min(v)) for k, v in shares.items()}
        discounts: list[str] = []
        if cfg is not None and cfg.negotiated:
            discounts.append("negotiated")
        if cfg is not None and cfg.commitments:
            discounts.append("committed-use")
        if cfg is not None and (cfg.discounts or cfg.default_discount):
            discounts.append("node-pool")
        return cls(dict(book.prices), book.region, book.basis,
                   {k: p.as_of for k, p in book.provenance.items() if p.as_of},
                   book.estimated, machine, tuple(discounts),
                   cfg is not None and cfg.catalog.enabled)


@dataclass(frozen=True, slots=True)
class PriceBasis:
    """What the week's costs are: which prices, what came off them, what they leave out."""

    basis: str
    """The book's ``basis``: ``gpu-component``, the GPU alone, machine excluded."""
    region: str
    as_of: tuple[str, ...]
    """The dates of the list prices the week's GPU-hours are priced at, oldest first (of
    every price when the week has none); empty when undated."""
    estimated: tuple[str, ...]
    """The week's list prices that are estimates (``model provisioning``)."""
    catalog: bool
    """List prices may be the Cloud Billing catalogue's: the warehouse does not say which."""
    discounts: tuple[str, ...]
    """What the configuration takes off the list prices."""
    cost_usd: float
    """The week's cost."""
    list_cost_usd: float | None
    """The week's priced GPU-hours at the list prices (those the list prices cover); None
    when they cover none."""
    off_list_usd: float | None
    """``list_cost_usd`` less what those GPU-hours cost, to the cent: what discounts took
    off (or, with none configured, what other list prices made of them)."""
    off_list_share: float | None
    """``off_list_usd`` over ``list_cost_usd``."""
    machine_usd: tuple[float, float] | None
    """The least and the most the machines of the priced GPUs whose models' machine types
    fix their GPU count add to the cost, at list price; None when no such GPU ran."""
    machine_share: tuple[float, float] | None
    """``machine_usd`` over those GPUs' cost plus it: the machines' share of their total."""
    machine_models: tuple[str, ...]
    """The GPU models ``machine_usd`` covers."""
    machine_unknown: tuple[str, ...]
    """The GPU models whose machine the book does not price per GPU."""
    machine_unknown_hour_share: float | None
    """Their share of the week's GPU-hours."""
    spot_hour_share: float | None
    """Spot GPUs' share of the week's GPU-hours; None without GPU-hours."""
    spot_cost_share: float | None
    """Their share of the week's cost; None without cost."""
    unpriced_gpu_hours: float
    """GPU-hours no price covered: not in the cost."""


def price_basis(usage: pd.DataFrame, pricing: Pricing) -> PriceBasis:
    """The basis of the week's costs (``queries.USAGE``'s rows: ``gpu_model``,
    ``provisioning``, ``this_week``, ``gpu_seconds``, ``priced_seconds`` (GPU-seconds with a
    cost), ``cost_usd``).

    What discounts took off is the priced GPU-hours at the list prices less what they cost,
    over the (model, provisioning) the list prices cover. A machine's share is the least
    and the most a GPU-hour carries of its machine types (``Pricing.machine_usd_per_gpu_
    hour``), at list price, over the priced GPU-hours of those models."""
    now = this_week(usage)
    g = now.assign(gpu_model=now.gpu_model.fillna(""), provisioning=now.provisioning.fillna("")
                   ).groupby(["gpu_model", "provisioning"])[
        ["gpu_seconds", "priced_seconds", "cost_usd"]].sum().astype(float)
    keys = [(str(m), str(p)) for m, p in g.index]
    hours = g.gpu_seconds.to_numpy() / HOUR
    priced = g.priced_seconds.to_numpy() / HOUR
    cost = g.cost_usd.to_numpy()
    listed = np.array([k in pricing.list_prices for k in keys], dtype=bool)
    list_cost = float(sum(priced[i] * pricing.list_prices[k]
                          for i, k in enumerate(keys) if listed[i]))
    off = round(list_cost - float(cost[listed].sum()), 2) if listed.any() else None
    machine = np.array([k in pricing.machine_usd_per_gpu_hour for k in keys], dtype=bool)
    lo = float(sum(priced[i] * pricing.machine_usd_per_gpu_hour[k][0]
                   for i, k in enumerate(keys) if machine[i]))
    hi = float(sum(priced[i] * pricing.machine_usd_per_gpu_hour[k][1]
                   for i, k in enumerate(keys) if machine[i]))
    gpus_cost = float(cost[machine].sum())
    used = {k for i, k in enumerate(keys) if priced[i] > 0}
    dates = {d for k, d in pricing.as_of.items() if k in used} or set(pricing.as_of.values())
    total_hours, total_cost = float(hours.sum()), float(cost.sum())
    spot = np.array([p == "spot" for _, p in keys], dtype=bool)
    unknown = sorted({m for i, (m, _) in enumerate(keys)
                      if not machine[i] and hours[i] > 0 and m})
    return PriceBasis(
        basis=pricing.basis, region=pricing.region, as_of=tuple(sorted(dates)),
        estimated=tuple(f"{m} {p}" for m, p in sorted(used & pricing.estimated)),
        catalog=pricing.catalog, discounts=pricing.discounts, cost_usd=total_cost,
        list_cost_usd=list_cost if listed.any() else None, off_list_usd=off,
        off_list_share=None if off is None else _ratio(off, list_cost),
        machine_usd=(lo, hi) if lo > 0 else None,
        machine_share=(lo / (gpus_cost + lo), hi / (gpus_cost + hi)) if lo > 0 else None,
        machine_models=tuple(sorted({k[0] for i, k in enumerate(keys)
                                     if machine[i] and priced[i] > 0})),
        machine_unknown=tuple(unknown),
        machine_unknown_hour_share=_ratio(float(hours[~machine].sum()), total_hours)
        if unknown else None,
        spot_hour_share=_ratio(float(hours[spot].sum()), total_hours),
        spot_cost_share=_ratio(float(cost[spot].sum()), total_cost),
        unpriced_gpu_hours=float((hours - priced).sum()),
    )

