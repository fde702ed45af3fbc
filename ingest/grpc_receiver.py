"""OTLP/gRPC receiver (port 4317): ``MetricsService/Export`` and ``LogsService/Export``.

grpc.aio servicers from ``opentelemetry-proto`` on the service's event loop. The
threshold travels back in the initial metadata (``autorepair-threshold``,
``autorepair-quorum-met``, DESIGN §4.3) so the agent reads it from the same call.
Limits: ``max_receive_message_length = ingest.max_body_bytes`` (grpc answers
RESOURCE_EXHAUSTED above it); ``maximum_concurrent_rpcs = ingest.max_inflight`` (grpc
answers RESOURCE_EXHAUSTED beyond it — retryable per OTLP). A payload that does not decode
gets INVALID_ARGUMENT from grpc; a missing/wrong bearer token UNAUTHENTICATED; a full alert
hand-off queue UNAVAILABLE (retryable). gzip request compression is handled by grpc.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ingest.auth import TokenCheck, grpc_tls_material
from ingest.handoff import HandoffQueueFull
from ingest.pipeline import Ingestor


class _Common:
    def __init__(self, ingestor: Ingestor, auth: TokenCheck | None) -> None:
        self.ingestor = ingestor
        self.auth = auth if auth is not None and auth.enabled else None
        m = ingestor.metrics
        self.hist = m.otlp_request_seconds.labels("grpc")
        self.ok = m.otlp_requests_total.labels("grpc", "ok")
        self.partial = m.otlp_requests_total.labels("grpc", "partial")
        self.unauth = m.otlp_requests_total.labels("grpc", "unauthorized")
        self.unavailable = m.otlp_requests_total.labels("grpc", "unavailable")

    async def check_auth(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if self.auth is None:
            return
        md = context.invocation_metadata() or ()
        value = next((v for k, v in md if k == "authorization"), None)
        if not self.auth.check_header(value):
            self.unauth.inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "missing or invalid bearer token")


class MetricsServicer(_Common, metrics_service_pb2_grpc.MetricsServiceServicer):
    """``opentelemetry.proto.collector.metrics.v1.MetricsService``."""

    async def Export(
        self, request: ExportMetricsServiceRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> ExportMetricsServiceResponse:
        t0 = time.perf_counter()
        await self.check_auth(context)
        resp, hint = await self.ingestor.handle_metrics(request, "grpc")
        await context.send_initial_metadata(hint.grpc_metadata())
        (self.partial if resp.partial_success.rejected_data_points else self.ok).inc()
        self.hist.observe(time.perf_counter() - t0)
        return resp


class LogsServicer(_Common, logs_service_pb2_grpc.LogsServiceServicer):
    """``opentelemetry.proto.collector.logs.v1.LogsService``."""

    async def Export(
        self, request: ExportLogsServiceRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> ExportLogsServiceResponse:
        t0 = time.perf_counter()
        await self.check_auth(context)
        try:
            resp, hint = await self.ingestor.handle_logs(request, "grpc")
        except HandoffQueueFull as e:
            self.unavailable.inc()
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        await context.send_initial_metadata(hint.grpc_metadata())
        (self.partial if resp.partial_success.rejected_log_records else self.ok).inc()
        self.hist.observe(time.perf_counter() - t0)
        return resp


async def start_grpc_server(
    ingestor: Ingestor, host: str, port: int, *, auth: TokenCheck | None = None
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
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
        MetricsServicer(ingestor, auth), server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(LogsServicer(ingestor, auth), server)
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
