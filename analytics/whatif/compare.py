"""The week, its replay on its own layout and its replay on the proposed one, side by side.

The deltas are the proposed replay's figures less the week's own replay's: both are made
by the same simulator from the same jobs, so what differs between them is the layout, not
what the simulator gets wrong. How close the week's own replay comes to the measured week
is the fidelity (``FIDELITY``): every what-if prints it, so its reader can judge the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from analytics import format as fmt
from analytics.whatif.measure import Measured

COST_TOLERANCE = 0.02
GPU_HOURS_TOLERANCE = 0.01
WAIT_TOLERANCE = 0.10
"""The fidelity bounds: a replay of the week on its own layout is trusted when its cost is
within 2 % of the week's, its GPU-hours within 1 %, and each team's queue-wait p50 and p90
within 10 % or one interval."""


@dataclass(frozen=True, slots=True)
class Comparison:
    summary: pd.DataFrame
    """``figure``, ``actual``, ``replay`` (the week's own layout), ``proposed``, ``delta``
    (proposed - replay), ``delta_ratio``, ``delta_usd`` (the money it moves: a dollar
    figure's delta; none for the others, waiting included, which is never priced), ``unit``."""
    teams: pd.DataFrame
    causes: pd.DataFrame
    pools: pd.DataFrame
    fidelity: pd.DataFrame
    """``check``, ``actual``, ``replay``, ``error``, ``bound``, ``ok``."""
    unchecked: str | None = None
    """Why there is no fidelity (no check could be made), in a person's words; None when
    there is."""

    @property
    def faithful(self) -> bool:
        return bool(self.fidelity.ok.all()) if not self.fidelity.empty else False


def _get(m: Measured | None, key: str) -> float | None:
    if m is None:
        return None
    if key == "wait_p50_seconds":
        return m.wait_percentile(50)
    if key == "wait_p90_seconds":
        return m.wait_percentile(90)
    if key == "pending_gpu_hours":
        return float((m.waits.wait_seconds * m.waits.gpus).sum() / 3600)
    if key == "stranded_gpu_hours":
        return m.stranded_gpu_hours
    if key == "stranded_cost_usd":
        return m.stranded_cost_usd
    if key == "reclaims":
        return None if m.reclaims is None else float(m.reclaims)
    if key == "min_availability":
        a = m.pools.availability.dropna()
        return float(a.min()) if len(a) else None
    v = m.headline.get(key)
    return None if v is None else float(v)


SUMMARY = (
    ("cost_usd", "Cost", "usd"),
    ("gpu_hours", "GPU-hours", "hours"),
    ("allocated_gpu_hours", "GPU-hours held by pods", "hours"),
    ("utilization", "Utilisation", "ratio"),
    ("fleet_cost_usd_per_utilized_hour", "Cost per utilised GPU-hour", "usd"),
    ("idle_cost_usd", "Idle cost (held, not used)", "usd"),
    ("unallocated_cost_usd", "Unallocated cost (free GPUs)", "usd"),
    ("stranded_gpu_hours", "Stranded GPU-hours (free, no waiting pod fits)", "hours"),
    ("stranded_cost_usd", "Stranded cost", "usd"),
    ("wait_p50_seconds", "Queue wait p50, pods submitted in the week", "seconds"),
    ("wait_p90_seconds", "Queue wait p90, pods submitted in the week", "seconds"),
    ("pending_gpu_hours", "GPU-hours waited", "hours"),
    ("reclaims", "Spot reclaims", "count"),
    ("min_availability", "Lowest pool availability", "ratio"),
)
"""The summary's figures: key, label, unit."""


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _ratio(d: float | None, base: float | None) -> float | None:
    return None if d is None or not base else d / base


NO_WEEK = "there is no measured or recorded week to check a replay against"
NO_OWN_REPLAY = "the week was not replayed on the layout it ran on"


def compare(actual: Measured | None, replay: Measured | None, proposed: Measured | None,
            step: float, unchecked: str | None = None) -> Comparison:
    """Side by side: the measured week (or as a pods CSV recorded it; None for a trace
    without one), its replay on its own layout (None without one) and the replay on the
    proposed layout (None where no replay could be made: what was measured is still
    shown). ``unchecked``: why the week cannot be checked, where its caller knows
    better than ``NO_WEEK`` and ``NO_OWN_REPLAY``."""
    base = replay if replay is not None else actual
    rows = []
    for key, label, unit in SUMMARY:
        a, r, p = _get(actual, key), _get(replay, key), _get(proposed, key)
        d = _delta(_get(base, key), p)
        usd = d if unit == "usd" and key != "fleet_cost_usd_per_utilized_hour" else None
        rows.append((label, a, r, p, d, _ratio(d, _get(base, key)), usd, unit))
    summary = pd.DataFrame(rows, columns=["figure", "actual", "replay", "proposed", "delta",
                                          "delta_ratio", "delta_usd", "unit"])
    checks = fidelity(actual, replay, step)
    why = None if not checks.empty else unchecked or (
        NO_WEEK if actual is None else NO_OWN_REPLAY if replay is None else
        "the week records none of the figures a replay is checked on")
    return Comparison(summary, _teams(actual, replay, proposed), _causes(actual, replay,
                                                                         proposed),
                      _pools(replay, proposed), checks, why)


def _side(frames: Mapping[str, Measured | None], attr: str, key: str,
          values: tuple[str, ...]) -> pd.DataFrame:
    parts = []
    for name, m in frames.items():
        if m is None:
            continue
        f = getattr(m, attr).set_index(key)[list(values)]
        parts.append(f.add_suffix(f"_{name}"))
    return pd.concat(parts, axis=1).reset_index(names=key) if parts else pd.DataFrame()


def _teams(actual: Measured | None, replay: Measured | None,
           proposed: Measured | None) -> pd.DataFrame:
    values = ("cost_usd", "gpu_hours", "wait_p50_seconds", "wait_p90_seconds")
    t = _side({"actual": actual, "replay": replay, "proposed": proposed}, "teams", "team",
              values)
    base = "replay" if replay is not None else "actual"
    if f"cost_usd_{base}" in t and "cost_usd_proposed" in t:
        for v in ("cost_usd", "wait_p90_seconds"):
            t[f"{v}_delta"] = t[f"{v}_proposed"] - t[f"{v}_{base}"]
    return _by_last(t, "cost_usd")


def _by_last(t: pd.DataFrame, value: str) -> pd.DataFrame:
    """``t`` by the last side's ``value``, largest first (proposed, else replayed, else
    the week's)."""
    for side in ("proposed", "replay", "actual"):
        if f"{value}_{side}" in t:
            return t.sort_values(f"{value}_{side}", ascending=False, ignore_index=True)
    return t


def _causes(actual: Measured | None, replay: Measured | None,
            proposed: Measured | None) -> pd.DataFrame:
    known = {name: m for name, m in (("actual", actual), ("replay", replay),
                                     ("proposed", proposed))
             if m is not None and m.causes is not None}
    t = _side(known, "causes", "cause", ("gpu_hours",)).fillna(0.0)
    base = "replay" if replay is not None else "actual"
    if f"gpu_hours_{base}" in t and "gpu_hours_proposed" in t:
        t["gpu_hours_delta"] = t.gpu_hours_proposed - t[f"gpu_hours_{base}"]
    return _by_last(t, "gpu_hours")


def _pools(replay: Measured | None, proposed: Measured | None) -> pd.DataFrame:
    return _side({"replay": replay, "proposed": proposed}, "pools", "node_pool",
                 ("gpu_hours", "cost_usd", "availability", "stranded_gpu_hours"))


def fidelity(actual: Measured | None, replay: Measured | None, step: float) -> pd.DataFrame:
    """How far the week's own replay is from the measured (or recorded) week, check by
    check; a figure the week does not have (a pods CSV records no cost) is not checked."""
    cols = ["check", "actual", "replay", "error", "bound", "ok"]
    if actual is None or replay is None:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, label, bound in (("cost_usd", "cost ($)", COST_TOLERANCE),
                              ("gpu_hours", "GPU-hours", GPU_HOURS_TOLERANCE),
                              ("allocated_gpu_hours", "GPU-hours held by pods",
                               GPU_HOURS_TOLERANCE)):
        known = _get(actual, key)
        if known is None:
            continue
        a, r = known, _get(replay, key) or 0.0
        err = abs(r - a) / a if a else (0.0 if r == 0 else math.inf)
        rows.append((label, a, r, err, f"{bound:.0%}", err <= bound))
    teams = actual.teams.merge(replay.teams, on="team", how="outer",
                               suffixes=("", "_replay")).set_index("team")
    for team, t in teams.iterrows():
        for q in ("p50", "p90"):
            a, r = t[f"wait_{q}_seconds"], t[f"wait_{q}_seconds_replay"]
            if pd.isna(a) and pd.isna(r):
                continue
            a = 0.0 if pd.isna(a) else float(a)
            r = 0.0 if pd.isna(r) else float(r)
            allowed = max(WAIT_TOLERANCE * a, step)
            rows.append((f"{team} wait {q} (s)", a, r, abs(r - a),
                         f"{allowed:.0f} s", abs(r - a) <= allowed + 1e-6))
    return pd.DataFrame(rows, columns=cols)


def past_targets(teams: pd.DataFrame, target: Callable[[str], float]) -> list[str]:
    """The teams of a comparison (``Comparison.teams``) whose queue-wait p90 the proposed
    layout pushes past ``target(team)`` seconds: within it on the week's own replay and
    past it on the proposed layout, or past it already and longer by more than
    ``WAIT_TOLERANCE``; in words, the furthest past first."""
    base = "replay" if "wait_p90_seconds_replay" in teams else "actual"
    out = []
    for t in teams.itertuples():
        before, after = getattr(t, f"wait_p90_seconds_{base}"), t.wait_p90_seconds_proposed
        if pd.isna(after):
            continue
        limit = target(str(t.team))
        before = 0.0 if pd.isna(before) else float(before)
        if after > limit and (before <= limit or after > before * (1 + WAIT_TOLERANCE)):
            out.append((after - limit, f"{t.team}'s p90 {fmt.duration(before)} → "
                                       f"{fmt.duration(float(after))}, past its "
                                       f"{fmt.duration(limit)} target"))
    return [text for _, text in sorted(out, reverse=True)]
