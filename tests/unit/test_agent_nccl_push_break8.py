"""A push carrying many NCCL timings still delivers the node's health score.

The agent put every NCCL point read since the last push (up to ``nccl_max_points``,
100,000) into the same export request as its health score. 100,000 points are ~16 MiB;
ingest refuses a body over ``ingest.max_body_bytes`` (4 MiB) whole (HTTP 413, gRPC
RESOURCE_EXHAUSTED), so a node with a busy NCCL trace lost its score on every push and
went silent to the threshold engine. The score now travels in its own request and the
NCCL points in requests that each fit the receiver's default limit.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from agent.config import AgentConfig
from agent.nccl import NcclRecord
from agent.nvml import SimulatedBackend
from agent.otlp import PushResult
from agent.runner import Agent
from workflows.config import IngestConfig

LIMIT = IngestConfig().max_body_bytes  # ingest's default body limit (4 MiB)


class Receiver:
    """Answers 413 to a body over ingest's default limit, as the receivers do."""

    def __init__(self) -> None:
        self.accepted: list[ExportMetricsServiceRequest] = []

    async def export_metrics(self, req: ExportMetricsServiceRequest) -> PushResult:
        if req.ByteSize() > LIMIT:
            return PushResult(False, False, status=413, error="HTTP 413")
        self.accepted.append(req)
        return PushResult(True, False, status=200)

    async def export_logs(self, req: ExportLogsServiceRequest) -> PushResult:
        return PushResult(True, False, status=200)

    async def aclose(self) -> None:
        return None


def _names(reqs: list[ExportMetricsServiceRequest]) -> list[str]:
    return [m.name for r in reqs for rm in r.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics]


def _nccl_points(reqs: list[ExportMetricsServiceRequest]) -> int:
    return sum(len(m.gauge.data_points) for r in reqs for rm in r.resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics
               if m.name == "autorepair.nccl.collective.duration_ms")


async def test_a_full_nccl_buffer_does_not_cost_the_push_its_score(tmp_path: Any) -> None:
    cfg = AgentConfig(endpoint="http://127.0.0.1:9", cluster="c", node="gpu-01",
                      backend="simulated", state_dir=str(tmp_path), kernel_log="none")
    rx = Receiver()
    agent = Agent(cfg, SimulatedBackend(gpu_count=2, seed=1), transport=rx,
                  cpu=lambda: 1.0, memory=lambda: 1.0, persist=False)
    agent.open()
    for _ in range(cfg.score.calibration_samples + 2):
        agent.sample_once()
    n = cfg.nccl_max_points
    agent.nccl_buffer.extend(
        NcclRecord("0x9f3a1c2b4d5e6f70", "AllReduce", i, i % 8, 64, 12.345, 26214400,
                   1_800_000_000_000_000_000 + i) for i in range(n))
    await agent.push_once()
    assert "autorepair.node.health_score" in _names(rx.accepted)
    assert _nccl_points(rx.accepted) == n  # every point delivered, none refused
    assert agent.pusher.stats.metrics_dropped == 0
    await agent.close()
