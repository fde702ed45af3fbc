"""Alert hand-off to Temporal: fault log records and server-side stragglers reach a
``NodeWorkflow`` through update-with-start on the real Temporal dev server.

A small same-named test workflow (``name="NodeWorkflow"``) with a ``deliver_alert`` update
stands in for the real entity, on a task queue of its own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from ingest.handoff import HandoffQueueFull, TemporalAlertSink
from ingest.otlp import make_fault_request, make_metrics_request
from ingest.service import IngestService
from workflows.config import (
    AutorepairConfig,
    ClusterConfig,
    IngestConfig,
    NodeConfig,
    ThresholdConfig,
)
from workflows.models import Alert, AlertDelivery, AlertOutcome, NodeInput
from workflows.protocol import NODE_UPDATE_DELIVER_ALERT, workflow_id_node

PB = {"Content-Type": "application/x-protobuf"}


@workflow.defn(name="NodeWorkflow", sandboxed=False)
class FakeNodeWorkflow:
    """Records delivered alerts; de-duplicates by alert id like the real entity."""

    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    @workflow.run
    async def run(self, inp: NodeInput) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update(name=NODE_UPDATE_DELIVER_ALERT)
    async def deliver_alert(self, alert: Alert) -> AlertDelivery:
        if any(a.alert_id == alert.alert_id for a in self.alerts):
            return AlertDelivery(alert_id=alert.alert_id, outcome=AlertOutcome.deduplicated)
        self.alerts.append(alert)
        return AlertDelivery(alert_id=alert.alert_id, outcome=AlertOutcome.new)

    @workflow.query
    def delivered(self) -> list[Alert]:
        return self.alerts


def cfg(**ingest: Any) -> AutorepairConfig:
    return AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0, api_port=0,
                            admin_port=0, **ingest),
        threshold=ThresholdConfig(push_interval_s=3600, straggler_pushes=2),
    )


@pytest.fixture
async def client(temporal_dev_env: Any) -> Client:
    c: Client = temporal_dev_env.client
    return c


async def delivered(client: Client, cluster: str, node: str, n: int) -> list[Alert]:
    h = client.get_workflow_handle(workflow_id_node(cluster, node))
    for _ in range(200):
        try:
            got: list[Alert] = await h.query("delivered", result_type=list[Alert])
        except Exception:
            got = []
        if len(got) >= n:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"{workflow_id_node(cluster, node)}: fewer than {n} alerts delivered")


@pytest.fixture
async def queue() -> AsyncIterator[str]:
    yield f"ingest-test-{uuid.uuid4().hex[:8]}"


async def test_fault_and_straggler_alerts_reach_node_workflow(client: Client, queue: str) -> None:
    cluster = f"h-{uuid.uuid4().hex[:6]}"
    sink = TemporalAlertSink(client, queue)
    svc = IngestService(cfg(), sink)
    async with Worker(client, task_queue=queue, workflows=[FakeNodeWorkflow]):
        await svc.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
                line = ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
                        "GPU has fallen off the bus.")
                body = make_fault_request(cluster, "gpu-01", kind="xid", code=79,
                                          gpu="0000:3b:00.0", body=line,
                                          time_ns=1_700_000_000 * 10**9).SerializeToString()
                r = await c.post("/v1/logs", headers=PB, content=body)
                assert r.status_code == 200, r.content
                r = await c.post("/v1/logs", headers=PB, content=body)  # re-delivery
                assert r.status_code == 200
                (alert,) = await delivered(client, cluster, "gpu-01", 1)
                assert alert.kind == "xid" and alert.code == 79
                assert alert.gpu == "0000:3b:00.0" and alert.evidence_text == line
                # the Temporal UI's console text: the first alert names the node entity
                desc = await client.get_workflow_handle(
                    workflow_id_node(cluster, "gpu-01")).describe()
                assert await desc.static_summary() == (
                    f"node gpu-01 · cluster {cluster} · first alert: {alert.summary}")
                assert line in (await desc.static_details() or "")
                # server-side straggler: 5 healthy nodes, one slow one
                for i in range(6):
                    r = await c.post("/v1/metrics", headers=PB, content=make_metrics_request(
                        cluster, f"gpu-{i + 10}", 0.95 if i else 0.40).SerializeToString())
                await svc.compute_now()
                for _ in range(2):
                    r = await c.post("/v1/metrics", headers=PB, content=make_metrics_request(
                        cluster, "gpu-10", 0.40).SerializeToString())
                (strag,) = await delivered(client, cluster, "gpu-10", 1)
                assert strag.kind == "straggler" and strag.active and strag.source == "ingest"
                assert strag.evidence["threshold"] > 0.40
            await asyncio.sleep(0.2)
            assert sink.counts["delivered"] >= 3
            assert sink.last_results[alert.alert_id].outcome == AlertOutcome.deduplicated
        finally:
            await svc.stop()


async def test_alerts_wait_for_temporal_worker_and_are_not_lost(
    client: Client, queue: str
) -> None:
    """No worker yet (the entity cannot answer): alerts stay queued and retry with backoff;
    once a worker runs they are delivered."""
    cluster = f"w-{uuid.uuid4().hex[:6]}"
    sink = TemporalAlertSink(client, queue, rpc_timeout_s=1.0, max_backoff_s=0.5)
    await sink.start()
    try:
        for i in range(3):
            await sink.submit(Alert(alert_id=f"a{i}", cluster=cluster, node="n1", kind="xid",
                                    code=79, summary="Xid 79",
                                    observed_at="2026-01-01T00:00:00Z"))  # type: ignore[arg-type]
        # a retry comes after the first try's 1 s RPC timeout; on a loaded CI machine that
        # takes longer than the 2.5 s this waited for once, so it waits for the retry
        for _ in range(300):
            if sink.counts["retried"] >= 1:
                break
            await asyncio.sleep(0.1)
        assert sink.counts["delivered"] == 0 and sink.counts["retried"] >= 1
        async with Worker(client, task_queue=queue, workflows=[FakeNodeWorkflow]):
            got = await delivered(client, cluster, "n1", 3)
        assert [a.alert_id for a in got] == ["a0", "a1", "a2"]  # order kept per node
    finally:
        await sink.stop(drain_timeout_s=0.1)
        h = client.get_workflow_handle(workflow_id_node(cluster, "n1"))
        await h.terminate()


async def test_full_handoff_queue_answers_503(client: Client, queue: str) -> None:
    cluster = f"q-{uuid.uuid4().hex[:6]}"
    sink = TemporalAlertSink(client, queue, queue_size=1, shards=1, rpc_timeout_s=30)
    svc = IngestService(cfg(alert_queue=1), sink)
    await svc.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
            statuses = []
            for i in range(4):
                body = make_fault_request(cluster, "n1", kind="xid", code=48, body=f"x{i}",
                                          time_ns=(1_700_000_000 + i) * 10**9)
                r = await c.post("/v1/logs", headers=PB, content=body.SerializeToString())
                statuses.append(r.status_code)
            assert 503 in statuses
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
        with pytest.raises(HandoffQueueFull):
            for i in range(3):
                await sink.submit(Alert(alert_id=f"z{i}", cluster=cluster, node="n1",
                                        kind="xid", summary="s",
                                        observed_at="2026-01-01T00:00:00Z"))  # type: ignore[arg-type]
        assert sink.counts["queue_full"] >= 2
    finally:
        await asyncio.wait_for(svc.stop(), timeout=15)


async def test_unknown_nodes_are_observed_and_their_workflows_rate_limited(
    client: Client, queue: str
) -> None:
    """A node outside the inventory gets an observed alert (no repair action); beyond the
    cluster's bucket no NodeWorkflow starts for further made-up names, and the drop is
    counted on /metrics."""
    cluster = f"inv-{uuid.uuid4().hex[:6]}"
    config = AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0, api_port=0,
                            admin_port=0, unknown_node_burst=1, unknown_nodes_per_minute=0.001),
        threshold=ThresholdConfig(push_interval_s=3600),
        clusters=[ClusterConfig(name=cluster, nodes=[NodeConfig(name="gpu-01")])],
    )
    sink = TemporalAlertSink(client, queue)
    svc = IngestService(config, sink)
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    async with Worker(client, task_queue=queue, workflows=[FakeNodeWorkflow]):
        await svc.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
                for node in ("gpu-01", "gpu-66", "gpu-67"):
                    body = make_fault_request(cluster, node, kind="xid", code=79,
                                              gpu="0000:3b:00.0", body=line,
                                              time_ns=1_700_000_000 * 10**9)
                    r = await c.post("/v1/logs", headers=PB, content=body.SerializeToString())
                    assert r.status_code == 200, r.content
            (known,) = await delivered(client, cluster, "gpu-01", 1)
            assert known.actionable and known.action.value == "power_cycle"
            (unknown,) = await delivered(client, cluster, "gpu-66", 1)
            assert not unknown.actionable and unknown.action.value == "none"
            assert unknown.evidence["inventory"] == "unknown"
            with pytest.raises(RPCError) as e:
                await client.get_workflow_handle(workflow_id_node(cluster, "gpu-67")).describe()
            assert e.value.status == RPCStatusCode.NOT_FOUND
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.api_port}") as c:
                text = (await c.get("/metrics")).text
            assert f'autorepair_unknown_nodes_limited_total{{cluster="{cluster}"}} 1.0' in text
            assert f'autorepair_unknown_node_alerts_total{{cluster="{cluster}"}} 1.0' in text
        finally:
            await svc.stop()
            for node in ("gpu-01", "gpu-66"):
                await client.get_workflow_handle(workflow_id_node(cluster, node)).terminate()
