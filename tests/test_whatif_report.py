"""The weekly report with its actions replayed: a simulated day measured by the exporter,
then ``report weekly --whatif-budget``: each action that changes the layout is replayed
while the budget lasts, the rest say why not."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import pytest

from analytics.week import Week
from analytics.whatif.priced import AS_IT_IS
from exporter.cli import main
from exporter.demo import Progress
from exporter.whatif import replay
from simulator.scenario import parse_scenario
from tests.conftest import scenario_data

STEP = 600.0


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A day of the small test cluster: idle pools to scale down, an 8-GPU queue."""
    data = scenario_data(step=STEP)
    rates = {"train": 3, "urgent": 1, "half": 4, "shared": 20, "slice": 20, "spotjob": 6}
    for w in data["workloads"]:
        w["arrivals_per_day"] = rates[w["name"]]
        w["duration"] = ["1h", "6h"]
    data["pools"][0]["nodes"] = 2
    scenario = parse_scenario(data, "report")
    out = tmp_path_factory.mktemp("day")
    day = Week(scenario.start, scenario.start + timedelta(days=1))
    ran = asyncio.run(replay(scenario, day, out, Progress(round(86400 / STEP), STEP,
                                                          "the day")))
    return ran.warehouse


@pytest.mark.parametrize(("budget", "replayed"), [("10m", True), ("0.001s", False)])
def test_the_report_replays_its_actions_within_the_budget(
        tmp_path: Path, warehouse: Path, budget: str, replayed: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GKE_GPU_EXPORTER_REPORT__WHATIF_STEP", f"{STEP:g}")
    out = tmp_path / "report"
    assert main(["report", "weekly", "--week", "2026-W47", "--store", f"duckdb:{warehouse}",
                 "--out", str(out), "--force", "--whatif-budget", budget]) == 0
    doc = json.loads((out / "report.json").read_text())
    actions, rows = doc["tables"]["actions"], doc["tables"]["replayed"]
    assert rows, "some action changes the layout"
    assert list(doc["tables"]).index("replayed") == list(doc["tables"]).index("actions") + 1
    listed = {(a["action"], a["where"]): a for a in actions}
    weighed = {s["node_pool"] for s in doc["tables"]["settings"]
               if s["choice"] != AS_IT_IS}  # a pool with an alternative weighed
    recommended = {s["node_pool"]: s for s in doc["tables"]["settings"]
                   if s["choice"] == "recommended"}
    for r in rows:
        a = listed.get((r["action"], r["where"]))
        if a is None and r["where"].split(" (")[0] in weighed:
            continue  # its pool's setting was weighed: one action for the pool instead
        if a is None:  # left out: its replay moved nothing
            assert r["cost_change_usd"] == pytest.approx(0, abs=0.005), r
            assert r["waited_gpu_hours_change"] == pytest.approx(0, abs=0.005), r
            continue
        change = r["cost_change_usd"]
        if change is None:  # not replayed: a scale-down keeps the hours it matched
            assert a["weekly_cost_usd"] is None, "waiting is never priced"
        elif r["tradeoff"] and change < 0:
            assert a["weekly_saving_usd"] is None and a["weekly_cost_usd"] is None, \
                "a trade-off is no saving"
            assert a["why"].startswith("Trade-off, replayed") and r["tradeoff"] in a["why"]
        elif change < 0:
            assert a["weekly_saving_usd"] == pytest.approx(-change, abs=0.005), \
                "the action's saving is its replay's"
            assert a["weekly_cost_usd"] is None
        elif change > 0:
            assert a["weekly_cost_usd"] == pytest.approx(change, abs=0.005), \
                "the action's cost is its replay's"
            assert a["weekly_saving_usd"] is None
    done = [r for r in rows if r["cost_change_usd"] is not None]
    if not replayed:
        assert done == []
        assert all(r["note"].startswith("not replayed: over report.whatif_budget")
                   for r in rows)
        return
    assert done, "the budget holds a replay or more"
    for pool, chosen in recommended.items():
        [a] = [a for a in actions if a["action"] == f"set {pool} to {chosen['setting']}"]
        change = chosen["cost_change_usd"]
        assert (a["weekly_saving_usd"] or 0.0) - (a["weekly_cost_usd"] or 0.0) == \
            pytest.approx(-change, abs=0.005), "a recommendation's dollars are its replay's"
    for r in done:
        assert "the week's own replay" in r["note"]
        assert 0 < r["min_availability"] <= 1
    downs = [r for r in done if r["action"] == "scale this pool down"]
    assert downs and all(r["cost_change_usd"] <= 0 for r in downs), \
        "autoscaling a pool saves what its free nodes cost, or nothing where a pod holds " \
        "every node"
    assert any(r["cost_change_usd"] < 0 for r in downs)
    assert "What the actions do, replayed" in (out / "report.md").read_text()
    assert "replayed" not in json.loads(next((out / "teams").glob("*/report.json"))
                                        .read_text())["tables"], "the platform report's"
