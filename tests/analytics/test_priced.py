"""The report's actions priced by their replays (``analytics.whatif.priced``): a table of
cases, an action and its replayed row each."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analytics.tables import columns
from analytics.whatif.priced import priced

WHERE = "h100 (nvidia-h100-80gb)"


def action(name: str, answers: str | None, saving: float = np.nan,
           cost: float = np.nan) -> dict[str, Any]:
    return {"action": name, "where": WHERE, "weekly_saving_usd": saving,
            "weekly_cost_usd": cost, "why": "the evidence", "answers": answers}


def replayed(name: str, cost: float | None, waited: float = 0.0, p90: float = 0.0,
             tradeoff: str | None = None, stranded: float = 0.0) -> dict[str, Any]:
    return {"action": name, "where": WHERE, "change": "the layout", "cost_change_usd": cost,
            "waited_gpu_hours_change": None if cost is None else waited, "team": "research",
            "wait_p90_change_seconds": None if cost is None else p90,
            "wait_p90_seconds": None if cost is None else 3600.0 + p90,
            "stranded_gpu_hours_change": None if cost is None else stranded,
            "min_availability": None if cost is None else 1.0,
            "reclaims_change": None if cost is None else 0.0, "tradeoff": tradeoff,
            "note": "not replayed: over report.whatif_budget (1 s)" if cost is None else ""}


ADD = "add capacity (max nodes)"
DOWN = "scale this pool down"

CASES = [
    # (the action, its replay or None, saving, cost, why starts with) — None: left out
    (action(ADD, "no_capacity"), replayed(ADD, 6000.0, waited=-2800.0, p90=-18 * 3600.0),
     (None, 6000.0, "Replayed (the layout): costs $6,000.00 a week, 2,800 GPU-hours less "
                    "waiting, research's p90 -18.0h")),
    (action(DOWN, "no_demand", saving=5000.0), replayed(DOWN, -4800.0, waited=13.0, p90=300.0),
     (4800.0, None, "Replayed (the layout): saves $4,800.00 a week, 13 GPU-hours more "
                    "waiting, research's p90 +5m (to 65m)")),
    (action(DOWN, "no_demand", saving=5000.0),
     replayed(DOWN, -4800.0, waited=900.0, tradeoff="research's p90 1.0h → 9.0h, past its "
                                                    "4.0h target"),
     (None, None, "Trade-off, replayed (the layout): saves $4,800.00 a week, 900 GPU-hours "
                  "more waiting, but research's p90 1.0h → 9.0h, past its 4.0h target")),
    (action(DOWN, "no_demand", saving=5000.0), replayed(DOWN, 0.0), None),
    (action(ADD, "no_capacity"), None, None),
    (action(DOWN, "no_demand", saving=5000.0), replayed(DOWN, None),
     (5000.0, None, "the evidence")),
    (action("fix the manifests", "unschedulable"), None, (None, None, "the evidence")),
    (action("share lightly used GPUs", None, saving=190.0), None,
     (190.0, None, "the evidence")),
]


@pytest.mark.parametrize(("act", "replay", "expected"), CASES,
                         ids=["a cost", "a saving", "a trade-off", "moves nothing",
                              "the layout has it already", "not replayed",
                              "no layout change", "a lever of the week's cost"])
def test_an_actions_dollars_are_its_replays(act: dict[str, Any], replay: dict[str, Any] | None,
                                            expected: tuple[Any, ...] | None) -> None:
    actions = pd.DataFrame([act], columns=columns("actions"))
    replays = pd.DataFrame([replay] if replay else [], columns=columns("replayed"))
    out = priced(actions, replays)
    if expected is None:
        assert out.empty
        return
    [row] = out.to_dict("records")
    saving, cost, why = expected
    assert (None if math.isnan(row["weekly_saving_usd"]) else row["weekly_saving_usd"]) == \
        saving
    assert (None if math.isnan(row["weekly_cost_usd"]) else row["weekly_cost_usd"]) == cost
    assert row["why"].startswith(why)
    assert row["why"].endswith("the evidence")
