"""GPU energy and CO2e (``exporter.model.energy``): the definitions, a table of cases each,
and the split of a GPU's energy among its MIG instances and the pods sharing it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.model import compute
from exporter.model.carbon import load_carbon_book
from exporter.model.energy import (
    ENERGY,
    MAX_GPU_WATTS,
    POWER,
    Carbon,
    Energy,
    gpu_energy,
    grams_per_joule,
    interval_energy,
)
from exporter.model.records import DeviceReading
from tests.exporter.test_compute import node, reading, states

S = 30.0


@pytest.mark.parametrize(("case", "start", "end", "expected"), [
    ("the counter's increase, mJ to J", {ENERGY: 1_000_000.0, POWER: 100.0},
     {ENERGY: 4_000_000.0, POWER: 300.0}, Energy(3000.0, "counter")),
    ("a counter that did not move: nothing drawn", {ENERGY: 5e6}, {ENERGY: 5e6},
     Energy(0.0, "counter")),
    ("a counter that went backwards: the power integral (trapezoid)",
     {ENERGY: 9e9, POWER: 100.0}, {ENERGY: 1_000_000.0, POWER: 200.0}, Energy(4500.0, "reset")),
    ("a reset, with more counted since it than the power says: the counter",
     {ENERGY: 9e9, POWER: 10.0}, {ENERGY: 2_000_000.0, POWER: 10.0}, Energy(2000.0, "reset")),
    ("a reset without power readings: what the counter counted since",
     {ENERGY: 9e9}, {ENERGY: 1_500_000.0}, Energy(1500.0, "reset")),
    ("a counter that jumped past any GPU's power: the power integral",
     {ENERGY: 0.0, POWER: 100.0}, {ENERGY: MAX_GPU_WATTS * S * 1000 * 2, POWER: 100.0},
     Energy(3000.0, "reset")),
    ("a jump and no power: unknown", {ENERGY: 0.0}, {ENERGY: 1e15}, None),
    ("no counter on the page: the power integral", {POWER: 100.0}, {POWER: 300.0},
     Energy(6000.0, "power")),
    ("not read at the end: the start's power held", {POWER: 100.0, ENERGY: 1.0}, None,
     Energy(3000.0, "power")),
    ("no power at the start: unknown", {}, {POWER: 100.0, ENERGY: 5.0}, None),
    ("a NaN counter: the power integral", {ENERGY: math.nan, POWER: 50.0},
     {ENERGY: 7.0, POWER: 50.0}, Energy(1500.0, "power")),
    ("a negative power reading is no reading", {POWER: -5.0}, {POWER: 100.0}, None),
])
def test_interval_energy(case: str, start: dict[str, float], end: dict[str, float] | None,
                         expected: Energy | None) -> None:
    got = interval_energy(start, end, S)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert (got.joules, got.basis) == (pytest.approx(expected.joules), expected.basis)


@given(st.floats(0, 1e12), st.floats(0, MAX_GPU_WATTS * S * 1000))
def test_a_counter_that_rises_is_read_as_it_is(c0: float, rose: float) -> None:
    got = interval_energy({ENERGY: c0}, {ENERGY: c0 + rose}, S)
    assert got is not None and got.basis == "counter"
    assert got.joules == pytest.approx(rose / 1000, rel=1e-9, abs=1e-3)


def test_a_time_shared_gpu_splits_its_energy_evenly_like_its_cost() -> None:
    n = node(capacity_gpus=2, allocatable_gpus=2, clients_per_gpu=2)
    before = states([n], {"n1": [reading(pods=("a", "b"),
                                         DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=0)]})
    after = states([n], {"n1": [reading(pods=("a", "b"),
                                        DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=6e6)]})
    energy = gpu_energy(before, after, S)
    rows = compute.usage_rows(before, 0.0, S, energy, {before[0].zone: 1e-4})
    assert {r.owner.uid if r.owner else None: r.joules for r in rows} == \
        {"uid-a": 3000.0, "uid-b": 3000.0}
    assert [r.co2e_grams for r in rows] == pytest.approx([0.3, 0.3])
    assert [r.cost_usd for r in rows] == pytest.approx([0.7 * S / 3600 / 2] * 2)


def test_mig_instances_share_their_gpus_energy_by_compute_slices() -> None:
    """Two 1g and one 3g instance (5/7 of the GPU in all): the GPU's 5,000 J as 1:1:3."""
    n = node(accelerator="nvidia-tesla-a100", capacity_gpus=3, allocatable_gpus=3,
             mig_profile="1g.5gb")

    def instances(counter: float) -> list[DeviceReading]:
        out = [reading(pods=("a",), instance="1", DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=counter),
               reading(instance="2", DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=counter),
               reading(pods=("b",), instance="3", DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=counter)]
        out[2].mig_profile = "3g.20gb"
        return out

    before = states([n], {"n1": instances(0.0)})
    after = states([n], {"n1": instances(5e6)})
    rows = compute.usage_rows(before, 0.0, S, gpu_energy(before, after, S))
    got = {r.device.device_id: r.joules for r in rows}
    assert sorted(got.values()) == pytest.approx([1000.0, 1000.0, 3000.0])
    assert sum(got.values()) == pytest.approx(5000.0)
    unallocated = [r for r in rows if r.owner is None]
    assert [r.joules for r in unallocated] == pytest.approx([1000.0])  # the idle slice's own


def test_a_gpu_not_read_has_no_energy_rather_than_zero() -> None:
    before = states([node(ready=False)], {})
    (row,) = compute.usage_rows(before, 0.0, S, gpu_energy(before, before, S))
    assert row.device.state == "unavailable"
    assert row.joules is None and row.co2e_grams is None and row.energy_basis is None


def test_co2e_is_energy_times_pue_times_intensity_to_the_gram() -> None:
    book = load_carbon_book(None)
    carbon = Carbon.of(book)
    grid = book.regions["us-central1"].grid_g_per_kwh
    (factor,) = carbon.factors(["us-central1-a"]).values()
    kwh = 1234.5
    assert kwh * 3.6e6 * factor == pytest.approx(kwh * book.pue * grid, abs=0.5)
    assert grams_per_joule(500.0, 1.0) * 3.6e6 == pytest.approx(500.0)
    assert str(book.year) in carbon.basis and f"PUE {book.pue:g}" in carbon.basis


def test_a_sites_own_factor_and_pue_replace_the_published_ones() -> None:
    carbon = Carbon.of(load_carbon_book(None), pue=1.4, site_g_per_kwh=100.0)
    assert carbon.factors(["us-central1-a", "europe-west4-b", "nowhere-1-a"]) == \
        dict.fromkeys(["us-central1-a", "europe-west4-b", "nowhere-1-a"],
                      pytest.approx(100.0 * 1.4 / 3.6e6))
    assert carbon.basis == "site factor 100 gCO2e/kWh; PUE 1.4"


def test_a_region_the_data_lacks_has_no_co2e() -> None:
    assert Carbon.of(load_carbon_book(None)).factors(["mars-north1-a"]) == {}
