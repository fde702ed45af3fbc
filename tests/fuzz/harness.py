"""Sends :mod:`tests.fuzz.cases` to a running ingest service and checks the properties.

Properties of every answer: HTTP status in :data:`HTTP_ALLOWED` (no 5xx but the
documented 503, and 429/503 carry ``Retry-After``); gRPC status in :data:`GRPC_ALLOWED`
(never ``UNKNOWN`` / ``INTERNAL``: the servicer did not crash); the connection answered.
:meth:`Sender.alive` checks that a valid push still gets 200 with the threshold headers
and that ``/healthz`` answers.

:class:`ServerThread` runs a real :class:`ingest.service.IngestService` on its own event
loop in a thread (used by the CI slice; ``make fuzz`` runs it in a child process).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import grpc
import h11
import httpx

from ingest.otlp import make_metrics_request
from ingest.service import IngestService
from tests.fuzz.cases import LOGS, METRICS, Case
from workflows.config import AutorepairConfig, IngestConfig, ThresholdConfig

HTTP_ALLOWED = frozenset({200, 400, 401, 403, 404, 405, 413, 415, 429, 503})
GRPC_ALLOWED = frozenset({
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
})
PATHS = {METRICS: "/v1/metrics", LOGS: "/v1/logs"}
SERVICES = {METRICS: "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            LOGS: "/opentelemetry.proto.collector.logs.v1.LogsService/Export"}


def fuzz_config() -> AutorepairConfig:
    """Ephemeral loopback ports, no recompute during the run, default limits."""
    return AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0, api_port=0,
                            admin_port=0),
        threshold=ThresholdConfig(push_interval_s=3600),
    )


class ServerThread:
    """An :class:`IngestService` on its own loop in a daemon thread."""

    def __init__(self, config: AutorepairConfig) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.svc: IngestService | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="fuzz-ingest")

    def start(self) -> IngestService:
        self._thread.start()

        async def up() -> IngestService:
            svc = IngestService(self.config)
            await svc.start()
            return svc

        self.svc = asyncio.run_coroutine_threadsafe(up(), self.loop).result(60)
        return self.svc

    def stop(self) -> None:
        if self.svc is not None:
            asyncio.run_coroutine_threadsafe(self.svc.stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


class Sender:
    """Blocking clients of both transports for one thread (``close()`` when done)."""

    def __init__(self, http_port: int, grpc_port: int, api_port: int) -> None:
        # TCP_NODELAY: httpcore writes headers and body separately; with Nagle the body
        # waits for the server's delayed ACK (40 ms per request on Linux)
        nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=60,
                                 transport=httpx.HTTPTransport(socket_options=nodelay))
        self.api = f"http://127.0.0.1:{api_port}"
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{grpc_port}",
            options=[("grpc.max_send_message_length", -1),
                     ("grpc.max_receive_message_length", -1)])
        self.calls: dict[str, Any] = {
            s: self.channel.unary_unary(m, request_serializer=None, response_deserializer=None)
            for s, m in SERVICES.items()}
        self.not_sent = 0

    def close(self) -> None:
        self.http.close()
        self.channel.close()

    def send(self, c: Case) -> str | None:
        """Send ``c``; the property violated, or ``None``."""
        if c.transport == "grpc":
            return self._grpc(c)
        path = c.path or PATHS[c.signal]
        try:
            r = self.http.request(c.method, path, content=c.body, headers=c.headers)
        except (httpx.LocalProtocolError, httpx.UnsupportedProtocol, httpx.InvalidURL,
                h11.LocalProtocolError, UnicodeEncodeError, ValueError):
            self.not_sent += 1  # the client refused to send it: nothing to check
            return None
        except httpx.TransportError as e:
            return f"{c.family}: no answer ({type(e).__name__}: {e})"
        if r.status_code not in HTTP_ALLOWED:
            return f"{c.family}: HTTP {r.status_code} {r.text[:200]!r}"
        if r.status_code in (429, 503) and "retry-after" not in r.headers:
            return f"{c.family}: HTTP {r.status_code} without Retry-After"
        return None

    def _grpc(self, c: Case) -> str | None:
        kw: dict[str, Any] = {"timeout": 60}
        if c.grpc_gzip:
            kw["compression"] = grpc.Compression.Gzip
        if "authorization" in c.headers:
            kw["metadata"] = (("authorization", c.headers["authorization"]),)
        try:
            self.calls[c.signal](c.body, **kw)
        except grpc.RpcError as e:
            code = e.code()  # type: ignore[attr-defined]
            if code not in GRPC_ALLOWED:
                return f"{c.family}: gRPC {code} {e.details()!r}"  # type: ignore[attr-defined]
        except ValueError:
            self.not_sent += 1  # e.g. metadata the client refuses
        return None

    def alive(self) -> str | None:
        """A valid push over both transports answers OK; ``/healthz`` answers 200."""
        body = make_metrics_request("fuzz-alive", "alive-0", 0.9).SerializeToString()
        r = self.http.post(PATHS[METRICS], content=body,
                           headers={"content-type": "application/x-protobuf"})
        if r.status_code != 200 or "x-autorepair-threshold" not in r.headers:
            return f"valid HTTP push answered {r.status_code}"
        try:
            self.calls[METRICS](body, timeout=30)
        except grpc.RpcError as e:
            return f"valid gRPC push answered {e.code()}"  # type: ignore[attr-defined]
        h = httpx.get(f"{self.api}/healthz", timeout=30)
        if h.status_code != 200:
            return f"/healthz answered {h.status_code}"
        return None
