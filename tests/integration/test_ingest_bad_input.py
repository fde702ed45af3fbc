"""Bad input against the running receivers: each gets the right OTLP status, the process
stays healthy, and data accepted earlier is still there."""

from __future__ import annotations

import gzip
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ingest.otlp import METRIC_SCORE, make_metrics_request
from ingest.service import IngestService
from workflows.config import AutorepairConfig, IngestConfig, ThresholdConfig

PB = {"Content-Type": "application/x-protobuf"}


@pytest.fixture
async def svc() -> AsyncIterator[IngestService]:
    cfg = AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0, api_port=0,
                            admin_port=0, max_body_bytes=4 * 1024 * 1024,
                            max_decompressed_bytes=8 * 1024 * 1024,
                            max_json_bytes=1024 * 1024),
        threshold=ThresholdConfig(push_interval_s=3600),
    )
    s = IngestService(cfg)
    await s.start()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.http_port}") as c:
        # earlier data: a healthy cohort with quorum
        for i in range(6):
            r = await c.post("/v1/metrics", headers=PB, content=make_metrics_request(
                "bad", f"n{i}", 0.9).SerializeToString())
            assert r.status_code == 200
    await s.compute_now()
    yield s
    await s.stop()


async def still_healthy(s: IngestService) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.api_port}") as c:
        assert (await c.get("/healthz")).status_code == 200
        body = (await c.get("/api/v1/threshold", params={"cluster_id": "bad"})).json()
    assert body["active_nodes"] == 6 and body["quorum_met"] is True


def status_of(r: httpx.Response) -> status_pb2.Status:
    st = status_pb2.Status()
    st.ParseFromString(r.content)
    return st


async def http(s: IngestService, body: bytes, headers: dict[str, str],
               path: str = "/v1/metrics") -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{s.http_port}") as c:
        return await c.post(path, content=body, headers=headers)


async def test_truncated_protobuf_400_with_status(svc: IngestService) -> None:
    good = make_metrics_request("bad", "x", 0.5).SerializeToString()
    r = await http(svc, good[: len(good) // 2], PB)
    assert r.status_code == 400
    st = status_of(r)
    assert st.code == code_pb2.INVALID_ARGUMENT and "ExportMetricsServiceRequest" in st.message
    await still_healthy(svc)


async def test_bad_json_400(svc: IngestService) -> None:
    r = await http(svc, b'{"resourceMetrics": [', {"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == code_pb2.INVALID_ARGUMENT
    # protobuf's JSON reader takes an array (or a bare value) as an empty message
    for body in (b"[]", b" [ ]", b"null", b'"x"', b"\xef\xbb\xbf{}"):
        r = await http(svc, body, {"Content-Type": "application/json"})
        assert r.status_code == 400, body
    r = await http(svc, b" {}", {"Content-Type": "application/json"})
    assert r.status_code == 200


async def test_wrong_content_type_415(svc: IngestService) -> None:
    r = await http(svc, b"hello", {"Content-Type": "text/plain"})
    assert r.status_code == 415 and "text/plain" in status_of(r).message
    r = await http(svc, b"x", {**PB, "Content-Encoding": "br"})
    assert r.status_code == 415
    await still_healthy(svc)


async def test_gzip_bomb_413(svc: IngestService) -> None:
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)  # 64 MiB → ~64 KiB
    assert len(bomb) < 200_000
    r = await http(svc, bomb, {**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 413 and "decompresses beyond" in status_of(r).message
    r = await http(svc, b"\x1f\x8b garbage", {**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 400
    await still_healthy(svc)


async def test_json_decoded_size_cap_413(svc: IngestService) -> None:
    js = {"Content-Type": "application/json"}
    doc = b'{"resourceMetrics": []' + b" " * (2 * 1024 * 1024) + b"}"
    r = await http(svc, gzip.compress(doc), {**js, "Content-Encoding": "gzip"})
    assert r.status_code == 413 and "decompresses beyond 1048576" in r.json()["message"]
    r = await http(svc, doc, js)
    assert r.status_code == 413 and "ingest.max_json_bytes" in r.json()["message"]
    # the same bytes as protobuf are under the 8 MiB cap: the JSON cap is JSON's own
    r = await http(svc, gzip.compress(b"\0" * (2 * 1024 * 1024)), {**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 400
    await still_healthy(svc)


async def test_deeply_nested_json_400(svc: IngestService) -> None:
    js = {"Content-Type": "application/json"}
    for doc in (b'{"resourceMetrics": ' + b"[" * 200_000,
                b'{"resourceMetrics": [' + b'{"resource": ' * 5000 + b"{}" + b"}" * 5000 + b"]}",
                b'{"resourceMetrics": "not a list"}', b'{"resourceMetrics": [{"resource": 7}]}',
                b"\xff\xfe{}"):
        r = await http(svc, doc, js)
        assert r.status_code == 400, (doc[:40], r.text)
    await still_healthy(svc)


async def test_json_is_parsed_off_the_event_loop(svc: IngestService,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from google.protobuf import json_format

    threads: list[str] = []
    real = json_format.Parse

    def spy(*a: Any, **kw: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*a, **kw)

    monkeypatch.setattr(json_format, "Parse", spy)
    body = json_format.MessageToJson(make_metrics_request("bad", "j2", 0.9)).encode()
    r = await http(svc, body, {"Content-Type": "application/json"})
    assert r.status_code == 200
    assert threads and threads[0].startswith("otlp-decode")
    assert threading.current_thread().name not in threads


async def test_body_over_limit_413(svc: IngestService) -> None:
    r = await http(svc, b"\0" * (5 * 1024 * 1024), PB)
    assert r.status_code == 413
    await still_healthy(svc)


async def test_huge_attribute_strings_rejected_and_counted(svc: IngestService) -> None:
    req = make_metrics_request("bad", "h" * 1000, 0.5)
    r = await http(svc, req.SerializeToString(), PB)
    assert r.status_code == 200
    resp = ExportMetricsServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_data_points == 1
    assert "longer than 253" in resp.partial_success.error_message
    req = make_metrics_request("bad", "h" * 1_000_000, 0.5)
    r = await http(svc, req.SerializeToString(), PB)
    resp = ExportMetricsServiceResponse.FromString(r.content)
    assert r.status_code == 200 and resp.partial_success.rejected_data_points == 1
    assert "'host.name': string value longer than 16384" in resp.partial_success.error_message
    await still_healthy(svc)


async def test_invalid_points_rejected_never_stored(svc: IngestService) -> None:
    now_ns = time.time_ns()
    req = ExportMetricsServiceRequest()
    cases = [("nan", math.nan, 0), ("inf", math.inf, 0), ("neg", -0.1, 0), ("big", 1.5, 0),
             ("future", 0.5, now_ns + 3600 * 10**9)]
    for node, score, t in cases:
        req.MergeFrom(make_metrics_request("bad", node, score, time_ns=t))
    req.MergeFrom(make_metrics_request("", "nocluster", 0.5))
    req.MergeFrom(make_metrics_request("bad", "okay", 0.5, time_ns=now_ns))
    r = await http(svc, req.SerializeToString(), PB)
    assert r.status_code == 200
    ps = ExportMetricsServiceResponse.FromString(r.content).partial_success
    assert ps.rejected_data_points == 6
    assert "outside [0, 1]" in ps.error_message
    nodes = {n["node"] for n in svc.ingestor.snapshot("bad")["nodes"]}
    assert "okay" in nodes and not nodes & {"nan", "inf", "neg", "big", "future", "nocluster"}
    async with httpx.AsyncClient() as c:
        m = (await c.get(f"http://127.0.0.1:{svc.api_port}/metrics")).text
    assert 'autorepair_otlp_rejected_total{reason="value",signal="metrics",transport="http"} 4.0' in m
    assert 'autorepair_otlp_rejected_total{reason="timestamp",signal="metrics",transport="http"} 1.0' in m
    assert 'autorepair_otlp_rejected_total{reason="resource",signal="metrics",transport="http"} 1.0' in m


async def test_100k_points_in_one_request(svc: IngestService) -> None:
    req = make_metrics_request("bad", "many", 0.9)
    pts = req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    proto = pts[0]
    for _ in range(99_999):
        pts.add().CopyFrom(proto)
    body = req.SerializeToString()
    r = await http(svc, gzip.compress(body), {**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 200
    assert ExportMetricsServiceResponse.FromString(r.content).partial_success \
        .rejected_data_points == 0
    await still_healthy(svc)


async def test_unknown_metric_names_accepted_and_ignored(svc: IngestService) -> None:
    req = make_metrics_request("bad", "unk", 0.9)
    req.resource_metrics[0].scope_metrics[0].metrics[0].name = "something.else"
    r = await http(svc, req.SerializeToString(), PB)
    assert r.status_code == 200
    assert not ExportMetricsServiceResponse.FromString(r.content).HasField("partial_success")
    assert "unk" not in {n["node"] for n in svc.ingestor.snapshot("bad")["nodes"]}


async def test_json_push_and_wrong_path(svc: IngestService) -> None:
    from google.protobuf import json_format

    body = json_format.MessageToJson(make_metrics_request("bad", "j", 0.9))
    r = await http(svc, body.encode(), {"Content-Type": "application/json"})
    assert r.status_code == 200 and r.headers["x-autorepair-quorum-met"] == "true"
    assert r.headers["content-type"] == "application/json"
    r = await http(svc, b"", PB, path="/v1/traces")
    assert r.status_code == 404
    async with httpx.AsyncClient() as c:
        r = await c.get(f"http://127.0.0.1:{svc.http_port}/v1/metrics")
    assert r.status_code == 405


async def test_grpc_truncated_and_oversize(svc: IngestService) -> None:
    good = make_metrics_request("bad", "g", 0.5).SerializeToString()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.grpc_port}") as ch:
        export = ch.unary_unary(
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await export(good[: len(good) // 2])
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await export(b"\0" * (5 * 1024 * 1024))
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        call = export(good)
        md = dict(await call.initial_metadata())
        await call
        assert md["autorepair-quorum-met"] == "true"
        assert float(md["autorepair-threshold"]) > 0.8
    await still_healthy(svc)


def test_metric_name_constant() -> None:
    assert METRIC_SCORE == "autorepair.node.health_score"
