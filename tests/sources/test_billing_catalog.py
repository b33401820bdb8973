"""List prices from Google's Cloud Billing Catalog API (``prices.catalog``): which SKUs
price which GPU, and the exporter refreshing its prices from a CloudCatalog over real gRPC
(``tests/billing_catalog_fake.py``), the shipped book the fallback model by model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.demo import demo_config
from exporter.model.prices import load_price_book
from exporter.runtime.app import open_exporter
from exporter.sources.billing_catalog import CatalogRefresh, catalog_client, gpu_prices, model_of
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.billing_catalog_fake import FakeCloudCatalog, sku
from tests.timing import limit

US = ["us-central1", "us-east1", "us-west1"]
SKUS = [
    sku("8A1B-6DB3-7D8E", "Nvidia Tesla T4 GPU running in Americas", 0.35, US),
    sku("D1A8-1A53-3DD7", "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in "
        "Americas", 0.11, US, "Preemptible"),
    sku("A88A-5A60-E821", "Nvidia L4 GPU running in Iowa", 0.5866, ["us-central1"]),
    sku("E548-B46D-71CD", "Nvidia L4 GPU attached to Spot Preemptible VMs running in Iowa",
        0.2001, ["us-central1"], "Preemptible"),
    sku("4E35-7276-6341", "Nvidia L4 GPU running in Belgium", 0.61666, ["europe-west1"]),
    sku("F13A-42C7-1D57", "Nvidia Tesla A100 GPU running in Americas", 2.934, US),
    sku("39D4-516A-0317", "Nvidia Tesla A100 GPU attached to Spot Preemptible VMs running in "
        "Americas", 1.1, US, "Preemptible"),
    sku("9C3B-1F0A-2E77", "Nvidia A100 80GB GPU running in Americas", 3.9, US),
    sku("2B8E-77A1-9F40", "Nvidia H100 80GB GPU running in Americas", 9.5, US),
    sku("7D1C-0B2E-44A9", "Nvidia H100 80GB Mega GPU running in Americas", 10.2, US),
    sku("5E6F-A1B2-C3D4", "Nvidia H100 80GB GPU attached to DWS Defined Duration VMs running "
        "in Americas", 6.1, US),
    sku("0F1E-2D3C-4B5A", "Commitment v1: Nvidia H100 80GB GPU in Americas for 1 Year",
        6.0, US, "Commit1Yr"),
    sku("6A7B-8C9D-0E1F", "H200 141GB GPU running in Netherlands", 10.5, ["europe-west4"]),
    sku("1C2D-3E4F-5A6B", "N1 Predefined Instance Core running in Americas", 0.0316, US,
        group="N1Standard"),
    sku("B1B2-C3C4-D5D6", "Nvidia Tesla V100 GPU running in Americas", 2.48, US),
    sku("B7B8-C9C0-D1D2", "Nvidia Tesla V100 GPU running in Iowa", 2.55, ["us-central1"]),
]
"""Compute Engine GPU SKUs as the catalogue describes them (prices of this test's own)."""


@pytest.mark.parametrize(("description", "model"), [
    ("Nvidia Tesla T4 GPU running in Americas", "nvidia-tesla-t4"),
    ("Nvidia L4 GPU attached to Spot Preemptible VMs running in Virginia", "nvidia-l4"),
    ("Nvidia Tesla A100 GPU running in Americas", "nvidia-tesla-a100"),
    ("Nvidia A100 80GB GPU running in Americas", "nvidia-a100-80gb"),
    ("Nvidia H100 80GB GPU running in Americas", "nvidia-h100-80gb"),
    ("H200 141GB GPU running in Netherlands", "nvidia-h200-141gb"),
    ("Nvidia Tesla P4 GPU running in Montreal", "nvidia-tesla-p4"),
    ("Nvidia Tesla P100 GPU running in Belgium", "nvidia-tesla-p100"),
    ("Nvidia H100 80GB Mega GPU running in Tokyo", None),  # A3 Mega: not a model here
    ("Nvidia H100 80GB GPU attached to DWS Defined Duration VMs running in Americas", None),
    ("Commitment v1: Nvidia L4 GPU in Americas for 3 Year", None),
    ("Reserved Nvidia L4 GPU running in Americas", None),
    ("RTX 6000 96GB running in Belgium", None),  # G4: not in the catalogue yet
    ("N1 Predefined Instance Core running in Americas", None),
])
def test_which_model_a_sku_prices(description: str, model: str | None) -> None:
    assert model_of(description) == model


def test_a_regions_gpu_prices() -> None:
    found = gpu_prices([s for s in SKUS], "us-central1")
    assert found.prices == {
        ("nvidia-tesla-t4", "on-demand"): 0.35, ("nvidia-tesla-t4", "spot"): 0.11,
        ("nvidia-l4", "on-demand"): 0.5866, ("nvidia-l4", "spot"): 0.2001,
        ("nvidia-tesla-a100", "on-demand"): 2.934, ("nvidia-tesla-a100", "spot"): 1.1,
        ("nvidia-a100-80gb", "on-demand"): 3.9, ("nvidia-h100-80gb", "on-demand"): 9.5}
    assert found.ambiguous == (("nvidia-tesla-v100", "on-demand"),)  # 2.48 and 2.55
    assert found.skus == len(SKUS)
    assert gpu_prices(SKUS, "europe-west1").prices == {("nvidia-l4", "on-demand"): 0.61666}


def test_a_price_in_other_units_or_currency_is_not_read() -> None:
    assert gpu_prices([sku("X", "Nvidia L4 GPU running in Iowa", 0.5, ["us-central1"],
                           unit="mo")], "us-central1").prices == {}


@pytest.fixture
async def catalog() -> AsyncIterator[tuple[FakeCloudCatalog, str]]:
    service = FakeCloudCatalog(list(SKUS))
    server, address = await service.start()
    yield service, address
    await server.stop(None)


async def test_the_catalogue_is_read_page_by_page(
        catalog: tuple[FakeCloudCatalog, str]) -> None:
    service, address = catalog
    client = catalog_client(address, anonymous=True)
    refresh = CatalogRefresh(client, "us-central1", 86400, 5, clock=lambda: 1234.0,
                             page_size=4)
    try:
        assert await refresh.once()
    finally:
        await client.transport.close()  # type: ignore[no-untyped-call]
    assert len(service.requests) == 4  # 16 SKUs, 4 a page
    assert {r.parent for r in service.requests} == {"services/6F81-5844-456A"}
    assert {r.currency_code for r in service.requests} == {"USD"}
    assert refresh.latest is not None and refresh.latest.read_at == 1234.0
    assert refresh.latest.prices[("nvidia-h100-80gb", "on-demand")] == 9.5
    assert refresh.stats.reads == 1 and refresh.stats.failures == 0


async def _exporter_prices(sim: SimulatorServer, tmp_path: Path, address: str,
                           service: FakeCloudCatalog, steps: Callable[[Any], Any]) -> Any:
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path / "w")
    cfg = cfg.model_copy(update={
        "warehouse": cfg.warehouse.model_copy(update={"enabled": False}),
        "prices": cfg.prices.model_copy(update={"catalog": cfg.prices.catalog.model_copy(
            update={"enabled": True, "endpoint": address, "anonymous": True,
                    "refresh": 0.2, "timeout": 2.0})})})
    async with open_exporter(cfg) as exporter:
        await exporter.kube.wait_synced()
        return await steps(exporter)


async def until(check: Callable[[], bool]) -> None:
    """Wait (10 s at most) for the refresh task, which runs on its own, to have done it."""
    async with asyncio.timeout(limit(10)):
        while not check():  # noqa: ASYNC110 (a condition of another task's state, no event)
            await asyncio.sleep(0.05)


async def test_the_exporter_prices_from_the_catalogue_the_book_its_fallback(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        catalog: tuple[FakeCloudCatalog, str], tmp_path: Path) -> None:
    service, address = catalog
    sim: SimulatorServer = await make_server(make_scenario())
    book = load_price_book(None, "us-central1")
    sim.cluster.submit("train", run_seconds=3600)
    await sim.advance(60)

    async def steps(exporter: Any) -> None:
        await until(lambda: exporter.catalog.reads > 0)
        await exporter.cycle(sim.cluster.now)
        h100 = [d for d in exporter.states if d.accelerator == "nvidia-h100-80gb"]
        assert {d.price_usd_per_hour for d in h100} == {9.5}  # the catalogue's
        text = exporter.metrics.text.decode()
        assert ('gke_gpu_list_price_usd_per_hour{cluster="test",model="nvidia-h100-80gb",'
                'provisioning="on-demand",source="catalog"} 9.5') in text
        # the catalogue has no H100 spot SKU here: the book's price, and its age
        assert ('gke_gpu_list_price_usd_per_hour{cluster="test",model="nvidia-h100-80gb",'
                f'provisioning="spot",source="book"}} {book.hourly("nvidia-h100-80gb", "spot")}'
                ) in text
        assert 'gke_gpu_exporter_price_catalog_reads_total{cluster="test",outcome="ok"}' in text
        # the API fails: the prices in use are kept, the failures counted
        service.failing = True
        failures = exporter.catalog.failures
        await until(lambda: exporter.catalog.failures > failures)
        await exporter.cycle(sim.cluster.now + 30)
        assert {d.price_usd_per_hour for d in exporter.states
                if d.accelerator == "nvidia-h100-80gb"} == {9.5}
        assert exporter.catalog.last_error.startswith("ServiceUnavailable")
        text = exporter.metrics.text.decode()
        assert 'gke_gpu_exporter_price_catalog_reads_total{cluster="test",outcome="failed"}' \
            in text
        service.failing = False
        service.skus[8] = sku("2B8E-77A1-9F40", "Nvidia H100 80GB GPU running in Americas",
                              9.25, US)
        h100 = ("nvidia-h100-80gb", "on-demand")
        feed = exporter.pricing.feed
        await until(lambda: feed.latest.prices[h100] == 9.25)
        assert exporter.pricing.list_prices[h100] == 9.5, "taken by the next cycle"
        await exporter.cycle(sim.cluster.now + 60)
        assert exporter.pricing.sources[h100][0] == "catalog"
        assert {d.price_usd_per_hour for d in exporter.states
                if d.accelerator == "nvidia-h100-80gb"} == {9.25}

    await _exporter_prices(sim, tmp_path, address, service, steps)
