"""GPU prices: the price book, and the hourly price of one GPU in one pool.

The book is YAML: ``regions.<region>.<accelerator>.{on_demand, spot}`` in USD per
GPU-hour, with ``as_of`` and its sources. A GPU model the book does not price is an error
at start-up (for the models the exporter knows) and, for anything else met at run time,
an unpriced GPU: counted and shown, never silently $0.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from exporter.catalog import GPU_MODELS
from exporter.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PriceBook:
    as_of: str
    currency: str
    region: str
    prices: dict[tuple[str, str], float]
    """(accelerator, "on-demand" | "spot") -> USD per GPU-hour."""

    def hourly(self, accelerator: str, provisioning: str) -> float | None:
        """List price of one GPU-hour, or None if the book does not price it."""
        return self.prices.get((accelerator, provisioning))


def load_price_book(path: Path | None, region: str) -> PriceBook:
    """Load a book (None: the shipped one) for ``region``; every known GPU must be priced."""
    if path is None:
        text = resources.files("exporter").joinpath("data/pricebook.yaml").read_text()
        source = "shipped price book"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read price book: {exc.strerror}") from None
        source = str(path)
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("regions"), dict):
        raise ConfigError(f"{source}: a price book needs a 'regions' mapping")
    regions = data["regions"]
    if region not in regions:
        raise ConfigError(f"{source}: no prices for region {region!r}; the book has "
                          f"{', '.join(sorted(regions))}. Add the region or set prices.book.")
    prices: dict[tuple[str, str], float] = {}
    for accel, entry in (regions[region] or {}).items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{source}: {region}.{accel} must map on_demand/spot to prices")
        for key, prov in (("on_demand", "on-demand"), ("spot", "spot")):
            value = entry.get(key)
            if value is None:
                continue
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{source}: {region}.{accel}.{key} must be a positive "
                                  f"number, got {value!r}")
            prices[(accel, prov)] = float(value)
    missing = sorted(f"{a} ({p})" for a in GPU_MODELS for p in ("on-demand", "spot")
                     if (a, p) not in prices)
    if missing:
        raise ConfigError(f"{source}: region {region} does not price {', '.join(missing)}; "
                          "a GPU without a price would be reported as free")
    return PriceBook(as_of=str(data.get("as_of", "")), currency=str(data.get("currency", "USD")),
                     region=region, prices=prices)
