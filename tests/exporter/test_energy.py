"""GPU energy and CO2e (``exporter.model.energy``): the definitions, a table of cases each;
the counter carried from one interval to the next, over random runs of DCGM collection
periods, exporter cycles, draws and driver reloads; and the split of a GPU's energy among
its MIG instances and the pods sharing it."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.model import compute
from exporter.model.carbon import load_carbon_book
from exporter.model.energy import (
    ENERGY,
    LONGEST_COLLECTION_SECONDS,
    MAX_GPU_WATTS,
    POWER,
    Carbon,
    CounterState,
    Energy,
    EnergyStep,
    gpu_energy,
    grams_per_joule,
    interval_energy,
)
from exporter.model.records import DeviceReading
from tests.exporter.test_compute import U, node, reading, states

S = 30.0
MOVED = CounterState(0.0, since=-S, moved_at=0.0, first_moved_at=-S, moves=1)
"""A counter at 0 that moved in the interval before, as in each one before it (DCGM collects
every interval)."""


def after(counter_mj: float, **changes: float | None) -> CounterState:
    """A counter at ``counter_mj`` that moved in the interval before, with ``changes``."""
    return replace(MOVED, counter_mj=counter_mj, **changes)


@pytest.mark.parametrize(("case", "start", "end", "counter", "expected"), [
    ("the counter's increase, mJ to J", {ENERGY: 1_000_000.0, POWER: 100.0},
     {ENERGY: 4_000_000.0, POWER: 300.0}, after(1e6), Energy(3000.0, "counter")),
    ("a counter first read that did not move, no power: nothing yet", {ENERGY: 5e6},
     {ENERGY: 5e6}, None, Energy(0.0, "counter")),
    ("a counter that did not move since the last cycle: on account, at its mean power over "
     "its last rise", {ENERGY: 5e6, POWER: 200.0}, {ENERGY: 5e6, POWER: 200.0},
     after(5e6, watts=100.0), Energy(3000.0, "counter")),
    ("before it has risen twice: on account, at the power integral",
     {ENERGY: 5e6, POWER: 100.0}, {ENERGY: 5e6, POWER: 100.0},
     after(5e6, first_moved_at=0.0, moves=0), Energy(3000.0, "counter")),
    ("the rise pays first for the intervals given on account",
     {ENERGY: 0.0, POWER: 500.0}, {ENERGY: 9e6, POWER: 500.0},
     after(0.0, since=-3 * S, moved_at=-2 * S, first_moved_at=-5 * S, watts=100.0,
           ahead_joules=6000.0),
     Energy(3000.0, "counter")),
    ("what the intervals were given beyond the counter is paid back over the next period, "
     "never below half of what they are given on account",
     {ENERGY: 0.0, POWER: 100.0}, {ENERGY: 0.0, POWER: 100.0},
     after(0.0, owed_joules=-1e6, installment_joules=-250_000.0, first_moved_at=-4 * S,
           watts=100.0),
     Energy(1500.0, "counter")),
    ("what the counter counted beyond them is paid over the next period, a share each",
     {ENERGY: 0.0, POWER: 100.0}, {ENERGY: 0.0, POWER: 100.0},
     after(0.0, owed_joules=4000.0, installment_joules=1000.0, first_moved_at=-4 * S,
           watts=100.0), Energy(4000.0, "counter")),
    ("no more is paid than is owed", {ENERGY: 0.0, POWER: 100.0}, {ENERGY: 0.0, POWER: 100.0},
     after(0.0, owed_joules=400.0, installment_joules=1000.0, first_moved_at=-4 * S,
           watts=100.0), Energy(3400.0, "counter")),
    ("a rise beyond what the intervals were given on account: a 60-second collection "
     "period, so half of it now", {ENERGY: 0.0, POWER: 100.0}, {ENERGY: 12e6, POWER: 100.0},
     after(0.0, since=-2 * S, moved_at=-S, first_moved_at=-3 * S, watts=100.0),
     Energy(9000.0, "counter")),
    ("at its second rise its pace is new: the interval is given it, nothing is settled",
     {ENERGY: 0.0, POWER: 500.0}, {ENERGY: 3e6, POWER: 500.0},
     after(0.0, ahead_joules=7777.0), Energy(3000.0, "counter")),
    ("a counter still for longer than DCGM ever waits to collect: the power integral",
     {ENERGY: 5e6, POWER: 100.0}, {ENERGY: 5e6, POWER: 100.0},
     after(5e6, since=-LONGEST_COLLECTION_SECONDS, watts=50.0), Energy(3000.0, "power")),
    ("a counter first read: its first rise is where it is read from, the power integral",
     {ENERGY: 0.0, POWER: 100.0}, {ENERGY: MAX_GPU_WATTS * S * 1000 * 3}, None,
     Energy(3000.0, "counter")),
    ("a counter first read that rises by less than the power integral: its rise (DCGM "
     "collects every interval)", {ENERGY: 0.0, POWER: 400.0}, {ENERGY: 3e6, POWER: 400.0},
     None, Energy(3000.0, "counter")),
    ("a counter first read that rises, no power: nothing (its rise may predate the reading)",
     {ENERGY: 0.0}, {ENERGY: 3e6}, None, Energy(0.0, "counter")),
    ("a counter that went backwards: the power integral (trapezoid)",
     {ENERGY: 9e9, POWER: 100.0}, {ENERGY: 1_000_000.0, POWER: 200.0}, None,
     Energy(4500.0, "reset")),
    ("a reset, with more counted since it than the power says: the counter",
     {ENERGY: 9e9, POWER: 10.0}, {ENERGY: 2_000_000.0, POWER: 10.0}, None,
     Energy(2000.0, "reset")),
    ("a reset without power readings: what the counter counted since",
     {ENERGY: 9e9}, {ENERGY: 1_500_000.0}, None, Energy(1500.0, "reset")),
    ("a reset after intervals on account: what it counted since, less what they were given",
     {ENERGY: 9e9, POWER: 10.0}, {ENERGY: 20_000_000.0, POWER: 10.0},
     after(9e9, since=-10 * S, moved_at=-9 * S, first_moved_at=-10 * S,
           ahead_joules=2700.0),
     Energy(17_300.0, "reset")),
    ("a counter that jumped past any GPU's power since it last moved: the power integral",
     {ENERGY: 0.0, POWER: 100.0}, {ENERGY: MAX_GPU_WATTS * S * 1000 * 3, POWER: 100.0},
     MOVED, Energy(3000.0, "reset")),
    ("a jump and no power: unknown", {ENERGY: 0.0}, {ENERGY: 1e15}, MOVED, None),
    ("no counter on the page: the power integral", {POWER: 100.0}, {POWER: 300.0}, None,
     Energy(6000.0, "power")),
    ("not read at the end: the start's power held", {POWER: 100.0, ENERGY: 1.0}, None, None,
     Energy(3000.0, "power")),
    ("no power at the start: unknown", {}, {POWER: 100.0, ENERGY: 5.0}, None, None),
    ("a NaN counter: the power integral", {ENERGY: math.nan, POWER: 50.0},
     {ENERGY: 7.0, POWER: 50.0}, None, Energy(1500.0, "power")),
    ("a negative counter is no reading", {ENERGY: -5.0, POWER: 50.0},
     {ENERGY: 7.0, POWER: 50.0}, None, Energy(1500.0, "power")),
    ("a negative power reading is no reading", {POWER: -5.0}, {POWER: 100.0}, None, None),
])
def test_interval_energy(case: str, start: dict[str, float], end: dict[str, float] | None,
                         counter: CounterState | None, expected: Energy | None) -> None:
    got = interval_energy(start, end, 0.0, S, counter).energy
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert (got.joules, got.basis) == (pytest.approx(expected.joules), expected.basis)


@given(st.floats(0, 1e12), st.floats(0, MAX_GPU_WATTS * S * 1000))
def test_a_counter_that_rises_is_read_as_it_is(c0: float, rose: float) -> None:
    """Where DCGM collects every interval, an interval's energy is its counter's increase."""
    step = interval_energy({ENERGY: c0}, {ENERGY: c0 + rose}, 0.0, S, after(c0))
    assert step.energy is not None and step.energy.basis == "counter"
    assert step.energy.joules == pytest.approx(rose / 1000, rel=1e-9, abs=1e-3)
    assert step.counter is not None
    assert step.counter.owed_joules == pytest.approx(0.0, abs=1e-3)


def test_the_counter_carried_is_the_one_the_start_read() -> None:
    """A counter state for another reading than the start's (a GPU read again after a gap)
    is not used: the start's reading is taken as first seen."""
    stale = after(1e9, ahead_joules=1e6, owed_joules=-1e6)
    step = interval_energy({ENERGY: 0.0, POWER: 100.0}, {ENERGY: 3e6, POWER: 100.0}, 0.0, S,
                           stale)
    assert step.energy == Energy(3000.0, "counter")  # its first rise: read from here on
    assert step.counter == CounterState(3e6, 0.0, S, S)


def test_a_gpu_not_read_at_the_end_carries_no_counter() -> None:
    step = interval_energy({ENERGY: 0.0, POWER: 100.0}, None, 0.0, S, MOVED)
    assert step == EnergyStep(Energy(3000.0, "power"), None)


class Dcgm:
    """A GPU under a dcgm-exporter that collects every ``period`` seconds from ``phase``:
    its true power, piecewise constant, its energy counter (mJ since the driver last loaded)
    and power gauge as of its last collection."""

    def __init__(self, period: float, phase: float, powers: list[tuple[float, float]],
                 resets: list[float], gauge_error: float) -> None:
        self.period, self.phase, self.resets = period, phase, sorted(resets)
        self.gauge_error = gauge_error
        self.bounds: list[tuple[float, float, float]] = []  # (from, to, watts)
        t = 0.0
        for seconds, watts in powers:
            self.bounds.append((t, t + seconds, watts))
            t += seconds
        self.bounds.append((t, math.inf, powers[-1][1]))

    def watts(self, t: float) -> float:
        return next(w for a, b, w in self.bounds if a <= t < b)

    def drawn(self, t0: float, t1: float) -> float:
        """The true joules from ``t0`` to ``t1``."""
        return sum(w * max(0.0, min(b, t1) - max(a, t0)) for a, b, w in self.bounds)

    def collected(self, t: float) -> float:
        """The time of the last collection at or before ``t``."""
        return self.phase + math.floor((t - self.phase) / self.period) * self.period

    def page(self, t: float) -> dict[str, float]:
        s = self.collected(t)
        loaded = max((r for r in self.resets if r <= s), default=0.0)
        return {ENERGY: self.drawn(loaded, s) * 1000,
                POWER: self.watts(s) * (1 + self.gauge_error)}


periods = st.sampled_from([1.0, 5.0, 10.0, 29.0, 30.0, 45.0, 60.0, 300.0, 600.0])
cycles = st.sampled_from([1.0, 5.0, 15.0, 30.0, 60.0])
powers = st.lists(st.tuples(st.floats(1.0, 3600.0), st.floats(10.0, 1500.0)),
                  min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(period=periods, cycle=cycles, phase=st.floats(0.0, 1.0), powers=powers,
       resets=st.lists(st.floats(0.0, 1.0), max_size=3), gauge_error=st.floats(-0.2, 0.2),
       cycles_run=st.integers(10, 400))
def test_over_a_run_the_energy_is_the_counters_rise(
        period: float, cycle: float, phase: float, powers: list[tuple[float, float]],
        resets: list[float], gauge_error: float, cycles_run: int) -> None:
    """Whatever DCGM's collection period and the exporter's cycle: over the run, the
    intervals' energy is the counter's rise (its healthy steps from its second rise on; the
    intervals up to that rise and those in which it went backwards are their own estimates,
    and keep what the intervals before a reset were given), but for what the last counter
    state carries; an interval is flagged ``reset`` exactly where the counter
    went backwards; once its pace is known no interval reads 0 W; and the run's energy is
    the true energy within a few collection periods' draw."""
    start = period * 2
    end = start + cycles_run * cycle
    dcgm = Dcgm(period, phase * period, powers,
                [start + r * (end - start) for r in resets], gauge_error)
    counter: CounterState | None = None
    given_joules = accounted = 0.0
    flagged = 0
    for k in range(cycles_run):
        t0, t1 = start + k * cycle, start + (k + 1) * cycle
        p0, p1 = dcgm.page(t0), dcgm.page(t1)
        was = counter
        step = interval_energy(p0, p1, t0, cycle, counter)
        assert step.energy is not None and step.counter is not None
        e, counter = step.energy, step.counter
        assert 0.0 <= e.joules < math.inf
        if was is not None and was.watts is not None and e.basis == "counter":
            assert e.joules > 0.0, k  # the GPU draws all along: no interval reads 0 W
        given_joules += e.joules
        backwards = p1[ENERGY] < p0[ENERGY]
        assert (e.basis == "reset") == backwards, (k, e, p0, p1)
        read = was is not None and was.watts is not None  # its pace known: rises counted
        if backwards:  # its own estimate, and what the intervals before it were given
            flagged += 1
            accounted += e.joules + (was.ahead_joules if read and was is not None else 0.0)
        elif read:
            accounted += (p1[ENERGY] - p0[ENERGY]) / 1000
        else:  # up to its second rise: the intervals' own estimates
            accounted += e.joules
    assert counter is not None
    carried = (counter.ahead_joules if counter.watts is not None else 0.0) \
        - counter.owed_joules
    assert given_joules == pytest.approx(accounted + carried, rel=1e-9, abs=1e-6)
    truth = dcgm.drawn(start, end)
    watts = max(w for _, w in powers) * 1.2
    slack = watts * (period + cycle) * (4 + 2 * flagged)
    assert abs(given_joules - truth) <= slack


@settings(max_examples=200, deadline=None)
@given(period=periods, cycle=cycles, phase=st.floats(0.0, 1.0), watts=st.floats(10.0, 1500.0),
       cycles_run=st.integers(10, 400))
def test_a_steady_draw_reads_steady_whatever_the_collection_period(
        period: float, cycle: float, phase: float, watts: float, cycles_run: int) -> None:
    """A GPU drawing the same power all along: no interval reads 0 W, none is flagged, and
    once the counter has risen twice every interval reads within a factor of two of the
    power."""
    start = period * 2
    dcgm = Dcgm(period, phase * period, [(1.0, watts)], [], 0.0)
    counter: CounterState | None = None
    moves = 0
    for k in range(cycles_run):
        t0 = start + k * cycle
        p0, p1 = dcgm.page(t0), dcgm.page(t0 + cycle)
        step = interval_energy(p0, p1, t0, cycle, counter)
        assert step.energy is not None and step.energy.basis == "counter"
        counter = step.counter
        got = step.energy.joules / cycle
        assert got > 0.0
        if moves >= 2:
            assert 0.5 * watts * (1 - 1e-9) <= got <= 2.0 * watts * (1 + 1e-9), (k, got)
        moves += p1[ENERGY] != p0[ENERGY]


def test_a_jump_is_flagged_once_and_the_counter_read_on_from_it() -> None:
    """A counter that rose faster than any GPU draws since it last moved: that interval is
    the power integral, flagged; the next rises are read from its new value."""
    pages = [{ENERGY: 0.0, POWER: 100.0}, {ENERGY: 3e6, POWER: 100.0},
             {ENERGY: 1e12, POWER: 100.0}, {ENERGY: 1e12 + 3e6, POWER: 100.0}]
    counter = MOVED
    got = []
    for k, (p0, p1) in enumerate(itertools.pairwise(pages)):
        step = interval_energy(p0, p1, k * S, S, counter)
        assert step.energy is not None and step.counter is not None
        got.append((step.energy.basis, round(step.energy.joules)))
        counter = step.counter
    assert got == [("counter", 3000), ("reset", 3000), ("counter", 3000)]


def test_a_rise_over_a_slow_collection_is_no_jump_but_one_faster_than_any_gpu_is() -> None:
    """A 5-minute collection seen by 5-second cycles: the rise covers the time since the
    interval in which the counter last moved, not the interval it shows in."""
    counter = CounterState(0.0, since=-5.0, moved_at=0.0, first_moved_at=-300.0, moves=1)
    healthy = 700.0 * 300 * 1000  # an H100 at its limit for 5 minutes
    step = interval_energy({ENERGY: 0.0}, {ENERGY: healthy}, 295.0, 5.0, counter)
    assert step.energy is not None and step.energy.basis == "counter"
    too_fast = MAX_GPU_WATTS * 305 * 1000 * 1.01
    step = interval_energy({ENERGY: 0.0}, {ENERGY: too_fast}, 295.0, 5.0, counter)
    assert step.energy is None  # no power to stand in for it
    assert step.counter is not None and step.counter.counter_mj == too_fast


def test_a_time_shared_gpu_splits_its_energy_evenly_like_its_cost() -> None:
    n = node(capacity_gpus=2, allocatable_gpus=2, clients_per_gpu=2)
    before = states([n], {"n1": [reading(pods=("a", "b"),
                                         DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=0)]})
    after = states([n], {"n1": [reading(pods=("a", "b"),
                                        DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=6e6)]})
    energy = gpu_energy(before, after, 0.0, S, {U: MOVED}).by_gpu
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
    rows = compute.usage_rows(before, 0.0, S, gpu_energy(before, after, 0.0, S, {U: MOVED}).by_gpu)
    got = {r.device.device_id: r.joules for r in rows}
    assert sorted(got.values()) == pytest.approx([1000.0, 1000.0, 3000.0])
    assert sum(got.values()) == pytest.approx(5000.0)
    unallocated = [r for r in rows if r.owner is None]
    assert [r.joules for r in unallocated] == pytest.approx([1000.0])  # the idle slice's own


def test_a_gpu_not_read_has_no_energy_rather_than_zero() -> None:
    before = states([node(ready=False)], {})
    (row,) = compute.usage_rows(before, 0.0, S, gpu_energy(before, before, 0.0, S).by_gpu)
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
