"""The headline and the line under it in words, as every format of the report states
them: what the week cost and used, and what the costs are priced on and leave out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from analytics import format as fmt
from analytics.figures.headline import PriceBasis
from analytics.report import WeeklyReport


def headline_items(report: WeeklyReport) -> list[tuple[str, str]]:
    h = report.headline
    if h["cost_change"] is not None:
        change = f" ({fmt.percent(h['cost_change'], True)} week over week)"
    elif h["previous_cost_usd"] is None:
        change = " (week over week: n/a, no data for the week before)"
    else:
        change = ""
    items = [
        ("Total cost", fmt.money(h["cost_usd"]) + change),
        ("Coverage", f"{fmt.percent(h['coverage'])} of the week's hours have data"),
        ("GPU-hours", f"{h['gpu_hours'] or 0:,.0f} capacity, "
                      f"{h['allocated_gpu_hours'] or 0:,.0f} allocated"),
        ("Utilisation of allocated GPUs", fmt.percent(h["utilization"])),
        ("Cost per utilised GPU-hour" if report.team else "Fleet cost per utilised GPU-hour",
         fmt.money(h["fleet_cost_usd_per_utilized_hour"])),
        # "idle" is the energy line's (intervals under 5 % busy): this is the unused time
        ("Held GPUs' unused time", f"{fmt.money(h['idle_cost_usd'])} "
                                   f"({fmt.percent(h['idle_share'])} of cost: allocated "
                                   "cost x (1 - utilisation))"),
        ("Unallocated capacity", f"{fmt.money(h['unallocated_cost_usd'])} "
                                 f"({fmt.percent(h['unallocated_share'])} of cost)"),
        ("Energy and carbon", _energy(h)),
    ]
    # a team's slice holds no GPU nobody held: the fleet's unallocated line is not its own
    return [(k, v) for k, v in items if not (report.team and k == "Unallocated capacity")]


def _energy(h: Mapping[str, float | None]) -> str:
    if not h.get("metered_share"):
        return "not measured this week (no GPU energy in the warehouse)"
    if h["energy_change"] is not None:
        change = f" ({fmt.percent(h['energy_change'], True)} week over week)"
    else:
        change = ""
    per = h["kwh_per_utilized_gpu_hour"]
    per_hour = "" if per is None else \
        f"; {per:,.2f} kWh and {h['co2e_g_per_utilized_gpu_hour'] or 0:,.0f} g CO2e per " \
        "utilised GPU-hour"
    unmetered = "" if (h["metered_share"] or 0) >= 0.9995 else \
        f" (energy known for {fmt.percent(h['metered_share'])} of GPU-hours)"
    return (f"{h['energy_kwh'] or 0:,.1f} kWh{change}, {h['co2e_kg'] or 0:,.1f} kg CO2e; "
            f"{h['idle_energy_kwh'] or 0:,.1f} kWh idle, "
            f"{h['unallocated_energy_kwh'] or 0:,.1f} kWh unallocated{per_hour}{unmetered}")


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _dates(basis: PriceBasis) -> str:
    if not basis.as_of:
        return "an undated price book"
    first, last = basis.as_of[0], basis.as_of[-1]
    return f"the price book of {first}" if first == last else \
        f"the price book (prices of {first} to {last})"


def _list_prices(basis: PriceBasis) -> str:
    where = f" of {basis.region}" if basis.region else ""
    text = f"list prices{where} from Google's Cloud Billing catalogue where the exporter " \
        f"read it, else from {_dates(basis)} (the warehouse does not record which)" \
        if basis.catalog else f"list prices{where} from {_dates(basis)}"
    if basis.estimated:
        text += f" ({_and(basis.estimated)}: estimated, not Google's)"
    return text


def _discounts(basis: PriceBasis) -> str:
    off = basis.off_list_usd
    text = f" less {_and(basis.discounts)} discounts" if basis.discounts else \
        ", no discount configured"
    if off is None or (not off and not basis.discounts):
        return text
    if off > 0 and basis.discounts:
        return text + f" ({fmt.signed_money(-off)}, {fmt.percent(basis.off_list_share)} off list)"
    if not off:
        return text + " (none applied this week)"
    return (text + f", though the week's costs differ from them by {fmt.signed_money(-off)} "
            "(priced at other list prices: another book, or the catalogue)")


def _machines(basis: PriceBasis) -> str:
    if basis.basis != "gpu-component":
        return ""
    text = "; the machines the GPUs run in are not included"
    unknown = f"{_and(basis.machine_unknown)}, " \
        f"{fmt.percent(basis.machine_unknown_hour_share)} of GPU-hours" \
        if basis.machine_unknown else ""
    if basis.machine_usd is None or basis.machine_share is None:
        return text + (f", nor known (the book gives no machine share for {unknown})"
                       if unknown else "")
    (lo, hi), (lo_share, hi_share) = basis.machine_usd, basis.machine_share
    cost = f"about {fmt.money(lo)} more at list price, {fmt.percent(lo_share)}" \
        if lo == hi else f"{fmt.money(lo)} to {fmt.money(hi)} more at list price by " \
        f"machine type, {fmt.percent(lo_share)} to {fmt.percent(hi_share)}"
    if not unknown:
        return text + f" ({cost} of the total)"
    return text + (f" ({cost} of the total of {_and(basis.machine_models)}; not known for "
                   f"{unknown}, for which the book gives no machine share)")


def _spot(basis: PriceBasis) -> str:
    if not basis.spot_hour_share:
        return "; no spot GPUs"
    return f"; spot GPUs {fmt.percent(basis.spot_hour_share)} of GPU-hours, " \
        f"{fmt.percent(basis.spot_cost_share)} of cost"


def price_basis(basis: PriceBasis) -> str:
    """The line under the headline: what the costs are priced on and what they leave out."""
    what = "GPU component only" if basis.basis == "gpu-component" else \
        f"the book's basis {basis.basis!r}"
    unpriced = f"; {basis.unpriced_gpu_hours:,.1f} GPU-hours unpriced, not in the cost" \
        if basis.unpriced_gpu_hours >= 0.05 else ""
    return (f"Prices: {what}, at {_list_prices(basis)}{_discounts(basis)}{_machines(basis)}"
            f"{_spot(basis)}{unpriced}.")


def basis_line(report: WeeklyReport) -> str | None:
    prices = None if report.basis is None else price_basis(report.basis)
    carbon = None if report.carbon is None else f"CO2e: {report.carbon}."
    return " ".join(x for x in (prices, carbon) if x) or None
