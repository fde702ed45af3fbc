"""Item 4 of issue 27: a client certificate naming its node by subject CN alone is bound
to ``ingest.tls.cn_cluster`` (or the one configured cluster), and refused when several
clusters are configured and none is named — over OTLP/HTTP and OTLP/gRPC. The SPIFFE URI
SAN keeps naming its own cluster."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from ingest.auth import cn_binding
from ingest.otlp import make_metrics_request
from ingest.service import IngestService
from tests.security.transport_pki import make_pki
from workflows.config import (
    AutorepairConfig,
    ClusterConfig,
    IngestConfig,
    ThresholdConfig,
    TLSConfig,
)

PB = {"Content-Type": "application/x-protobuf"}
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"), {
        "cn": ("gpu-01", "DNS:gpu-01.example"),
        "spiffe": ("ignored", "URI:spiffe://test/cluster/staging/node/gpu-01"),
    })


def config(pki: dict[str, Path], clusters: list[str], cn_cluster: str | None
           ) -> AutorepairConfig:
    tls = TLSConfig(cert=str(pki["server.pem"]), key=str(pki["server.key"]),
                    client_ca=str(pki["ca.pem"]), cn_cluster=cn_cluster)
    return AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0,
                            api_port=0, admin_port=0, tls=tls),
        threshold=ThresholdConfig(push_interval_s=3600),
        clusters=[ClusterConfig(name=c) for c in clusters])


def body(cluster: str) -> bytes:
    return make_metrics_request(cluster, "gpu-01", 0.9).SerializeToString()


async def push(svc: IngestService, pki: dict[str, Path], cert: str, cluster: str
               ) -> tuple[int, Any]:
    """(HTTP status, gRPC status code) of one push of gpu-01 of ``cluster``."""
    ctx = ssl.create_default_context(cafile=str(pki["ca.pem"]))
    ctx.load_cert_chain(str(pki[f"{cert}.pem"]), str(pki[f"{cert}.key"]))
    async with httpx.AsyncClient(verify=ctx) as c:
        r = await c.post(f"https://127.0.0.1:{svc.http_port}/v1/metrics", headers=PB,
                         content=body(cluster))
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki["ca.pem"].read_bytes(),
        private_key=pki[f"{cert}.key"].read_bytes(),
        certificate_chain=pki[f"{cert}.pem"].read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{svc.grpc_port}", creds) as ch:
        export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        try:
            await export(body(cluster), timeout=10)
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as e:
            code = e.code()
    return r.status_code, code


async def test_transport_cn_certificate_is_bound_to_cn_cluster(pki: dict[str, Path]) -> None:
    svc = IngestService(config(pki, ["prod", "staging"], "prod"))
    await svc.start()
    try:
        assert await push(svc, pki, "cn", "prod") == (200, grpc.StatusCode.OK)
        # CN=gpu-01 issued for prod/gpu-01 cannot report staging/gpu-01 (on main: 200/OK)
        assert await push(svc, pki, "cn", "staging") == (
            403, grpc.StatusCode.PERMISSION_DENIED)
        # the SPIFFE SAN names its own cluster and stays accepted there
        assert await push(svc, pki, "spiffe", "staging") == (200, grpc.StatusCode.OK)
        assert await push(svc, pki, "spiffe", "prod") == (
            403, grpc.StatusCode.PERMISSION_DENIED)
    finally:
        await svc.stop()


async def test_transport_cn_certificate_refused_with_several_clusters_unnamed(
        pki: dict[str, Path]) -> None:
    svc = IngestService(config(pki, ["prod", "staging"], None))
    await svc.start()
    try:
        for cluster in ("prod", "staging"):
            assert await push(svc, pki, "cn", cluster) == (
                401, grpc.StatusCode.UNAUTHENTICATED)
        assert await push(svc, pki, "spiffe", "staging") == (200, grpc.StatusCode.OK)
    finally:
        await svc.stop()


async def test_transport_cn_certificate_one_cluster_binds_to_it(pki: dict[str, Path]) -> None:
    svc = IngestService(config(pki, ["prod"], None))
    await svc.start()
    try:
        assert await push(svc, pki, "cn", "prod") == (200, grpc.StatusCode.OK)
        assert await push(svc, pki, "cn", "elsewhere") == (
            403, grpc.StatusCode.PERMISSION_DENIED)
    finally:
        await svc.stop()


def test_transport_cn_cluster_must_be_configured() -> None:
    with pytest.raises(ValueError, match=r"ingest\.tls\.cn_cluster: 'qa' is not a configured"):
        cn_binding("qa", ["prod", "staging"])
    assert cn_binding(None, ["prod", "staging"]) == (False, None)
    assert cn_binding(None, []) == (True, None)


async def test_transport_agent_certificate_identity_spiffe_san(pki: dict[str, Path]) -> None:
    """The agent's certificate mode (the chart's ``agent.identity: certificate``: a CSI
    volume's certificate passed as ``--client-cert`` / ``--client-key`` / ``--ca-file``):
    the SPIFFE URI SAN binds the agent to its cluster and node, over HTTP and gRPC. (On
    main the HTTP transport never sent its certificate with httpx 0.28 — ``cert=`` is
    ignored when ``verify`` is a path — and the gRPC transport had no client certificate.)"""
    from agent.otlp import GrpcTransport, HttpTransport

    svc = IngestService(config(pki, ["prod", "staging"], None))
    await svc.start()
    transport = HttpTransport(f"https://127.0.0.1:{svc.http_port}", ca_file=str(pki["ca.pem"]),
                              client_cert=str(pki["spiffe.pem"]),
                              client_key=str(pki["spiffe.key"]))
    try:
        own = await transport.export_metrics(make_metrics_request("staging", "gpu-01", 0.9))
        assert own.ok
        other = await transport.export_metrics(make_metrics_request("staging", "gpu-02", 0.9))
        assert not other.ok and other.status == 403
        g = GrpcTransport(f"https://127.0.0.1:{svc.grpc_port}", ca_file=str(pki["ca.pem"]),
                          client_cert=str(pki["spiffe.pem"]),
                          client_key=str(pki["spiffe.key"]))
        try:
            assert (await g.export_metrics(make_metrics_request("staging", "gpu-01", 0.9))).ok
            bad = await g.export_metrics(make_metrics_request("staging", "gpu-02", 0.9))
            assert not bad.ok and "PERMISSION_DENIED" in (bad.error or "")
        finally:
            await g.aclose()
    finally:
        await transport.aclose()
        await svc.stop()
