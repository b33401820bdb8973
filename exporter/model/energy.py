"""Energy and carbon, as pure functions: no I/O, no clock.

==================  =====================================================================
figure              definition
==================  =====================================================================
GPU energy          of a physical GPU over an interval: the increase of
                    ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ since the driver loaded),
                    spread over the intervals it covers (basis ``counter``). dcgm-exporter
                    moves the counter only when it collects (its ``-c``, every 30 s by
                    default), so an interval in which it did not move is given energy on
                    account: the counter's mean power over its last rise (the rise over the
                    mean time between the cycles that saw it move) x the interval. When it
                    moves, its rise pays for those intervals first; what is left over (or
                    what they were given too much) is settled in equal parts by the
                    intervals of the next collection period, none given less than
                    ``LEAST_SHARE`` of its account. Where DCGM collects at least as often as
                    the exporter cycles, that is the counter's increase over each interval.
                    Each GPU's counter goes from one interval to the next in a
                    ``CounterState``, so that the energy over any stretch is the counter's
                    rise over it but for what the states at its ends carry
                    (``ahead_joules`` - ``owed_joules``). A counter's first rise after it
                    is first read may cover time before that reading, and its pace is
                    known from its second: up to then the intervals are given the power
                    integral (the mean of ``DCGM_FI_DEV_POWER_USAGE``'s two readings, or the
                    start's alone, x the interval; no more than the first rise in the
                    interval it comes in), and the counter is read from there on.
reset               where the counter went backwards (the driver reloaded, the node
                    restarted) or rose faster than any GPU draws (``MAX_GPU_WATTS``) over
                    the time since the start of the interval in which it last moved: the
                    power integral over the interval, and never less than what the counter
                    counted since it restarted less what the intervals since it last moved
                    were given (basis ``reset``). Its new reading is where the next
                    intervals start from.
power               where either end lacks the counter (the page has none), or it has not
                    moved for ``LONGEST_COLLECTION_SECONDS`` (it stopped counting): the
                    power integral (basis ``power``). A GPU read at neither end, or without
                    power at the start, has no energy (unknown, never zero): a NotReady
                    node, a GPU off the bus. A GPU not read at an interval's end starts
                    again from its next reading.
split               as cost is: a MIG instance takes its share of its GPU's energy by its
                    compute slices (fraction / the fractions of the GPU's instances at the
                    interval's start, so the instances add up to the GPU); a time-shared
                    GPU's share is split evenly among the pods on it; idle, unallocated and
                    unavailable devices keep theirs in their own rows.
CO2e                energy x PUE x the zone's region's grid carbon intensity (location-
                    based, gCO2e per kWh: the shipped ``carbon.yaml``, or a site's own
                    factor); unknown where the region has none.
per utilised        kWh (or CO2e) / utilised GPU-hours, the energy twin of effective cost
GPU-hour            (``compute.per_utilized_hour``).
==================  =====================================================================
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from exporter.model.carbon import grams_co2e, region_of_zone

if TYPE_CHECKING:
    from exporter.model.carbon import CarbonBook
    from exporter.model.compute import DeviceState

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
POWER = "DCGM_FI_DEV_POWER_USAGE"
FIELDS_READ = (ENERGY, POWER)
"""The DCGM fields these definitions read."""
MAX_GPU_WATTS = 3000.0
"""More than any GPU draws (a B200 board 1,000 W, a GB200 superchip 2,700 W): a counter that
rose faster jumped, and is not read."""
LONGEST_COLLECTION_SECONDS = 3600.0
"""dcgm-exporter collects (its ``-c``, 30 s by default) at least this often: a counter that
has not moved for longer has stopped counting (its energy is the power integral, basis
``power``, until it moves)."""
LEAST_SHARE = 0.5
"""Where DCGM collects less often than the exporter cycles, an interval is given no less
than this share of its account, however far the intervals before ran ahead of the counter
(its draw fell): what they were given too much is paid back over the intervals after, not
by intervals reading 0 W."""

EnergyBasis = Literal["counter", "reset", "power"]
"""Where a GPU's energy over an interval comes from: its energy counter; the power integral
where the counter restarted or jumped; the power integral where the page has no counter (or
it stopped counting). In
that order of trust (as strings too: ``max`` of a set of them is the weakest)."""
ENERGY_BASES: tuple[EnergyBasis, ...] = ("counter", "reset", "power")


@dataclass(frozen=True, slots=True)
class Energy:
    """A physical GPU's energy over one interval, and where it comes from."""

    joules: float
    basis: EnergyBasis


@dataclass(frozen=True, slots=True)
class CounterState:
    """A GPU's energy counter as one interval leaves it for the next."""

    counter_mj: float
    """Its last reading: mJ since the driver loaded."""
    since: float
    """The start of the interval in which it came to that reading (or was first read): what
    it counts next, it counts since then."""
    moved_at: float | None = None
    """The end of that interval, the time of the first reading of that value; None while
    it has not been seen to move since it was first read (it may have taken that value
    long before)."""
    first_moved_at: float | None = None
    """The end of the interval in which it was first seen to move."""
    moves: int = 0
    """How often it has been seen to move since."""
    watts: float | None = None
    """Its mean power over its last rise (the rise over ``period_seconds``): what the
    intervals in which it does not move are given on account; None until it has risen
    twice."""
    ahead_joules: float = 0.0
    """What the intervals since it last moved were given on account: its next rise covers
    them, and pays for them first."""
    owed_joules: float = 0.0
    """What it counted beyond what the intervals were given (negative: what they were given
    beyond it), not settled yet."""
    installment_joules: float = 0.0
    """What each interval settles of ``owed_joules``: an equal part of what was owed when
    the counter last moved, over the next collection period."""

    @property
    def period_seconds(self) -> float | None:
        """How often DCGM collects, as the cycles see it: the mean time between the cycles
        that saw the counter move; None until it has been seen to move twice."""
        if not self.moves or self.moved_at is None or self.first_moved_at is None:
            return None
        return (self.moved_at - self.first_moved_at) / self.moves


@dataclass(frozen=True, slots=True)
class EnergyStep:
    """A GPU's energy over one interval (None: unknown) and its counter as the interval
    leaves it (None: none to carry)."""

    energy: Energy | None
    counter: CounterState | None


@dataclass(frozen=True, slots=True)
class IntervalEnergy:
    """Each physical GPU's energy over one interval, and the counters it leaves, by UUID."""

    by_gpu: dict[str, Energy]
    counters: dict[str, CounterState]


def interval_energy(start: Mapping[str, float], end: Mapping[str, float] | None,
                    start_time: float, seconds: float,
                    counter: CounterState | None = None) -> EnergyStep:
    """The energy of a GPU over the interval of ``seconds`` from ``start_time``, from its
    readings at the interval's ``start`` and ``end`` (None: not read then) and its
    ``counter`` as the interval before left it (None, or another reading than the start's:
    the start's reading is taken as first seen)."""
    p0 = start.get(POWER)
    p1 = end.get(POWER) if end is not None else None
    power = _positive(p0)
    if power is not None and (p1 := _positive(p1)) is not None:
        power = (power + p1) / 2
    integral = None if power is None else power * seconds
    c1 = _counter(end.get(ENERGY)) if end is not None else None
    c0 = _counter(start.get(ENERGY))
    end_time = start_time + seconds
    if c1 is None or c0 is None:
        estimate = None if integral is None else Energy(integral, "power")
        return EnergyStep(estimate, None if c1 is None else CounterState(c1, start_time))
    if counter is None or counter.counter_mj != c0:
        counter = CounterState(c0, start_time)
    drawn = 0.0 if integral is None else integral
    rise = (c1 - c0) / 1000.0
    if rise == 0.0:
        basis: EnergyBasis = "counter"
        on_account = drawn if counter.watts is None else counter.watts * seconds
        if end_time - counter.since > LONGEST_COLLECTION_SECONDS and integral is not None:
            on_account, basis = integral, "power"  # it stopped counting
        joules, owed = _settle(on_account, counter, seconds, counter.period_seconds)
        return EnergyStep(Energy(joules, basis), replace(
            counter, ahead_joules=counter.ahead_joules + on_account, owed_joules=owed))
    covered = end_time - counter.since
    if counter.moved_at is None:  # its first move since its first reading, which it may
        after = CounterState(c1, start_time, end_time, end_time)  # long predate: read on
        if rise > 0.0:
            # its power integral, but no more than its rise: where DCGM collects as often
            # as the exporter cycles, the rise covers about the interval
            first = 0.0 if integral is None else min(rise, integral)
            return EnergyStep(Energy(first, "counter"), after)
    else:
        after = replace(counter, counter_mj=c1, since=start_time, moved_at=end_time,
                        moves=counter.moves + 1, ahead_joules=0.0)
        period = after.period_seconds
        if period is not None and 0.0 < rise <= MAX_GPU_WATTS * covered:
            watts = rise / period
            on_account = watts * seconds
            owed = counter.owed_joules
            if counter.watts is not None:  # (at its second rise its pace is new: read on)
                owed += rise - counter.ahead_joules - on_account  # what it pays for first
            part = min(1.0, seconds / period)
            after = replace(after, watts=watts, owed_joules=owed,
                            installment_joules=owed * part)
            joules, owed = _settle(on_account, after, seconds, period)
            return EnergyStep(Energy(joules, "counter"), replace(after, owed_joules=owed))
    if rise > 0.0:  # jumped: its rise is no energy
        return EnergyStep(None if integral is None else Energy(integral, "reset"), after)
    since = c1 / 1000.0  # counted since it restarted: the least the GPU drew
    since = since if since <= MAX_GPU_WATTS * covered else 0.0
    return EnergyStep(Energy(max(drawn, since - counter.ahead_joules), "reset"), after)


def _settle(on_account: float, counter: CounterState, seconds: float,
            period: float | None) -> tuple[float, float]:
    """An interval's energy: its ``on_account`` and the counter's installment of what is
    owed (no more than is owed), never less than ``LEAST_SHARE`` of ``on_account`` where
    DCGM collects less often than the interval (nor less than 0); and what is owed after
    it."""
    owed, installment = counter.owed_joules, counter.installment_joules
    settled = max(min(installment, max(owed, 0.0)), min(owed, 0.0))
    least = LEAST_SHARE * on_account if period is not None and period > seconds else 0.0
    joules = max(least, on_account + settled)
    return joules, owed - (joules - on_account)


def _counter(x: float | None) -> float | None:
    """An energy counter reading that can be used: finite and at least 0."""
    return x if x is not None and 0.0 <= x < math.inf else None


def _positive(x: float | None) -> float | None:
    """A power reading that can be used: finite and at least 0."""
    return x if x is not None and 0.0 <= x < MAX_GPU_WATTS else None


def gpu_energy(before: Iterable[DeviceState], after: Iterable[DeviceState],
               start_time: float, seconds: float,
               counters: Mapping[str, CounterState] | None = None) -> IntervalEnergy:
    """Each physical GPU's energy over the interval of ``seconds`` from ``start_time``
    between two snapshots, by GPU UUID: from its readings in the ``before`` states (any of
    its MIG instances: the readings are the GPU's) and the ``after`` ones, and its counter
    as the interval before left it (``counters``); GPUs whose energy is unknown are left
    out, and so are the counters of GPUs not read at the end."""
    counters = counters or {}
    end: dict[str, Mapping[str, float]] = {}
    for d in after:
        if d.fields and d.gpu_uuid not in end:
            end[d.gpu_uuid] = d.fields
    out: dict[str, Energy] = {}
    left: dict[str, CounterState] = {}
    done: set[str] = set()
    for d in before:
        uuid = d.gpu_uuid
        if uuid in done or not d.fields:
            continue
        done.add(uuid)
        step = interval_energy(d.fields, end.get(uuid), start_time, seconds,
                               counters.get(uuid))
        if step.energy is not None:
            out[uuid] = step.energy
        if step.counter is not None:
            left[uuid] = step.counter
    return IntervalEnergy(out, left)


def gpu_fractions(states: Sequence[DeviceState]) -> dict[str, float]:
    """Each physical GPU's devices' fractions added up, by GPU UUID (1 for a whole GPU; the
    compute slices of the instances it has, over 7, for a partitioned one)."""
    out: dict[str, float] = {}
    for d in states:
        out[d.gpu_uuid] = out.get(d.gpu_uuid, 0.0) + d.fraction
    return out


def grams_per_joule(grid_g_per_kwh: float, pue: float) -> float:
    """CO2e of a joule the GPU draws (``carbon.grams_co2e`` of one joule)."""
    return grams_co2e(1.0, grid_g_per_kwh, pue)


@dataclass(frozen=True, slots=True)
class Carbon:
    """The carbon factors in force: each region's grid intensity (or a site's own factor
    for every zone), the PUE, and the words that say where they come from."""

    pue: float
    regions: Mapping[str, float]
    """Region -> grid carbon intensity, gCO2e per kWh."""
    source: str
    """Where the intensities come from: the data, its year and basis (or the site's
    factor)."""
    site_g_per_kwh: float | None = None
    """A site's own factor: every zone's intensity, instead of the region's."""

    @property
    def basis(self) -> str:
        """Printed wherever a CO2e figure is: the intensities' source and the PUE."""
        return f"{self.source}; PUE {self.pue:g}"

    @classmethod
    def of(cls, book: CarbonBook, pue: float | None = None,
           site_g_per_kwh: float | None = None) -> Carbon:
        """The factors of a carbon book's year, at ``pue`` (default: the book's), or a
        site's own intensity for every zone."""
        pue = book.pue if pue is None else pue
        data = f"site factor {site_g_per_kwh:g} gCO2e/kWh" if site_g_per_kwh is not None \
            else book.basis
        return cls(pue, {r: c.grid_g_per_kwh for r, c in book.regions.items()},
                   data, site_g_per_kwh)

    def grid_g_per_kwh(self, zone: str) -> float | None:
        """The intensity of ``zone``'s grid; None where the data has none."""
        if self.site_g_per_kwh is not None:
            return self.site_g_per_kwh
        return self.regions.get(region_of_zone(zone))

    def factors(self, zones: Iterable[str]) -> dict[str, float]:
        """Grams of CO2e per joule by zone, for those with an intensity."""
        out: dict[str, float] = {}
        for zone in zones:
            g = self.grid_g_per_kwh(zone)
            if g is not None:
                out[zone] = grams_per_joule(g, self.pue)
        return out
