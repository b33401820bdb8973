"""The shipped carbon book: built from the vendored upstream files as they are, covering the
regions the price book sells in, and the arithmetic that turns joules into grams of CO2e."""

from __future__ import annotations

import math
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from exporter.data import build_carbon as builder
from exporter.errors import ConfigError
from exporter.model.carbon import (
    BASIS,
    UNITS,
    CarbonBook,
    RegionCarbon,
    grams_co2e,
    load_carbon_book,
    region_of_zone,
)

DATA = Path(builder.__file__).parent
SHIPPED_TEXT = resources.files("exporter").joinpath("data/carbon.yaml").read_text()
SHIPPED: dict[str, Any] = yaml.safe_load(SHIPPED_TEXT)
PRICEBOOK: dict[str, Any] = yaml.safe_load(
    resources.files("exporter").joinpath("data/pricebook.yaml").read_text())
NEWEST = builder.FILES[0]


def vendored(file: builder.Vendored) -> dict[str, builder.Row]:
    return builder.parse(builder.read_vendored(file), file.name)


# ------------------------------------------------------------------------ the shipped book


def test_the_shipped_book_is_what_the_vendored_files_make() -> None:
    """``build_carbon.py --verify``, in-process."""
    assert builder.render(builder.build()) == SHIPPED_TEXT
    assert builder.main(["--verify"]) == 0


def test_verify_fails_on_a_book_that_is_not_what_it_would_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    book = tmp_path / "carbon.yaml"
    book.write_text(SHIPPED_TEXT.replace("grid_g_per_kwh: 412.72", "grid_g_per_kwh: 41.272"))
    monkeypatch.setattr(builder, "BOOK", book)
    assert builder.main(["--verify"]) == 1
    assert "rebuild it" in capsys.readouterr().err
    assert builder.main([]) == 0  # rebuilds it
    assert book.read_text() == SHIPPED_TEXT
    assert builder.main(["--verify"]) == 0


def test_the_book_says_where_it_comes_from_and_on_what_basis() -> None:
    assert SHIPPED["source"]["repository"] == builder.REPOSITORY
    assert SHIPPED["source"]["commit"] == builder.COMMIT
    assert SHIPPED["source"]["license"] == "Apache-2.0"
    assert SHIPPED["year"] == NEWEST.year == max(SHIPPED["years"])
    assert sorted(SHIPPED["years"], reverse=True) == [f.year for f in builder.FILES]
    assert (SHIPPED["basis"], SHIPPED["units"], SHIPPED["period"]) == \
        (BASIS, UNITS, "annual")
    assert SHIPPED["pue"]["default"] == builder.PUE.default
    assert SHIPPED["pue"]["url"].startswith("https://")
    for file in builder.FILES:
        assert SHIPPED["years"][file.year]["file"] == file.path
        assert SHIPPED["years"][file.year]["sha256"] == file.sha256
    assert SHIPPED_TEXT.startswith("# ") and "do not edit" in SHIPPED_TEXT.split("\n", 3)[2]


def test_the_loaded_book_names_its_source_basis_and_pue() -> None:
    book = load_carbon_book()
    assert book.year == NEWEST.year
    assert book.source == f"GoogleCloudPlatform/region-carbon-info@{builder.COMMIT[:7]} " \
                          f"{NEWEST.year}.csv"
    assert book.basis == f"location-based, {NEWEST.year} annual grid average " \
                         "(Google region-carbon-info)"
    assert book.pue == builder.PUE.default and 1.0 <= book.pue < 1.5
    assert builder.PUE.url in book.pue_source
    older = load_carbon_book(year=2021)
    assert older.year == 2021 and older.source.endswith(" 2021.csv")


@pytest.mark.parametrize("file", builder.FILES, ids=lambda f: str(f.year))
def test_every_year_holds_every_region_of_its_file_as_the_file_gives_it(
        file: builder.Vendored) -> None:
    rows = vendored(file)
    book = load_carbon_book(year=file.year)
    assert set(book.regions) == set(rows)
    for region, row in rows.items():
        assert book.regions[region] == RegionCarbon(region, row.grid_g_per_kwh, row.cfe)


def test_the_newest_year_figures_hand_checked_against_the_file() -> None:
    """Lines of ``region_carbon/2024.csv``: ``us-central1,Iowa,0.87,412.72``,
    ``me-central1,Doha,0.01,366``, ``europe-north2,Stockholm,1.00,2.73``."""
    book = load_carbon_book()
    assert book.of_region("us-central1") == RegionCarbon("us-central1", 412.72, 0.87)
    assert book.of_region("me-central1") == RegionCarbon("me-central1", 366.0, 0.01)
    assert book.of_region("europe-north2") == RegionCarbon("europe-north2", 2.73, 1.0)
    assert load_carbon_book(year=2021).regions["europe-west9"].cfe is None  # blank upstream


def test_every_region_the_price_book_sells_in_that_upstream_lists_has_an_intensity() -> None:
    sold = set(PRICEBOOK["regions"]) | set(PRICEBOOK.get("machines") or {})
    listed = {r for f in builder.FILES for r in vendored(f)}
    covered = sold & listed
    assert covered, "no region of the price book is in the carbon data"
    book = load_carbon_book()
    missing = sorted(r for r in covered if book.of_region(r) is None)
    assert missing == [], f"listed in an older year only: {missing}"
    for region in covered:
        figures = book.of_region(region)
        assert figures is not None and figures.grid_g_per_kwh >= 0
    assert sorted(sold - listed) == []  # today upstream lists every one


def test_source_md_records_each_vendored_file_and_its_digests() -> None:
    text = (DATA / "region_carbon" / "SOURCE.md").read_text()
    assert builder.REPOSITORY in text and builder.COMMIT in text
    assert "2026-12-07" in text and "Apache" in text
    for file in builder.FILES:
        assert file.sha256 in text and file.blob in text and file.path in text
    on_disk = sorted(p.name for p in (DATA / "region_carbon").glob("*.csv"))
    assert on_disk == sorted(f.name for f in builder.FILES)


# ------------------------------------------------------------------------ the builder


def test_a_vendored_file_is_read_only_at_its_pinned_digest(tmp_path: Path) -> None:
    for file in builder.FILES:
        shutil.copyfile(DATA / "region_carbon" / file.name, tmp_path / file.name)
    assert builder.build(directory=tmp_path) == builder.build()
    path = tmp_path / NEWEST.name
    path.write_bytes(path.read_bytes().replace(b"412.72", b"41.272"))
    with pytest.raises(builder.SourceError, match="is not the pinned"):
        builder.build(directory=tmp_path)
    path.write_bytes(path.read_bytes().replace(b"\r\n", b"\n"))  # line ends converted
    with pytest.raises(builder.SourceError, match="is not the pinned"):
        builder.read_vendored(NEWEST, tmp_path)
    path.unlink()
    with pytest.raises(builder.SourceError, match="cannot read"):
        builder.read_vendored(NEWEST, tmp_path)


HEAD = ",".join(builder.HEADER)


@pytest.mark.parametrize(("text", "message"), [
    ("Google Cloud Region,Location,Google CFE,Lifecycle grid carbon intensity "
     "(gCO2eq / kWh)\nus-east1,South Carolina,0.19,500\n", "the header is not"),
    (f"{HEAD}\nus-east1,South Carolina,0.19,500\nus-east1,South Carolina,0.2,501\n",
     "us-east1 is listed twice"),
    (f"{HEAD}\nus-east1,South Carolina,1.19,500\n", "is over 1"),
    (f"{HEAD}\nus-east1,South Carolina,0.19,\n", "not a number"),
    (f"{HEAD}\nus-east1,South Carolina,0.19,-5\n", "out of range"),
    (f"{HEAD}\nus-east1-b,South Carolina,0.19,500\n", "is not a Google Cloud region"),
    (f"{HEAD}\nus-east1,South Carolina,500\n", "3 fields, not 4"),
    (f"{HEAD}\n", "no regions"),
])
def test_a_file_that_cannot_be_read_as_a_year_is_refused(text: str, message: str) -> None:
    with pytest.raises(builder.SourceError, match=message):
        builder.parse(text.encode(), "year.csv")


def test_crlf_lf_and_blank_lines_read_alike() -> None:
    lf = f"{HEAD}\nus-east1,South Carolina,,500\n\n".encode()
    assert builder.parse(lf, "a") == builder.parse(lf.replace(b"\n", b"\r\n"), "b") == \
        {"us-east1": builder.Row(500.0, None)}


# ------------------------------------------------------------------------ the loader


def test_a_book_of_your_own_loads(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("year: 2030\nbasis: location-based\nunits: gCO2e/kWh\n"
                    "pue: {default: 1.2, source: our facilities team}\n"
                    "years:\n  2030:\n    regions:\n"
                    "      us-central1: {grid_g_per_kwh: 100, cfe: null}\n")
    book = load_carbon_book(path)
    assert book == CarbonBook(2030, str(path), f"location-based, 2030 annual grid average "
                              f"({path})", 1.2, "our facilities team",
                              {"us-central1": RegionCarbon("us-central1", 100.0, None)})
    assert book.of_region("us-central1-f") == book.regions["us-central1"]
    assert book.of_region("europe-west4") is None


GOOD = {"year": 2024, "units": "gCO2e/kWh", "pue": {"default": 1.09, "source": "report"},
        "years": {2024: {"regions": {"us-central1": {"grid_g_per_kwh": 412.72,
                                                     "cfe": 0.87}}}}}


def _with(**changes: Any) -> str:
    data = GOOD | changes
    return yaml.safe_dump(data)


@pytest.mark.parametrize(("text", "message"), [
    ("year: [2024\n", "carbon book: not valid YAML at line 2"),
    ("- 2024\n", "a carbon book is a mapping"),
    (_with(year="2024"), "year must be a year such as 2024"),
    (_with(year=2023), "no figures for 2023; the book has 2024"),
    (_with(years=[2024]), "years must be a mapping"),
    (_with(units="kgCO2e/kWh"), "units must be gCO2e/kWh"),
    (_with(pue={"default": 0.9, "source": "x"}), "pue.default must be a number at least 1"),
    (_with(pue={"default": 1.1}), "pue.source must be a text"),
    (_with(years={2024: {"regions": {}}}), "years.2024.regions lists no region"),
    (_with(years={2024: {"regions": {"us-central1-a": {"grid_g_per_kwh": 1}}}}),
     "'us-central1-a' is not a region"),
    (_with(years={2024: {"regions": {"us-central1": {"grid_g_per_kwh": -1}}}}),
     r"years.2024.regions.us-central1.grid_g_per_kwh must be a number at least 0, got -1"),
    (_with(years={2024: {"regions": {"us-central1": {"grid_g_per_kwh": "412"}}}}),
     "grid_g_per_kwh must be a number"),
    (_with(years={2024: {"regions": {"us-central1": {"grid_g_per_kwh": 1, "cfe": 87}}}}),
     r"cfe must be a number from 0 to 1, got 87"),
    (_with(years={2024: {"regions": {"us-central1": {"grid_g_per_kwh": 1, "co2": 2}}}}),
     "names co2; the figures are grid_g_per_kwh and cfe"),
])
def test_a_bad_book_names_the_file_and_what_is_wrong(tmp_path: Path, text: str,
                                                     message: str) -> None:
    path = tmp_path / "carbon.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_carbon_book(path)
    assert str(err.value).startswith(f"{path}: ")


def test_a_missing_book_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match="cannot read") as err:
        load_carbon_book(path)
    assert str(path) in str(err.value)


def test_a_year_the_shipped_book_lacks_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"shipped carbon book .*no figures for 2019; "
                                          r"the book has 2021, 2022, 2023, 2024"):
        load_carbon_book(year=2019)


# ------------------------------------------------------------------------ the arithmetic


@pytest.mark.parametrize(("name", "region"), [
    ("us-central1-a", "us-central1"),
    ("us-central1-f", "us-central1"),
    ("europe-west12-b", "europe-west12"),
    ("northamerica-northeast1-c", "northamerica-northeast1"),
    ("me-central2-a", "me-central2"),
    ("us-central1", "us-central1"),  # a region passes through
    ("europe-west4", "europe-west4"),
    ("asia-southeast1", "asia-southeast1"),
    ("", ""),  # neither: as it is
    ("global", "global"),
    ("us-central1-", "us-central1-"),
])
def test_region_of_zone(name: str, region: str) -> None:
    assert region_of_zone(name) == region


@pytest.mark.parametrize(("joules", "grid", "pue", "grams"), [
    (3.6e6, 500.0, 1.0, 500.0),  # 1 kWh at 500 g/kWh
    (3.6e6, 500.0, 1.09, 545.0),  # the facility's overhead on top
    (0.0, 500.0, 1.09, 0.0),
    (1.8e6, 412.72, 1.0, 206.36),  # half a kWh in us-central1, 2024
    (700.0 * 3600, 412.72, 1.09, 0.7 * 1.09 * 412.72),  # a 700 W GPU for an hour
    (3.6e9, 2.73, 1.1, 3003.0),  # 1 MWh in europe-north2, 2024
])
def test_grams_co2e_hand_worked(joules: float, grid: float, pue: float,
                                grams: float) -> None:
    assert grams_co2e(joules, grid, pue) == pytest.approx(grams, rel=1e-12)


_JOULES = st.floats(min_value=0, max_value=1e15, allow_nan=False)


@given(a=_JOULES, b=_JOULES, k=st.floats(min_value=0, max_value=1e6),
       grid=st.floats(min_value=0, max_value=2000), pue=st.floats(min_value=1, max_value=3))
def test_grams_co2e_is_linear_in_joules(a: float, b: float, k: float, grid: float,
                                        pue: float) -> None:
    def close(x: float, y: float) -> bool:
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)

    assert close(grams_co2e(a + b, grid, pue), grams_co2e(a, grid, pue) + grams_co2e(b, grid, pue))
    assert close(grams_co2e(k * a, grid, pue), k * grams_co2e(a, grid, pue))
    assert grams_co2e(0.0, grid, pue) == 0.0
