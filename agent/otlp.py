"""OTLP messages (docs/design.md §4.3) and their push: HTTP/protobuf by default, gRPC optional.

Messages are built with the ``opentelemetry.proto`` classes directly. :class:`Pusher`
keeps bounded in-memory queues (oldest dropped and counted), retries with full-jitter
exponential backoff (AWS Architecture Blog, "Exponential Backoff and Jitter", 2015), and
hands every response's threshold headers to a callback.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import random
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

log = logging.getLogger("autorepair.agent.otlp")

SCOPE = InstrumentationScope(name="autorepair-agent", version="0.1.0")
THRESHOLD_HEADER = "X-Autorepair-Threshold"
QUORUM_HEADER = "X-Autorepair-Quorum-Met"
GRPC_THRESHOLD_KEY = "autorepair-threshold"
GRPC_QUORUM_KEY = "autorepair-quorum-met"
#: OTLP SeverityNumber values (OTLP logs data model): WARN = 13, INFO = 9.
SEVERITY_WARN = 13
SEVERITY_INFO = 9

AttrValue = str | bool | int | float | Sequence[Any] | None


def any_value(value: AttrValue) -> AnyValue:
    """Python value → OTLP ``AnyValue`` (bool before int: bool is an int subclass)."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, list | tuple):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    return AnyValue(string_value=str(value))


def key_values(attrs: Mapping[str, AttrValue]) -> list[KeyValue]:
    """Attributes → ``KeyValue`` list; None values are left out."""
    return [KeyValue(key=k, value=any_value(v)) for k, v in attrs.items() if v is not None]


def gauge(
    name: str, value: float, time_ns: int, attrs: Mapping[str, AttrValue] | None = None,
    unit: str = "1",
) -> Metric:
    """One gauge metric with one double data point."""
    point = NumberDataPoint(time_unix_nano=time_ns, as_double=float(value))
    if attrs:
        point.attributes.extend(key_values(attrs))
    return Metric(name=name, unit=unit, gauge=Gauge(data_points=[point]))


def metrics_request(
    resource_attrs: Mapping[str, AttrValue], metrics: Sequence[Metric]
) -> ExportMetricsServiceRequest:
    """Wrap metrics under one resource and the agent's scope."""
    return ExportMetricsServiceRequest(
        resource_metrics=[
            ResourceMetrics(
                resource=Resource(attributes=key_values(resource_attrs)),
                scope_metrics=[ScopeMetrics(scope=SCOPE, metrics=list(metrics))],
            )
        ]
    )


def log_record(
    body: str, attrs: Mapping[str, AttrValue], time_ns: int, severity: int = SEVERITY_WARN
) -> LogRecord:
    """One OTLP log record: body = raw evidence text."""
    return LogRecord(
        time_unix_nano=time_ns,
        observed_time_unix_nano=time.time_ns(),
        severity_number=severity,  # type: ignore[arg-type]
        severity_text="WARN" if severity >= SEVERITY_WARN else "INFO",
        body=AnyValue(string_value=body),
        attributes=key_values(attrs),
    )


def logs_request(
    resource_attrs: Mapping[str, AttrValue], records: Sequence[LogRecord]
) -> ExportLogsServiceRequest:
    """Wrap log records under one resource and the agent's scope."""
    return ExportLogsServiceRequest(
        resource_logs=[
            ResourceLogs(
                resource=Resource(attributes=key_values(resource_attrs)),
                scope_logs=[ScopeLogs(scope=SCOPE, log_records=list(records))],
            )
        ]
    )


@dataclass(frozen=True)
class PushResult:
    """Outcome of one export call."""

    ok: bool
    retryable: bool
    status: int | None = None
    threshold: str | None = None
    quorum: str | None = None
    error: str | None = None


class Transport(Protocol):
    """Sends one export request; never raises for network/server errors."""

    async def export_metrics(self, req: ExportMetricsServiceRequest) -> PushResult: ...

    async def export_logs(self, req: ExportLogsServiceRequest) -> PushResult: ...

    async def aclose(self) -> None: ...


#: HTTP statuses worth retrying: the OTLP/HTTP specification's 429, 502, 503, 504, and
#: 408, which the ingest answers when the body did not arrive within
#: ``ingest.receive_timeout_s`` (an overloaded path; nothing of the push was kept) and the
#: OpenTelemetry SDK's own exporters retry too; over gRPC the same is DEADLINE_EXCEEDED,
#: retried below. Dropping it would lose a fault record.
RETRYABLE_STATUS = frozenset({408, 429, 502, 503, 504})


def client_ssl_context(ca_file: str | None, client_cert: str | None,
                       client_key: str | None) -> ssl.SSLContext:
    """TLS context of the HTTP transport: verifies the server with ``ca_file`` (else the
    system / certifi roots) and presents ``client_cert`` / ``client_key`` (mTLS) when both
    are given. One context, because httpx ≥ 0.28 ignores ``cert=`` when ``verify`` is a
    path (the client certificate was then never sent). Raises ``OSError`` / ``ssl.SSLError``
    when a file cannot be read."""
    if ca_file:
        ctx = ssl.create_default_context(cafile=ca_file)
    else:
        import certifi

        ctx = ssl.create_default_context(cafile=certifi.where())
    if client_cert and client_key:
        ctx.load_cert_chain(client_cert, client_key)
    return ctx


def _with_token(headers: dict[str, str], token: str | Callable[[], str | None] | None
                ) -> dict[str, str]:
    """``headers`` plus ``Authorization: Bearer`` of ``token`` (asked now when callable)."""
    value = token() if callable(token) else token
    return {**headers, "Authorization": f"Bearer {value}"} if value else headers


class HttpTransport:
    """OTLP/HTTP protobuf: POST ``{endpoint}/v1/metrics`` and ``/v1/logs``.

    ``client`` may be shared by many agents (the simulator does); it is then not closed
    here. TLS: ``ca_file`` verifies the server; ``client_cert``/``client_key`` for mTLS.
    ``token``: the bearer token, or a callable asked before every push (a token file
    re-read on rotation, :class:`agent.token.TokenFile`).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        token: str | Callable[[], str | None] | None = None,
        timeout_s: float = 5.0,
        use_gzip: bool = False,
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._headers = {"Content-Type": "application/x-protobuf"}
        self._token = token
        if use_gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._gzip = use_gzip
        self._own = client is None
        if client is None:
            client = httpx.AsyncClient(timeout=timeout_s,
                                       verify=client_ssl_context(ca_file, client_cert,
                                                                 client_key))
        self._client = client

    async def _post(self, path: str, body: bytes) -> PushResult:
        if self._gzip:
            body = gzip.compress(body)
        try:
            resp = await self._client.post(
                self.endpoint + path, content=body, headers=_with_token(self._headers,
                                                                        self._token)
            )
        except httpx.HTTPError as exc:
            return PushResult(False, True, error=f"{type(exc).__name__}: {exc}")
        ok = 200 <= resp.status_code < 300
        return PushResult(
            ok,
            retryable=(not ok) and resp.status_code in RETRYABLE_STATUS,
            status=resp.status_code,
            threshold=resp.headers.get(THRESHOLD_HEADER),
            quorum=resp.headers.get(QUORUM_HEADER),
            error=None if ok else f"HTTP {resp.status_code}",
        )

    async def export_metrics(self, req: ExportMetricsServiceRequest) -> PushResult:
        return await self._post("/v1/metrics", req.SerializeToString())

    async def export_logs(self, req: ExportLogsServiceRequest) -> PushResult:
        return await self._post("/v1/logs", req.SerializeToString())

    async def aclose(self) -> None:
        if self._own:
            await self._client.aclose()


GRPC_TOO_LARGE = "message larger than max"
"""Words of gRPC's RESOURCE_EXHAUSTED for a message over the receiver's
``max_receive_message_length`` ("Received message larger than max (N vs. M)", grpc core),
as opposed to a server too busy (retryable)."""


class GrpcTransport:
    """OTLP/gRPC (``grpcio`` imported lazily, only when this transport is configured).

    Reads ``autorepair-threshold`` / ``autorepair-quorum-met`` from initial metadata.
    ``endpoint`` ``http://host:4317`` → insecure channel; ``https://`` → TLS (``ca_file``
    verifies the server; ``client_cert`` / ``client_key`` for mTLS).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        token: str | Callable[[], str | None] | None = None,
        timeout_s: float = 5.0,
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
    ) -> None:
        import grpc
        import grpc.aio
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

        self._grpc = grpc
        target = endpoint.split("://", 1)[-1].rstrip("/")
        if endpoint.startswith("https://"):
            from pathlib import Path

            root = Path(ca_file).read_bytes() if ca_file else None
            mtls = client_cert and client_key
            self._channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(
                root_certificates=root,
                private_key=Path(client_key).read_bytes() if mtls and client_key else None,
                certificate_chain=Path(client_cert).read_bytes() if mtls and client_cert
                else None))
        else:
            self._channel = grpc.aio.insecure_channel(target)
        self._metrics = metrics_service_pb2_grpc.MetricsServiceStub(self._channel)
        self._logs = logs_service_pb2_grpc.LogsServiceStub(self._channel)
        self._token = token
        self._timeout = timeout_s

    async def _call(self, stub_method: Any, req: Any) -> PushResult:
        grpc = self._grpc
        try:
            auth = _with_token({}, self._token).get("Authorization")
            metadata = (("authorization", auth),) if auth else ()
            call = stub_method(req, metadata=metadata, timeout=self._timeout)
            await call
            md = dict(await call.initial_metadata() or ())
            return PushResult(
                True, False, threshold=md.get(GRPC_THRESHOLD_KEY), quorum=md.get(GRPC_QUORUM_KEY)
            )
        except grpc.aio.AioRpcError as exc:
            if (exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    and GRPC_TOO_LARGE in (exc.details() or "")):
                # over the server's message limit: resending it as is can never succeed;
                # the HTTP status of the same refusal lets the pusher split the batch
                return PushResult(False, False, status=Pusher.TOO_LARGE,
                                  error=f"gRPC {exc.code().name}: {exc.details()}")
            retryable = exc.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.ABORTED,
            )
            return PushResult(False, retryable, error=f"gRPC {exc.code().name}")

    async def export_metrics(self, req: ExportMetricsServiceRequest) -> PushResult:
        return await self._call(self._metrics.Export, req)

    async def export_logs(self, req: ExportLogsServiceRequest) -> PushResult:
        return await self._call(self._logs.Export, req)

    async def aclose(self) -> None:
        await self._channel.close()


@dataclass
class Backoff:
    """Full-jitter exponential backoff: delay ~ U(0, min(cap, base·2^attempt))."""

    base_s: float = 1.0
    cap_s: float = 60.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        delay = self.rng.uniform(0.0, min(self.cap_s, self.base_s * 2**self.attempt))
        self.attempt = min(self.attempt + 1, 30)
        return delay

    def reset(self) -> None:
        self.attempt = 0


ResponseCallback = Callable[[PushResult], None]


@dataclass
class PushStats:
    """Counters a test or the bench can read."""

    metrics_sent: int = 0
    logs_sent: int = 0
    metrics_dropped: int = 0
    logs_dropped: int = 0
    failures: int = 0
    permanent_failures: int = 0
    last_error: str | None = None


class Pusher:
    """Bounded retry queues in front of a :class:`Transport`.

    ``max_metric_batches`` export requests and ``max_log_records`` records at most are
    kept; the oldest are dropped and counted in :attr:`stats`. A failed retryable send
    keeps the data and waits a jittered backoff; a permanent failure (4xx other than 429)
    drops that request and counts it, except a log batch refused as too large (HTTP 413:
    bodies beyond ``ingest.max_body_bytes``), which is sent again in halves until each
    request fits, so only a record too large alone is dropped. Every response is passed
    to ``on_response``.
    """

    LOG_BATCH = 512
    TOO_LARGE = 413
    """HTTP status of a body over the receiver's size limit (RFC 9110 §15.5.14)."""

    def __init__(
        self,
        transport: Transport,
        *,
        max_metric_batches: int = 60,
        max_log_records: int = 2000,
        backoff: Backoff | None = None,
        on_response: ResponseCallback | None = None,
    ) -> None:
        self.transport = transport
        self._metrics: deque[ExportMetricsServiceRequest] = deque()
        self._logs: deque[tuple[tuple[tuple[str, Any], ...], LogRecord]] = deque()
        self.max_metric_batches = max_metric_batches
        self.max_log_records = max_log_records
        self.backoff = backoff or Backoff()
        self.on_response = on_response
        self.stats = PushStats()
        self._not_before = 0.0
        self._lock = asyncio.Lock()

    @property
    def pending(self) -> tuple[int, int]:
        """(queued metric requests, queued log records)."""
        return len(self._metrics), len(self._logs)

    def enqueue_metrics(self, req: ExportMetricsServiceRequest) -> None:
        self._metrics.append(req)
        while len(self._metrics) > self.max_metric_batches:
            self._metrics.popleft()
            self.stats.metrics_dropped += 1

    def enqueue_log(self, resource_attrs: Mapping[str, AttrValue], record: LogRecord) -> None:
        key = tuple(sorted((k, v) for k, v in resource_attrs.items() if v is not None))
        self._logs.append((key, record))
        while len(self._logs) > self.max_log_records:
            self._logs.popleft()
            self.stats.logs_dropped += 1

    def _handle(self, result: PushResult) -> None:
        if self.on_response is not None and (result.threshold is not None or result.ok):
            self.on_response(result)

    def _failed(self, result: PushResult, now: float) -> None:
        self.stats.failures += 1
        self.stats.last_error = result.error
        self._not_before = now + self.backoff.next_delay()

    async def flush(self, now: float | None = None) -> bool:
        """Send what is queued (logs first, then metrics, oldest first).

        Returns True when the queues were emptied; False when a send failed or the
        backoff is still running. Never raises for network/server errors.
        """
        now = time.monotonic() if now is None else now
        if now < self._not_before:
            return False
        async with self._lock:
            size = self.LOG_BATCH
            while self._logs:
                key = self._logs[0][0]
                batch: list[LogRecord] = []
                for k, rec in self._logs:
                    if k != key or len(batch) >= size:
                        break
                    batch.append(rec)
                result = await self.transport.export_logs(logs_request(dict(key), batch))
                self._handle(result)
                if result.status == self.TOO_LARGE and len(batch) > 1:
                    size = max(1, len(batch) // 2)  # the same records, in smaller requests
                    continue
                if result.ok or not result.retryable:
                    for _ in batch:
                        self._logs.popleft()
                    if result.ok:
                        self.stats.logs_sent += len(batch)
                    else:
                        self.stats.permanent_failures += 1
                        self.stats.logs_dropped += len(batch)
                        log.warning("event=otlp_logs_rejected error=%s", result.error)
                    continue
                self._failed(result, now)
                return False
            while self._metrics:
                result = await self.transport.export_metrics(self._metrics[0])
                self._handle(result)
                if result.ok or not result.retryable:
                    self._metrics.popleft()
                    if result.ok:
                        self.stats.metrics_sent += 1
                    else:
                        self.stats.permanent_failures += 1
                        self.stats.metrics_dropped += 1
                        log.warning("event=otlp_metrics_rejected error=%s", result.error)
                    continue
                self._failed(result, now)
                return False
            self.backoff.reset()
            return True
