"""Discounts as finance writes them: negotiated fractions per GPU model or machine family,
resource-based commitments at their term price, spot as priced."""

from __future__ import annotations

import pytest

from exporter.config import load_config
from exporter.errors import ConfigError
from exporter.model.catalog import MACHINE_FAMILIES
from exporter.model.compute import on_demand_gpus
from exporter.model.prices import Commitment, effective_prices, unused_commitment
from tests.exporter.test_compute import node

LIST = {("nvidia-h100-80gb", "on-demand"): 10.0, ("nvidia-h100-80gb", "spot"): 4.0,
        ("nvidia-h200-141gb", "on-demand"): 12.0, ("nvidia-l4", "on-demand"): 0.6,
        ("nvidia-l4", "spot"): 0.25}
H100 = "nvidia-h100-80gb"


@pytest.mark.parametrize(("present", "commitments", "negotiated", "expected"), [
    # nothing agreed: the list price
    (16, [], {}, 10.0),
    # negotiated by model
    (16, [], {H100: 0.1}, 9.0),
    # by family (A3 sells H100 and H200), the model's own entry first
    (16, [], {"a3": 0.2}, 8.0),
    (16, [], {"a3": 0.2, H100: 0.05}, 9.5),
    # 8 committed at $6 of 16 present: half at the term price, half at list
    (16, [Commitment(H100, 8, 6.0)], {}, 8.0),
    # ... and the uncovered half at the negotiated list price
    (16, [Commitment(H100, 8, 6.0)], {H100: 0.1}, 7.5),
    # as many present as committed, or fewer: each at the term price
    (8, [Commitment(H100, 8, 6.0)], {}, 6.0),
    (4, [Commitment(H100, 8, 6.0)], {}, 6.0),
    # two commitments of one model add their GPUs and their cost
    (16, [Commitment(H100, 8, 6.0), Commitment(H100, 8, 5.0)], {}, 5.5),
    (24, [Commitment(H100, 8, 6.0), Commitment(H100, 8, 5.0)], {}, (48 + 40 + 80) / 24),
    # none present: the list price (no GPU carries it)
    (0, [Commitment(H100, 8, 6.0)], {}, 10.0),
])
def test_on_demand_price_after_what_finance_agreed(
        present: float, commitments: list[Commitment], negotiated: dict[str, float],
        expected: float) -> None:
    prices = effective_prices(LIST, {H100: present}, commitments, negotiated)
    assert prices[H100, "on-demand"] == pytest.approx(expected)


def test_spot_is_as_priced() -> None:
    prices = effective_prices(LIST, {H100: 16}, [Commitment(H100, 8, 1.0)], {"a3": 0.5, H100: 0.5})
    assert prices[H100, "spot"] == 4.0
    assert prices["nvidia-l4", "spot"] == 0.25


def test_other_models_keep_their_own_terms() -> None:
    prices = effective_prices(LIST, {H100: 16, "nvidia-l4": 4}, [Commitment(H100, 8, 6.0)],
                              {"g2": 0.1})
    assert prices["nvidia-l4", "on-demand"] == pytest.approx(0.54)
    assert prices["nvidia-h200-141gb", "on-demand"] == 12.0


def test_unused_commitment() -> None:
    c = [Commitment(H100, 8, 6.0), Commitment(H100, 4, 3.0)]
    assert unused_commitment(c, {H100: 10})[H100] == pytest.approx((12, 2, 2 * 60 / 12))
    assert unused_commitment(c, {H100: 16}) == {H100: (12, 0, 0)}
    assert unused_commitment(c, {}) == {H100: (12, 12, 60.0)}


def test_families_are_those_of_the_catalogue() -> None:
    assert set(MACHINE_FAMILIES) == {"a2", "a3", "g2", "n1"}
    assert set(MACHINE_FAMILIES["a3"]) == {"nvidia-h100-80gb", "nvidia-h200-141gb"}
    assert set(MACHINE_FAMILIES["a2"]) == {"nvidia-a100-80gb", "nvidia-tesla-a100"}
    assert MACHINE_FAMILIES["g2"] == ("nvidia-l4",)
    assert set(MACHINE_FAMILIES["n1"]) == {"nvidia-tesla-t4", "nvidia-tesla-v100",
                                   "nvidia-tesla-p100", "nvidia-tesla-p4"}


def test_committed_gpus_are_counted_by_machine_type() -> None:
    nodes = [node(name="a", accelerator=H100, capacity_gpus=8, instance_type="a3-highgpu-8g"),
             node(name="b", accelerator=H100, capacity_gpus=8, instance_type="a3-highgpu-8g",
                  provisioning="spot"),
             node(name="c", accelerator="nvidia-tesla-a100", capacity_gpus=7,
                  instance_type="a2-highgpu-1g", mig_profile="1g.5gb"),
             node(name="d", accelerator="nvidia-tesla-t4", capacity_gpus=2,
                  instance_type="n1-standard-16")]
    assert on_demand_gpus(nodes) == {H100: 8, "nvidia-tesla-a100": 1, "nvidia-tesla-t4": 2}


def test_config_takes_commitments_and_negotiated_discounts() -> None:
    cfg = load_config(None, overrides={"prices": {
        "negotiated": {"a3": 0.1, "nvidia-l4": 0.05},
        "commitments": [{"gpu": H100, "gpus": 16, "usd_per_gpu_hour": 6.2, "term": "3y"}]}})
    assert cfg.prices.negotiated == {"a3": 0.1, "nvidia-l4": 0.05}
    assert cfg.prices.commitments[0].gpus == 16


@pytest.mark.parametrize(("prices", "message"), [
    ({"negotiated": {"z9": 0.1}}, "not a GPU model or a machine family"),
    ({"negotiated": {"a3": 1.2}}, "must be in [0, 1)"),
    ({"commitments": [{"gpu": "nvidia-b300", "gpus": 8, "usd_per_gpu_hour": 5,
                       "term": "1y"}]}, "unknown GPU model 'nvidia-b300'"),
    ({"commitments": [{"gpu": H100, "gpus": 0, "usd_per_gpu_hour": 5, "term": "1y"}]},
     "greater than 0"),
    ({"commitments": [{"gpu": H100, "gpus": 8, "usd_per_gpu_hour": 5, "term": "2y"}]},
     "'1y' or '3y'"),
])
def test_bad_terms_are_refused(prices: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        load_config(None, overrides={"prices": prices})
