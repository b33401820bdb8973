"""Builds the shipped carbon data, ``carbon.yaml``, from Google's per-region grid carbon
intensity and carbon-free energy, vendored unchanged under ``region_carbon/``.

    python exporter/data/build_carbon.py             # writes exporter/data/carbon.yaml
    python exporter/data/build_carbon.py --verify    # fails if the file is not what it makes

**The source.** Google publishes, for each Google Cloud region and each calendar year, the
grid's average carbon intensity and Google's carbon-free energy share (CFE) in
``GoogleCloudPlatform/region-carbon-info`` (Apache-2.0), one CSV a year under
``data/yearly/``. The years used (``FILES``, newest first) are copied byte for byte from
that repository at the pinned ``COMMIT`` into ``region_carbon/<year>.csv``; each is read
only if its SHA-256 and its git blob id are the pinned ones (``region_carbon/SOURCE.md``
says where each came from). Nothing is fetched: the build reads the checkout.

**The basis.** Location-based: a region's figure is its grid's average operational carbon
intensity over the year, in gCO2e per kWh, as Google publishes it, whatever Google buys
there (the CFE share is carried beside it, for information, and never lowers the figure).
Only the years from 2021 on are vendored: Google's 2019 and 2020 files give *lifecycle*
intensities, another basis, which the book does not mix in.

**Years.** ``carbon.yaml`` keeps every vendored year under ``years.<year>.regions``;
``year`` names the newest, the one used unless another is asked for. A region is in a year
only if that year's file lists it.

**PUE.** The energy measured at a GPU leaves out the data centre's overhead (cooling,
power distribution). The book ships Google's fleet-wide annual average power usage
effectiveness as the default multiplier (``PUE``): 1.09 for 2024, from Google's 2025
Environmental Report (https://blog.google/outreach-initiatives/sustainability/
environmental-report-2025/: in 2024 "Google data centers used 84% less overhead energy
than the industry average", an overhead of 0.09 against about 0.56). It is one figure for
the fleet, not for a region's own data centres.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.model.carbon import BASIS, UNITS, is_region

BOOK = Path(__file__).with_name("carbon.yaml")
VENDORED = Path(__file__).with_name("region_carbon")
REPOSITORY = "https://github.com/GoogleCloudPlatform/region-carbon-info"
NAME = "Google region-carbon-info"
"""How a figure's caption names the dataset."""
COMMIT = "49f3f26bfd682305e8d9b572fea1f811900421a9"
"""The upstream commit the files were copied at (2025-12-03, "add missing me-central1,
us-central2, us-east5")."""
LICENSE = "Apache-2.0"
PERIOD = "annual"
HEADER = ("Google Cloud Region", "Location", "Google CFE",
          "Grid carbon intensity (gCO2eq / kWh)")
"""The header of every vendored year (2019 and 2020 say "Lifecycle grid carbon intensity")."""


@dataclass(frozen=True, slots=True)
class Vendored:
    """One upstream CSV copied into ``region_carbon/``, pinned by its digests."""

    year: int
    path: str
    """The file in the upstream repository."""
    sha256: str
    blob: str
    """Its git blob id at ``COMMIT`` (``git hash-object`` of the copy gives the same)."""

    @property
    def name(self) -> str:
        """The copy's name in ``region_carbon/``."""
        return f"{self.year}.csv"


FILES = (
    Vendored(2024, "data/yearly/2024.csv",
             "7c2d3fb7169063c6c59ef317f0188f54b85c83c3a65f4e2a571aaf58dace8a82",
             "824a6e79c2929fc8f4013e075606faaa230174b4"),
    Vendored(2023, "data/yearly/2023.csv",
             "3332f81bf6db43f31a263788319aeb9305820b2b198a04702c2b4ae646e5ac8a",
             "0f0e1867a2cad4a5c907c622ba54bb3451456f42"),
    Vendored(2022, "data/yearly/2022.csv",
             "b8298eab07497f1565dddcbd06052544adca64a1d8beb94ea8b3f50a966de9ba",
             "9dfc0aa8ff558f376ca288a53d0b93c67c39e411"),
    Vendored(2021, "data/yearly/2021.csv",
             "67fe75fcabc665913edbe8e0d2d792b6384b60d4943391855e1f777a9e10768f",
             "58508e6eb9c937e91218cc71cd98fda01c794f1e"),
)
"""Newest first; the first is the book's ``year``."""


@dataclass(frozen=True, slots=True)
class Pue:
    """The default power usage effectiveness and where it is published."""

    default: float
    year: int
    """The year it averages."""
    source: str
    url: str


PUE = Pue(1.09, 2024,
          "Google 2025 Environmental Report: fleet-wide annual average PUE of Google's "
          "data centres in 2024",
          "https://blog.google/outreach-initiatives/sustainability/environmental-report-2025/")


class SourceError(Exception):
    """A vendored file that cannot be used as it is."""


@dataclass(frozen=True, slots=True)
class Row:
    """One region of one year, as the file gives it."""

    grid_g_per_kwh: float
    cfe: float | None
    """None where the file leaves it blank."""


def blob_id(data: bytes) -> str:
    """The git blob id of ``data``: what ``git hash-object`` prints."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def read_vendored(file: Vendored, directory: Path = VENDORED) -> bytes:
    """The vendored copy's bytes, checked against its pinned SHA-256 and blob id."""
    path = directory / file.name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != file.sha256:
        raise SourceError(f"{path}: SHA-256 {digest} is not the pinned {file.sha256}")
    if blob_id(data) != file.blob:
        raise SourceError(f"{path}: git blob {blob_id(data)} is not the pinned {file.blob}")
    return data


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SourceError(f"{where}: not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise SourceError(f"{where}: out of range: {text!r}")
    return value


def parse(data: bytes, what: str) -> dict[str, Row]:
    """A year's CSV (UTF-8, CRLF or LF line ends, blank lines skipped): region -> its row.
    The header must be ``HEADER``; every region is listed once, its intensity a number of
    at least 0 and its CFE blank or a share from 0 to 1."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{what}: not UTF-8 at byte {exc.start}") from None
    rows = [r for r in csv.reader(io.StringIO(text, newline="")) if any(c.strip() for c in r)]
    if not rows or tuple(c.strip() for c in rows[0]) != HEADER:
        raise SourceError(f"{what}: the header is not {', '.join(HEADER)}")
    out: dict[str, Row] = {}
    for line, row in enumerate(rows[1:], start=2):
        where = f"{what} row {line}"
        if len(row) != len(HEADER):
            raise SourceError(f"{where}: {len(row)} fields, not {len(HEADER)}")
        region, _, cfe, grid = (c.strip() for c in row)
        if not is_region(region):
            raise SourceError(f"{where}: {region!r} is not a Google Cloud region")
        if region in out:
            raise SourceError(f"{where}: {region} is listed twice")
        share = None if cfe == "" else _number(cfe, f"{where} {HEADER[2]}")
        if share is not None and share > 1:
            raise SourceError(f"{where}: {HEADER[2]} {cfe} is over 1")
        out[region] = Row(_number(grid, f"{where} {HEADER[3]}"), share)
    if not out:
        raise SourceError(f"{what}: no regions")
    return out


def build(files: Sequence[Vendored] = FILES, directory: Path = VENDORED
          ) -> dict[Vendored, dict[str, Row]]:
    """Each vendored year's regions, newest first, every file checked and parsed."""
    years = [f.year for f in files]
    if not files or years != sorted(set(years), reverse=True):
        raise SourceError(f"the vendored years must be distinct, newest first: {years}")
    return {f: parse(read_vendored(f, directory), f"{directory / f.name}") for f in files}


def _figure(value: float) -> str:
    """A figure as the file writes it: ``656.85``, ``366``, ``0.6``."""
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def render(book: Mapping[Vendored, Mapping[str, Row]], pue: Pue = PUE) -> str:
    """The book as YAML: the header, the source, the basis, the PUE, then each year's
    regions (newest first), one region a line, sorted."""
    newest = next(iter(book))
    lines = [
        "# Grid carbon intensity and carbon-free energy per Google Cloud region: written by",
        "# exporter/data/build_carbon.py from the files in exporter/data/region_carbon/",
        "# (do not edit; rebuild it).",
        "#",
        f"# basis: {BASIS}. A region's grid_g_per_kwh is its grid's average operational carbon",
        "# intensity over the calendar year, in gCO2e per kWh, as Google publishes it per",
        "# region; what Google buys there does not lower it. cfe is Google's carbon-free",
        "# energy share there that year (0-1; null where Google gives none), for information.",
        "# Emissions = energy at the GPU (kWh) x pue x grid_g_per_kwh.",
        "#",
        f"# pue: Google's fleet-wide annual average for {pue.year}, one figure for every region.",
        "# year: the newest year, the one used unless another is asked for; `years` keeps",
        "# every vendored year. Upstream's 2019 and 2020 files (lifecycle intensities, another",
        "# basis) are left out.",
        "source:",
        f"  name: {NAME}",
        f"  repository: {REPOSITORY}",
        f"  commit: {COMMIT}",
        f"  license: {LICENSE}",
        f"year: {newest.year}",
        f"basis: {BASIS}",
        f"period: {PERIOD}",
        f"units: {UNITS}",
        "pue:",
        f"  default: {_figure(pue.default)}",
        f"  year: {pue.year}",
        f"  source: \"{pue.source}\"",
        f"  url: {pue.url}",
        "years:",
    ]
    for file, regions in book.items():
        lines += [f"  {file.year}:",
                  f"    file: {file.path}",
                  f"    sha256: {file.sha256}",
                  "    regions:"]
        for region, row in sorted(regions.items()):
            cfe = "null" if row.cfe is None else _figure(row.cfe)
            lines.append(f"      {region}: {{grid_g_per_kwh: {_figure(row.grid_g_per_kwh)}, "
                         f"cfe: {cfe}}}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--verify", action="store_true",
                        help="fail if carbon.yaml is not what the vendored files make")
    args = parser.parse_args(argv)
    try:
        text = render(build())
    except SourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.verify:
        try:
            shipped = BOOK.read_text(encoding="utf-8")
        except OSError as exc:
            print(f"{BOOK}: cannot read: {exc.strerror or exc}", file=sys.stderr)
            return 1
        if shipped != text:
            print(f"{BOOK} is not what its sources make: rebuild it", file=sys.stderr)
            return 1
        return 0
    BOOK.write_text(text, encoding="utf-8")
    print(f"wrote {BOOK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
