"""Carbon: the grams of CO2e that a GPU's measured energy stands for, location-based.

The carbon book is YAML: ``years.<year>.regions.<region>.{grid_g_per_kwh, cfe}``, with
``year`` (the year used unless another is asked for), ``basis`` and ``units``, ``source``
and a ``pue`` section (``default``, ``source``, ``url``). The shipped book
(``data/carbon.yaml``) is built by ``data/build_carbon.py`` from Google's per-region data
(``GoogleCloudPlatform/region-carbon-info``, Apache-2.0), vendored unchanged in
``data/region_carbon/``: every year from 2021 to 2024, ``year: 2024``.

**Location-based.** A region's ``grid_g_per_kwh`` is its grid's average operational carbon
intensity over a calendar year, in gCO2e per kWh, as Google publishes it per region: the
emissions of the electricity drawn there, whatever clean energy Google buys (a
market-based figure would subtract that). ``cfe`` is Google's carbon-free energy share in
the region that year (0-1; None where Google gives none), carried for information.

**PUE.** Energy measured at a GPU leaves out the data centre's overhead (cooling, power
distribution); multiplied by the power usage effectiveness it is the GPU's share of what
the facility draws. The shipped default is Google's fleet-wide annual average for 2024,
1.09 (Google 2025 Environmental Report,
https://blog.google/outreach-initiatives/sustainability/environmental-report-2025/):
one figure for the fleet, not any region's own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from exporter.errors import ConfigError
from exporter.files import Unreadable, decode, parse_yaml, read_yaml

BASIS = "location-based"
"""The only basis the shipped book has: the grid's average intensity where the energy is
drawn."""
UNITS = "gCO2e/kWh"
"""The units of ``grid_g_per_kwh``; a book in any other is refused."""
JOULES_PER_KWH = 3.6e6

_REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_ZONE = re.compile(r"([a-z]+-[a-z]+[0-9]+)-[a-z][a-z0-9]*")


@dataclass(frozen=True, slots=True)
class RegionCarbon:
    """One region's figures for the book's year."""

    region: str
    grid_g_per_kwh: float
    """Location-based grid carbon intensity: the grid's annual average, gCO2e per kWh."""
    cfe: float | None
    """Google's carbon-free energy share in the region, 0-1; None where not published."""


@dataclass(frozen=True, slots=True)
class CarbonBook:
    """One year of a carbon book, with its provenance and its default PUE."""

    year: int
    source: str
    """Where the year's figures come from, in short: ``GoogleCloudPlatform/
    region-carbon-info@49f3f26 2024.csv`` (a book of your own: its path)."""
    basis: str
    """Short words to print beside a figure: ``location-based, 2024 annual grid average
    (Google region-carbon-info)``."""
    pue: float
    """The default power usage effectiveness (at least 1)."""
    pue_source: str
    """Where ``pue`` is published, with its address."""
    regions: Mapping[str, RegionCarbon]
    """Region -> its figures: every region the year lists."""

    def of_region(self, region: str) -> RegionCarbon | None:
        """The figures of ``region`` (a zone is read as its region), or None when the book
        does not list it that year."""
        return self.regions.get(region_of_zone(region))


def is_region(name: str) -> bool:
    """Whether ``name`` is written as a Google Cloud region is: ``us-central1``,
    ``europe-west12``."""
    return _REGION.fullmatch(name) is not None


def region_of_zone(zone: str) -> str:
    """The region of a zone: ``us-central1-a`` -> ``us-central1``. Anything else (a region,
    or a name that is neither) is returned as it is."""
    m = _ZONE.fullmatch(zone)
    return zone if m is None else m[1]


def grams_co2e(joules: float, grid_g_per_kwh: float, pue: float) -> float:
    """Location-based emissions, in grams of CO2e, of ``joules`` measured at the GPU:
    ``joules / 3.6e6`` kWh x ``pue`` (the facility's share: cooling and power distribution
    added) x ``grid_g_per_kwh`` (the grid's average intensity where it is drawn)."""
    return joules / JOULES_PER_KWH * pue * grid_g_per_kwh


def _read(path: Path | None) -> tuple[dict[str, Any], str]:
    source = "shipped carbon book (exporter/data/carbon.yaml)" if path is None else str(path)
    try:
        data: Any = parse_yaml(decode(
            resources.files("exporter").joinpath("data/carbon.yaml").read_bytes()
        )) if path is None else read_yaml(Path(path))
    except (Unreadable, OSError) as exc:
        raise ConfigError(f"{source}: carbon book: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a carbon book is a mapping with 'year' and 'years'")
    return data, source


def _number(value: object, where: str, source: str, low: float,
            high: float = float("inf")) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) \
            or not low <= value <= high or value == float("inf"):
        span = f"from {low:g} to {high:g}" if high != float("inf") else f"at least {low:g}"
        raise ConfigError(f"{source}: {where} must be a number {span}, got {value!r}")
    return float(value)


def _text(value: object, where: str, source: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{source}: {where} must be a text, got {value!r}")
    return value.strip()


def _mapping(value: object, where: str, source: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {where} must be a mapping, got {value!r}")
    return value


def _regions(value: object, where: str, source: str) -> dict[str, RegionCarbon]:
    out = {}
    for region, entry in _mapping(value, where, source).items():
        if not isinstance(region, str) or not is_region(region):
            raise ConfigError(f"{source}: {where}: {region!r} is not a region")
        row = _mapping(entry, f"{where}.{region}", source)
        unknown = set(row) - {"grid_g_per_kwh", "cfe"}
        if unknown:
            raise ConfigError(f"{source}: {where}.{region} names "
                              f"{', '.join(sorted(map(str, unknown)))}; "
                              "the figures are grid_g_per_kwh and cfe")
        cfe = row.get("cfe")
        out[region] = RegionCarbon(
            region, _number(row.get("grid_g_per_kwh"), f"{where}.{region}.grid_g_per_kwh",
                            source, 0.0),
            None if cfe is None else _number(cfe, f"{where}.{region}.cfe", source, 0.0, 1.0))
    if not out:
        raise ConfigError(f"{source}: {where} lists no region")
    return out


def _cited(data: dict[str, Any], file: object, source: str) -> tuple[str, str]:
    """The year's source in short, and the dataset's name for the caption."""
    cited = data.get("source")
    if not isinstance(cited, dict):
        return source, source
    repository = str(cited.get("repository") or "").removeprefix("https://github.com/")
    commit = str(cited.get("commit") or "")[:7]
    name = str(cited.get("name") or repository or source)
    where = repository + (f"@{commit}" if commit else "")
    if isinstance(file, str) and file:
        where = f"{where} {file.rsplit('/', 1)[-1]}".strip()
    return where or source, name


def load_carbon_book(path: Path | None = None, year: int | None = None) -> CarbonBook:
    """Load a carbon book (None: the shipped one), for ``year`` (None: the book's
    ``year``, its newest). A file that cannot be used raises ``ConfigError`` naming it and
    what is wrong."""
    data, source = _read(path)
    chosen = data.get("year") if year is None else year
    if not isinstance(chosen, int) or isinstance(chosen, bool):
        raise ConfigError(f"{source}: year must be a year such as 2024, got {chosen!r}")
    years = _mapping(data.get("years"), "years", source)
    if chosen not in years:
        listed = ", ".join(str(y) for y in sorted(years, key=str)) or "none"
        raise ConfigError(f"{source}: no figures for {chosen}; the book has {listed}")
    entry = _mapping(years[chosen], f"years.{chosen}", source)
    units = data.get("units", UNITS)
    if units != UNITS:
        raise ConfigError(f"{source}: units must be {UNITS}, got {units!r}")
    basis = _text(data.get("basis", BASIS), "basis", source)
    period = _text(data.get("period", "annual"), "period", source)
    pue = _mapping(data.get("pue"), "pue", source)
    pue_source = _text(pue.get("source"), "pue.source", source)
    if isinstance(pue.get("url"), str) and pue["url"].strip():
        pue_source = f"{pue_source} ({pue['url'].strip()})"
    cited, name = _cited(data, entry.get("file"), source)
    return CarbonBook(
        year=chosen, source=cited,
        basis=f"{basis}, {chosen} {period} grid average ({name})",
        pue=_number(pue.get("default"), "pue.default", source, 1.0),
        pue_source=pue_source,
        regions=MappingProxyType(_regions(entry.get("regions"), f"years.{chosen}.regions",
                                          source)))
