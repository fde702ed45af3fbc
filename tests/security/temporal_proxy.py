"""A TLS-terminating gRPC proxy in front of the Temporal dev server, with the checks of a
production frontend: a client certificate signed by the test CA (mTLS) and an
``authorization: Bearer <API key>`` header on every call (what Temporal Cloud and a
frontend authorizer require). ``temporal server start-dev`` has no TLS flags, so the
transport tests reach the real dev server through this proxy.

Every Temporal frontend RPC is unary, so one generic unary-unary handler forwards the raw
request bytes and the caller's metadata (minus the API key) to the dev server and the raw
answer back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

_DROP = frozenset({"authorization", "user-agent", "te", "content-type", "host"})


class TemporalTlsProxy:
    """``async with TemporalTlsProxy(upstream, pki, api_key) as proxy``: ``proxy.address``
    is ``127.0.0.1:PORT``; ``proxy.calls`` counts the forwarded calls, ``proxy.refused``
    the calls refused for a missing or wrong API key."""

    def __init__(self, upstream: str, pki: dict[str, Path], api_key: str) -> None:
        self.upstream = upstream
        self.pki = pki
        self.api_key = api_key
        self.calls = 0
        self.refused = 0
        self.address = ""
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None

    def _forward(self, method: str) -> Callable[..., Any]:
        async def behavior(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            md = context.invocation_metadata() or ()
            if dict(md).get("authorization") != f"Bearer {self.api_key}":
                self.refused += 1
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "API key required")
            assert self._channel is not None
            fwd = [(k, v) for k, v in md if k not in _DROP and not k.startswith((":", "grpc-"))]
            remaining = context.time_remaining()
            self.calls += 1
            try:
                out: bytes = await self._channel.unary_unary(
                    method, request_serializer=None, response_deserializer=None)(
                    raw, metadata=fwd, timeout=remaining)
            except grpc.aio.AioRpcError as e:
                await context.abort(e.code(), e.details() or "")
            return out

        return behavior

    async def __aenter__(self) -> TemporalTlsProxy:
        proxy = self

        class _Generic(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
                return grpc.unary_unary_rpc_method_handler(
                    proxy._forward(details.method),  # type: ignore[attr-defined]
                    request_deserializer=None, response_serializer=None)

        self._channel = grpc.aio.insecure_channel(self.upstream)
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((_Generic(),))
        creds = grpc.ssl_server_credentials(
            [(self.pki["server.key"].read_bytes(), self.pki["server.pem"].read_bytes())],
            root_certificates=self.pki["ca.pem"].read_bytes(), require_client_auth=True)
        port = self._server.add_secure_port("127.0.0.1:0", creds)
        await self._server.start()
        self.address = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            await self._server.stop(grace=0)
        if self._channel is not None:
            await self._channel.close()
