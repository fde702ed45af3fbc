"""A GPU's NVML memory state and its NVLink state are two level signals; one's clear must
not end the other's raise.

The agent samples both per GPU and sends each as an ``nvsmi`` level fault on the GPU's
address. ingest keys a fault by ``kind:code:gpu`` (workflows.protocol.fault_key), so the
two shared one identity: the start clear of healthy NVLinks (I20: every level signal's
state goes out once after start) ended the pending-row-remap raise sent one line earlier,
and an NVLink flap ended an open ECC fault.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from agent.config import AgentConfig
from agent.nvml import GpuSample, SimulatedBackend
from agent.otlp import PushResult
from agent.runner import Agent
from ingest.pipeline import Ingestor
from tests.fixtures.sinks import ListSink
from workflows.config import AutorepairConfig
from workflows.models import Alert
from workflows.protocol import fault_key


class IngestTransport:
    """The agent's pushes go straight into an :class:`Ingestor` (the receivers' call)."""

    def __init__(self, ingestor: Ingestor) -> None:
        self.ingestor = ingestor

    async def export_metrics(self, req: ExportMetricsServiceRequest) -> PushResult:
        await self.ingestor.handle_metrics(req, "test")
        return PushResult(ok=True, retryable=False, status=200)

    async def export_logs(self, req: ExportLogsServiceRequest) -> PushResult:
        await self.ingestor.handle_logs(req, "test")
        return PushResult(ok=True, retryable=False, status=200)

    async def aclose(self) -> None:
        return None


def _setup(tmp: Any) -> tuple[Agent, SimulatedBackend, ListSink]:
    cfg = AutorepairConfig.model_validate({
        "clusters": [{"name": "it", "gpu_nodes": 1, "nodes": [{"name": "gpu-01"}]}]})
    sink = ListSink()
    ing = Ingestor(cfg, alert_sink=sink)
    acfg = AgentConfig(endpoint="http://127.0.0.1:9", cluster="it", node="gpu-01",
                       backend="simulated", state_dir=str(tmp), kernel_log="none",
                       expected_gpus=2)
    backend = SimulatedBackend(gpu_count=2, seed=3)
    agent = Agent(acfg, backend, transport=IngestTransport(ing), cpu=lambda: 1.0,
                  memory=lambda: 1.0, persist=False)
    agent.open()
    return agent, backend, sink


def _open_faults(alerts: list[Alert], kind: str) -> dict[str, Alert]:
    """Fault key → its raise, for the faults whose last edge is a raise."""
    last: dict[str, Alert] = {}
    for a in alerts:
        if a.kind == kind:
            last[fault_key(a)] = a
    return {k: a for k, a in last.items() if a.active}


async def test_a_pending_remap_seen_at_start_stays_raised(tmp_path: Any) -> None:
    agent, backend, sink = _setup(tmp_path)
    backend.faults.remap_pending = True  # GPU 0 has rows waiting for a reset
    agent.sample_once()
    await agent.pusher.flush()
    open_ = _open_faults(sink.alerts, "nvsmi")
    assert [a.evidence.get("remap_pending") for a in open_.values()] == [True], (
        [(a.active, a.gpu, a.evidence_text) for a in sink.alerts if a.kind == "nvsmi"])
    await agent.close()


async def test_an_nvlink_flap_does_not_clear_an_open_ecc_fault(tmp_path: Any) -> None:
    agent, backend, sink = _setup(tmp_path)
    agent.sample_once()
    await agent.pusher.flush()
    backend.faults.ecc_uncorrectable = 2
    agent.sample_once()
    await agent.pusher.flush()
    assert len(_open_faults(sink.alerts, "nvsmi")) == 1
    real = backend.sample

    def links(down: bool) -> list[GpuSample]:
        gpus = real()
        if down:  # GPU 0 loses links 3 and 4
            g = gpus[0]
            gpus[0] = GpuSample(**{**g.__dict__, "nvlink_active": tuple(
                i for i in g.nvlink_active if i not in (3, 4))})
        return gpus

    backend.sample = lambda: links(True)  # type: ignore[method-assign]
    agent.sample_once()
    await agent.pusher.flush()
    backend.sample = lambda: links(False)  # type: ignore[method-assign]
    agent.sample_once()
    await agent.pusher.flush()
    open_ = _open_faults(sink.alerts, "nvsmi")
    assert any(a.evidence.get("dram_uncorrectable") == 2 for a in open_.values()), (
        [(a.active, a.gpu, a.evidence_text) for a in sink.alerts if a.kind == "nvsmi"])
    await agent.close()


async def test_an_unknown_nvlink_keeps_its_last_known_state(tmp_path: Any) -> None:
    """The NVLink query of GPU 0 fails from some sample on: its links were last known
    up, so the ECC fault raised meanwhile still clears when the memory is good again."""
    agent, backend, sink = _setup(tmp_path)
    agent.sample_once()
    await agent.pusher.flush()
    backend.faults.failing_queries = {"nvlink"}
    backend.faults.ecc_uncorrectable = 2
    agent.sample_once()
    await agent.pusher.flush()
    assert len(_open_faults(sink.alerts, "nvsmi")) == 1
    backend.faults.ecc_uncorrectable = 0
    agent.sample_once()
    await agent.pusher.flush()
    assert _open_faults(sink.alerts, "nvsmi") == {}
    await agent.close()
