"""The platform report's actions with the dollars their replays found.

An action that changes the layout (``analytics.whatif.levers``) is worth what its replay
moves: the week on the layout it implies, less the week on its own layout. So, once the
actions are replayed (``exporter.whatif.replay_levers``):

- a replay that costs less: its saving, in ``weekly_saving_usd``;
- a replay that costs more: that cost, in ``weekly_cost_usd``;
- a saving that pushes a team's queue-wait p90 past its target (``report.wait_targets``):
  a trade-off, told in ``why`` with its dollars and the waits, in no dollar column;
- an action whose layout change the replay could not make (the layout has it already:
  compact placement on a compact cluster, no stockout to take away), or whose replay moves
  nothing (cost, waiting, stranded GPUs, reclaims): left out, it changes nothing;
- an action not replayed (over the time budget): as it was, its dollars unknown.

Waiting is told in hours and in the waits of the team it moves most, never in dollars.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analytics import format as fmt
from analytics.figures.actions import LAYOUT_CAUSES, LEVERS, SCALE_DOWN, TO_SPOT, pool_of


def changes_layout(action: str, answers: object) -> bool:
    """Whether an action of the report is one a replay can price."""
    return action in (SCALE_DOWN, TO_SPOT) or (isinstance(answers, str)
                                                and answers in LAYOUT_CAUSES)


def _effect(r: dict[str, Any]) -> str:
    waited = float(r["waited_gpu_hours_change"])
    parts = [f"{abs(waited):,.0f} GPU-hours {'more' if waited > 0 else 'less'} waiting"
             if abs(waited) >= 0.5 else "the same waiting"]
    d, team = r["wait_p90_change_seconds"], r["team"]
    if isinstance(team, str) and d is not None and not pd.isna(d) and abs(float(d)) >= 1:
        parts.append(f"{team}'s p90 {'+' if d > 0 else '-'}{fmt.duration(abs(float(d)))} "
                     f"(to {fmt.duration(float(r['wait_p90_seconds']))})")
    return ", ".join(parts)


def _no_change(r: dict[str, Any]) -> bool:
    return all(r[k] is not None and not pd.isna(r[k]) and abs(float(r[k])) < tol
               for k, tol in (("cost_change_usd", 0.005), ("waited_gpu_hours_change", 0.005),
                              ("stranded_gpu_hours_change", 0.005),
                              ("reclaims_change", 0.5)))


AS_IT_IS = "as it is"
"""A pool's setting as the week had it, in the ``settings`` table's ``choice``."""
POOL_ACTIONS = (SCALE_DOWN, LEVERS["no_capacity"].action, LEVERS["fragmented"].action)
"""The actions about one pool's size or shape: its weighed setting takes their place."""


def recommendations(settings: pd.DataFrame) -> list[dict[str, Any]]:
    """An action for each pool whose weighed setting is not the pool as it is."""
    out = []
    for pool, g in settings.groupby("node_pool", sort=False):
        chosen = g[g.choice == "recommended"]
        if chosen.empty:
            continue
        c = chosen.iloc[0]
        base = g[g.choice == AS_IT_IS].iloc[0]
        change = float(c.cost_change_usd)
        within = float(c.past_target_seconds) == 0
        wait = f"{c.team}'s p90 {fmt.duration(base.wait_p90_seconds)} → " \
            f"{fmt.duration(c.wait_p90_seconds)}" if c.team == base.team and \
            isinstance(c.team, str) else f"worst p90 {c.team} " \
            f"{fmt.duration(c.wait_p90_seconds)}"
        others = "; ".join(
            f"{o.setting}: {'+' if o.cost_change_usd > 0 else '-'}"
            f"${abs(float(o.cost_change_usd)):,.0f}, {o.team} p90 "
            f"{fmt.duration(o.wait_p90_seconds)}"
            for o in g.itertuples() if o.setting not in (base.setting, c.setting))
        why = (f"Weighed {len(g) - 1} settings, replayed: {wait}, "
               + ("every team within its wait target" if within else
                  f"the least past its target ({fmt.duration(float(c.past_target_seconds))} "
                  "over) of the settings weighed")
               + f"; the pool was {base.setting.removeprefix(AS_IT_IS).strip(' ()')}. "
               f"Also weighed: {others or 'nothing else'}.")
        out.append({"action": f"set {pool} to {c.setting}",
                    "where": f"{pool} ({c.gpu_model})",
                    "weekly_saving_usd": -change if change < 0 else np.nan,
                    "weekly_cost_usd": change if change > 0 else np.nan,
                    "why": why, "answers": "setting"})
    return out


def priced(actions: pd.DataFrame, replayed: pd.DataFrame,
           settings: pd.DataFrame | None = None) -> pd.DataFrame:
    """``actions`` with each replayed action's dollars from its replay (see above); the
    pools ``settings`` weighed get one action each, in place of their size and shape
    actions."""
    weighed = settings.groupby("node_pool").size() if settings is not None and \
        not settings.empty else pd.Series(dtype=int)
    searched = set(weighed[weighed > 1].index)  # a setting replayed beside the pool as it is
    actions = actions[~(actions.action.isin(POOL_ACTIONS)
                        & actions["where"].map(pool_of).isin(searched))]
    by_action = {(str(r["action"]), str(r["where"])): r for r in replayed.to_dict("records")}
    rows = []
    for a in actions.to_dict("records"):
        if not changes_layout(str(a["action"]), a.get("answers")):
            rows.append(a)
            continue
        r = by_action.get((str(a["action"]), str(a["where"])))
        if r is None:
            continue  # its layout change is the layout already: it changes nothing
        change = r["cost_change_usd"]
        if change is None or pd.isna(change):
            rows.append(a)  # not replayed (a budget): as it was
            continue
        change = float(change)
        if _no_change(r):
            continue  # the layout change moves nothing: nothing to propose
        effect = _effect(r)
        a["weekly_saving_usd"] = a["weekly_cost_usd"] = np.nan
        tradeoff = r.get("tradeoff")
        if isinstance(tradeoff, str) and tradeoff and change < 0:
            a["why"] = (f"Trade-off, replayed ({r['change']}): saves ${-change:,.2f} a week, "
                        f"{effect}, but {tradeoff}. {a['why']}")
        else:
            if change < 0:
                a["weekly_saving_usd"] = -change
            elif change > 0:
                a["weekly_cost_usd"] = change
            money = "no change in cost" if math.isclose(change, 0.0, abs_tol=0.005) else \
                f"{'saves' if change < 0 else 'costs'} ${abs(change):,.2f} a week"
            a["why"] = f"Replayed ({r['change']}): {money}, {effect}. {a['why']}"
        rows.append(a)
    if settings is not None and not settings.empty:
        rows = recommendations(settings) + rows
    return pd.DataFrame(rows, columns=actions.columns).astype(actions.dtypes.to_dict())
