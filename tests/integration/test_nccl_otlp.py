"""NCCL collective timings over real OTLP: the OpenTelemetry Python SDK's own exporters
(HTTP with a delta histogram, gRPC with an observable gauge) and the fleet simulator push
per-rank timings of one communicator with a planted late node; ingest attributes it,
serves ``autorepair_nccl_slow_rank_info`` / ``autorepair_nccl_rank_lag_ms`` on ``/metrics``
and hands an observed ``nccl_slow_rank`` alert to the sink."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from agent.nccl import METRIC, TraceModel
from agent.simulator import FleetSimulator
from ingest.service import IngestService
from tests.fixtures.sinks import ListSink
from workflows.config import (
    AutorepairConfig,
    ClusterConfig,
    IngestConfig,
    NcclConfig,
    ThresholdConfig,
)
from workflows.models import Alert

NODES = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]


class NcclSink(ListSink):
    def nccl(self) -> list[Alert]:
        return [a for a in self.alerts if a.kind == "nccl_slow_rank"]


@pytest.fixture
async def service() -> AsyncIterator[tuple[IngestService, NcclSink]]:
    sink = NcclSink()
    cfg = AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0, api_port=0,
                            admin_port=0),
        threshold=ThresholdConfig(push_interval_s=3600),
        nccl=NcclConfig(alert_ops=8),
        clusters=[ClusterConfig(name="alpha", gpu_nodes=0)],
    )
    svc = IngestService(cfg, alert_sink=sink)
    await svc.start()
    try:
        yield svc, sink
    finally:
        await svc.stop()


class SdkNode:
    """One node's ranks reported through an SDK MeterProvider (resource ``host.name``)."""

    def __init__(self, node: str, transport: str, port: int) -> None:
        self.pending: list[Observation] = []
        if transport == "http":
            exporter: Any = HttpMetricExporter(
                endpoint=f"http://127.0.0.1:{port}/v1/metrics",
                preferred_temporality={Histogram: AggregationTemporality.DELTA})
        else:
            exporter = GrpcMetricExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
        self.reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        self.provider = MeterProvider(
            resource=Resource.create({"host.name": node, "autorepair.cluster.id": "alpha"}),
            metric_readers=[self.reader])
        meter = self.provider.get_meter("nccl-profiler-test")
        self.transport = transport
        if transport == "http":
            self.hist = meter.create_histogram(METRIC, unit="ms")
        else:
            meter.create_observable_gauge(METRIC, callbacks=[self._observe], unit="ms")

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        out, self.pending = self.pending, []
        return out

    def record(self, value: float, attrs: dict[str, Any]) -> None:
        if self.transport == "http":
            self.hist.record(value, attrs)
        else:
            self.pending.append(Observation(value, attrs))

    async def push(self) -> None:
        assert await asyncio.to_thread(self.provider.force_flush, 10_000), "SDK export failed"

    async def close(self) -> None:
        await asyncio.to_thread(self.provider.shutdown)


async def scrape(svc: IngestService) -> str:
    async with httpx.AsyncClient() as c:
        r = await c.get(f"http://127.0.0.1:{svc.api_port}/metrics")
    assert r.status_code == 200
    return r.text


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_sdk_exporters_feed_nccl_timings(
    service: tuple[IngestService, NcclSink], transport: str
) -> None:
    svc, sink = service
    port = svc.http_port if transport == "http" else svc.grpc_port
    model = TraceModel(32, NODES, late={"gpu-03": 1.5}, seed=11, comm=f"sdk-{transport}")
    nodes = {n: SdkNode(n, transport, port) for n in NODES}
    try:
        for _ in range(5):  # 50 ops, pushed 10 at a time per node
            seqs, types, nbytes, dur = model.next_ops(10)
            for name, node in nodes.items():
                for rec in model.records(name, seqs, types, nbytes, dur):
                    node.record(rec.duration_ms, {
                        "nccl.comm_id_hash": rec.comm, "nccl.op_type": rec.op_type,
                        "nccl.op_seq": rec.seq, "nccl.rank": rec.rank,
                        "nccl.nranks": rec.nranks, "nccl.bytes": rec.nbytes or 0})
                await node.push()
        assert svc.ingestor.nccl.ops["complete"] == 50
        assert not svc.ingestor.nccl.rejected
        text = await scrape(svc)
        assert (f'autorepair_nccl_slow_rank_info{{cluster="alpha",comm="{model.comm}",'
                'node="gpu-03"} 1.0') in text
        assert (f'autorepair_nccl_rank_lag_ms_count{{cluster="alpha",comm="{model.comm}"}} '
                f'{32.0 * 50}') in text
        (alert,) = sink.nccl()
        assert alert.node == "gpu-03" and alert.active and alert.evidence["comm"] == model.comm
        assert not alert.actionable and "arrived last" in alert.evidence_text
    finally:
        for node in nodes.values():
            await node.close()


async def test_simulated_fleet_with_slow_rank(
    service: tuple[IngestService, NcclSink], tmp_path: Path
) -> None:
    svc, sink = service
    sim = FleetSimulator(
        f"http://127.0.0.1:{svc.http_port}", "alpha", nodes=4, gpus_per_node=8,
        push_interval_s=0.3, state_dir=tmp_path, nccl_ranks=32, nccl_ops_per_s=100,
        slow_ranks={"gpu-02": 2.0}, seed=3)
    await sim.start()
    try:
        for _ in range(200):
            if sink.nccl():
                break
            await asyncio.sleep(0.1)
        (alert,) = sink.nccl()
        assert alert.node == "gpu-02" and alert.active
        assert set(alert.evidence["ranks"]) <= set(range(8, 16))
        assert f'comm="{sim.nccl_model.comm if sim.nccl_model else ""}"' in await scrape(svc)
        # the node recovers ("clear"): the attribution ends and the alert clears
        await sim.clear("gpu-02")
        for _ in range(200):
            if len(sink.nccl()) == 2:
                break
            await asyncio.sleep(0.1)
        assert [a.active for a in sink.nccl()] == [True, False]
    finally:
        await sim.stop()
