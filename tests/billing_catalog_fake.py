"""An in-process Cloud Billing CloudCatalog over real gRPC, for the method the exporter
calls (ListSkus). Google's API cannot be reached from the tests; this server answers with
the message shapes Google documents for ``services.skus.list`` (a ``Sku``: ``name``,
``sku_id``, ``description``, ``category`` {``service_display_name``, ``resource_family``,
``resource_group``, ``usage_type``}, ``service_regions``, ``pricing_info`` [{``summary``,
``pricing_expression`` {``usage_unit``, ``usage_unit_description``, ``base_unit``,
``base_unit_conversion_factor``, ``display_quantity``, ``tiered_rates`` [{
``start_usage_amount``, ``unit_price`` {``currency_code``, ``units``, ``nanos``}}]},
``currency_conversion_rate``, ``effective_time``}], ``service_provider_name``,
``geo_taxonomy``), paged by ``page_size`` (at most 5000) and ``page_token``, and with the
descriptions Compute Engine's GPU SKUs carry (``Nvidia L4 GPU running in Belgium``,
``Nvidia Tesla A100 GPU attached to Spot Preemptible VMs running in Americas``, ``H200
141GB GPU running in Netherlands``, ``Nvidia H100 80GB Mega GPU ...``)."""

from __future__ import annotations

from typing import Any

import grpc
from google.cloud.billing_v1.types import ListSkusRequest, ListSkusResponse, Sku

from tests.grpc_fake import serve, unary

SERVICE = "google.cloud.billing.v1.CloudCatalog"
COMPUTE_ENGINE = "services/6F81-5844-456A"


def sku(sku_id: str, description: str, usd: float, regions: list[str],
        usage_type: str = "OnDemand", group: str = "GPU", unit: str = "h") -> Sku:
    units = int(usd)
    return Sku(
        name=f"{COMPUTE_ENGINE}/skus/{sku_id}", sku_id=sku_id, description=description,
        category={"service_display_name": "Compute Engine", "resource_family": "Compute",
                  "resource_group": group, "usage_type": usage_type},
        service_regions=regions,
        pricing_info=[{
            "summary": "", "effective_time": {"seconds": 1_793_000_000},
            "currency_conversion_rate": 1.0,
            "pricing_expression": {
                "usage_unit": unit, "usage_unit_description": "hour", "base_unit": "s",
                "base_unit_description": "second", "base_unit_conversion_factor": 3600,
                "display_quantity": 1,
                "tiered_rates": [{"start_usage_amount": 0, "unit_price": {
                    "currency_code": "USD", "units": units,
                    "nanos": round((usd - units) * 1e9)}}]}}],
        service_provider_name="Google",
        geo_taxonomy={"type_": "MULTI_REGIONAL" if len(regions) > 1 else "REGIONAL",
                      "regions": regions})


class FakeCloudCatalog:
    def __init__(self, skus: list[Sku]) -> None:
        self.skus = skus
        self.requests: list[ListSkusRequest] = []
        self.failing = False
        """Answer UNAVAILABLE, as the API does when it cannot serve."""

    async def list_skus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.requests.append(request)
        if self.failing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "The service is unavailable.")
        if request.parent != COMPUTE_ENGINE:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{request.parent} not found")
        if request.page_size > 5000:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_size > 5000")
        size = request.page_size or 5000
        start = int(request.page_token or 0)
        page = self.skus[start:start + size]
        more = start + size < len(self.skus)
        return ListSkusResponse.pb(ListSkusResponse(
            skus=page, next_page_token=str(start + size) if more else ""))

    async def start(self) -> tuple[grpc.aio.Server, str]:
        return await serve(SERVICE, {"ListSkus": unary(self.list_skus, ListSkusRequest)})
