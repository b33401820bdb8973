"""The prices in use: the list price of each (GPU model, provisioning), from the price
book or the price catalogue, and where each comes from; the committed-use discounts and
what of them no on-demand GPU uses; the GPU models priced nowhere, logged once."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from exporter import logs
from exporter.config import Config
from exporter.metrics.health import CatalogStats
from exporter.model import compute
from exporter.model.prices import (
    Commitment,
    CommitmentUse,
    ListPrice,
    PriceBook,
    effective_prices,
    unused_commitment,
)
from exporter.model.records import NodeInfo

if TYPE_CHECKING:
    from exporter.sources.billing_catalog import ListPrices


class PriceFeed(Protocol):
    """List prices from elsewhere than the book (``sources.billing_catalog``): its reads'
    figures, and the prices of its latest read that priced something."""

    @property
    def stats(self) -> CatalogStats: ...
    @property
    def latest(self) -> ListPrices | None: ...


class PriceState:
    """List prices as the book gives them, until the feed (the price catalogue) prices a
    model: each cycle takes the feed's latest read, when it is new."""

    def __init__(self, config: Config, book: PriceBook, log: logging.Logger) -> None:
        self.config = config
        self.book = book
        self.list_prices = dict(book.prices)
        self.sources: dict[tuple[str, str], tuple[str, float | None]] = dict.fromkeys(
            book.prices, ("book", book.as_of_unix))
        """Where each list price in use comes from (``book`` or ``catalog``), and when it
        was read (the book's ``as_of``; None when it has none)."""
        self.feed: PriceFeed | None = None
        """The price catalogue, when it is read."""
        self._taken: ListPrices | None = None
        self._commitments = [
            Commitment(c.gpu, c.gpus, c.usd_per_gpu_hour) for c in config.prices.commitments]
        self.commitment_use: Mapping[str, CommitmentUse] = {}
        """Of the last cycle (``prices.unused_commitment``): a new mapping each cycle."""
        self._log = log
        self._logged: set[tuple[str, str]] = set()

    @property
    def catalog(self) -> CatalogStats | None:
        """The price catalogue's reads, when it is read."""
        return None if self.feed is None else self.feed.stats

    def take(self) -> None:
        """The feed's latest read, if new: the list prices it gives, model by model (what it
        does not price keeps the book's)."""
        latest = None if self.feed is None else self.feed.latest
        if latest is None or latest is self._taken:
            return
        self._taken = latest
        self.list_prices.update(latest.prices)
        self.sources.update(dict.fromkeys(latest.prices, ("catalog", latest.read_at)))

    def device_prices(self, nodes: Mapping[str, NodeInfo]) -> dict[tuple[str, str], float]:
        """The hourly price of a GPU of each (model, provisioning) on these nodes, after
        commitments and negotiated prices, from the feed's latest read; what of the
        commitments goes unused, kept."""
        self.take()
        gpus = compute.on_demand_gpus(nodes.values())
        price = effective_prices(self.list_prices, gpus, self._commitments,
                                 self.config.prices.negotiated)
        self.commitment_use = unused_commitment(self._commitments, gpus)
        return price

    def unpriced(self, states: Sequence[compute.DeviceState]) -> None:
        """Log once per node and model that a GPU has no price."""
        for d in states:
            if d.price_usd_per_hour is None:
                key = (d.node, f"unpriced:{d.accelerator}")
                if key in self._logged:
                    continue
                self._logged.add(key)
                self._log.warning("gpu model not priced", extra=logs.ctx(
                    target=d.node, model=d.accelerator, provisioning=d.provisioning,
                    region=self.book.region))

    def shown(self) -> dict[tuple[str, str], ListPrice]:
        """(model, provisioning) -> list price in use, its source and when it was read."""
        return {k: ListPrice(v, *self.sources.get(k, ("book", None)))
                for k, v in sorted(self.list_prices.items())}
