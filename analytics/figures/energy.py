"""What the GPUs drew and emitted: energy and CO2e by team and pool, week over week.

- energy: the warehouse's ``energy_joules``, each GPU's energy counter's increase split as
  cost is (``exporter.model.energy``); GPU-hours whose energy is unknown count nothing, and
  ``metered_share`` says how many there were.
- CO2e: the warehouse's ``co2e_grams``, energy x PUE x the region's grid intensity as
  the exporter had them in force.
- idle energy: what GPUs pods held drew while idle (under 5 % busy in the exporter's
  cycle); unallocated energy: what the GPUs no pod held drew.
- per utilised GPU-hour: energy (CO2e, cost) / utilised GPU-hours, the energy twin of the
  effective cost.

A team table ends with ``(unallocated)`` and ``(unavailable)``, as the cost tables do, so
that every table sums to the headline's energy.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analytics.figures import HOUR, this_week
from analytics.figures.cost import OWNED_BY, POOLED
from analytics.tables import columns
from exporter.model.carbon import JOULES_PER_KWH

SUMMED = ("energy_joules", "co2e_grams", "idle_joules", "estimated_joules", "cost_usd",
          "utilized_seconds", "gpu_seconds", "metered_seconds")


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(b > 0, a / np.where(b > 0, b, 1.0), np.nan)


def energy_by(usage: pd.DataFrame, dimension: str, previous: bool = True) -> pd.DataFrame:
    """Energy this week and last, the change, CO2e, idle energy and the figures per
    utilised GPU-hour, per value of ``dimension`` (``team`` or ``node_pool``); last week's
    energy and the change unknown (NaN) without ``previous`` week's data."""
    key = usage[dimension].fillna("(none)")
    if dimension in OWNED_BY:
        key = key.where(usage.state == "allocated", "(" + usage.state + ")")
    g = usage.assign(key=key).groupby(["key", "this_week"], dropna=False)[list(SUMMED)].sum()
    g = g.astype(float).unstack("this_week", fill_value=0.0)
    out = pd.DataFrame({dimension: g.index})

    def cur(column: str, this: bool = True) -> np.ndarray:
        return g[(column, this)].to_numpy(dtype=float) if (column, this) in g.columns \
            else np.zeros(len(g))

    energy, before = cur("energy_joules"), cur("energy_joules", False)
    utilized_hours = cur("utilized_seconds") / HOUR
    out["energy_kwh"] = energy / JOULES_PER_KWH
    out["previous_energy_kwh"] = before / JOULES_PER_KWH if previous else np.nan
    out["change"] = _ratio(energy - before, before) if previous else np.nan
    out["co2e_kg"] = cur("co2e_grams") / 1000.0
    out["idle_kwh"] = cur("idle_joules") / JOULES_PER_KWH
    out["kwh_per_utilized_gpu_hour"] = _ratio(energy / JOULES_PER_KWH, utilized_hours)
    out["co2e_g_per_utilized_gpu_hour"] = _ratio(cur("co2e_grams"), utilized_hours)
    out["cost_usd_per_utilized_hour"] = _ratio(cur("cost_usd"), utilized_hours)
    out["metered_share"] = _ratio(cur("metered_seconds"), cur("gpu_seconds"))
    out["estimated_share"] = _ratio(cur("estimated_joules"), energy)
    total = energy.sum()
    out["share"] = energy / total if total else np.nan
    pooled = out[dimension].isin(POOLED).to_numpy()
    out = out.assign(_pooled=pooled)[(energy > 0) | (before > 0)]
    return out.sort_values(["_pooled", "energy_kwh", dimension], ascending=[True, False, True],
                           ignore_index=True)[columns(f"energy_by_{dimension}")]


def energy_headline(usage: pd.DataFrame, previous: bool = True) -> dict[str, float | None]:
    """The week's energy figures for the headline (``tables.HEADLINE``)."""
    now, before = this_week(usage), this_week(usage, False)
    energy, prev = float(now.energy_joules.sum()), float(before.energy_joules.sum())
    utilized_hours = float(now[now.state == "allocated"].utilized_seconds.sum()) / HOUR
    gpu_seconds = float(now.gpu_seconds.sum())

    def ratio(a: float, b: float) -> float | None:
        return a / b if b > 0 else None

    return {
        "energy_kwh": energy / JOULES_PER_KWH,
        "previous_energy_kwh": prev / JOULES_PER_KWH if previous else None,
        "energy_change": ratio(energy - prev, prev) if previous else None,
        "co2e_kg": float(now.co2e_grams.sum()) / 1000.0,
        "idle_energy_kwh": float(now.idle_joules.sum()) / JOULES_PER_KWH,
        "unallocated_energy_kwh":
            float(now[now.state == "unallocated"].energy_joules.sum()) / JOULES_PER_KWH,
        "kwh_per_utilized_gpu_hour": ratio(energy / JOULES_PER_KWH, utilized_hours),
        "co2e_g_per_utilized_gpu_hour": ratio(float(now.co2e_grams.sum()), utilized_hours),
        "metered_share": ratio(float(now.metered_seconds.sum()), gpu_seconds),
    }
