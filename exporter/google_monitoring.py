"""The Cloud Monitoring API client both the source and the sink use."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.cloud.monitoring_v3 import MetricServiceAsyncClient


def metric_client(endpoint: str | None = None, anonymous: bool = False
                  ) -> MetricServiceAsyncClient:
    """A MetricService client on the running event loop.

    Default: Google's endpoint with Application Default Credentials (Workload Identity on
    GKE). ``anonymous``: no credentials over a plaintext channel to ``endpoint``
    (``host:port``), for a local server."""
    import grpc  # heavy imports: only when Cloud Monitoring is used
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.monitoring_v3 import MetricServiceAsyncClient
    from google.cloud.monitoring_v3.services.metric_service.transports import (
        MetricServiceGrpcAsyncIOTransport,
    )

    if anonymous:
        if not endpoint:
            raise ValueError("an anonymous Cloud Monitoring client needs an endpoint")
        transport = MetricServiceGrpcAsyncIOTransport(
            host=endpoint, credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            channel=grpc.aio.insecure_channel(endpoint))
        return MetricServiceAsyncClient(transport=transport)
    from google.api_core.client_options import ClientOptions

    options = ClientOptions(api_endpoint=endpoint) if endpoint else None
    return MetricServiceAsyncClient(client_options=options)
