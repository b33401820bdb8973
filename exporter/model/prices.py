"""GPU prices: the price book, and the hourly price of one GPU in one pool.

The book is YAML: ``regions.<region>.<accelerator>.{on_demand, spot}`` in USD per
GPU-hour, with ``as_of``, its ``basis`` and its sources; optionally ``machines.<region>.
<machine type>.{accelerator, gpus, on_demand, spot}``, the machine a GPU runs in priced
apart (vCPUs and memory, GPUs excluded). The shipped book (``data/pricebook.yaml``) is
built by ``data/build_pricebook.py`` from pinned snapshots of Google's published prices:
every GPU model the product knows, in every region that sells it, priced by its GPU
component alone (``basis: gpu-component``, what the Cloud Billing export's GPU lines
charge).

Each entry may say where its prices come from: ``source`` (a ``sources`` entry's ``id``)
and ``as_of`` (YYYY-MM-DD), each one value for the entry or one per kind
(``{on_demand: ..., spot: ...}``), and ``estimated: [spot]``, the kinds that are estimates
rather than prices Google published. A book without them (the earlier format, or one of
your own) is read as before: each price dated by the book's ``as_of``, cited by its
``sources``.

A region must be in the book. A GPU model it does not price there (not every region sells
every GPU, and the shipped book leaves estimates out) is an unpriced GPU when one is met:
counted and shown, never silently $0.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from exporter.errors import ConfigError
from exporter.files import Unreadable, decode, parse_yaml, read_yaml
from exporter.model.catalog import MACHINE_FAMILIES


@dataclass(frozen=True, slots=True)
class MachinePrice:
    """One machine type's own price in the region (its vCPUs and memory, GPUs excluded)."""

    accelerator: str
    gpus: int
    hourly: float

    @property
    def per_gpu(self) -> float:
        """The machine's share of one of its GPUs' hour."""
        return self.hourly / self.gpus


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where one price of the book comes from."""

    source: str
    """The entry's ``source`` (a ``sources`` id), else the book's sources, else its path."""
    as_of: str
    """YYYY-MM-DD: the entry's ``as_of``, else the book's ("" when neither says)."""
    estimated: bool = False
    """An estimate, not a price Google published (the entry's ``estimated`` lists it)."""


@dataclass(frozen=True, slots=True)
class BookEntry:
    """One price of a book, in any region, with its provenance (``book_entries``)."""

    region: str
    accelerator: str
    provisioning: str
    usd_per_hour: float
    provenance: Provenance


@dataclass(frozen=True, slots=True)
class PriceBook:
    as_of: str
    currency: str
    region: str
    prices: dict[tuple[str, str], float]
    """(accelerator, "on-demand" | "spot") -> USD per GPU-hour."""
    basis: str = "gpu-component"
    """What a GPU's price covers: ``gpu-component``, the GPU alone."""
    machines: dict[tuple[str, str], MachinePrice] = field(default_factory=dict)
    """(machine type, "on-demand" | "spot") -> its own price, for the machine types that
    fix their GPU count."""
    sources: tuple[str, ...] = ()
    """Where the figures come from (package@version, or the book's path)."""
    provenance: dict[tuple[str, str], Provenance] = field(default_factory=dict)
    """(accelerator, provisioning) -> where its price comes from."""

    @property
    def estimated(self) -> frozenset[tuple[str, str]]:
        """The prices in use that are estimates, not prices Google published."""
        return frozenset(k for k, p in self.provenance.items() if p.estimated)

    def hourly(self, accelerator: str, provisioning: str) -> float | None:
        """List price of one GPU-hour, or None if the book does not price it."""
        return self.prices.get((accelerator, provisioning))

    @property
    def as_of_unix(self) -> float | None:
        """``as_of`` (YYYY-MM-DD) as Unix seconds at 00:00 UTC; None without a date."""
        try:
            return datetime.strptime(self.as_of, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
        except ValueError:
            return None

    def machine_share(self, machine_type: str, provisioning: str) -> float | None:
        """The hourly price a GPU of ``machine_type`` carries of its machine, or None if the
        book does not price that machine type here."""
        machine = self.machines.get((machine_type, provisioning))
        return None if machine is None else machine.per_gpu


_PROVISIONINGS = (("on_demand", "on-demand"), ("spot", "spot"))


def _price(value: object, where: str, source: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{source}: {where} must be a positive number, got {value!r}")
    return float(value)


def _per_kind(value: object, where: str, source: str) -> dict[str, str]:
    """An entry's ``source`` or ``as_of``: one value for every kind, or one per kind."""
    if value is None:
        return {}
    if isinstance(value, dict):
        unknown = set(value) - {k for k, _ in _PROVISIONINGS}
        if unknown:
            raise ConfigError(f"{source}: {where} names {', '.join(sorted(map(str, unknown)))};"
                              " the kinds are on_demand and spot")
        return {str(k): str(v) for k, v in value.items()}
    return {k: str(value) for k, _ in _PROVISIONINGS}


def _read(path: Path | None) -> tuple[dict[str, Any], str]:
    source = "shipped price book" if path is None else str(path)
    try:
        data: Any = parse_yaml(decode(
            resources.files("exporter").joinpath("data/pricebook.yaml").read_bytes()
        )) if path is None else read_yaml(Path(path))
    except Unreadable as exc:
        raise ConfigError(f"{source}: price book: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("regions"), dict):
        raise ConfigError(f"{source}: a price book needs a 'regions' mapping")
    return data, source


def _cited(data: dict[str, Any]) -> tuple[str, ...]:
    sources = data.get("sources")
    return tuple(str(s["package"]) for s in sources if isinstance(s, dict) and "package" in s
                 ) if isinstance(sources, list) else ()


def _name(key: object) -> str:
    """A key of the book as a message shows it: as written when printable, else quoted."""
    return key if isinstance(key, str) and key.isprintable() and key else repr(key)


def _mapping(value: object, where: str, source: str) -> dict[Any, Any]:
    """A part of the book that must be a mapping (None: an empty one)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {where} must be a mapping, not a {type(value).__name__}")
    return value


def _entries(data: dict[str, Any], region: str, source: str) -> list[BookEntry]:
    """The prices of one region of a book, each with its provenance."""
    cited = ", ".join(_cited(data)) or source
    as_of = str(data.get("as_of", "") or "")
    out = []
    for accel, entry in _mapping(data["regions"][region], f"regions.{region}",
                                 source).items():
        where = f"{region}.{_name(accel)}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{source}: {where} must map on_demand/spot to prices")
        sources = _per_kind(entry.get("source"), f"{where}.source", source)
        dates = _per_kind(entry.get("as_of"), f"{where}.as_of", source)
        estimated = entry.get("estimated") or []
        if not isinstance(estimated, list) or \
                not all(isinstance(k, str) for k in estimated) or \
                not set(estimated) <= {k for k, _ in _PROVISIONINGS}:
            raise ConfigError(f"{source}: {where}.estimated must list on_demand and/or spot")
        for key, prov in _PROVISIONINGS:
            if entry.get(key) is not None:
                out.append(BookEntry(
                    region, accel, prov, _price(entry[key], f"{where}.{key}", source),
                    Provenance(sources.get(key, cited), dates.get(key, as_of),
                               key in estimated)))
    return out


def book_entries(path: Path | None) -> list[BookEntry]:
    """Every price of a book (None: the shipped one), in every region, with where it comes
    from: what ``build_pricebook.py --check`` reads."""
    data, source = _read(path)
    return [e for region in sorted(data["regions"], key=str)
            for e in _entries(data, region, source)]


def load_price_book(path: Path | None, region: str) -> PriceBook:
    """Load a book (None: the shipped one) for ``region``."""
    data, source = _read(path)
    regions = data["regions"]
    if region not in regions:
        near = difflib.get_close_matches(region, [str(r) for r in regions], n=1, cutoff=0.7)
        raise ConfigError(f"{source}: no prices for region {region!r}"
                          + (f" (did you mean {near[0]!r}?)" if near else "")
                          + f"; the book has {', '.join(sorted(map(_name, regions)))}. Add the "
                          "region or set prices.book.")
    entries = _entries(data, region, source)
    if not entries:
        raise ConfigError(f"{source}: region {region} prices no GPU")
    prices = {(e.accelerator, e.provisioning): e.usd_per_hour for e in entries}
    machines: dict[tuple[str, str], MachinePrice] = {}
    for machine, entry in _mapping(_mapping(data.get("machines"), "machines", source)
                                   .get(region), f"machines.{region}", source).items():
        where = f"machines.{region}.{_name(machine)}"
        if not isinstance(entry, dict) or not isinstance(entry.get("accelerator"), str) \
                or not isinstance(entry.get("gpus"), int) or entry["gpus"] < 1:
            raise ConfigError(f"{source}: {where} needs an accelerator and a number of gpus")
        for key, prov in _PROVISIONINGS:
            if entry.get(key) is not None:
                machines[(machine, prov)] = MachinePrice(
                    entry["accelerator"], entry["gpus"], _price(entry[key], f"{where}.{key}",
                                                                source))
    return PriceBook(as_of=str(data.get("as_of", "")), currency=str(data.get("currency", "USD")),
                     region=region, prices=prices,
                     basis=str(data.get("basis", "gpu-component")), machines=machines,
                     sources=_cited(data) or (source,),
                     provenance={(e.accelerator, e.provisioning): e.provenance
                                 for e in entries})


@dataclass(frozen=True, slots=True)
class Commitment:
    """A resource-based committed-use discount: ``gpus`` GPUs of one model in the region,
    paid at ``usd_per_gpu_hour`` (the commitment's term price) every hour, used or not."""

    accelerator: str
    gpus: int
    usd_per_gpu_hour: float


class _Committed(NamedTuple):
    """What a model's commitments add up to: the GPUs and their cost an hour."""

    gpus: int
    usd_per_hour: float


class CommitmentUse(NamedTuple):
    """A model's commitments now: the GPUs committed, those no on-demand GPU of the model
    uses, and what the unused ones cost an hour at the term price."""

    gpus: float
    unused_gpus: float
    unused_usd_per_hour: float


class ListPrice(NamedTuple):
    """A list price in use: USD per GPU-hour before discounts, where it comes from
    (``book`` or ``catalog``) and when that was read (Unix seconds; None when unknown)."""

    usd_per_hour: float
    source: str
    read_unix: float | None


def _committed(commitments: Sequence[Commitment]) -> dict[str, _Committed]:
    """Per model: the GPUs committed and what they cost an hour (commitments of one model
    add)."""
    out: dict[str, _Committed] = {}
    for c in commitments:
        prior = out.get(c.accelerator, _Committed(0, 0.0))
        out[c.accelerator] = _Committed(prior.gpus + c.gpus,
                                        prior.usd_per_hour + c.gpus * c.usd_per_gpu_hour)
    return out


def effective_prices(list_prices: Mapping[tuple[str, str], float],
                     on_demand_gpus: Mapping[str, float],
                     commitments: Sequence[Commitment] = (),
                     negotiated: Mapping[str, float] | None = None
                     ) -> dict[tuple[str, str], float]:
    """Each (model, provisioning)'s price per GPU-hour after what finance agreed.

    - ``negotiated``: a fraction off the on-demand list price, by GPU model or by machine
      family (the model's own entry first). Spot is as priced: no discount applies to it.
    - ``commitments``: the committed GPUs of a model are paid at their term price; the
      model's on-demand GPUs beyond them (``on_demand_gpus``, now in the cluster) at the
      negotiated list price. Each on-demand GPU of the model carries the blend, as Cloud
      Billing spreads a commitment's credit over the usage it covers. With fewer GPUs than
      committed, each costs the term price; the rest of the commitment is paid for nothing
      (``unused_commitment``).
    """
    off = dict(negotiated or {})
    committed = _committed(commitments)
    out: dict[tuple[str, str], float] = {}
    for (model, provisioning), price in list_prices.items():
        if provisioning != "on-demand":
            out[model, provisioning] = price
            continue
        fraction = off.get(model)
        if fraction is None:
            fraction = next((f for family, f in off.items()
                             if model in MACHINE_FAMILIES.get(family, ())), 0.0)
        listed = price * (1.0 - fraction)
        term = committed.get(model, _Committed(0, 0.0))
        present = on_demand_gpus.get(model, 0.0)
        if term.gpus and present > 0:
            covered = min(float(term.gpus), present)
            out[model, provisioning] = (covered * term.usd_per_hour / term.gpus
                                        + (present - covered) * listed) / present
        else:
            out[model, provisioning] = listed
    return out


def unused_commitment(commitments: Sequence[Commitment], on_demand_gpus: Mapping[str, float]
                      ) -> dict[str, CommitmentUse]:
    """Per model with a commitment: the GPUs committed, those no on-demand GPU uses now,
    and what the unused ones cost an hour at the term price."""
    out: dict[str, CommitmentUse] = {}
    for model, term in _committed(commitments).items():
        unused = max(0.0, term.gpus - on_demand_gpus.get(model, 0.0))
        out[model] = CommitmentUse(float(term.gpus), unused,
                                   unused * term.usd_per_hour / term.gpus)
    return out
