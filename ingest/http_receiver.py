"""OTLP/HTTP receiver (port 4318): ``POST /v1/metrics`` and ``POST /v1/logs``.

A plain ASGI application (served by uvicorn) — no framework routing on the hot path.
Answers as the OTLP/HTTP specification says:

* 200 with an ``Export*ServiceResponse`` (``partial_success`` carrying the rejected count
  and a message when points were rejected), encoded like the request
  (``application/x-protobuf`` or ``application/json``), plus the threshold headers
  ``X-Autorepair-Threshold`` / ``X-Autorepair-Quorum-Met`` (and ``X-Ingero-*`` for Ingero
  agents, docs/design.md §4.3).
* 400 with a ``google.rpc.Status`` body for a payload that does not decode (truncated
  protobuf, bad JSON, corrupt gzip).
* 401 when authentication is on and neither a known bearer token nor (with mTLS) a client
  certificate naming a node identifies the sender.
* 403 when the sender's identity may not report for a node the request names
  (:class:`ingest.auth.Identity`; counted as ``reason="identity"``).
* 413 when the body exceeds ``ingest.max_body_bytes`` or decompresses beyond
  ``ingest.max_decompressed_bytes`` (gzip bomb guard: decompression stops at the limit), or
  a JSON body decodes beyond ``ingest.max_json_bytes``.
* 415 for other content types or content encodings than gzip/identity.
* 408 when the body does not arrive within ``ingest.receive_timeout_s``.
* 429 + ``Retry-After`` when ``ingest.max_inflight`` requests are already being handled,
  or ``ingest.max_inflight_per_identity`` of the sender's identity;
  503 + ``Retry-After`` when the alert hand-off cannot take the push's alerts: its queue
  is full, or PostgreSQL cannot store them (:class:`ingest.handoff.HandoffRefused`;
  retryable: nothing of the push was kept, so 200 always means stored).

The sender is identified from the headers before anything else and before the body is
read (a request without credentials never takes an in-flight slot), and in-flight slots
are counted per identity as well as in total. The listener's protocol
(:func:`peercert_protocol`) closes a connection whose request headers take longer than
``ingest.header_timeout_s`` (slowloris).

Decoding (gunzip, then protobuf or JSON parsing) of anything but a small uncompressed
protobuf body runs in a pool of :data:`DECODE_THREADS` threads, so that a large JSON
document (≈10× the CPU of the same protobuf) does not stall the event loop and the other
pushes on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingest.auth import ROLE_COLLECTOR, Identity, ReceiverAuth
from ingest.handoff import HandoffRefused
from ingest.otlp import identity_violation
from ingest.pipeline import Ingestor, ThresholdHint

log = logging.getLogger("autorepair.ingest.http")

Scope = MutableMapping[str, Any]
Message_ = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message_]]
Send = Callable[[Message_], Awaitable[None]]

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
RETRY_AFTER_S = 1
"""``Retry-After`` seconds on 429/503: one second, well under the 5–10 s push interval."""
INLINE_DECODE_BYTES = 64 * 1024
"""Uncompressed protobuf bodies up to this size are parsed on the event loop (upb parses
64 KiB in well under a millisecond; a thread hop would cost more than it saves)."""
DECODE_THREADS = 2
"""Decode threads: parsing holds the GIL, so more threads would not decode faster; two
keep one large body from queueing every other large body behind it."""
GUNZIP_CHUNK = 256 * 1024
"""Output bytes produced per ``decompress`` call while gunzipping."""


class _Reject(Exception):
    def __init__(self, status: int, code: int, message: str, extra: list[tuple[bytes, bytes]]
                 | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra or []


class OtlpHttpApp:
    """ASGI app of the OTLP/HTTP receiver (see module docstring)."""

    def __init__(self, ingestor: Ingestor, *, auth: ReceiverAuth | None = None) -> None:
        cfg = ingestor.config.ingest
        self.ingestor = ingestor
        self.auth = auth if auth is not None and auth.enabled else None
        self.max_body = cfg.max_body_bytes
        self.max_decompressed = cfg.max_decompressed_bytes
        self.max_json = cfg.max_json_bytes
        self._pool: ThreadPoolExecutor | None = None
        self.max_inflight = cfg.max_inflight
        self.inflight = 0
        self.max_per_identity = cfg.max_inflight_per_identity
        self.max_per_collector = cfg.max_inflight_per_collector
        self.per_identity: dict[str, int] = {}
        self.receive_timeout_s = cfg.receive_timeout_s
        m = ingestor.metrics
        self._hist = m.otlp_request_seconds.labels("http")
        self._outcomes: dict[str, Any] = {}
        self._requests = m.otlp_requests_total

    def close(self) -> None:
        """Stop the decode threads (after the server stopped taking requests)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _count(self, outcome: str) -> None:
        c = self._outcomes.get(outcome)
        if c is None:
            c = self._outcomes[outcome] = self._requests.labels("http", outcome)
        c.inc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        t0 = time.perf_counter()
        path = scope["path"]
        if path == "/v1/metrics":
            signal = "metrics"
        elif path == "/v1/logs":
            signal = "logs"
        else:
            await _plain(send, 404, b"not found: use POST /v1/metrics or /v1/logs")
            return
        if scope["method"] != "POST":
            await _plain(send, 405, b"method not allowed: POST only", [(b"allow", b"POST")])
            return
        headers = _headers(scope)
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower().decode("latin-1")
        as_json = ctype == JSON
        try:
            ident = await self._identify(headers, scope)
        except _Reject as e:
            self._count(_OUTCOME.get(e.status, "error"))
            await _status(send, e.status, e.code, e.message, as_json, e.extra)
            return
        key = ident.id if ident is not None else ""
        mine = self.per_identity.get(key, 0)
        cap = _identity_cap(ident, self.max_per_identity, self.max_per_collector)
        if self.inflight >= self.max_inflight or mine >= cap:
            self._count("overloaded")
            limit = (f"{cap} of {ident.label}" if ident is not None and mine >= cap
                     else str(self.max_inflight))
            await _status(send, 429, code_pb2.RESOURCE_EXHAUSTED,
                          f"too many requests in flight ({limit})", as_json,
                          [(b"retry-after", str(RETRY_AFTER_S).encode())])
            return
        self.inflight += 1
        self.per_identity[key] = mine + 1
        try:
            status, body, out_headers, outcome = await self._handle(
                signal, ctype, headers, receive, ident)
        except _Reject as e:
            self._count(_OUTCOME.get(e.status, "error"))
            await _status(send, e.status, e.code, e.message, as_json, e.extra)
            return
        finally:
            self.inflight -= 1
            left = self.per_identity[key] - 1
            if left:
                self.per_identity[key] = left
            else:
                del self.per_identity[key]
            self._hist.observe(time.perf_counter() - t0)
        self._count(outcome)
        await send({"type": "http.response.start", "status": status, "headers": out_headers})
        await send({"type": "http.response.body", "body": body})

    async def _identify(self, headers: dict[bytes, bytes], scope: Scope) -> Identity | None:
        """The sender's identity (``None`` when authentication is off); raises 401."""
        if self.auth is None:
            return None
        ident = await self.auth.authenticate(headers.get(b"authorization"))
        if ident is None and self.auth.mtls:
            ident = self.auth.from_peercert(scope.get("state", {}).get(PEERCERT))
        if ident is None:
            raise _Reject(401, code_pb2.UNAUTHENTICATED,
                          "missing or invalid bearer token or client certificate",
                          [(b"www-authenticate", b"Bearer")])
        return ident

    async def _handle(
        self, signal: str, ctype: str, headers: dict[bytes, bytes], receive: Receive,
        ident: Identity | None,
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]], str]:
        if ctype not in (PROTOBUF, JSON):
            raise _Reject(415, code_pb2.INVALID_ARGUMENT,
                          f"Content-Type: {ctype!r} is not {PROTOBUF} or {JSON}")
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"gzip", b"identity", b""):
            raise _Reject(415, code_pb2.INVALID_ARGUMENT,
                          f"Content-Encoding: {encoding.decode('latin-1')!r} is not gzip")
        clen = headers.get(b"content-length")
        if clen is not None and clen.isdigit() and int(clen) > self.max_body:
            raise _Reject(413, code_pb2.RESOURCE_EXHAUSTED,
                          f"Content-Length: {int(clen)} exceeds {self.max_body} bytes")
        try:
            # asyncio.timeout, not wait_for: no task per request (a tenth of a push's cost)
            async with asyncio.timeout(self.receive_timeout_s):
                body = await self._read_body(receive)
        except TimeoutError:
            raise _Reject(408, code_pb2.DEADLINE_EXCEEDED,
                          f"body: not received within {self.receive_timeout_s} s "
                          "(ingest.receive_timeout_s)") from None
        gzipped = encoding == b"gzip"
        if ctype == PROTOBUF and not gzipped and len(body) <= INLINE_DECODE_BYTES:
            req, raw = self._decode(signal, ctype, gzipped, body)
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="otlp-decode")
            loop = asyncio.get_running_loop()
            req, raw = await loop.run_in_executor(
                self._pool, self._decode, signal, ctype, gzipped, body)
        if ident is not None:
            bad = identity_violation(req, ident.may_report,  # type: ignore[arg-type]
                                     self.ingestor.limits)
            if bad is not None:
                n, why = bad
                self.ingestor.metrics.otlp_rejected_total.labels("http", signal, "identity").inc(n)
                log.warning("event=otlp_identity_rejected transport=http identity=%r %s",
                            ident.label, why)
                raise _Reject(403, code_pb2.PERMISSION_DENIED, f"{ident.label}: {why}")
        hint: ThresholdHint
        try:
            if isinstance(req, ExportMetricsServiceRequest):
                resp, hint = await self.ingestor.handle_metrics(req, "http", raw,
                                                                 identity=ident)
                partial = resp.partial_success.rejected_data_points > 0
            else:
                assert isinstance(req, ExportLogsServiceRequest)
                resp2, hint = await self.ingestor.handle_logs(
                    req, "http", raw, identity=ident)
                resp = resp2  # type: ignore[assignment]
                partial = resp2.partial_success.rejected_log_records > 0
        except HandoffRefused as e:
            raise _Reject(503, code_pb2.UNAVAILABLE, str(e),
                          [(b"retry-after", str(RETRY_AFTER_S).encode())]) from e
        if ctype == JSON:
            out = json_format.MessageToJson(resp, indent=None).encode()
        else:
            out = resp.SerializeToString()
        hdrs = [(b"content-type", ctype.encode()), (b"content-length", str(len(out)).encode())]
        hdrs += hint.http_headers()
        return 200, out, hdrs, "partial" if partial else "ok"

    def _decode(self, signal: str, ctype: str, gzipped: bool, body: bytes
                ) -> tuple[Message, bytes | None]:
        """Gunzip (when ``gzipped``) and parse; returns the request and, for protobuf, its
        serialized bytes. Raises :class:`_Reject` (400/413). Runs in a decode thread for
        all but small protobuf bodies."""
        limit = self.max_decompressed if ctype == PROTOBUF else min(
            self.max_decompressed, self.max_json)
        if gzipped:
            body = self._gunzip(body, limit)
        if ctype == JSON and len(body) > self.max_json:
            raise _Reject(413, code_pb2.RESOURCE_EXHAUSTED,
                          f"body: JSON of {len(body)} bytes exceeds ingest.max_json_bytes "
                          f"({self.max_json})")
        req: Message
        req = ExportMetricsServiceRequest() if signal == "metrics" else ExportLogsServiceRequest()
        try:
            if ctype == JSON:
                if not body.lstrip(b" \t\r\n").startswith(b"{"):
                    # protobuf's reader takes a JSON array as an empty message
                    raise ValueError("the body must be a JSON object")
                json_format.Parse(body, req, ignore_unknown_fields=True)
            else:
                req.ParseFromString(body)
        except (DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError,
                RecursionError, TypeError, OverflowError) as e:
            raise _Reject(400, code_pb2.INVALID_ARGUMENT,
                          f"body: not a valid {type(req).__name__} ({ctype}): "
                          f"{type(e).__name__}: {str(e)[:200]}") from e
        return req, (body if ctype == PROTOBUF else None)

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise _Reject(400, code_pb2.CANCELLED, "client disconnected")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise _Reject(413, code_pb2.RESOURCE_EXHAUSTED,
                              f"body: exceeds {self.max_body} bytes")
            chunks.append(chunk)
            more = msg.get("more_body", False)
        return b"".join(chunks)

    @staticmethod
    def _gunzip(body: bytes, limit: int) -> bytes:
        """Decompress ``body`` :data:`GUNZIP_CHUNK` bytes at a time, stopping (413) as soon
        as the output passes ``limit``: a gzip bomb never costs more than ``limit`` bytes."""
        d = zlib.decompressobj(wbits=31)
        out: list[bytes] = []
        size = 0
        data = body
        try:
            while data and not d.eof:
                chunk = d.decompress(data, GUNZIP_CHUNK)
                size += len(chunk)
                if size > limit:
                    raise _Reject(413, code_pb2.RESOURCE_EXHAUSTED,
                                  f"body: decompresses beyond {limit} bytes")
                out.append(chunk)
                data = d.unconsumed_tail
            if not d.eof:
                chunk = d.flush()
                size += len(chunk)
                if size > limit:
                    raise _Reject(413, code_pb2.RESOURCE_EXHAUSTED,
                                  f"body: decompresses beyond {limit} bytes")
                out.append(chunk)
        except zlib.error as e:
            raise _Reject(400, code_pb2.INVALID_ARGUMENT, f"body: bad gzip data ({e})") from e
        if not d.eof:
            raise _Reject(400, code_pb2.INVALID_ARGUMENT, "body: truncated gzip stream")
        return b"".join(out)


def _identity_cap(ident: Identity | None, per_node: int, per_collector: int) -> int:
    """In-flight cap of ``ident``: ``per_node`` for a node identity, ``per_collector`` for
    a collector; no cap of its own without authentication (``None``)."""
    if ident is None:
        return 1 << 62
    return per_collector if ident.role == ROLE_COLLECTOR else per_node


_OUTCOME = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 408: "timeout",
            413: "too_large",
            415: "unsupported", 429: "overloaded", 503: "unavailable"}
PEERCERT = "autorepair.peercert"
"""Key of the verified client certificate (``getpeercert()`` dict) in the ASGI scope's
``state``, set by :func:`peercert_protocol`."""


def peercert_protocol(base: type, header_timeout_s: float | None = None) -> type:
    """A uvicorn HTTP protocol class (``base``: httptools' or h11's) that puts the TLS
    client certificate into every request's ``scope["state"][PEERCERT]`` (uvicorn itself
    does not expose it; mTLS identities need it).

    ``header_timeout_s``: close a connection whose request line and headers are not
    complete within this many seconds of the connection (first request) or of the
    request's first byte (later requests) — uvicorn has no header timeout, so a client
    sending a header byte now and then would hold the connection for ever (slowloris).
    Needs the httptools parser (its ``on_message_begin`` / ``on_headers_complete``
    callbacks); with h11 only the first request is timed."""

    class _PeerCert(base):  # type: ignore[misc,valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def _arm_header_timer(self) -> None:
            if header_timeout_s is None or self._header_timer is not None:
                return
            self._header_timer = asyncio.get_running_loop().call_later(
                header_timeout_s, self._header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            transport = getattr(self, "transport", None)
            if transport is not None and not transport.is_closing():
                log.info("event=http_header_timeout timeout_s=%s", header_timeout_s)
                transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            cert = transport.get_extra_info("peercert")
            if cert:
                self.app_state = {**self.app_state, PEERCERT: cert}  # type: ignore[has-type]
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_header_timer()

        def on_headers_complete(self) -> None:
            self._disarm_header_timer()
            super().on_headers_complete()

    _PeerCert.__name__ = f"PeerCert{base.__name__}"
    return _PeerCert


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope["headers"]}


async def _plain(send: Send, status: int, text: bytes,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), *(extra or [])]})
    await send({"type": "http.response.body", "body": text})


async def _status(send: Send, http_status: int, code: int, message: str, as_json: bool,
                  extra: list[tuple[bytes, bytes]]) -> None:
    # the message may quote undecodable input (a lone surrogate from JSON): keep it printable
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    st = status_pb2.Status(code=code, message=message)
    if as_json:
        body = json.dumps({"code": code, "message": message}).encode()
        ctype = JSON.encode()
    else:
        body = st.SerializeToString()
        ctype = PROTOBUF.encode()
    await send({"type": "http.response.start", "status": http_status,
                "headers": [(b"content-type", ctype),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})
