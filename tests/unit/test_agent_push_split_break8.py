"""A fault batch the receiver refuses as too large (HTTP 413) is sent again in smaller
requests, not dropped.

The agent's pusher sends up to 512 queued fault records in one request; when their bodies
add up beyond ``ingest.max_body_bytes`` ingest answers 413 (docs/wire-contract.md) and the
pusher dropped all of them as a permanent failure: a burst of long multi-line records
lost every fault in it, the critical ones included. One record alone over the limit
cannot be sent and is the only one dropped (counted).
"""

from __future__ import annotations

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from agent.otlp import Pusher, PushResult, log_record

LIMIT = 3  # records one request may hold before the receiver answers 413


class SizeLimited:
    def __init__(self) -> None:
        self.bodies: list[str] = []

    async def export_metrics(self, req: ExportMetricsServiceRequest) -> PushResult:
        return PushResult(True, False, status=200)

    async def export_logs(self, req: ExportLogsServiceRequest) -> PushResult:
        records = [r for rl in req.resource_logs for sl in rl.scope_logs
                   for r in sl.log_records]
        if len(records) > LIMIT or any(len(r.body.string_value) > 1000 for r in records):
            return PushResult(False, False, status=413, error="HTTP 413")
        self.bodies += [r.body.string_value for r in records]
        return PushResult(True, False, status=200)

    async def aclose(self) -> None:
        return None


RES = {"host.name": "gpu-01", "autorepair.cluster.id": "c"}


async def test_a_batch_refused_as_too_large_is_split_and_every_record_sent() -> None:
    t = SizeLimited()
    p = Pusher(t)
    for i in range(10):
        p.enqueue_log(RES, log_record(f"NVRM: Xid (PCI:0000:0{i}:00): 79, fault {i}", {}, i))
    assert await p.flush(now=0.0) is True
    assert t.bodies == [f"NVRM: Xid (PCI:0000:0{i}:00): 79, fault {i}" for i in range(10)]
    assert p.stats.logs_dropped == 0 and p.stats.logs_sent == 10


async def test_only_a_record_too_large_alone_is_dropped() -> None:
    t = SizeLimited()
    p = Pusher(t)
    p.enqueue_log(RES, log_record("before", {}, 1))
    p.enqueue_log(RES, log_record("x" * 5000, {}, 2))
    p.enqueue_log(RES, log_record("after", {}, 3))
    assert await p.flush(now=0.0) is True
    assert t.bodies == ["before", "after"]
    assert p.stats.logs_dropped == 1 and p.stats.logs_sent == 2
