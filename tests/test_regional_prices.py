"""A cluster outside us-central1 (the embedded ``europe`` scenario: H200 and L4 in
europe-west1, on demand and spot) is priced from the shipped book, to the cent of the
simulator's ground truth, and no GPU of it goes unpriced."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from exporter.config import Prices
from exporter.demo import demo_config, step_both
from exporter.model.prices import Commitment, effective_prices, load_price_book
from exporter.runtime.app import open_exporter
from simulator.scenario import load_scenario
from simulator.server import SimulatorServer
from tests.timing import limit

HOURS = 6
H200_L4_ON_DEMAND = {"nvidia-h200-141gb": 16.0, "nvidia-l4": 2.0}
"""The scenario's on-demand GPUs: two a3-ultragpu-8g nodes, two g2-standard-8."""


async def run(out: Path, terms: dict[str, Any] | None = None
              ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float],
                         set[float | None], int, str]:
    """The exporter's cost per (model, provisioning) over the scenario's first hours, and
    the truth's GPU-seconds at ``price`` (per (model, provisioning): the book's list price
    by default)."""
    scenario = load_scenario("europe").model_copy(update={"step": 60.0})
    async with SimulatorServer(scenario) as sim:
        outputs = sim.write_outputs(out)
        cfg = demo_config(scenario, outputs.kubeconfig, out)
        if terms:
            cfg = cfg.model_copy(update={"prices": Prices.model_validate(
                cfg.prices.model_dump() | terms)})
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(limit(30)):
                await exporter.kube.wait_synced()
            await exporter.cycle(sim.cluster.now)
            await step_both(sim, exporter, round(HOURS * 3600 / scenario.step))
            sim.cluster.close()
            truth = sim.cluster.truth.report(sim.cluster.start, sim.cluster.now)
            book = load_price_book(None, scenario.region)
            price_of = effective_prices(book.prices, H200_L4_ON_DEMAND, [
                Commitment(c.gpu, c.gpus, c.usd_per_gpu_hour) for c in cfg.prices.commitments],
                cfg.prices.negotiated)
            expected: dict[tuple[str, str], float] = {}
            for (accel, prov), secs in truth.seconds_by("accelerator", "provisioning").items():
                price = price_of.get((accel, prov))
                if price is None:  # unpriced: no cost, counted instead
                    continue
                expected[accel, prov] = expected.get((accel, prov), 0.0) + secs / 3600 * price
            ours: dict[tuple[str, str], float] = {}
            for key, cost in exporter.totals.cost_usd.items():
                accel, prov = key.accelerator, key.provisioning
                ours[accel, prov] = ours.get((accel, prov), 0.0) + cost
            unpriced = sum(1 for d in exporter.states if d.price_usd_per_hour is None)
            shown = {d.price_usd_per_hour for d in exporter.states
                     if d.accelerator == "nvidia-h200-141gb" and d.provisioning == "spot"}
            text = exporter.metrics.text.decode()
            return ours, expected, shown, unpriced, text


H200_SPOT_GPUS = 8
"""The scenario's spot H200s: one a3-ultragpu-8g node. Google publishes no H200 spot price
the book's snapshots hold (their figures are the package's estimates, left out)."""


def test_europe_west1_h200_and_l4_are_priced_to_the_cent(tmp_path: Path) -> None:
    """Published prices to the cent; the H200 spot GPUs, whose only figure is an estimate,
    unpriced: counted and shown, with no cost."""
    ours, expected, shown, unpriced, text = asyncio.run(run(tmp_path))
    assert unpriced == H200_SPOT_GPUS
    assert set(expected) == {("nvidia-h200-141gb", "on-demand"),
                             ("nvidia-l4", "on-demand"), ("nvidia-l4", "spot")}
    for key, cost in expected.items():
        assert ours[key] == pytest.approx(cost, abs=0.01), key
    assert not ours.get(("nvidia-h200-141gb", "spot"))
    assert shown == {None}
    assert 'gke_gpu_exporter_unpriced_gpus{cluster="europe",model="nvidia-h200-141gb"' \
           in text


def test_a_commitment_and_a_negotiated_discount_price_the_on_demand_gpus(
        tmp_path: Path) -> None:
    """8 of the 16 on-demand H200s committed at $6 (3-year), 10 % off G2's list: the H200s
    carry the blend, the L4s the negotiated price, spot stays as priced."""
    terms = {"commitments": [{"gpu": "nvidia-h200-141gb", "gpus": 8,
                              "usd_per_gpu_hour": 6.0, "term": "3y"}],
             "negotiated": {"g2": 0.1}}
    ours, expected, shown, unpriced, text = asyncio.run(run(tmp_path, terms))
    assert unpriced == H200_SPOT_GPUS
    for key, cost in expected.items():
        assert ours[key] == pytest.approx(cost, abs=0.01), key
    h200 = effective_prices({("nvidia-h200-141gb", "on-demand"): 10.25316},
                            H200_L4_ON_DEMAND, [Commitment("nvidia-h200-141gb", 8, 6.0)])
    assert h200["nvidia-h200-141gb", "on-demand"] == pytest.approx((8 * 6 + 8 * 10.25316) / 16)
    assert shown == {None}
    assert 'gke_gpu_commitment_gpus{cluster="europe",model="nvidia-h200-141gb"} 8' in text
    assert 'gke_gpu_commitment_unused_gpus{cluster="europe",model="nvidia-h200-141gb"} 0' in text
