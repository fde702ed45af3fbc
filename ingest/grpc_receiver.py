"""OTLP/gRPC receiver (port 4317): ``MetricsService/Export`` and ``LogsService/Export``.

grpc.aio servicers from ``opentelemetry-proto`` on the service's event loop. The
threshold travels back in the initial metadata (``autorepair-threshold``,
``autorepair-quorum-met``, docs/design.md §4.3) so the agent reads it from the same call.
Credentials are checked by a server interceptor (:class:`AuthInterceptor`) from the call's
metadata, before its message is read: a caller without a known bearer token (and, without
mTLS, nothing else to show) is answered UNAUTHENTICATED at once and holds no slot.
Limits: ``max_receive_message_length = ingest.max_body_bytes`` (grpc answers
RESOURCE_EXHAUSTED above it); ``maximum_concurrent_rpcs = ingest.max_inflight`` (grpc
answers RESOURCE_EXHAUSTED beyond it — retryable per OTLP); per HTTP/2 connection
``ingest.max_streams_per_connection`` streams; per peer address
``ingest.max_inflight_per_peer`` and per identity ``ingest.max_inflight_per_identity``
(``max_inflight_per_collector`` for a collector) calls in flight (RESOURCE_EXHAUSTED
beyond); the message must arrive within
``ingest.receive_timeout_s`` of the call's start (DEADLINE_EXCEEDED otherwise), so stalled
streams end. A payload that does not decode gets INVALID_ARGUMENT; a missing/wrong bearer
token (and, with mTLS, no client certificate naming a node) UNAUTHENTICATED; data about a
node the sender's identity may not report for PERMISSION_DENIED (counted as
``reason="identity"``); an alert hand-off that cannot take the push's alerts (queue full,
or PostgreSQL unable to store them) UNAVAILABLE (retryable: nothing of the push was kept).
gzip request compression is handled by grpc.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ingest.auth import ROLE_COLLECTOR, Identity, ReceiverAuth, grpc_tls_material
from ingest.handoff import HandoffRefused
from ingest.otlp import identity_violation
from ingest.pipeline import Ingestor

log = logging.getLogger("autorepair.ingest.grpc")

METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


AUTH_REFUSED = "missing or invalid bearer token or client certificate"
ANONYMOUS = "anonymous"
"""Identity key of calls when authentication is off (no per-identity cap applies)."""


def _peer_host(peer: str) -> str:
    """The address part of a gRPC peer string (``ipv4:10.0.0.7:51234`` → ``ipv4:10.0.0.7``,
    ``ipv6:[::1]:5 `` → ``ipv6:[::1]``)."""
    head, sep, _port = peer.rpartition(":")
    return head if sep and head else peer


class _Slots:
    """In-flight counts per key with a cap; :meth:`take` is an async context manager that
    answers RESOURCE_EXHAUSTED beyond the cap (``cap`` given to :meth:`take` replaces the
    default one for that key)."""

    def __init__(self, cap: int, what: str) -> None:
        self.cap = cap
        self.what = what
        self.count: Counter[str] = Counter()

    @asynccontextmanager
    async def take(self, key: str, context: grpc.aio.ServicerContext[Any, Any],
                   on_full: Callable[[], None], cap: int | None = None
                   ) -> AsyncIterator[None]:
        cap = self.cap if cap is None else cap
        if self.count[key] >= cap:
            on_full()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"too many calls in flight for this {self.what} ({cap})")
        self.count[key] += 1
        try:
            yield
        finally:
            self.count[key] -= 1
            if self.count[key] <= 0:
                del self.count[key]


class _Common:
    def __init__(self, ingestor: Ingestor, auth: ReceiverAuth | None,
                 per_identity: _Slots | None = None, per_peer: _Slots | None = None) -> None:
        cfg = ingestor.config.ingest
        self.ingestor = ingestor
        self.auth = auth if auth is not None and auth.enabled else None
        self.per_identity = per_identity or _Slots(cfg.max_inflight_per_identity, "identity")
        self.per_peer = per_peer or _Slots(cfg.max_inflight_per_peer, "peer address")
        self.receive_timeout_s = cfg.receive_timeout_s
        self.per_collector = cfg.max_inflight_per_collector
        m = ingestor.metrics
        self.hist = m.otlp_request_seconds.labels("grpc")
        self.ok = m.otlp_requests_total.labels("grpc", "ok")
        self.partial = m.otlp_requests_total.labels("grpc", "partial")
        self.unauth = m.otlp_requests_total.labels("grpc", "unauthorized")
        self.unavailable = m.otlp_requests_total.labels("grpc", "unavailable")
        self.bad = m.otlp_requests_total.labels("grpc", "bad_request")
        self.forbidden = m.otlp_requests_total.labels("grpc", "forbidden")
        self.overloaded = m.otlp_requests_total.labels("grpc", "overloaded")

    async def check_cert(self, ident: Identity | None,
                         context: grpc.aio.ServicerContext[Any, Any]) -> Identity | None:
        """The identity the interceptor found, else (mTLS) the client certificate's;
        aborts UNAUTHENTICATED when authentication is on and there is none."""
        if self.auth is None or ident is not None:
            return ident
        if self.auth.mtls:
            ident = self.auth.from_auth_context(dict(context.auth_context()))
        if ident is None:
            self.unauth.inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, AUTH_REFUSED)
        return ident

    async def receive(self, requests: AsyncIterator[bytes],
                      context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        """The call's one message, within ``ingest.receive_timeout_s`` (DEADLINE_EXCEEDED
        otherwise; INVALID_ARGUMENT when the stream ends without one)."""
        try:
            # asyncio.timeout, not wait_for: no task per call (as the HTTP receiver)
            async with asyncio.timeout(self.receive_timeout_s):
                return await anext(requests)
        except TimeoutError:
            self.bad.inc()
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"request: no message within {self.receive_timeout_s} s "
                                "(ingest.receive_timeout_s)")
        except StopAsyncIteration:
            self.bad.inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request: no message")
        raise AssertionError("unreachable")  # abort raises

    async def guarded(self, requests: AsyncIterator[bytes],
                      context: grpc.aio.ServicerContext[Any, Any], ident: Identity | None,
                      body: Callable[[bytes, Identity | None], Awaitable[Any]]) -> Any:
        """Per-peer and per-identity slots around receiving the message and ``body``."""
        t0 = time.perf_counter()
        ident = await self.check_cert(ident, context)
        peer = _peer_host(context.peer() or "")
        key = ident.id if ident is not None else ANONYMOUS
        cap = (1 << 62 if ident is None else self.per_collector
               if ident.role == ROLE_COLLECTOR else None)
        try:
            async with self.per_peer.take(peer, context, self.overloaded.inc), \
                    self.per_identity.take(key, context, self.overloaded.inc, cap):
                raw = await self.receive(requests, context)
                return await body(raw, ident)
        finally:
            self.hist.observe(time.perf_counter() - t0)

    async def check_identity(self, ident: Identity | None, request: Any, signal: str,
                             context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Aborts PERMISSION_DENIED when ``request`` names a node ``ident`` may not
        report for (counted in ``autorepair_otlp_rejected_total{reason="identity"}``)."""
        if ident is None:
            return
        bad = identity_violation(request, ident.may_report, self.ingestor.limits)
        if bad is None:
            return
        n, why = bad
        self.ingestor.metrics.otlp_rejected_total.labels("grpc", signal, "identity").inc(n)
        self.forbidden.inc()
        log.warning("event=otlp_identity_rejected transport=grpc identity=%r %s",
                    ident.label, why)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{ident.label}: {why}")


class MetricsServicer(_Common):
    """``opentelemetry.proto.collector.metrics.v1.MetricsService/Export`` on raw bytes."""

    async def export(self, requests: AsyncIterator[bytes],
                     context: grpc.aio.ServicerContext[Any, Any],
                     ident: Identity | None = None) -> ExportMetricsServiceResponse:
        async def body(raw: bytes, who: Identity | None) -> ExportMetricsServiceResponse:
            request = ExportMetricsServiceRequest()
            try:
                request.ParseFromString(raw)
            except DecodeError as e:
                self.bad.inc()
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"request: not a valid ExportMetricsServiceRequest: {e}")
            await self.check_identity(who, request, "metrics", context)
            resp, hint = await self.ingestor.handle_metrics(request, "grpc", raw,
                                                             identity=who)
            await context.send_initial_metadata(hint.grpc_metadata())
            (self.partial if resp.partial_success.rejected_data_points else self.ok).inc()
            return resp

        out: ExportMetricsServiceResponse = await self.guarded(requests, context, ident, body)
        return out


class LogsServicer(_Common):
    """``opentelemetry.proto.collector.logs.v1.LogsService/Export`` on raw bytes."""

    async def export(self, requests: AsyncIterator[bytes],
                     context: grpc.aio.ServicerContext[Any, Any],
                     ident: Identity | None = None) -> ExportLogsServiceResponse:
        async def body(raw: bytes, who: Identity | None) -> ExportLogsServiceResponse:
            request = ExportLogsServiceRequest()
            try:
                request.ParseFromString(raw)
            except DecodeError as e:
                self.bad.inc()
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"request: not a valid ExportLogsServiceRequest: {e}")
            await self.check_identity(who, request, "logs", context)
            try:
                resp, hint = await self.ingestor.handle_logs(
                    request, "grpc", raw, identity=who)
            except HandoffRefused as e:
                self.unavailable.inc()
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
            await context.send_initial_metadata(hint.grpc_metadata())
            (self.partial if resp.partial_success.rejected_log_records else self.ok).inc()
            return resp

        out: ExportLogsServiceResponse = await self.guarded(requests, context, ident, body)
        return out


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks the bearer token of every call from its metadata, before the message is
    read. Unknown token and no mTLS → a handler that answers UNAUTHENTICATED without
    reading the stream; known → the servicer gets the identity. With mTLS a call without
    a token goes on to the servicer, which takes the identity from the certificate."""

    def __init__(self, auth: ReceiverAuth | None, on_refused: Callable[[], None]) -> None:
        self.auth = auth if auth is not None and auth.enabled else None
        self.on_refused = on_refused

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails],
                                     Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or self.auth is None or handler.stream_unary is None:
            return handler
        md = handler_call_details.invocation_metadata or ()  # type: ignore[attr-defined]
        value = next((v for k, v in md if k == "authorization"), None)
        ident = await self.auth.authenticate(value)
        if ident is None and not self.auth.mtls:
            self.on_refused()
            return grpc.stream_unary_rpc_method_handler(
                _refuse, request_deserializer=None, response_serializer=_serialize)
        behavior = handler.stream_unary

        async def with_identity(requests: AsyncIterator[bytes],
                                context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            return await behavior(requests, context, ident)  # type: ignore[call-arg]

        return grpc.stream_unary_rpc_method_handler(
            with_identity, request_deserializer=None,
            response_serializer=handler.response_serializer)


async def _refuse(requests: AsyncIterator[bytes],
                  context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, AUTH_REFUSED)


def _serialize(msg: Any) -> bytes:
    out: bytes = msg.SerializeToString()
    return out


def _handler(service: str, export: Any) -> grpc.GenericRpcHandler:
    # request_deserializer=None hands the raw bytes to the servicer: it decodes them itself
    # (INVALID_ARGUMENT on garbage, as OTLP says) and forwards them without re-serializing.
    # Stream-unary (the same wire form as the exporters' unary call) so the servicer reads
    # the message itself, under ingest.receive_timeout_s.
    return grpc.method_handlers_generic_handler(service, {
        "Export": grpc.stream_unary_rpc_method_handler(
            export, request_deserializer=None, response_serializer=_serialize),
    })


async def start_grpc_server(
    ingestor: Ingestor, host: str, port: int, *, auth: ReceiverAuth | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the OTLP/gRPC server; returns it and the bound port (``port`` 0 = ephemeral).

    Raises ``RuntimeError`` naming the address when the port cannot be bound.
    """
    cfg = ingestor.config.ingest
    metrics = MetricsServicer(ingestor, auth)
    # one set of caps for both services: a peer / identity is capped across them
    logs = LogsServicer(ingestor, auth, metrics.per_identity, metrics.per_peer)
    server = grpc.aio.server(
        maximum_concurrent_rpcs=cfg.max_inflight,
        interceptors=[AuthInterceptor(auth, metrics.unauth.inc)],
        options=[
            ("grpc.max_receive_message_length", cfg.max_body_bytes),
            ("grpc.max_concurrent_streams", cfg.max_streams_per_connection),
            ("grpc.max_connection_idle_ms", int(cfg.grpc_idle_timeout_s * 1000)),
            ("grpc.server_handshake_timeout_ms", int(cfg.grpc_handshake_timeout_s * 1000)),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers((
        _handler(METRICS_SERVICE, metrics.export),
        _handler(LOGS_SERVICE, logs.export),
    ))
    addr = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    tls = grpc_tls_material(cfg.tls)
    try:
        if tls is None:
            bound = server.add_insecure_port(addr)
        else:
            key, cert, ca = tls
            creds = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=ca is not None)
            bound = server.add_secure_port(addr, creds)
    except RuntimeError as e:
        raise RuntimeError(f"ingest.otlp_grpc_port: cannot bind {addr}: {e}") from e
    if bound == 0:
        raise RuntimeError(f"ingest.otlp_grpc_port: cannot bind {addr}")
    await server.start()
    return server, bound
