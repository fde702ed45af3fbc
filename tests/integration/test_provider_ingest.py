"""Provider facts in ingest: alerts carry ``autorepair.provider…`` in their evidence, the
snapshot shows each node's facts, and forwarded OTLP resources carry them as resource
attributes (a real loopback OTLP/HTTP receiver decodes what was forwarded)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingest.otlp import _kv, attributes, make_fault_request, make_metrics_request
from ingest.pipeline import Ingestor
from ingest.service import IngestService
from tests.fixtures.sinks import ListSink as Sink
from workflows.config import AutorepairConfig

PROVIDERS = {"currency": "USD", "rules": [
    {"match": {"cidr": "10.8.0.0/16"}, "provider": "coreweave", "region": "us-east-04",
     "hourly_rate": 4.25},
    {"match": {"cluster": "fwd"}, "provider": "onprem", "gpu_type": "H100"},
]}


def _cfg(**ingest: Any) -> AutorepairConfig:
    return AutorepairConfig.model_validate({
        "ingest": {"host": "127.0.0.1", "otlp_grpc_port": 0, "otlp_http_port": 0,
                   "api_port": 0, "admin_port": 0, **ingest},
        "threshold": {"push_interval_s": 3600}, "providers": PROVIDERS})


async def test_alert_evidence_and_snapshot_carry_provider_facts() -> None:
    sink = Sink()
    ing = Ingestor(_cfg(), alert_sink=sink)
    req = make_fault_request("fwd", "gpu-1", kind="xid", code=79, body="NVRM: Xid 79")
    req.resource_logs[0].resource.attributes.extend(
        [_kv("host.ip", "10.8.7.1"), _kv("cloud.provider", "gcp")])
    await ing.handle_logs(req, "test")
    (a,) = sink.alerts
    ev = a.evidence
    assert (ev["autorepair.provider"], ev["autorepair.provider.region"]) == (
        "coreweave", "us-east-04")            # the IP rule wins over the agent's gcp
    assert ev["autorepair.provider.gpu_type"] == "H100"
    assert ev["autorepair.provider.hourly_rate"] == 4.25
    assert ev["autorepair.provider.gpus_per_node"] == 8
    await ing.handle_metrics(make_metrics_request("fwd", "gpu-2", 0.9), "test")
    (node,) = ing.snapshot("fwd")["nodes"]
    assert node["provider"] == {"provider": "onprem", "region": None, "gpu_type": "H100",
                                "gpus_per_node": 8, "hourly_rate": None, "currency": "USD"}


@pytest.fixture
async def collector() -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
    got: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        req = ExportMetricsServiceRequest()
        req.ParseFromString(await request.read())
        for rm in req.resource_metrics:
            keys = [kv.key for kv in rm.resource.attributes]
            got.append({**attributes(rm.resource.attributes), "_keys": keys})
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield got, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_forwarded_resources_carry_provider_attributes(
        collector: tuple[list[dict[str, Any]], str]) -> None:
    got, url = collector
    svc = IngestService(_cfg(forward_endpoint=url))
    await svc.start()
    try:
        body = make_metrics_request("fwd", "gpu-3", 0.9, extra_resource={
            "host.ip": "10.8.0.9", "autorepair.provider": "spoofed"}).SerializeToString()
        async with httpx.AsyncClient() as c:
            r = await c.post(f"http://127.0.0.1:{svc.http_port}/v1/metrics", content=body,
                             headers={"Content-Type": "application/x-protobuf"})
            assert r.status_code == 200
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.05)
    finally:
        await svc.stop()
    (res,) = got
    assert res["host.name"] == "gpu-3"
    assert res["autorepair.provider"] == "coreweave"      # replaced, not duplicated
    assert res["_keys"].count("autorepair.provider") == 1
    assert res["autorepair.provider.hourly_rate"] == 4.25
    assert res["autorepair.provider.gpu_type"] == "H100"
    assert res["autorepair.provider.currency"] == "USD"
