"""The OpenTelemetry Python SDK's own OTLP exporters (gRPC and HTTP) push to the running
ingest receivers; the test reads the threshold back from the push response (HTTP headers,
gRPC initial metadata) and from ``GET /api/v1/threshold``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
import httpx
import pytest
import requests
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from ingest.service import IngestService
from workflows.config import AutorepairConfig, ClusterConfig, IngestConfig, ThresholdConfig


def make_config(**threshold: Any) -> AutorepairConfig:
    return AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0, api_port=0,
                            admin_port=0),
        # long interval: the test drives recomputes itself through compute_now()
        threshold=ThresholdConfig(push_interval_s=3600, **threshold),
        clusters=[ClusterConfig(name="alpha", gpu_nodes=0)],
    )


@pytest.fixture
async def service() -> AsyncIterator[IngestService]:
    svc = IngestService(make_config())
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()


class _MetadataCapture(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Records the initial metadata of every call made through the SDK's gRPC channel."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = continuation(details, request)
        self.metadata.append(dict(call.initial_metadata() or ()))
        return call


class Node:
    """One simulated agent: an SDK MeterProvider with the contract's resource and gauge."""

    def __init__(self, name: str, cluster: str, transport: str, port: int,
                 workload: str = "training", ingero: bool = False) -> None:
        self.score = 0.9
        self.state = "active"
        self.headers: list[dict[str, str]] = []
        attrs = ({"ingero.node.id": name, "ingero.cluster.id": cluster} if ingero else
                 {"host.name": name, "host.id": f"m-{name}", "autorepair.cluster.id": cluster,
                  "autorepair.host.boot_id": "b-1", "autorepair.workload_type": workload})
        if transport == "http":
            session = requests.Session()
            session.hooks["response"].append(
                lambda r, *a, **k: self.headers.append(dict(r.headers)))
            exporter: Any = HttpMetricExporter(
                endpoint=f"http://127.0.0.1:{port}/v1/metrics", session=session,
                compression=Compression.Gzip)
        else:
            exporter = GrpcMetricExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
            self.capture = _MetadataCapture()
            # the SDK does not surface response metadata: wrap its channel to read it
            exporter._channel = grpc.intercept_channel(exporter._channel, self.capture)
            exporter._client = exporter._stub(exporter._channel)
        self.reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        self.provider = MeterProvider(resource=Resource.create(attrs),
                                      metric_readers=[self.reader])
        meter = self.provider.get_meter("autorepair-agent-test")
        score_name = "ingero.node.health_score" if ingero else "autorepair.node.health_score"
        state_key = "ingero.node.state" if ingero else "autorepair.node.state"
        meter.create_observable_gauge(score_name, callbacks=[self._score])
        meter.create_observable_gauge("autorepair.node.throughput_ratio",
                                      callbacks=[lambda o: [Observation(0.97)]])
        self._state_key = state_key

    def _score(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.score, {self._state_key: self.state})]

    async def push(self) -> None:
        ok = await asyncio.to_thread(self.provider.force_flush, 10_000)
        assert ok, "SDK export failed"

    def last_threshold(self) -> tuple[float, bool]:
        if hasattr(self, "capture"):
            md = self.capture.metadata[-1]
            return float(md["autorepair-threshold"]), md["autorepair-quorum-met"] == "true"
        h = {k.lower(): v for k, v in self.headers[-1].items()}
        return float(h["x-autorepair-threshold"]), h["x-autorepair-quorum-met"] == "true"

    async def close(self) -> None:
        # shutdown() exports once more: off the loop, the server runs on it
        await asyncio.to_thread(self.provider.shutdown)


async def api_threshold(svc: IngestService, cluster: str, **params: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as c:
        r = await c.get(f"http://127.0.0.1:{svc.api_port}/api/v1/threshold",
                        params={"cluster_id": cluster, **params})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_sdk_exporters_get_threshold_in_response_and_api(
    service: IngestService, transport: str
) -> None:
    port = service.http_port if transport == "http" else service.grpc_port
    scores = [0.90, 0.92, 0.94, 0.96, 0.98, 0.60]
    nodes = [Node(f"{transport}-n{i}", "alpha", transport, port) for i in range(len(scores))]
    try:
        for n, s in zip(nodes, scores, strict=True):
            n.score = s
            await n.push()
        # cold start: before any recompute the push answer is 0 / no quorum
        assert nodes[0].last_threshold() == (0.0, False)
        cold = await api_threshold(service, "alpha")
        assert cold["threshold"] == 0 and cold["quorum_met"] is False
        await service.compute_now()
        # median of 0.60 0.90 0.92 0.94 0.96 0.98 = 0.93; |dev| .33 .03 .01 .01 .03 .05
        # → MAD 0.03; threshold = 0.93 − 2 · 0.03 · 1.4826 = 0.841044
        expected = 0.93 - 2 * 0.03 * 1.4826
        body = await api_threshold(service, "alpha")
        assert body["quorum_met"] is True
        assert body["threshold"] == pytest.approx(expected)
        assert body["median"] == pytest.approx(0.93)
        assert body["active_nodes"] == 6 and body["cluster_id"] == "alpha"
        await nodes[1].push()
        thr, quorum = nodes[1].last_threshold()
        assert quorum and thr == pytest.approx(expected, abs=1e-6)
        # a different cluster gets its own (cold-start) answer
        other = await api_threshold(service, "beta")
        assert other["threshold"] == 0 and other["quorum_met"] is False
        # server-side straggler: node 5 (0.60) below threshold for 3 pushes
        for _ in range(3):
            await nodes[5].push()
        await service.compute_now()
        body = await api_threshold(service, "alpha")
        assert body["stragglers"] == 1
        async with httpx.AsyncClient() as c:
            metrics = (await c.get(f"http://127.0.0.1:{service.api_port}/metrics")).text
        state = service.ingestor.snapshot()  # /api/v1/state needs an API token
        assert 'autorepair_stragglers{cluster_id="alpha",cohort="training"} 1.0' in metrics
        assert f'autorepair_otlp_requests_total{{outcome="ok",transport="{transport}"}}' in metrics
        strag = [n for n in state["nodes"] if n["straggler"]]
        assert [n["node"] for n in strag] == [f"{transport}-n5"]
        assert strag[0]["signals"]["throughput_ratio"] == pytest.approx(0.97)
        assert strag[0]["machine_id"] == f"m-{transport}-n5"
    finally:
        for n in nodes:
            await n.close()


async def test_ingero_aliases_and_headers(service: IngestService) -> None:
    nodes = [Node(f"ig-{i}", "ingero-c", "http", service.http_port, ingero=True)
             for i in range(5)]
    try:
        for n in nodes:
            n.score = 0.8
            await n.push()
        await service.compute_now()
        await nodes[0].push()
        h = {k.lower(): v for k, v in nodes[0].headers[-1].items()}
        assert h["x-ingero-quorum-met"] == "true"
        assert float(h["x-ingero-threshold"]) == pytest.approx(0.8 - 2 * 0.01 * 1.4826,
                                                              abs=1e-6)
        assert h["x-ingero-threshold"] == h["x-autorepair-threshold"]
        body = await api_threshold(service, "ingero-c")
        assert body["cohort"] == "default" and body["active_nodes"] == 5
    finally:
        for n in nodes:
            await n.close()


async def test_idle_nodes_and_health_endpoints(service: IngestService) -> None:
    nodes = [Node(f"idle-{i}", "idlec", "grpc", service.grpc_port) for i in range(6)]
    try:
        for i, n in enumerate(nodes):
            n.state = "idle" if i < 2 else "active"
            await n.push()
        await service.compute_now()
        body = await api_threshold(service, "idlec")
        assert body["active_nodes"] == 4 and body["idle_nodes"] == 2
        assert body["quorum_met"] is False  # 4 active < statistical_min 5
        async with httpx.AsyncClient() as c:
            base = f"http://127.0.0.1:{service.api_port}"
            assert (await c.get(f"{base}/healthz")).status_code == 200
            r = await c.get(f"{base}/readyz")
            assert r.status_code == 200 and r.json()["threshold_computed"] is True
            r = await c.get(f"{base}/api/v1/threshold")
            assert r.status_code == 422 and "cluster_id" in r.text
    finally:
        for n in nodes:
            await n.close()


class _Sink:
    def __init__(self) -> None:
        self.alerts: list[Any] = []

    async def submit(self, alert: Any) -> None:
        self.alerts.append(alert)


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_sdk_log_exporters_fault_records_become_alerts(transport: str) -> None:
    import time

    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
        OTLPLogExporter as GrpcLogExporter,
    )
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpLogExporter,
    )
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

    sink = _Sink()
    svc = IngestService(make_config(), sink)
    await svc.start()
    try:
        exporter: Any = (
            HttpLogExporter(endpoint=f"http://127.0.0.1:{svc.http_port}/v1/logs")
            if transport == "http"
            else GrpcLogExporter(endpoint=f"127.0.0.1:{svc.grpc_port}", insecure=True))
        provider = LoggerProvider(resource=Resource.create(
            {"host.name": "gpu-07", "autorepair.cluster.id": "alpha", "host.id": "m-7"}))
        logger = provider.get_logger("autorepair-agent-test")
        line = "NVRM: Xid (PCI:0000:3b:00): 48, pid=2211, name=python, DBE (0x1,0x2)"

        def emit() -> None:
            # SimpleLogRecordProcessor exports synchronously: run it off the loop
            provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
            logger.emit(body=line, timestamp=time.time_ns(), attributes={
                "event.name": "autorepair.fault", "autorepair.fault.kind": "xid",
                "autorepair.fault.code": 48, "autorepair.gpu.pci": "0000:3b:00.0",
                "autorepair.fault.active": True, "autorepair.fault.pid": 2211})
            provider.shutdown()

        await asyncio.to_thread(emit)
        (a,) = sink.alerts
        assert (a.cluster, a.node, a.kind, a.code, a.gpu) == \
            ("alpha", "gpu-07", "xid", 48, "0000:3b:00.0")
        # the machine comes from configuration (none here), host.id is evidence only
        assert a.machine_id is None and a.evidence["reported_host_id"] == "m-7"
        assert a.evidence_text == line and a.evidence["pid"] == 2211
    finally:
        await svc.stop()


async def test_http_answers_are_not_held_back_by_delayed_acks(service: IngestService) -> None:
    """Keep-alive requests from a blocking client (as agents send them) answer in a few ms
    when the answer has a body (a ``partial_success``, the threshold API). The listeners'
    sockets must get TCP_NODELAY: headers and body go out as two writes, and with Nagle the
    body waits for the client's delayed ACK, 40 ms on Linux, on every such request."""
    import time

    from ingest.otlp import make_metrics_request

    rejected = make_metrics_request("alpha", "nagle-0", 1.5).SerializeToString()  # > 1

    def median_s(port: int, method: str, path: str, **kw: Any) -> float:
        times = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
            for _ in range(21):
                t0 = time.perf_counter()
                r = c.request(method, path, **kw)
                times.append(time.perf_counter() - t0)
                assert r.status_code == 200 and r.content
        return sorted(times)[10]

    push = await asyncio.to_thread(median_s, service.http_port, "POST", "/v1/metrics",
                                   content=rejected,
                                   headers={"Content-Type": "application/x-protobuf"})
    api = await asyncio.to_thread(median_s, service.api_port, "GET", "/api/v1/threshold",
                                  params={"cluster_id": "alpha"})
    assert push < 0.02 and api < 0.02, f"median round trips {push * 1e3:.1f} / {api * 1e3:.1f} ms"
