"""Item 1 of issue 27 (ingest and agent side): a projected ServiceAccount token is a
per-node identity. Ingest verifies it with the TokenReview API (audience
``autorepair-ingest``) and binds it to the node of the pod it names — the node-name claim
where the API server issues it, else the pod's ``spec.nodeName`` read once and cached —
so a node cannot report for another with its token. The agent re-reads its token file
when the kubelet rotates it. The real ``kubernetes_asyncio`` client talks to kmock
(``tests/fixtures/kube.py``: TokenReview and Pod responses)."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from agent.otlp import HttpTransport
from agent.token import TokenFile
from ingest.kube_tokens import TokenReviewer
from ingest.otlp import make_metrics_request
from ingest.service import IngestService
from workflows.config import (
    AutorepairConfig,
    ClusterConfig,
    IngestConfig,
    ServiceAccountTokensConfig,
    ThresholdConfig,
)

PB = {"Content-Type": "application/x-protobuf"}
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
NS, SA = "autorepair", "ar-autorepair-agent"


def jwt(sub: str, exp_in_s: float = 600) -> str:
    """A JWT-shaped token (the API server, here kmock, is what verifies it)."""
    def seg(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return ".".join((seg({"alg": "RS256"}), seg({"sub": sub, "aud": ["autorepair-ingest"],
                                                  "exp": int(time.time() + exp_in_s)}),
                     "c2lnbmF0dXJl"))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


SA_CFG = ServiceAccountTokensConfig(enabled=True, service_accounts=[f"{NS}/{SA}"])


@pytest.fixture
async def world(kube_api: Any, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    kube_api.add_pod(NS, "agent-a", "gpu-01", uid="uid-a")
    kube_api.add_pod(NS, "agent-b", "gpu-02", uid="uid-b")
    clock = Clock()
    reviewer = TokenReviewer(SA_CFG, "gpu-east", api_client=kube_api.api_client, clock=clock)
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-col collector gpu-east\n")  # tokens-file identities still work
    cfg = AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0,
                            api_port=0, admin_port=0, tokens_file=str(tokens),
                            service_account_tokens=SA_CFG),
        threshold=ThresholdConfig(push_interval_s=3600),
        clusters=[ClusterConfig(name="gpu-east")])
    svc = IngestService(cfg, token_reviewer=reviewer)
    await svc.start()
    try:
        yield {"svc": svc, "kube": kube_api, "reviewer": reviewer, "clock": clock}
    finally:
        await svc.stop()


def body(node: str, cluster: str = "gpu-east") -> bytes:
    return make_metrics_request(cluster, node, 0.9).SerializeToString()


async def http(svc: IngestService, token: str, node: str, cluster: str = "gpu-east") -> int:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
        r = await c.post("/v1/metrics", content=body(node, cluster),
                         headers={**PB, "Authorization": f"Bearer {token}"})
    return r.status_code


async def grpc_code(svc: IngestService, token: str, node: str) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.grpc_port}") as ch:
        export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        try:
            await export(body(node), metadata=(("authorization", f"Bearer {token}"),),
                         timeout=10)
            return grpc.StatusCode.OK
        except grpc.aio.AioRpcError as e:
            return e.code()


async def test_transport_pod_token_binds_to_the_pods_node(world: dict[str, Any]) -> None:
    svc, kube, reviewer = world["svc"], world["kube"], world["reviewer"]
    tok = jwt("agent-a")
    kube.add_sa_token(tok, NS, SA, pod="agent-a", pod_uid="uid-a")  # no node claim (< 1.30)
    assert await http(svc, tok, "gpu-01") == 200
    assert await grpc_code(svc, tok, "gpu-01") == grpc.StatusCode.OK
    # root on gpu-01 lends its token to report for gpu-02, or for another cluster
    assert await http(svc, tok, "gpu-02") == 403
    assert await http(svc, tok, "gpu-01", "gpu-west") == 403
    assert await grpc_code(svc, tok, "gpu-02") == grpc.StatusCode.PERMISSION_DENIED
    # one review and one pod read for all those pushes (cached)
    assert reviewer.reviews == 1 and reviewer.pod_reads == 1
    assert kube.server.token_reviews == [(tok, ["autorepair-ingest"])]
    # after cache_s the token is reviewed again; the pod's node stays cached
    world["clock"].t += SA_CFG.cache_s + 1
    assert await http(svc, tok, "gpu-01") == 200
    assert reviewer.reviews == 2 and reviewer.pod_reads == 1
    assert await http(svc, "tok-col", "gpu-02") == 200


async def test_transport_node_claim_is_used_when_issued(world: dict[str, Any]) -> None:
    svc, kube, reviewer = world["svc"], world["kube"], world["reviewer"]
    tok = jwt("agent-b")
    kube.add_sa_token(tok, NS, SA, pod="agent-b", pod_uid="uid-b", node="gpu-02")
    assert await http(svc, tok, "gpu-02") == 200
    assert await http(svc, tok, "gpu-01") == 403
    assert reviewer.pod_reads == 0


@pytest.mark.parametrize("case", ["other_account", "other_audience", "no_pod", "pod_replaced",
                                  "pod_gone", "unknown", "not_a_jwt"])
async def test_transport_service_account_tokens_refused(world: dict[str, Any],
                                                         case: str) -> None:
    svc, kube = world["svc"], world["kube"]
    tok = jwt(case)
    if case == "other_account":  # e.g. the node-problem-detector's token on the node
        kube.add_sa_token(tok, "kube-system", "node-problem-detector", pod="agent-a",
                          pod_uid="uid-a")
    elif case == "other_audience":  # the pod's default API token
        kube.add_sa_token(tok, NS, SA, pod="agent-a", pod_uid="uid-a",
                          audiences=("https://kubernetes.default.svc",))
    elif case == "no_pod":  # minted with `kubectl create token`: names no pod
        kube.add_sa_token(tok, NS, SA)
    elif case == "pod_replaced":  # the token of an earlier pod under the same name
        kube.add_sa_token(tok, NS, SA, pod="agent-a", pod_uid="uid-old")
    elif case == "pod_gone":
        kube.add_sa_token(tok, NS, SA, pod="agent-z", pod_uid="uid-z")
    elif case == "not_a_jwt":
        tok = "plain-guess"
    assert await http(svc, tok, "gpu-01") == 401
    assert await grpc_code(svc, tok, "gpu-01") == grpc.StatusCode.UNAUTHENTICATED
    if case == "not_a_jwt":
        assert kube.server.token_reviews == []  # never sent to the API server


async def test_transport_agent_rereads_rotated_token(world: dict[str, Any],
                                                      tmp_path: Path) -> None:
    svc, kube = world["svc"], world["kube"]
    first, second = jwt("agent-a-1"), jwt("agent-a-2")
    kube.add_sa_token(first, NS, SA, pod="agent-a", pod_uid="uid-a")
    kube.add_sa_token(second, NS, SA, pod="agent-a", pod_uid="uid-a")
    # the kubelet's projected volume: ..data symlink swapped on rotation
    vol = tmp_path / "token-volume"
    (vol / "..2026_1").mkdir(parents=True)
    (vol / "..2026_1" / "token").write_text(first)
    (vol / "..data").symlink_to("..2026_1")
    (vol / "token").symlink_to("..data/token")
    source = TokenFile(vol / "token")
    transport = HttpTransport(f"http://127.0.0.1:{svc.http_port}", token=source)
    try:
        req = make_metrics_request("gpu-east", "gpu-01", 0.9)
        assert (await transport.export_metrics(req)).ok
        (vol / "..2026_2").mkdir()
        (vol / "..2026_2" / "token").write_text(second)
        os.symlink("..2026_2", vol / "..data_tmp")
        os.replace(vol / "..data_tmp", vol / "..data")
        kube.server.sa_tokens.pop(first)  # the old token is no longer accepted
        assert (await transport.export_metrics(req)).ok
    finally:
        await transport.aclose()
    assert [t for t, _ in kube.server.token_reviews] == [first, second]
    assert source.reads == 2


def test_transport_token_review_settings_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"service_account_tokens\.service_accounts: required"):
        ServiceAccountTokensConfig(enabled=True)
    with pytest.raises(ValueError, match=r"'agent' is not NAMESPACE/NAME"):
        ServiceAccountTokensConfig(service_accounts=["agent"])
    with pytest.raises(ValueError, match=r"service_account_tokens\.cluster: required"):
        TokenReviewer.from_config(SA_CFG, ["a", "b"])
    assert TokenReviewer.from_config(SA_CFG, ["a"]).cluster == "a"


async def test_transport_made_up_tokens_never_evict_a_verified_identity(
        kube_api: Any) -> None:
    """Issue 27 "by principle": a neighbour sending made-up JWT-shaped tokens fills the
    refusal cache only; the nodes' verified identities stay cached (no new review)."""
    kube_api.add_pod(NS, "agent-a", "gpu-01", uid="uid-a")
    cfg = SA_CFG.model_copy(update={"max_cached_tokens": 2})
    reviewer = TokenReviewer(cfg, "gpu-east", api_client=kube_api.api_client, clock=Clock())
    tok = jwt("agent-a")
    kube_api.add_sa_token(tok, NS, SA, pod="agent-a", pod_uid="uid-a")
    ident = await reviewer.identify(tok.encode())
    assert ident is not None and ident.node == "gpu-01"
    for i in range(5):
        assert await reviewer.identify(jwt(f"made-up-{i}").encode()) is None
    assert reviewer.reviews == 6
    again = await reviewer.identify(tok.encode())
    assert again == ident and reviewer.reviews == 6  # still cached: not reviewed again
