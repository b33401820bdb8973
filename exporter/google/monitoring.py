"""The Cloud Monitoring API client both the source and the sink use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.google.grpc_clients import async_client

if TYPE_CHECKING:
    from google.cloud.monitoring_v3 import MetricServiceAsyncClient


def metric_client(endpoint: str | None = None, anonymous: bool = False
                  ) -> MetricServiceAsyncClient:
    """A MetricService client on the running event loop.

    Default: Google's endpoint with Application Default Credentials (Workload Identity on
    GKE). ``anonymous``: no credentials over a plaintext channel to ``endpoint``
    (``host:port``), for a local server."""
    from google.cloud.monitoring_v3 import MetricServiceAsyncClient
    from google.cloud.monitoring_v3.services.metric_service.transports import (
        MetricServiceGrpcAsyncIOTransport,
    )

    return async_client(MetricServiceAsyncClient, MetricServiceGrpcAsyncIOTransport,
                        endpoint, anonymous, "Cloud Monitoring")
