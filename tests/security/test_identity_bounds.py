"""Issue 27, "also, by principle": every sender-chosen value that becomes ingest state is
bounded **per identity** (``ingest.limits``, :mod:`ingest.quota`), so one credential
flooding made-up nodes, cohorts, fault kinds or NCCL communicators leaves a second
identity's state and pushes unaffected.

Before: the score map, node table and unreachable tracker took every made-up node name;
the label budget (``ingest.max_label_values``) and the per-cluster unknown-node bucket
went to whoever sent first; a full NCCL engine evicted the least recently updated
communicator whoever owned it; two collector tokens of the same clusters shared one
identity key."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from temporalio.service import RPCError

from agent.nccl import NcclRecord, nccl_metric
from agent.otlp import metrics_request
from ingest.auth import ROLE_COLLECTOR, Identity, load_identities
from ingest.handoff import IdentityShareFull, TemporalAlertSink
from ingest.otlp import make_fault_request, make_metrics_request
from ingest.pipeline import Ingestor
from ingest.service import IngestService
from workflows.config import AutorepairConfig
from workflows.models import Alert
from workflows.protocol import workflow_id_node

PB = {"Content-Type": "application/x-protobuf"}
A = Identity(ROLE_COLLECTOR, "collector of c1", clusters=frozenset({"c1"}), key="line 1")
B = Identity(ROLE_COLLECTOR, "collector of c1", clusters=frozenset({"c1"}), key="line 2")


class ListSink:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)


def _scores(cluster: str, nodes: list[str], *, cohort: str | None = "training",
            cohorts: list[str] | None = None) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    for i, n in enumerate(nodes):
        wl = cohorts[i] if cohorts is not None else cohort
        req.resource_metrics.extend(make_metrics_request(cluster, n, 0.9,
                                                         workload=wl).resource_metrics)
    return req


def _faults(cluster: str, node_kinds: list[tuple[str, str]]) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    for node, kind in node_kinds:
        req.resource_logs.extend(make_fault_request(
            cluster, node, kind=kind, body=f"{kind} on {node}").resource_logs)
    return req


def _cfg(**ingest: Any) -> AutorepairConfig:
    return AutorepairConfig.model_validate({
        "ingest": ingest,
        "clusters": [{"name": "c1", "nodes": [{"name": f"n{i:02d}"} for i in range(1, 41)]}],
    })


def test_two_collector_tokens_of_the_same_clusters_are_two_identities(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-a collector c1\ntok-b collector c1\n")
    (_, _, a), (_, _, b) = load_identities(str(tokens))
    assert a.label == b.label == "collector of c1"
    assert a.id != b.id and "tok" not in a.id + b.id


async def test_unknown_node_flood_leaves_another_collector_unaffected(tmp_path: Path) -> None:
    """Through the real HTTP receiver: collector A invents 50 nodes; only
    ``unknown_nodes_per_identity`` of them enter the score map and node table, the rest
    are refused (``limit``) and counted; collector B's made-up-free and new-node pushes
    are taken whole, and B's unknown node still gets its (observed) alert although A
    spent its own unknown-node bucket."""
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-a collector c1  # A\ntok-b collector c1  # B\n")
    sink = ListSink()
    cfg = AutorepairConfig.model_validate({
        "ingest": {"host": "127.0.0.1", "otlp_grpc_port": 0, "otlp_http_port": 0,
                   "api_port": 0, "admin_port": 0, "tokens_file": str(tokens),
                   "unknown_node_burst": 2, "unknown_nodes_per_minute": 0,
                   "limits": {"unknown_nodes_per_identity": 4}},
        "clusters": [{"name": "c1", "nodes": [{"name": "n01"}, {"name": "n02"}]}],
    })
    svc = IngestService(cfg, alert_sink=sink)
    await svc.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
            def post(path: str, req: Any, tok: str) -> Any:
                return c.post(path, content=req.SerializeToString(),
                              headers={**PB, "Authorization": f"Bearer {tok}"})

            fake = [f"fake-{i:03d}" for i in range(50)]
            r = await post("/v1/metrics", _scores("c1", fake), "tok-a")
            assert r.status_code == 200
            from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
                ExportMetricsServiceResponse,
            )
            resp = ExportMetricsServiceResponse.FromString(r.content)
            assert resp.partial_success.rejected_data_points == 46
            assert "ingest.limits.unknown_nodes_per_identity" in \
                resp.partial_success.error_message
            r = await post("/v1/logs", _faults("c1", [(n, "xid") for n in fake]), "tok-a")
            assert r.status_code == 200
            a_alerts = [x for x in sink.alerts if x.node.startswith("fake-")]
            assert len(a_alerts) == 2  # A's own bucket: burst 2, no refill

            r = await post("/v1/metrics", _scores("c1", ["n01", "n02", "new-01"]), "tok-b")
            assert r.status_code == 200
            assert ExportMetricsServiceResponse.FromString(
                r.content).partial_success.rejected_data_points == 0
            r = await post("/v1/logs", _faults("c1", [("new-01", "xid")]), "tok-b")
            assert r.status_code == 200
            b_alerts = [x for x in sink.alerts if x.node == "new-01"]
            assert len(b_alerts) == 1 and b_alerts[0].actionable is False
            assert b_alerts[0].evidence["inventory"] == "unknown"

            metrics = (await c.get(f"http://127.0.0.1:{svc.api_port}/metrics")).text
        ing = svc.ingestor
        fakes = {n for (_, n) in ing.nodes if n.startswith("fake-")}
        assert len(fakes) == 4
        assert {("c1", "n01"), ("c1", "n02"), ("c1", "new-01")} <= set(ing.nodes)
        assert sum(len(co) for co in ing.scores.cohorts.values()) == 4 + 3
        line = next(x for x in metrics.splitlines()
                    if x.startswith('autorepair_identity_limited_total{what="unknown_node"}'))
        assert float(line.split()[-1]) >= 46
    finally:
        await svc.stop()


async def test_cohort_flood_and_its_labels_are_bounded_per_identity() -> None:
    cfg = _cfg(limits={"cohorts_per_identity": 3, "label_values_per_identity": 2})
    ing = Ingestor(cfg)
    nodes = [f"n{i:02d}" for i in range(1, 31)]
    resp, _ = await ing.handle_metrics(
        _scores("c1", nodes, cohorts=[f"co{i}" for i in range(30)]), "http", identity=A)
    assert resp.partial_success.rejected_data_points == 27
    assert "ingest.limits.cohorts_per_identity" in resp.partial_success.error_message
    resp, _ = await ing.handle_metrics(_scores("c1", ["n31", "n32"], cohort="inference"),
                                       "http", identity=B)
    assert resp.partial_success.rejected_data_points == 0
    await ing.compute()
    text = ing.metrics.render().decode()
    a_series = {c for c in ("co0", "co1", "co2")
                if f'autorepair_active_nodes{{cluster_id="c1",cohort="{c}"}}' in text}
    assert len(a_series) == 2  # A's label share of the cohort budget
    assert 'autorepair_active_nodes{cluster_id="c1",cohort="inference"}' in text
    assert ing.metrics.identity_limited_total.labels("cohort")._value.get() == 27


async def test_made_up_fault_kinds_cannot_take_the_label_budget() -> None:
    """A sends ten kinds outside the catalogue: two get their own series, the rest count
    as ``other``; B's new kind still gets its own series (the global budget is 4)."""
    cfg = _cfg(max_label_values=4, limits={"label_values_per_identity": 2})
    ing = Ingestor(cfg, alert_sink=ListSink())
    await ing.handle_logs(_faults("c1", [("n01", f"madeup{i}") for i in range(10)]), "http",
                          identity=A)
    await ing.handle_logs(_faults("c1", [("n02", "vendor_fault")]), "http", identity=B)
    text = ing.metrics.render().decode()
    kinds = {line.split('kind="')[1].split('"')[0] for line in text.splitlines()
             if line.startswith("autorepair_unmapped_alerts_total{")}
    assert "vendor_fault" in kinds and "other" in kinds
    assert len([k for k in kinds if k.startswith("madeup")]) == 2
    assert ing.metrics.identity_limited_total.labels("label_value")._value.get() == 8


def _nccl(node: str, comm: str, nranks: int = 4) -> ExportMetricsServiceRequest:
    recs = [NcclRecord(comm, "AllReduce", 1, r, nranks, 1.0) for r in range(nranks)]
    return metrics_request({"host.name": node, "autorepair.cluster.id": "c1"},
                           [nccl_metric(recs, now_ns=1)])


async def test_nccl_communicators_are_bounded_per_identity_and_never_evict_a_neighbour(
) -> None:
    cfg = AutorepairConfig.model_validate({
        "nccl": {"max_ranks": 16, "max_nranks": 8},
        "ingest": {"limits": {"nccl_communicators_per_collector": 3}},
        "clusters": [{"name": "c1", "nodes": [{"name": "n01"}, {"name": "n02"}]}],
    })
    ing = Ingestor(cfg)
    r, _ = await ing.handle_metrics(_nccl("n02", "b0"), "grpc", identity=B)
    assert r.partial_success.rejected_data_points == 0
    for i in range(6):
        await ing.handle_metrics(_nccl("n01", f"a{i}"), "grpc", identity=A)
    r, _ = await ing.handle_metrics(_nccl("n01", "a9"), "grpc", identity=A)
    assert r.partial_success.rejected_data_points == 4
    assert "nccl_communicators_per_identity" in r.partial_success.error_message
    assert set(ing.nccl.comms) == {("c1", "b0"), ("c1", "a0"), ("c1", "a1"), ("c1", "a2")}
    # the engine is full (16 ranks): B's next communicator evicts A's oldest, not B's
    r, _ = await ing.handle_metrics(_nccl("n02", "b1"), "grpc", identity=B)
    assert r.partial_success.rejected_data_points == 0
    assert ("c1", "b0") in ing.nccl.comms and ("c1", "b1") in ing.nccl.comms
    assert ("c1", "a0") not in ing.nccl.comms
    assert ing.metrics.identity_limited_total.labels("nccl_communicator")._value.get() == 4


async def test_one_identity_cannot_fill_the_alert_handoff_queue(temporal_dev_env: Any) -> None:
    """With the real hand-off on the Temporal dev server and no worker yet (deliveries
    wait): collector A's alerts fill its share (``queued_alerts_per_collector`` 3) and its
    next push is refused (503, counted) while B's push is taken; once the node workflows
    take A's alerts, A's share is free again."""
    from temporalio.worker import Worker

    from tests.integration.test_ingest_handoff import FakeNodeWorkflow

    client = temporal_dev_env.client
    queue = f"share-{uuid.uuid4().hex[:8]}"
    cl = f"qs-{uuid.uuid4().hex[:6]}"
    cfg = AutorepairConfig.model_validate({
        "ingest": {"limits": {"queued_alerts_per_collector": 3}},
        "clusters": [{"name": cl, "nodes": [{"name": f"n{i:02d}"} for i in range(1, 6)]}],
    })
    sink = TemporalAlertSink(client, queue, queue_size=100, shards=4, rpc_timeout_s=5,
                             queued_per_identity=cfg.ingest.limits.queued_alerts_per_identity,
                             queued_per_collector=3)
    await sink.start()
    ing = Ingestor(cfg, alert_sink=sink)
    try:
        await ing.handle_logs(_faults(cl, [("n01", "xid"), ("n02", "xid"), ("n03", "xid")]),
                              "http", identity=A)
        with pytest.raises(IdentityShareFull, match="queued_alerts_per_identity"):
            await ing.handle_logs(_faults(cl, [("n04", "xid")]), "http", identity=A)
        assert ing.metrics.identity_limited_total.labels("queued_alerts")._value.get() == 1
        await ing.handle_logs(_faults(cl, [("n05", "xid")]), "http", identity=B)  # taken
        assert sink.depth() == 4
        async with Worker(client, task_queue=queue, workflows=[FakeNodeWorkflow]):
            for _ in range(200):
                if sink.depth() == 0:
                    break
                await asyncio.sleep(0.1)
            assert sink.depth() == 0
            await ing.handle_logs(_faults(cl, [("n04", "xid")]), "http", identity=A)
            for _ in range(200):
                if sink.depth() == 0:
                    break
                await asyncio.sleep(0.1)
    finally:
        await sink.stop(drain_timeout_s=0.5)
        for i in range(1, 6):
            try:
                await client.get_workflow_handle(workflow_id_node(cl, f"n{i:02d}")).terminate()
            except RPCError:
                pass  # never started


@pytest.mark.parametrize("order", [("gpu-01", "gpu-02"), ("gpu-02", "gpu-01")])
async def test_repeated_identity_key_through_the_receiver_with_a_node_token(
        tmp_path: Path, order: tuple[str, str]) -> None:
    """A node token for gpu-01 sends a resource naming ``host.name`` twice (its own node
    and another, in either order): refused whole at the real HTTP receiver, whichever
    value a lenient reader would keep; nothing is recorded for either node."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceResponse,
    )
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    tokens = tmp_path / "tokens"
    tokens.write_text("tok-1 node c1/gpu-01\n")
    sink = ListSink()
    cfg = AutorepairConfig.model_validate({
        "ingest": {"host": "127.0.0.1", "otlp_grpc_port": 0, "otlp_http_port": 0,
                   "api_port": 0, "admin_port": 0, "tokens_file": str(tokens)},
        "clusters": [{"name": "c1", "nodes": [{"name": "gpu-01"}, {"name": "gpu-02"}]}],
    })
    svc = IngestService(cfg, alert_sink=sink)
    await svc.start()
    try:
        req = make_fault_request("c1", order[0], kind="xid", code=79, body="NVRM: Xid 79")
        kv = KeyValue(key="host.name")
        kv.value.string_value = order[1]
        req.resource_logs[0].resource.attributes.append(kv)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
            r = await c.post("/v1/logs", content=req.SerializeToString(),
                             headers={**PB, "Authorization": "Bearer tok-1"})
        assert r.status_code in (200, 403), r.text
        if r.status_code == 200:
            resp = ExportLogsServiceResponse.FromString(r.content)
            assert resp.partial_success.rejected_log_records == 1
            assert "'host.name' repeated" in resp.partial_success.error_message
        assert sink.alerts == [] and svc.ingestor.nodes == {}
    finally:
        await svc.stop()
