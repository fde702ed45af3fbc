"""Issue 27 item 10: node and cluster names are validated at decode with one rule (the
repair API's), reserved names refused; sender-chosen values that become keys, labels,
cohorts or log fields are validated; a resource repeating an identity key is refused.

``host.name="*"`` from a collector used to reach the cluster guard and its notifications
(a fake ``breaker_tripped`` page): ``*`` is the node of cluster-level alerts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from pydantic import ValidationError

from ingest.otlp import make_fault_request, make_metrics_request
from ingest.pipeline import Ingestor
from ingest.service import IngestService
from workers.repairs.models import RepairCreate
from workflows.config import AutorepairConfig, IngestConfig, ThresholdConfig
from workflows.models import Alert
from workflows.names import check_name, name_problem

PB = {"Content-Type": "application/x-protobuf"}


class ListSink:
    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    async def submit(self, alert: Alert) -> None:
        self.alerts.append(alert)


BAD_NAMES = ["*", "", "a/b", "gpu-01 kind=xid", "gpu-01\nevent=breaker_tripped", "-gpu",
             "x" * 254, "gpu\x00", "gpü-01"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_one_rule_refuses_reserved_and_hostile_names(name: str) -> None:
    why = name_problem(name, "host.name")
    assert why is not None and why.startswith("host.name: ")
    with pytest.raises(ValidationError) as ei:
        RepairCreate(node=name, mode="reboot", request_id="r-1", reason="test")
    assert ei.value.errors()[0]["loc"] == ("node",)
    with pytest.raises(ValidationError):
        RepairCreate(node="gpu-01", cluster=name, mode="reboot", request_id="r-1",
                     reason="test")


@pytest.mark.parametrize("name", ["gpu-01", "ip-10-0-0-1.ec2.internal", "node_7", "a1:b@c"])
def test_ordinary_names_pass(name: str) -> None:
    assert check_name(name, "host.name") == name
    assert RepairCreate(node=name, mode="reboot", request_id="r-1", reason="t").node == name


@pytest.mark.parametrize(("where", "value"), [
    ("node", "*"), ("cluster", "*"), ("node", "gpu-01\nevent=breaker_tripped"),
    ("cluster", "prod/x"), ("cohort", "train ing"), ("pool", "p=1"), ("k8s", "*"),
    ("kind", "xid\nevent=forged"),
])
async def test_decode_refuses_bad_names(where: str, value: str) -> None:
    cfg = AutorepairConfig.model_validate(
        {"clusters": [{"name": "c1", "nodes": [{"name": "gpu-01"}]}]})
    sink = ListSink()
    ing = Ingestor(cfg, alert_sink=sink)
    node = value if where == "node" else "gpu-01"
    cluster = value if where == "cluster" else "c1"
    kind = value if where == "kind" else "xid"
    req = make_fault_request(cluster, node, kind=kind, code=79, body="NVRM: Xid 79")
    extra = {"cohort": "autorepair.workload_type", "pool": "autorepair.node_pool",
             "k8s": "k8s.node.name"}.get(where)
    if extra:
        kv = KeyValue(key=extra)
        kv.value.string_value = value
        req.resource_logs[0].resource.attributes.append(kv)
    resp, _ = await ing.handle_logs(req, "http")
    assert sink.alerts == []
    assert resp.partial_success.rejected_log_records == 1
    msg = resp.partial_success.error_message
    assert "not a valid name" in msg or "reserved name" in msg, msg


async def test_repeated_identity_key_is_refused() -> None:
    cfg = AutorepairConfig.model_validate({"clusters": [{"name": "c1", "nodes": [
        {"name": "gpu-01"}, {"name": "gpu-02"}]}]})
    sink = ListSink()
    ing = Ingestor(cfg, alert_sink=sink)
    req = make_fault_request("c1", "gpu-01", kind="xid", code=79, body="NVRM: Xid 79")
    kv = KeyValue(key="host.name")
    kv.value.string_value = "gpu-02"
    req.resource_logs[0].resource.attributes.append(kv)
    resp, _ = await ing.handle_logs(req, "http")
    assert sink.alerts == [] and resp.partial_success.rejected_log_records == 1
    assert "'host.name' repeated" in resp.partial_success.error_message
    # the contract key and its Ingero alias naming different nodes
    m = make_metrics_request("c1", "gpu-01", 0.9,
                             extra_resource={"ingero.node.id": "gpu-02"})
    mresp, _ = await ing.handle_metrics(m, "http")
    assert mresp.partial_success.rejected_data_points >= 1
    assert ing.nodes == {}


async def test_star_node_from_a_collector_never_reaches_the_guard(tmp_path: Path) -> None:
    """Through the real HTTP receiver with a collector token of the cluster."""
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-col collector sec  # the cluster's collector\n")
    sink = ListSink()
    cfg: Any = AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0,
                            api_port=0, admin_port=0, tokens_file=str(tokens)),
        threshold=ThresholdConfig(push_interval_s=3600))
    svc = IngestService(cfg, alert_sink=sink)
    await svc.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
            body = make_fault_request("sec", "*", kind="xid", code=79,
                                      body="NVRM: Xid 79").SerializeToString()
            r = await c.post("/v1/logs", content=body,
                             headers={**PB, "Authorization": "Bearer tok-col"})
            assert r.status_code in (200, 400), r.status_code
        assert sink.alerts == []
        assert svc.ingestor.alerts_submitted == 0
    finally:
        await svc.stop()


async def test_nccl_communicator_must_pass_the_name_rule() -> None:
    """A communicator id becomes an engine key, a metric label and a log field."""
    from agent.nccl import NcclRecord, nccl_metric
    from agent.otlp import metrics_request

    ing = Ingestor(AutorepairConfig())
    recs = [NcclRecord("abc\nevent=forged", "AllReduce", 1, 0, 4, 1.0),
            NcclRecord("k1", "All Reduce", 1, 1, 4, 1.0),
            NcclRecord("k1", "AllReduce", 1, 2, 4, 1.0)]
    req = metrics_request({"host.name": "n1", "autorepair.cluster.id": "c"},
                          [nccl_metric(recs, now_ns=1)])
    resp, _ = await ing.handle_metrics(req, "grpc")
    assert resp.partial_success.rejected_data_points == 2
    assert "nccl.comm_id_hash" in resp.partial_success.error_message
    assert "nccl.op_type" in resp.partial_success.error_message
    assert list(ing.nccl.comms) == [("c", "k1")]


async def test_sender_chosen_evidence_keys_never_forge_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = AutorepairConfig.model_validate(
        {"ingest": {"max_evidence_value_chars": 64},
         "clusters": [{"name": "c1", "nodes": [{"name": "gpu-01"}]}]})
    sink = ListSink()
    ing = Ingestor(cfg, alert_sink=sink)
    big = "a" * 100
    req = make_fault_request("c1", "gpu-01", kind="xid", code=79, body="NVRM: Xid 79",
                             evidence={"k\nevent=breaker_tripped cluster=c1": big})
    with caplog.at_level("WARNING", logger="autorepair.ingest"):
        await ing.handle_logs(req, "http")
    capped = [r.getMessage() for r in caplog.records if "event=alert_capped" in r.getMessage()]
    assert capped and all("\n" not in m for m in capped)
