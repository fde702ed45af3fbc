"""Bearer-token auth, TLS/mTLS, the loopback admin endpoint, and forwarding downstream."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi import APIRouter

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
    tokens.write_text("# agents\nsecret-one\nsecret-two collector sec\n")
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
    # the client is an OTel Collector of cluster "sec" (SPIFFE-style URI SAN); the node
    # certificates name their node by URI SAN or by CN alone (docs/security.md)
    certs = {
        "server": ("server", "IP:127.0.0.1,DNS:localhost"),
        "client": ("client", "URI:spiffe://test/cluster/sec/collector"),
        "node1": ("ignored", "URI:spiffe://test/cluster/sec/node/n1"),
        "cn": ("n1", "DNS:n1.example"),
    }
    for name, (cn, san) in certs.items():
        ext = d / f"{name}.cnf"
        ext.write_text(f"subjectAltName={san}\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                 "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                 "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                 "-extfile", str(ext), "-out", str(d / f"{name}.pem"))
    out = {k: str(d / k) for k in ("ca.pem", "server.pem", "server.key")}
    out["ca.pem.bytes"] = (d / "ca.pem").read_text()
    for name in ("client", "node1", "cn"):
        for ext_ in ("pem", "key"):
            out[f"{name}.{ext_}"] = str(d / f"{name}.{ext_}")
            out[f"{name}.{ext_}.bytes"] = (d / f"{name}.{ext_}").read_text()
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


# ------------------------------------------------------------------ identities (docs/design.md §4.2)
LOGS_EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


def fault(node: str, cluster: str = "sec") -> bytes:
    from ingest.otlp import make_fault_request

    return make_fault_request(cluster, node, kind="xid", code=79,
                              body="NVRM: Xid (PCI:0000:3b:00): 79").SerializeToString()


async def _metrics_text(svc: IngestService) -> str:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"http://127.0.0.1:{svc.api_port}/metrics")).text


def _rejected(text: str, transport: str, signal: str) -> float:
    import re

    m = re.search(rf'autorepair_otlp_rejected_total\{{reason="identity",signal="{signal}",'
                  rf'transport="{transport}"\}} (\S+)', text)
    return float(m.group(1)) if m else 0.0


async def test_node_tokens_report_only_for_their_node(tmp_path: Path) -> None:
    import hashlib

    hashed = hashlib.sha256(b"tok-n2").hexdigest()
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-n1 node sec/n1\n"
                      f"sha256:{hashed} node sec/n2\n"
                      "tok-col collector sec,sec2\n")
    svc = IngestService(cfg(tokens_file=str(tokens)))
    await svc.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
            def as_(tok: str) -> dict[str, str]:
                return {**PB, "Authorization": f"Bearer {tok}"}

            assert (await c.post("/v1/metrics", headers=as_("tok-n1"),
                                 content=body("n1"))).status_code == 200
            # forged: another node, the same node name in another cluster, a fault record
            for path, content in (("/v1/metrics", body("n2")), ("/v1/metrics", body("n1", "x")),
                                  ("/v1/logs", fault("n3"))):
                r = await c.post(path, headers=as_("tok-n1"), content=content)
                assert r.status_code == 403, (path, r.status_code)
            assert "node sec/n1: may not report for node 'n3'" in \
                (await c.post("/v1/logs", headers=as_("tok-n1"), content=fault("n3"))).text
            # hashed token: its own node only; the hash itself is no credential
            assert (await c.post("/v1/logs", headers=as_("tok-n2"),
                                 content=fault("n2"))).status_code == 200
            assert (await c.post("/v1/metrics", headers=as_(hashed),
                                 content=body("n2"))).status_code == 401
            # collector: any node of its clusters, none of another cluster
            assert (await c.post("/v1/metrics", headers=as_("tok-col"),
                                 content=body("n7", "sec2"))).status_code == 200
            assert (await c.post("/v1/metrics", headers=as_("tok-col"),
                                 content=body("n7", "prod"))).status_code == 403
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.grpc_port}") as ch:
            export = ch.unary_unary(EXPORT, request_serializer=None,
                                    response_deserializer=None)
            logs = ch.unary_unary(LOGS_EXPORT, request_serializer=None,
                                  response_deserializer=None)
            md = (("authorization", "Bearer tok-n1"),)
            await export(body("n1"), metadata=md)
            for call, content in ((export, body("n2")), (logs, fault("n2"))):
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await call(content, metadata=md)
                assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "may not report for node 'n2'" in (ei.value.details() or "")
        nodes = {(n["cluster"], n["node"]) for n in svc.ingestor.snapshot()["nodes"]}
        assert nodes == {("sec", "n1"), ("sec2", "n7")}
        assert svc.ingestor.alerts_submitted == 1  # the n2 fault from n2's own token
        text = await _metrics_text(svc)
        assert _rejected(text, "http", "metrics") == 3
        assert _rejected(text, "http", "logs") == 2
        assert _rejected(text, "grpc", "metrics") == 1 and _rejected(text, "grpc", "logs") == 1
    finally:
        await svc.stop()


async def test_mtls_identities_bind_the_node(pki: dict[str, str]) -> None:
    import ssl

    tls = TLSConfig(cert=pki["server.pem"], key=pki["server.key"], client_ca=pki["ca.pem"])
    svc = IngestService(cfg(tls=tls))
    await svc.start()
    try:
        url = f"https://127.0.0.1:{svc.http_port}/v1/metrics"
        for cert, ok, forged in (("node1", body("n1"), [body("n2"), body("n1", "other")]),
                                 ("cn", body("n1", "any-cluster"), [body("n2")])):
            ctx = ssl.create_default_context(cafile=pki["ca.pem"])
            ctx.load_cert_chain(pki[f"{cert}.pem"], pki[f"{cert}.key"])
            async with httpx.AsyncClient(verify=ctx) as c:
                assert (await c.post(url, headers=PB, content=ok)).status_code == 200, cert
                for f in forged:
                    assert (await c.post(url, headers=PB, content=f)).status_code == 403, cert
            creds = grpc.ssl_channel_credentials(
                root_certificates=pki["ca.pem.bytes"].encode(),
                private_key=pki[f"{cert}.key.bytes"].encode(),
                certificate_chain=pki[f"{cert}.pem.bytes"].encode())
            async with grpc.aio.secure_channel(f"127.0.0.1:{svc.grpc_port}", creds) as ch:
                export = ch.unary_unary(EXPORT, request_serializer=None,
                                        response_deserializer=None)
                await export(ok, timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await export(forged[0], timeout=10)
                assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED, cert
    finally:
        await svc.stop()


async def test_production_refuses_receivers_without_auth(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("AUTOREPAIR_INGEST_TOKENS", raising=False)
    with pytest.raises(RuntimeError, match=r"ingest\.insecure_allow_unauthenticated: true"):
        IngestService(cfg(), require_auth=True)
    caplog.set_level("WARNING", logger="autorepair.ingest")
    IngestService(cfg(insecure_allow_unauthenticated=True), require_auth=True)
    assert any("INSECURE_RECEIVERS" in r.getMessage() for r in caplog.records)
    tokens = tmp_path / "tokens"
    tokens.write_text("t node sec/n1\n")
    IngestService(cfg(tokens_file=str(tokens)), require_auth=True)  # authenticated: starts
    monkeypatch.setenv("AUTOREPAIR_INGEST_TOKENS", "shared")
    IngestService(cfg(), require_auth=True)


@pytest.mark.parametrize(("line", "error"), [
    ("tok admin sec/n1", "role 'admin' is not 'node' or 'collector'"),
    ("tok node n1", "node identity 'n1' is not CLUSTER/NODE"),
    ("tok node sec/a/b", "is not CLUSTER/NODE"),
    ("sha256:abc node sec/n1", "64 hex digits"),
    ("tok node", "expected 'TOKEN node CLUSTER/NODE'"),
    ("tok collector ,", "names no cluster"),
])
def test_tokens_file_lines_are_checked(tmp_path: Path, line: str, error: str) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# header\n{line}\n")
    with pytest.raises(ValueError, match="line 2") as ei:
        IngestService(cfg(tokens_file=str(tokens)))
    assert error in str(ei.value) and "tok " not in str(ei.value)


async def test_state_needs_an_api_token_probes_stay_open(tmp_path: Path) -> None:
    """``/api/v1/state`` maps the fleet: any token of api.tokens_file (viewer and up) reads
    it, nobody else; ``/healthz`` and ``/readyz`` answer probes without a token; the CLI's
    ``status`` sends the dev stack's operator token."""
    from typer.testing import CliRunner

    from workers.cli import app

    api_tokens = tmp_path / "api-tokens"
    api_tokens.write_text("view-1 viewer bob\nop-1 operator alice\n")
    config = cfg()
    config.api.tokens_file = str(api_tokens)
    # stand-ins for the repair API's read routes, which `status` also calls
    reads = APIRouter(prefix="/api/v1")
    reads.get("/repairs")(lambda: {"repairs": []})
    reads.get("/alerts")(lambda: {"alerts": []})
    reads.get("/report")(lambda: {"currency": "USD", "gpu_hours": 0.0, "cost": 0.0,
                                  "breakdown": []})
    svc = IngestService(config, routers=[reads])
    unconfigured = IngestService(cfg())
    await svc.start()
    await unconfigured.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.api_port}") as c:
            await c.get("/api/v1/threshold", params={"cluster_id": "sec"})
            r = await c.get("/api/v1/state")
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert "bearer token" in r.json()["detail"]
            bad = await c.get("/api/v1/state", headers={"Authorization": "Bearer view-2"})
            assert bad.status_code == 401
            for tok in ("view-1", "op-1"):
                r = await c.get("/api/v1/state", headers={"Authorization": f"Bearer {tok}"})
                assert r.status_code == 200 and "nodes" in r.json()
            assert (await c.get("/healthz")).status_code == 200
            assert (await c.get("/readyz")).status_code == 200
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{unconfigured.api_port}") as c:
            r = await c.get("/api/v1/state", headers={"Authorization": "Bearer view-1"})
            assert r.status_code == 401 and "api.tokens_file" in r.json()["detail"]
        data = tmp_path / "data"
        data.mkdir()
        (data / "operator.token").write_text("op-1\n")
        url = f"http://127.0.0.1:{svc.api_port}"
        env: dict[str, str | None] = {"AUTOREPAIR_TOKEN": None, "COLUMNS": "200"}
        r = await asyncio.to_thread(CliRunner().invoke, app, [
            "status", "--api", url, "--data-dir", str(tmp_path / "nowhere"), "--json"],
            env=env)
        assert r.exit_code == 1 and "HTTP 401" in r.output and "no API token" in r.output
        r = await asyncio.to_thread(CliRunner().invoke, app, [
            "status", "--api", url, "--data-dir", str(data), "--json"], env=env)
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["state"]["nodes"] == []
    finally:
        await svc.stop()
        await unconfigured.stop()
