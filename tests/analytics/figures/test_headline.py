"""The headline and the price basis (``analytics.figures.headline``)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from analytics.figures.headline import Pricing, price_basis
from analytics.figures.headline import headline as headline_of
from tests.analytics.figures.frames import U, usage


def test_headline() -> None:
    h = headline_of(U)
    assert h["cost_usd"] == 31.0 and h["previous_cost_usd"] == 10.0
    assert h["cost_change"] == pytest.approx(2.1)
    assert h["gpu_hours"] == 4.0 and h["allocated_gpu_hours"] == 3.0
    assert h["utilization"] == pytest.approx(0.75)     # team b's GPU had no reading
    assert h["fleet_cost_usd_per_utilized_hour"] == pytest.approx(31.0 / 1.5)
    assert h["idle_cost_usd"] == 5.0 and h["idle_share"] == pytest.approx(5 / 31)
    assert h["unallocated_share"] == pytest.approx(10 / 31)


def test_headline_of_an_empty_week_has_no_ratios() -> None:
    h = headline_of(usage())
    assert h["cost_usd"] == 0 and h["cost_change"] is None and h["utilization"] is None


H100, L4, T4 = "nvidia-h100-80gb", "nvidia-l4", "nvidia-tesla-t4"
LIST = {(H100, "on-demand"): 10.0, (H100, "spot"): 2.0, (L4, "on-demand"): 0.5,
        (T4, "on-demand"): 0.35}
MACHINES = {(H100, "on-demand"): (1.2, 1.2), (H100, "spot"): (0.3, 0.3),
            (L4, "on-demand"): (0.15, 1.15)}


def priced(*rows: tuple[str, str, bool, float, float, float]) -> pd.DataFrame:
    """(model, provisioning, this week, GPU-hours, priced GPU-hours, cost) as
    ``queries.USAGE`` has them."""
    return pd.DataFrame([(m, p, w, h * 3600, ph * 3600, c) for m, p, w, h, ph, c in rows],
                        columns=["gpu_model", "provisioning", "this_week", "gpu_seconds",
                                 "priced_seconds", "cost_usd"])


def pricing(**overrides: Any) -> Pricing:
    return Pricing(**({"list_prices": LIST, "region": "us-central1",
                               "as_of": dict.fromkeys(LIST, "2026-02-24"),
                               "machine_usd_per_gpu_hour": MACHINES} | overrides))


BASES = [
    ("list prices, no discount", priced((H100, "on-demand", True, 10, 10, 100.0)), pricing(),
     {"off_list_usd": 0.0, "list_cost_usd": 100.0, "machine_usd": (12.0, 12.0),
      "machine_share": (12 / 112, 12 / 112), "machine_models": (H100,),
      "machine_unknown": (), "spot_hour_share": 0.0, "as_of": ("2026-02-24",)}),
    ("a negotiated discount took 10 %",
     priced((H100, "on-demand", True, 10, 10, 90.0)), pricing(discounts=("negotiated",)),
     {"discounts": ("negotiated",), "off_list_usd": 10.0, "off_list_share": 0.1,
      "machine_share": (12 / 102, 12 / 102)}),
    ("a discount configured that took nothing off",
     priced((T4, "on-demand", True, 10, 10, 3.5)), pricing(discounts=("negotiated",)),
     {"off_list_usd": 0.0, "off_list_share": 0.0}),
    ("other list prices than these, no discount",
     priced((H100, "on-demand", True, 10, 10, 110.0)), pricing(),
     {"discounts": (), "off_list_usd": -10.0}),
    ("spot: its share of GPU-hours and of cost",
     priced((H100, "on-demand", True, 10, 10, 100.0), (H100, "spot", True, 30, 30, 60.0)),
     pricing(),
     {"spot_hour_share": 0.75, "spot_cost_share": 60 / 160, "machine_usd": (21.0, 21.0),
      "off_list_usd": 0.0}),
    ("machine types that share a GPU-hour differently: a range",
     priced((L4, "on-demand", True, 100, 100, 50.0)), pricing(),
     {"machine_usd": (15.0, 115.0), "machine_share": (15 / 65, 115 / 165)}),
    ("the machine share known for some models only",
     priced((H100, "on-demand", True, 10, 10, 100.0), (T4, "on-demand", True, 30, 30, 10.5)),
     pricing(),
     {"machine_usd": (12.0, 12.0), "machine_share": (12 / 112, 12 / 112),
      "machine_models": (H100,), "machine_unknown": (T4,),
      "machine_unknown_hour_share": 0.75}),
    ("the machine share known for none",
     priced((T4, "on-demand", True, 10, 10, 3.5)), pricing(),
     {"machine_usd": None, "machine_share": None, "machine_unknown": (T4,),
      "machine_unknown_hour_share": 1.0}),
    ("unpriced GPU-hours: no cost, no list cost, no machine",
     priced((H100, "on-demand", True, 10, 10, 100.0), ("nvidia-h200-141gb", "spot", True,
                                                       5, 0, 0.0)),
     pricing(),
     {"unpriced_gpu_hours": 5.0, "list_cost_usd": 100.0, "off_list_usd": 0.0,
      "spot_hour_share": 1 / 3, "spot_cost_share": 0.0}),
    ("the week before does not count",
     priced((H100, "on-demand", True, 10, 10, 100.0), (H100, "spot", False, 99, 99, 1.0)),
     pricing(), {"spot_hour_share": 0.0, "cost_usd": 100.0, "off_list_usd": 0.0}),
    ("the dates of the prices the week used",
     priced((H100, "on-demand", True, 10, 10, 100.0), (H100, "spot", True, 10, 10, 20.0)),
     pricing(as_of={(H100, "on-demand"): "2026-02-24", (H100, "spot"): "2026-03-20",
                    (T4, "on-demand"): "2025-01-01"}, estimated=frozenset({(H100, "spot")})),
     {"as_of": ("2026-02-24", "2026-03-20"), "estimated": (f"{H100} spot",)}),
    ("prices the list does not have: nothing to compare",
     priced(("nvidia-h200-141gb", "on-demand", True, 10, 10, 90.0)), pricing(),
     {"list_cost_usd": None, "off_list_usd": None, "as_of": ("2026-02-24",)}),
    ("a week without GPU-hours",
     priced(), pricing(), {"spot_hour_share": None, "spot_cost_share": None,
                           "machine_usd": None, "unpriced_gpu_hours": 0.0}),
]


def _numbers(v: object) -> bool:
    return isinstance(v, float) or (isinstance(v, tuple) and bool(v)
                                    and all(isinstance(x, float) for x in v))


@pytest.mark.parametrize(("case", "usage_rows", "given", "expected"), BASES,
                         ids=[b[0] for b in BASES])
def test_price_basis(case: str, usage_rows: pd.DataFrame, given: Pricing,
                     expected: dict[str, Any]) -> None:
    b = price_basis(usage_rows, given)
    for k, v in expected.items():
        assert getattr(b, k) == (pytest.approx(v) if _numbers(v) else v), k


def test_pricing_of_the_shipped_book_and_a_configuration() -> None:
    """A machine share where the machine types of a model all give one (A3), a range where
    they differ (G2), none where no machine type fixes the GPU count (N1's T4); the
    discounts and the catalogue as configured."""
    from exporter.config import load_config
    from exporter.model.prices import load_price_book

    book = load_price_book(None, "us-central1")
    cfg = load_config(None, {"cluster": "c", "prices": {
        "negotiated": {"a3": 0.05}, "default_discount": 0.1, "catalog": {"enabled": True},
        "commitments": [{"gpu": H100, "gpus": 8, "usd_per_gpu_hour": 6.0, "term": "1y"}]}})
    p = Pricing.of(book, cfg.prices)
    h100 = p.machine_usd_per_gpu_hour[H100, "on-demand"]
    assert h100[0] == h100[1] == pytest.approx(
        book.machine_share("a3-highgpu-8g", "on-demand"))
    low, high = p.machine_usd_per_gpu_hour[L4, "on-demand"]
    assert low == pytest.approx(book.machine_share("g2-standard-4", "on-demand"))
    assert high == pytest.approx(book.machine_share("g2-standard-32", "on-demand"))
    assert (T4, "on-demand") not in p.machine_usd_per_gpu_hour
    assert p.discounts == ("negotiated", "committed-use", "node-pool") and p.catalog
    assert p.as_of[H100, "spot"] == book.provenance[H100, "spot"].as_of
    assert p.list_prices == book.prices and p.region == "us-central1"
    bare = Pricing.of(book)
    assert bare.discounts == () and not bare.catalog
