"""Over gRPC, a fault batch larger than ingest's message limit is split, not retried as is
for ever.

ingest's gRPC server takes messages up to ``ingest.max_body_bytes``
(``max_receive_message_length``) and answers a larger one RESOURCE_EXHAUSTED ("Received
message larger than max"). The agent read every RESOURCE_EXHAUSTED as "too busy, retry":
the same oversized batch went out again after each backoff, and since fault records go
before metrics, the node's scores stopped too — the node went silent to the control plane
while its agent was healthy.
"""

from __future__ import annotations

from ingest.service import IngestService
from tests.fixtures.sinks import ListSink
from workflows.config import AutorepairConfig


async def test_an_oversized_grpc_fault_batch_is_split_and_delivered() -> None:
    from agent.otlp import GrpcTransport, Pusher, log_record

    cfg = AutorepairConfig.model_validate({
        "ingest": {"host": "127.0.0.1", "otlp_grpc_port": 0, "otlp_http_port": 0,
                   "api_port": 0, "admin_port": 0, "max_body_bytes": 4096},
        "clusters": [{"name": "it", "gpu_nodes": 1, "nodes": [{"name": "gpu-01"}]}],
    })
    sink = ListSink()
    svc = IngestService(cfg, sink)
    await svc.start()
    transport = GrpcTransport(f"http://127.0.0.1:{svc.grpc_port}", timeout_s=5)
    p = Pusher(transport)
    res = {"host.name": "gpu-01", "autorepair.cluster.id": "it"}
    try:
        for i in range(12):  # ~700 bytes each: ~8 KB in one request, over the 4 KiB limit
            body = f"[{i}.0] NVRM: Xid (PCI:0000:{i:02x}:00): 79, GPU has fallen off the bus." \
                + " " * 600
            p.enqueue_log(res, log_record(body, {
                "event.name": "autorepair.fault", "autorepair.fault.kind": "xid",
                "autorepair.fault.code": 79, "autorepair.gpu.pci": f"0000:{i:02x}:00"}, 0))
        assert await p.flush(now=0.0) is True, p.stats.last_error
        assert sorted(a.gpu or "" for a in sink.alerts) == [f"0000:{i:02x}:00"
                                                            for i in range(12)]
        assert p.stats.logs_dropped == 0
    finally:
        await transport.aclose()
        await svc.stop()
