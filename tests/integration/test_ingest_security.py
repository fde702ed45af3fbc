"""Bearer-token auth, TLS/mTLS, the loopback admin endpoint, and forwarding downstream."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from ingest.otlp import make_metrics_request
from ingest.service import IngestService
from workflows.config import AutorepairConfig, IngestConfig, ThresholdConfig, TLSConfig

PB = {"Content-Type": "application/x-protobuf"}
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def cfg(**ingest: Any) -> AutorepairConfig:
    return AutorepairConfig(
        ingest=IngestConfig(**{"host": "127.0.0.1", "otlp_grpc_port": 0, "otlp_http_port": 0,
                               "api_port": 0, "admin_port": 0, **ingest}),
        threshold=ThresholdConfig(push_interval_s=3600),
    )


def body(node: str = "n1", cluster: str = "sec") -> bytes:
    return make_metrics_request(cluster, node, 0.9).SerializeToString()


async def test_bearer_tokens_http_and_grpc(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# agents\nsecret-one\nsecret-two extra-field\n")
    svc = IngestService(cfg(tokens_file=str(tokens)))
    await svc.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
            assert (await c.post("/v1/metrics", headers=PB, content=body())).status_code == 401
            bad = {**PB, "Authorization": "Bearer secret-on"}
            assert (await c.post("/v1/metrics", headers=bad, content=body())).status_code == 401
            ok = {**PB, "Authorization": "Bearer secret-two"}
            assert (await c.post("/v1/metrics", headers=ok, content=body())).status_code == 200
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.grpc_port}") as ch:
            export = ch.unary_unary(EXPORT, request_serializer=None,
                                    response_deserializer=None)
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await export(body())
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
            await export(body(), metadata=(("authorization", "Bearer secret-one"),))
    finally:
        await svc.stop()


async def test_tokens_file_errors_name_the_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="no token"):
        IngestService(cfg(tokens_file=str(empty)))
    with pytest.raises(ValueError, match="missing"):
        IngestService(cfg(tokens_file=str(tmp_path / "missing")))


async def test_admin_endpoint_loopback_and_token(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOREPAIR_ADMIN_TOKEN", "adm1n")
    svc = IngestService(cfg(host="0.0.0.0"))
    await svc.start()
    try:
        assert svc._servers[-1].servers[0].sockets[0].getsockname()[0] == "127.0.0.1"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
            assert (await c.post("/v1/metrics", headers=PB, content=body())).status_code == 200
        await svc.compute_now()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.admin_port}") as c:
            assert (await c.get("/internal/state")).status_code == 401
            r = await c.get("/internal/state", headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
            r = await c.get("/internal/state", headers={"Authorization": "Bearer adm1n"})
            assert r.status_code == 200
            state = r.json()
        assert [n["node"] for n in state["nodes"]] == ["n1"]
        assert state["cohorts"][0]["cluster_id"] == "sec"
    finally:
        await svc.stop()


async def test_admin_without_token_is_forbidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOREPAIR_ADMIN_TOKEN", raising=False)
    svc = IngestService(cfg())
    await svc.start()
    try:
        async with httpx.AsyncClient() as c:
            r = await c.get(f"http://127.0.0.1:{svc.admin_port}/internal/state",
                            headers={"Authorization": "Bearer x"})
        assert r.status_code == 403
    finally:
        await svc.stop()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    d = tmp_path
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    ext = d / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                 "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                 "-extfile", str(ext), "-out", str(d / f"{name}.pem"))
    out = {k: str(d / k) for k in ("ca.pem", "server.pem", "server.key", "client.pem",
                                   "client.key")}
    for k in ("ca.pem", "client.pem", "client.key"):
        out[k + ".bytes"] = (d / k).read_text()
    return out


async def test_mtls_on_http_and_grpc(pki: dict[str, str]) -> None:
    tls = TLSConfig(cert=pki["server.pem"], key=pki["server.key"], client_ca=pki["ca.pem"])
    svc = IngestService(cfg(tls=tls))
    await svc.start()
    try:
        url = f"https://127.0.0.1:{svc.http_port}/v1/metrics"
        import ssl

        good = ssl.create_default_context(cafile=pki["ca.pem"])
        good.load_cert_chain(pki["client.pem"], pki["client.key"])
        async with httpx.AsyncClient(verify=good) as c:
            r = await c.post(url, headers=PB, content=body())
            assert r.status_code == 200 and r.headers["x-autorepair-quorum-met"] == "false"
        no_cert = ssl.create_default_context(cafile=pki["ca.pem"])
        async with httpx.AsyncClient(verify=no_cert) as c:
            with pytest.raises(httpx.HTTPError):
                await c.post(url, headers=PB, content=body())
        ca = pki["ca.pem.bytes"].encode()
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=pki["client.key.bytes"].encode(),
            certificate_chain=pki["client.pem.bytes"].encode())
        async with grpc.aio.secure_channel(f"127.0.0.1:{svc.grpc_port}", creds) as ch:
            export = ch.unary_unary(EXPORT, request_serializer=None,
                                    response_deserializer=None)
            await export(body("g1"), timeout=10)
        async with grpc.aio.secure_channel(f"127.0.0.1:{svc.grpc_port}",
                                           grpc.ssl_channel_credentials(ca)) as ch:
            export = ch.unary_unary(EXPORT, request_serializer=None,
                                    response_deserializer=None)
            with pytest.raises(grpc.aio.AioRpcError):
                await export(body("g2"), timeout=5)
        nodes = {n["node"] for n in svc.ingestor.snapshot()["nodes"]}
        assert nodes == {"n1", "g1"}
    finally:
        await svc.stop()


async def test_forwarding_to_downstream_and_drop_oldest() -> None:
    down = IngestService(cfg())  # a real OTLP/HTTP receiver as the site's collector
    await down.start()
    up = IngestService(cfg(forward_endpoint=f"http://127.0.0.1:{down.http_port}",
                           forward_queue=5))
    await up.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{up.http_port}") as c:
            for i in range(3):
                r = await c.post("/v1/metrics", headers=PB, content=body(f"f{i}", "fwd"))
                assert r.status_code == 200
        for _ in range(100):
            if len(down.ingestor.snapshot("fwd")["nodes"]) == 3:
                break
            await asyncio.sleep(0.05)
        assert {n["node"] for n in down.ingestor.snapshot("fwd")["nodes"]} == \
            {"f0", "f1", "f2"}
        assert up.forwarder is not None and up.forwarder.counts["sent"] >= 1
        # downstream gone: pushes still answer at once; the queue drops the oldest
        await down.stop()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{up.http_port}") as c:
            for i in range(20):
                r = await c.post("/v1/metrics", headers=PB, content=body(f"g{i}", "fwd"))
                assert r.status_code == 200
        assert up.forwarder.dropped >= 14 and up.forwarder.depth() <= 5
        async with httpx.AsyncClient() as c:
            m = (await c.get(f"http://127.0.0.1:{up.api_port}/metrics")).text
        assert "autorepair_forward_dropped_total" in m
    finally:
        await up.stop()
