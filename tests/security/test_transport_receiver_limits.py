"""Items 7 and 8 of issue 27: neither an unauthenticated neighbour nor one token holder
can starve the OTLP receivers.

gRPC (item 7): credentials are checked by a server interceptor before the message is read,
so stalled unauthenticated streams are refused at once and hold no slot; a stalled
authenticated stream ends at ``ingest.receive_timeout_s``; calls in flight are capped per
identity and per peer address. HTTP (item 8): the sender is identified before an in-flight
slot is taken and before the body is read, slots are capped per identity, a body that does
not arrive in time gets 408, request headers that trickle in are cut at
``ingest.header_timeout_s`` (slowloris), and uvicorn's ``limit_concurrency`` bounds
connections.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from ingest.otlp import make_metrics_request
from ingest.service import IngestService
from workflows.config import AutorepairConfig, IngestConfig, ThresholdConfig

PB = {"Content-Type": "application/x-protobuf"}
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
TOKENS = ("tok-n1 node sec/n1\ntok-n2 node sec/n2\ntok-n3 node sec/n3\ntok-n4 node sec/n4\n"
          "tok-col collector sec\n")


def body(node: str) -> bytes:
    return make_metrics_request("sec", node, 0.9).SerializeToString()


@pytest.fixture
async def svc(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[IngestService]:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    limits: dict[str, Any] = {"max_inflight": 8, "max_inflight_per_identity": 2,
                              "max_inflight_per_collector": 3, "max_inflight_per_peer": 6, "receive_timeout_s": 1.0,
                              "header_timeout_s": 1.0, **getattr(request, "param", {})}
    cfg = AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0,
                            api_port=0, admin_port=0, tokens_file=str(tokens), **limits),
        threshold=ThresholdConfig(push_interval_s=3600))
    service = IngestService(cfg)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def _never() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()
    yield b""  # pragma: no cover


def _md(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


async def _status(call: Any) -> grpc.StatusCode:
    try:
        await call
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as e:
        return e.code()


async def test_transport_grpc_stalled_unauthenticated_streams_do_not_starve(
        svc: IngestService) -> None:
    target = f"127.0.0.1:{svc.grpc_port}"
    # more stalled streams than max_inflight (8), without a token or with a wrong one, on
    # three connections (each within ingest.max_streams_per_connection, which would
    # refuse the excess streams of one connection with REFUSED_STREAM)
    channels = [grpc.aio.insecure_channel(  # one TCP connection each
        target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(3)]
    try:
        calls = [ch.stream_unary(EXPORT, request_serializer=None, response_deserializer=None)(
                     _never(), metadata=_md(None if i % 2 else "wrong"), timeout=30)
                 for ch in channels for i in range(4)]
        t0 = time.monotonic()
        codes = await asyncio.wait_for(asyncio.gather(*(_status(c) for c in calls)), 10)
        # refused from the metadata, before any message (on main they wait for one)
        assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
        assert time.monotonic() - t0 < 5
    finally:
        for ch in channels:
            await ch.close()
    async with grpc.aio.insecure_channel(target) as ch:
        export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        await export(body("n1"), metadata=_md("tok-n1"), timeout=5)


async def test_transport_grpc_receive_deadline_and_per_identity_cap(
        svc: IngestService) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.grpc_port}") as ch:
        stalled = ch.stream_unary(EXPORT, request_serializer=None, response_deserializer=None)
        calls = [stalled(_never(), metadata=_md("tok-n2"), timeout=30) for _ in range(4)]
        tasks = [asyncio.create_task(_status(c)) for c in calls]
        await asyncio.sleep(0.3)
        # n2 holds its 2 slots; n1 still pushes
        export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        await export(body("n1"), metadata=_md("tok-n1"), timeout=5)
        codes = sorted(await asyncio.wait_for(asyncio.gather(*tasks), 10), key=str)
        # two over the cap at once, two cut at ingest.receive_timeout_s (1 s)
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 2, codes
        assert codes.count(grpc.StatusCode.DEADLINE_EXCEEDED) == 2, codes


async def test_transport_grpc_per_peer_cap(svc: IngestService) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.grpc_port}") as ch:
        stalled = ch.stream_unary(EXPORT, request_serializer=None, response_deserializer=None)
        # three identities x 2 stalled calls = the peer's 6 slots
        calls = [stalled(_never(), metadata=_md(t), timeout=30)
                 for t in ("tok-n2", "tok-n2", "tok-n3", "tok-n3", "tok-n4", "tok-n4")]
        tasks = [asyncio.create_task(_status(c)) for c in calls]
        await asyncio.sleep(0.3)
        export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await export(body("n1"), metadata=_md("tok-n1"), timeout=5)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "peer address" in (ei.value.details() or "")
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        await export(body("n1"), metadata=_md("tok-n1"), timeout=5)  # slots freed


@pytest.mark.parametrize("svc", [{"max_inflight_per_peer": 64,
                                  "max_streams_per_connection": 4}], indirect=True)
async def test_transport_grpc_streams_per_connection_cap_neighbour(
        svc: IngestService) -> None:
    """A neighbour opens 9 stalled streams on one HTTP/2 connection, under four
    identities (each within its own cap) — more than ``max_inflight`` (8). The server
    announces ``SETTINGS_MAX_CONCURRENT_STREAMS`` = ``ingest.max_streams_per_connection``
    (4), so only 4 of them are open at the server at once (the client holds the rest) and
    another connection's push goes through; without the cap the 9 streams take every
    slot and that push gets RESOURCE_EXHAUSTED."""
    target = f"127.0.0.1:{svc.grpc_port}"
    opts = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own
    neighbour = grpc.aio.insecure_channel(target, options=opts)
    other = grpc.aio.insecure_channel(target, options=opts)
    try:
        stalled = neighbour.stream_unary(EXPORT, request_serializer=None,
                                         response_deserializer=None)
        tokens = ("tok-n2", "tok-n2", "tok-n3", "tok-n3", "tok-n4", "tok-n4",
                  "tok-col", "tok-col", "tok-col")
        calls = [stalled(_never(), metadata=_md(t), timeout=3) for t in tokens]
        tasks = [asyncio.create_task(_status(c)) for c in calls]
        await asyncio.sleep(0.4)
        export = other.unary_unary(EXPORT, request_serializer=None,
                                   response_deserializer=None)
        for _ in range(3):
            await export(body("n1"), metadata=_md("tok-n1"), timeout=5)
        codes = await asyncio.wait_for(asyncio.gather(*tasks), 15)
        assert grpc.StatusCode.OK not in codes
    finally:
        await neighbour.close()
        await other.close()


async def _raw(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    await w.drain()
    return r, w


def _head(token: str, length: int = 100) -> bytes:
    return (f"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {length}\r\n\r\n").encode()


async def _status_line(r: asyncio.StreamReader, limit_s: float = 5) -> bytes:
    return await asyncio.wait_for(r.readline(), limit_s)


async def test_transport_http_one_identity_cannot_take_every_slot(svc: IngestService) -> None:
    # n2 opens max_inflight requests whose bodies never come
    conns = [await _raw(svc.http_port, _head("tok-n2")) for _ in range(8)]
    await asyncio.sleep(0.3)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
        r = await c.post("/v1/metrics", headers={**PB, "Authorization": "Bearer tok-n1"},
                         content=body("n1"))
        assert r.status_code == 200  # on main: 429, n2 holds all 8 slots
    lines = await asyncio.gather(*(_status_line(rd) for rd, _ in conns))
    assert sorted(line.split()[1] for line in lines) == [b"408"] * 2 + [b"429"] * 6
    for _, w in conns:
        w.close()


async def test_transport_http_collector_has_its_own_cap(svc: IngestService) -> None:
    conns = [await _raw(svc.http_port, _head("tok-col")) for _ in range(5)]
    await asyncio.sleep(0.3)
    lines = await asyncio.gather(*(_status_line(rd) for rd, _ in conns))
    # max_inflight_per_collector (3) held until the body timeout, the rest refused
    assert sorted(line.split()[1] for line in lines) == [b"408"] * 3 + [b"429"] * 2
    for _, w in conns:
        w.close()


async def test_transport_http_unauthenticated_refused_before_the_body(
        svc: IngestService) -> None:
    rd, w = await _raw(svc.http_port, _head("wrong", 10_000))
    assert (await _status_line(rd, 2)).split()[1] == b"401"
    w.close()


async def test_transport_http_slowloris_headers_are_cut(svc: IngestService) -> None:
    rd, w = await _raw(svc.http_port, b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    for _ in range(4):  # one header byte now and then: still cut at header_timeout_s
        await asyncio.sleep(0.2)
        w.write(b"X")
        await w.drain()
    assert await asyncio.wait_for(rd.read(), 5) == b""  # closed by the server
    assert time.monotonic() - t0 < 3
    w.close()
    # and an idle connection that never sends a byte
    rd, w = await _raw(svc.http_port, b"")
    assert await asyncio.wait_for(rd.read(), 5) == b""
    w.close()


@pytest.mark.parametrize("svc", [{"limit_concurrency": 2, "header_timeout_s": 30.0}],
                         indirect=True)
async def test_transport_http_limit_concurrency(svc: IngestService) -> None:
    held = [await _raw(svc.http_port, b"") for _ in range(2)]
    await asyncio.sleep(0.2)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
        r = await c.post("/v1/metrics", headers={**PB, "Authorization": "Bearer tok-n1"},
                         content=body("n1"))
    assert r.status_code == 503
    for _, w in held:
        w.close()


_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


async def _frames_until_closed(r: asyncio.StreamReader, limit_s: float) -> list[int]:
    """Types of the HTTP/2 frames the server sends until it closes the connection."""
    types: list[int] = []
    async with asyncio.timeout(limit_s):
        while True:
            head = await r.read(9)
            if len(head) < 9:
                return types
            length = int.from_bytes(head[:3], "big")
            types.append(head[3])
            await r.readexactly(length)


@pytest.mark.parametrize("svc", [{"grpc_idle_timeout_s": 1.0}], indirect=True)
async def test_transport_grpc_idle_connection_is_closed(svc: IngestService) -> None:
    """A connection that finished its HTTP/2 handshake (no token needed for that) and
    then makes no call is sent GOAWAY and closed after ``ingest.grpc_idle_timeout_s``:
    idle connections cannot pile up. One that keeps making calls stays open."""
    r, w = await _raw(svc.grpc_port, _H2_PREFACE)
    try:
        types = await _frames_until_closed(r, 10)
    finally:
        w.close()
    assert 7 in types  # GOAWAY (RFC 9113 §6.8)
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{svc.grpc_port}")
    try:
        export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        for _ in range(4):  # calls 0.5 s apart, past the 1 s idle bound in all
            await export(body("n1"), metadata=_md("tok-n1"), timeout=5)
            await asyncio.sleep(0.5)
        assert ch.get_state() == grpc.ChannelConnectivity.READY
    finally:
        await ch.close()


@pytest.mark.parametrize("svc", [{"grpc_handshake_timeout_s": 1.0}], indirect=True)
async def test_transport_grpc_handshake_is_bounded(svc: IngestService) -> None:
    """A TCP connection that never sends the HTTP/2 preface is closed after
    ``ingest.grpc_handshake_timeout_s``, not held for gRPC's default 120 s."""
    r, w = await asyncio.open_connection("127.0.0.1", svc.grpc_port)
    t0 = asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout(10):
            await r.read()  # until the server closes (it may say why in a GOAWAY first)
    finally:
        w.close()
    assert asyncio.get_running_loop().time() - t0 >= 0.5  # closed by the bound, not at once
