"""Clients of Google's gRPC APIs (Cloud Monitoring, the Cloud Billing catalogue)."""

from __future__ import annotations

from typing import Any


def async_client[C](client_cls: type[C], transport_cls: Any, endpoint: str | None = None,
                    anonymous: bool = False, api: str = "Google API") -> C:
    """A ``client_cls`` (a generated ``...AsyncClient``) on the running event loop.

    Default: Google's endpoint with Application Default Credentials (Workload Identity on
    GKE). ``anonymous``: no credentials over a plaintext channel to ``endpoint``
    (``host:port``), for a local server; ``transport_cls`` is the client's gRPC asyncio
    transport."""
    import grpc  # heavy imports: only when a Google API is used
    from google.auth.credentials import AnonymousCredentials

    if anonymous:
        if not endpoint:
            raise ValueError(f"an anonymous {api} client needs an endpoint")
        transport = transport_cls(
            host=endpoint, credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            channel=grpc.aio.insecure_channel(endpoint))
        return client_cls(transport=transport)  # type: ignore[call-arg]
    from google.api_core.client_options import ClientOptions

    options = ClientOptions(api_endpoint=endpoint) if endpoint else None
    return client_cls(client_options=options)  # type: ignore[call-arg]
