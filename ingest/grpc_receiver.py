"""OTLP/gRPC receiver (port 4317): ``MetricsService/Export`` and ``LogsService/Export``.

grpc.aio servicers from ``opentelemetry-proto`` on the service's event loop. The
threshold travels back in the initial metadata (``autorepair-threshold``,
``autorepair-quorum-met``, DESIGN §4.3) so the agent reads it from the same call.
Limits: ``max_receive_message_length = ingest.max_body_bytes`` (grpc answers
RESOURCE_EXHAUSTED above it); ``maximum_concurrent_rpcs = ingest.max_inflight`` (grpc
answers RESOURCE_EXHAUSTED beyond it — retryable per OTLP). A payload that does not decode
gets INVALID_ARGUMENT; a missing/wrong bearer token (and, with mTLS, no client
certificate naming a node) UNAUTHENTICATED; data about a node the sender's identity may
not report for PERMISSION_DENIED (counted as ``reason="identity"``); an alert hand-off that
cannot take the push's alerts (queue full, or PostgreSQL unable to store them)
UNAVAILABLE (retryable: nothing of the push was kept). gzip request compression is handled by grpc.
"""

from __future__ import annotations

import logging
import time
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

from ingest.auth import Identity, ReceiverAuth, grpc_tls_material, identity_from_auth_context
from ingest.handoff import HandoffRefused
from ingest.otlp import identity_violation
from ingest.pipeline import Ingestor

log = logging.getLogger("autorepair.ingest.grpc")

METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


class _Common:
    def __init__(self, ingestor: Ingestor, auth: ReceiverAuth | None) -> None:
        self.ingestor = ingestor
        self.auth = auth if auth is not None and auth.enabled else None
        m = ingestor.metrics
        self.hist = m.otlp_request_seconds.labels("grpc")
        self.ok = m.otlp_requests_total.labels("grpc", "ok")
        self.partial = m.otlp_requests_total.labels("grpc", "partial")
        self.unauth = m.otlp_requests_total.labels("grpc", "unauthorized")
        self.unavailable = m.otlp_requests_total.labels("grpc", "unavailable")
        self.bad = m.otlp_requests_total.labels("grpc", "bad_request")
        self.forbidden = m.otlp_requests_total.labels("grpc", "forbidden")

    async def check_auth(self, context: grpc.aio.ServicerContext[Any, Any]) -> Identity | None:
        """The caller's identity (``None`` when authentication is off); aborts
        UNAUTHENTICATED when there is none."""
        if self.auth is None:
            return None
        md = context.invocation_metadata() or ()
        value = next((v for k, v in md if k == "authorization"), None)
        ident = self.auth.from_header(value)
        if ident is None and self.auth.mtls:
            ident = identity_from_auth_context(dict(context.auth_context()))
        if ident is None:
            self.unauth.inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "missing or invalid bearer token or client certificate")
        return ident

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

    async def export(
        self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ExportMetricsServiceResponse:
        t0 = time.perf_counter()
        ident = await self.check_auth(context)
        request = ExportMetricsServiceRequest()
        try:
            request.ParseFromString(raw)
        except DecodeError as e:
            self.bad.inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"request: not a valid ExportMetricsServiceRequest: {e}")
        await self.check_identity(ident, request, "metrics", context)
        resp, hint = await self.ingestor.handle_metrics(request, "grpc", raw)
        await context.send_initial_metadata(hint.grpc_metadata())
        (self.partial if resp.partial_success.rejected_data_points else self.ok).inc()
        self.hist.observe(time.perf_counter() - t0)
        return resp


class LogsServicer(_Common):
    """``opentelemetry.proto.collector.logs.v1.LogsService/Export`` on raw bytes."""

    async def export(
        self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ExportLogsServiceResponse:
        t0 = time.perf_counter()
        ident = await self.check_auth(context)
        request = ExportLogsServiceRequest()
        try:
            request.ParseFromString(raw)
        except DecodeError as e:
            self.bad.inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"request: not a valid ExportLogsServiceRequest: {e}")
        await self.check_identity(ident, request, "logs", context)
        try:
            resp, hint = await self.ingestor.handle_logs(
                request, "grpc", raw, reporter=ident.role if ident is not None else None)
        except HandoffRefused as e:
            self.unavailable.inc()
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        await context.send_initial_metadata(hint.grpc_metadata())
        (self.partial if resp.partial_success.rejected_log_records else self.ok).inc()
        self.hist.observe(time.perf_counter() - t0)
        return resp


def _serialize(msg: Any) -> bytes:
    out: bytes = msg.SerializeToString()
    return out


def _handler(service: str, export: Any) -> grpc.GenericRpcHandler:
    # request_deserializer=None hands the raw bytes to the servicer: it decodes them itself
    # (INVALID_ARGUMENT on garbage, as OTLP says) and forwards them without re-serializing.
    return grpc.method_handlers_generic_handler(service, {
        "Export": grpc.unary_unary_rpc_method_handler(
            export, request_deserializer=None, response_serializer=_serialize),
    })


async def start_grpc_server(
    ingestor: Ingestor, host: str, port: int, *, auth: ReceiverAuth | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the OTLP/gRPC server; returns it and the bound port (``port`` 0 = ephemeral).

    Raises ``RuntimeError`` naming the address when the port cannot be bound.
    """
    cfg = ingestor.config.ingest
    server = grpc.aio.server(
        maximum_concurrent_rpcs=cfg.max_inflight,
        options=[
            ("grpc.max_receive_message_length", cfg.max_body_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers((
        _handler(METRICS_SERVICE, MetricsServicer(ingestor, auth).export),
        _handler(LOGS_SERVICE, LogsServicer(ingestor, auth).export),
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
