"""GPU list prices from Google's Cloud Billing Catalog API (``prices.catalog``).

At start and every ``refresh`` the exporter lists Compute Engine's SKUs
(``services/6F81-5844-456A``) in US dollars and reads, for the cluster's region, the
hourly price of each GPU model it knows, on demand (usage type ``OnDemand``) and spot
(``Preemptible``). A GPU SKU is in resource group ``GPU``; its description names the model
(``Nvidia L4 GPU running in Belgium``, ``Nvidia Tesla A100 GPU attached to Spot Preemptible
VMs running in Americas``, ``H200 141GB GPU running in Netherlands``) and is matched by
``MODEL_PATTERNS``; SKUs of other ways to buy the same GPU (DWS, calendar mode, reserved,
committed) and A3 Mega's H100 are left out. Its price is the first tier of its current
pricing expression, per hour (``usage_unit`` ``h``). A model that two SKUs price
differently in the region is left to the price book, and so is every model the catalogue
does not price there: the shipped book stays the fallback, model by model.

The Catalog API needs no IAM role: any authenticated caller (the exporter's Workload
Identity) may list SKUs, with the Cloud Billing API enabled in the project.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.backoff import Backoff
from exporter.google.grpc_clients import async_client
from exporter.logs import ctx
from exporter.metrics.health import CatalogStats

if TYPE_CHECKING:
    from google.cloud.billing_v1 import CloudCatalogAsyncClient

log = logging.getLogger(__name__)

COMPUTE_ENGINE = "services/6F81-5844-456A"
MODEL_PATTERNS = {
    "nvidia-h200-141gb": r"\bH200\b",
    "nvidia-h100-80gb": r"\bH100 80GB\b",
    "nvidia-a100-80gb": r"\bA100 80GB\b",
    "nvidia-tesla-a100": r"\bA100\b(?! 80GB)",
    "nvidia-l4": r"\bL4\b",
    "nvidia-tesla-t4": r"\bT4\b",
    "nvidia-tesla-v100": r"\bV100\b",
    "nvidia-tesla-p100": r"\bP100\b",
    "nvidia-tesla-p4": r"\bP4\b",
}
"""How Compute Engine's GPU SKUs name each model of the catalogue."""
_MODELS = [(model, re.compile(p)) for model, p in MODEL_PATTERNS.items()]
_OTHER_TERMS = re.compile(r"\b(DWS|Calendar|Flex|Reserv\w*|Commit\w*|Mega)\b", re.IGNORECASE)
"""Descriptions of SKUs that price the same GPU bought another way, or another machine's."""
USAGE_TYPES = {"OnDemand": "on-demand", "Preemptible": "spot"}
PAGE_SIZE = 5000


def model_of(description: str) -> str | None:
    """The catalogue's GPU model a SKU's description names; None for none, or another
    way to buy one."""
    if _OTHER_TERMS.search(description):
        return None
    found = [model for model, pattern in _MODELS if pattern.search(description)]
    return found[0] if len(found) == 1 else None


def _hourly(sku: Any) -> float | None:
    if not sku.pricing_info:
        return None
    expression = sku.pricing_info[-1].pricing_expression  # the current one is the last
    if expression.usage_unit != "h" or not expression.tiered_rates:
        return None
    first = min(expression.tiered_rates, key=lambda r: r.start_usage_amount)
    price = first.unit_price
    if price.currency_code and price.currency_code != "USD":
        return None
    value = price.units + price.nanos / 1e9
    return float(value) if value > 0 else None


@dataclass(frozen=True, slots=True)
class CatalogPrices:
    """What one read of the catalogue gave for a region."""

    prices: dict[tuple[str, str], float]
    """(model, provisioning) -> USD per GPU-hour."""
    ambiguous: tuple[tuple[str, str], ...]
    """Keys two SKUs priced differently: left to the price book."""
    skus: int
    """SKUs read."""


def gpu_prices(skus: Iterable[Any], region: str) -> CatalogPrices:
    """The GPU prices of ``region`` among Compute Engine's SKUs (``Sku`` messages)."""
    seen: dict[tuple[str, str], set[float]] = {}
    count = 0
    for sku in skus:
        count += 1
        category = sku.category
        provisioning = USAGE_TYPES.get(category.usage_type)
        if category.resource_group != "GPU" or provisioning is None or \
                region not in sku.service_regions:
            continue
        model = model_of(sku.description)
        price = _hourly(sku)
        if model is None or price is None:
            continue
        seen.setdefault((model, provisioning), set()).add(round(price, 9))
    prices = {key: next(iter(v)) for key, v in seen.items() if len(v) == 1}
    return CatalogPrices(prices, tuple(sorted(k for k, v in seen.items() if len(v) > 1)),
                         count)


def catalog_client(endpoint: str | None = None, anonymous: bool = False
                   ) -> CloudCatalogAsyncClient:
    """A CloudCatalog client on the running event loop: Google's endpoint with Application
    Default Credentials, or (``anonymous``) no credentials over a plaintext channel to
    ``endpoint`` (``host:port``), for a local server."""
    from google.cloud.billing_v1 import CloudCatalogAsyncClient
    from google.cloud.billing_v1.services.cloud_catalog.transports import (
        CloudCatalogGrpcAsyncIOTransport,
    )

    return async_client(CloudCatalogAsyncClient, CloudCatalogGrpcAsyncIOTransport, endpoint,
                        anonymous, "Cloud Billing Catalog")


@dataclass(frozen=True, slots=True)
class ListPrices:
    """The prices of one read of the catalogue that priced something."""

    prices: Mapping[tuple[str, str], float]
    """(model, provisioning) -> USD per GPU-hour."""
    read_at: float
    """Unix time of the read."""


class CatalogRefresh:
    """Reads the catalogue at start and every ``refresh`` seconds and publishes each read's
    prices as ``latest``, for the next cycle to take; a failed read is retried with
    backoff, the prices of the last good one kept meanwhile."""

    def __init__(self, client: CloudCatalogAsyncClient, region: str, refresh: float,
                 timeout: float, clock: Callable[[], float] = time.time,
                 page_size: int = PAGE_SIZE) -> None:
        self.client, self.region, self.refresh, self.timeout = client, region, refresh, timeout
        self.page_size = page_size
        self.clock = clock
        self.stats = CatalogStats()
        self.latest: ListPrices | None = None
        """The last read that priced something; None before one."""
        self._failing = False

    async def read(self) -> CatalogPrices:
        pager = await self.client.list_skus(
            request={"parent": COMPUTE_ENGINE, "currency_code": "USD",
                     "page_size": self.page_size}, timeout=self.timeout)
        skus = [sku async for sku in pager]
        return gpu_prices(skus, self.region)

    async def once(self) -> bool:
        """One read; whether it priced anything (and was published). It counts in
        ``stats.reads`` once it is over, so that a read in flight is neither ok nor failed."""
        try:
            return await self._once()
        finally:
            self.stats.reads += 1

    async def _once(self) -> bool:
        try:
            found = await asyncio.wait_for(self.read(), self.timeout * 4)
        except Exception as exc:  # any failure of the API: keep the prices in use
            self.stats.failures += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"[:300]
            if not self._failing:
                log.warning("price catalogue read failed", extra=ctx(
                    region=self.region, error=self.stats.last_error))
            self._failing = True
            return False
        if not found.prices:
            self.stats.failures += 1
            self.stats.last_error = f"no GPU price for {self.region} among {found.skus} SKUs"
            log.warning("price catalogue priced no GPU", extra=ctx(
                region=self.region, skus=found.skus))
            return False
        if self._failing:
            log.info("price catalogue read recovered", extra=ctx(region=self.region))
        self._failing = False
        if found.ambiguous:
            log.warning("price catalogue: several prices for one GPU, the book's kept",
                        extra=ctx(region=self.region,
                                  models=[f"{m} ({p})" for m, p in found.ambiguous]))
        now = self.clock()
        self.stats.last_success = now
        self.latest = ListPrices(found.prices, now)
        return True

    async def run(self) -> None:
        backoff = Backoff(base=30.0, cap=3600.0)
        while True:
            if await self.once():
                backoff.reset()
                await asyncio.sleep(self.refresh)
            else:
                await asyncio.sleep(min(self.refresh, backoff.next()))
