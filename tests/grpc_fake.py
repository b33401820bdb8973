"""Serving an in-process fake of one of Google's gRPC services on loopback."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc


def unary(method: Any, request_type: Any) -> grpc.RpcMethodHandler:
    """A unary method taking ``request_type`` (a proto-plus message class)."""
    return grpc.unary_unary_rpc_method_handler(
        method, request_deserializer=request_type.pb().FromString,
        response_serializer=lambda m: m.SerializeToString())


async def serve(service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
                ) -> tuple[grpc.aio.Server, str]:
    """Serve ``handlers`` as ``service`` on a free loopback port; the server and its
    ``host:port``."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service,
                                                                          dict(handlers)),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"
