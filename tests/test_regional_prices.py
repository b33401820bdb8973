"""A cluster outside us-central1 (the embedded ``europe`` scenario: H200 and L4 in
europe-west1, on demand and spot) is priced from the shipped book, to the cent of the
simulator's ground truth, and no GPU of it goes unpriced."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from exporter.app import open_exporter
from exporter.demo import demo_config, step_both
from exporter.prices import load_price_book
from simulator.scenario import load_scenario
from simulator.server import SimulatorServer

HOURS = 6


async def run(out: Path) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float],
                                  set[float | None], int]:
    scenario = load_scenario("europe").model_copy(update={"step": 60.0})
    async with SimulatorServer(scenario) as sim:
        outputs = sim.write_outputs(out)
        cfg = demo_config(scenario, outputs.kubeconfig, out)
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(30):
                await exporter.kube.wait_synced()
            await exporter.cycle(sim.cluster.now)
            await step_both(sim, exporter, round(HOURS * 3600 / scenario.step))
            sim.cluster.close()
            truth = sim.cluster.truth.report(sim.cluster.start, sim.cluster.now)
            book = load_price_book(None, scenario.region)
            expected: dict[tuple[str, str], float] = {}
            for (accel, prov), secs in truth.seconds_by("accelerator", "provisioning").items():
                price = book.hourly(accel, prov)
                assert price is not None, (accel, prov)
                expected[accel, prov] = expected.get((accel, prov), 0.0) + secs / 3600 * price
            ours: dict[tuple[str, str], float] = {}
            for key, cost in exporter.totals.cost_usd.items():
                accel, prov = key.accelerator, key.provisioning
                ours[accel, prov] = ours.get((accel, prov), 0.0) + cost
            unpriced = sum(1 for d in exporter.states if d.price_usd_per_hour is None)
            shown = {d.price_usd_per_hour for d in exporter.states
                     if d.accelerator == "nvidia-h200-141gb" and d.provisioning == "spot"}
            return ours, expected, shown, unpriced


def test_europe_west1_h200_and_l4_are_priced_to_the_cent(tmp_path: Path) -> None:
    ours, expected, shown, unpriced = asyncio.run(run(tmp_path))
    assert unpriced == 0
    assert set(expected) == {("nvidia-h200-141gb", "on-demand"), ("nvidia-h200-141gb", "spot"),
                             ("nvidia-l4", "on-demand"), ("nvidia-l4", "spot")}
    assert set(ours) == set(expected)
    for key, cost in expected.items():
        assert ours[key] == pytest.approx(cost, abs=0.01), key
    assert shown == {4.101264}  # europe-west1's H200 spot price, not us-central1's
