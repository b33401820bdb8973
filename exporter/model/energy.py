"""Energy and carbon, as pure functions: no I/O, no clock.

==================  =====================================================================
figure              definition
==================  =====================================================================
GPU energy          of a physical GPU over an interval: the increase of
                    ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ since the driver loaded)
                    from the interval's start to its end (basis ``counter``). Where the
                    counter went backwards (the driver reloaded, the node restarted) or rose
                    faster than any GPU draws (``MAX_GPU_WATTS``), the integral of
                    ``DCGM_FI_DEV_POWER_USAGE`` over the interval, and never less than what
                    the counter counted since it restarted (basis ``reset``). Where either
                    end lacks the counter, the integral of power: the mean of the two
                    readings (or the start's alone) x the interval (basis ``power``). A GPU
                    read at neither end, or without power at the start, has no energy
                    (unknown, never zero): a NotReady node, a GPU off the bus.
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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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

EnergyBasis = Literal["counter", "reset", "power"]
"""Where a GPU's energy over an interval comes from: its energy counter; the power integral
where the counter restarted or jumped; the power integral where the page has no counter. In
that order of trust (as strings too: ``max`` of a set of them is the weakest)."""
ENERGY_BASES: tuple[EnergyBasis, ...] = ("counter", "reset", "power")


@dataclass(frozen=True, slots=True)
class Energy:
    """A physical GPU's energy over one interval, and where it comes from."""

    joules: float
    basis: EnergyBasis


def interval_energy(start: Mapping[str, float], end: Mapping[str, float] | None,
                    seconds: float) -> Energy | None:
    """The energy of a GPU over an interval of ``seconds`` from its readings at the
    interval's ``start`` and ``end`` (None: not read then); None where unknown."""
    p0 = start.get(POWER)
    p1 = end.get(POWER) if end is not None else None
    power = _positive(p0)
    if power is not None and (p1 := _positive(p1)) is not None:
        power = (power + p1) / 2
    integral = None if power is None else power * seconds
    c0 = start.get(ENERGY)
    c1 = end.get(ENERGY) if end is not None else None
    if c0 is None or c1 is None or not (c0 == c0 and c1 == c1):  # absent, or NaN
        return None if integral is None else Energy(integral, "power")
    rose = (c1 - c0) / 1000.0
    if 0.0 <= rose <= MAX_GPU_WATTS * seconds:
        return Energy(rose, "counter")
    since = c1 / 1000.0  # counted since it restarted: the least the GPU drew
    since = since if 0.0 <= since <= MAX_GPU_WATTS * seconds else 0.0
    if integral is None:
        return Energy(since, "reset") if rose < 0 else None
    return Energy(max(since, integral) if rose < 0 else integral, "reset")


def _positive(x: float | None) -> float | None:
    """A power reading that can be used: finite and at least 0."""
    return x if x is not None and 0.0 <= x < MAX_GPU_WATTS else None


def gpu_energy(before: Iterable[DeviceState], after: Iterable[DeviceState],
               seconds: float) -> dict[str, Energy]:
    """Each physical GPU's energy over the interval between two snapshots, by GPU UUID:
    from its readings in the ``before`` states (any of its MIG instances: the readings are
    the GPU's) and the ``after`` ones; GPUs whose energy is unknown are left out."""
    end: dict[str, Mapping[str, float]] = {}
    for d in after:
        if d.fields and d.gpu_uuid not in end:
            end[d.gpu_uuid] = d.fields
    out: dict[str, Energy] = {}
    done: set[str] = set()
    for d in before:
        uuid = d.gpu_uuid
        if uuid in done or not d.fields:
            continue
        done.add(uuid)
        e = interval_energy(d.fields, end.get(uuid), seconds)
        if e is not None:
            out[uuid] = e
    return out


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
