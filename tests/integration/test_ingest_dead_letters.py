"""One bad record never blocks others (ingest caps, bounded hand-off, dead letters).

Real Temporal dev server, real ingest service, embedded PostgreSQL ledger:

* a fault record carrying a 3 MB attribute is refused by the decoder (partial success);
  one carrying ~2 MB within the decoder's per-attribute limits is capped at ingest and
  reaches the real ``NodeWorkflow``, which keeps answering (the next alert of the same node
  is delivered too) — the alert in the ledger names what was cut;
* a node whose workflow never answers (a wedged update) is retried a bounded number of
  times while another node's alerts on the same shard are delivered, then written to the
  ``dead_letters`` table, counted in ``autorepair_alerts_dead_lettered_total`` and logged;
* a workflow that refuses the update dead-letters the alert at once (``rejected``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from temporalio import workflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from activities.notify import NotifyActivities
from activities.policy_activities import PolicyActivities
from ingest.handoff import TemporalAlertSink
from ingest.limits import CUT_KEY, alert_bytes, cap_alert
from ingest.otlp import FAULT_PREFIX, make_fault_request
from ingest.service import IngestService
from workflows.alerts import alert_from_fault
from workflows.config import AutorepairConfig, CatalogueConfig, IngestConfig, ThresholdConfig
from workflows.models import Alert, AlertDelivery, AlertOutcome, NodeInput
from workflows.protocol import NODE_UPDATE_DELIVER_ALERT
from workflows.registry import WORKFLOWS

PB = {"Content-Type": "application/x-protobuf"}
THREE_MB = 3 * 1024 * 1024


def cfg(**ingest: Any) -> AutorepairConfig:
    return AutorepairConfig(
        ingest=IngestConfig(host="127.0.0.1", otlp_grpc_port=0, otlp_http_port=0, api_port=0,
                            admin_port=0, **ingest),
        threshold=ThresholdConfig(push_interval_s=3600),
    )


class LedgerStore:
    """``DeadLetterStore`` on the test's ledger schema."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def record(self, alert: Alert, reason: str, error: str, attempts: int) -> None:
        await self.ledger.record_dead_letter(alert, reason, error, attempts)


def test_cap_alert_bounds_values_and_size() -> None:
    a = alert_from_fault(
        cluster="c", node="n", kind="xid", code=13, gpu=None, evidence_text="x" * 500_000,
        evidence={"big": "y" * THREE_MB, "items": list(range(400_000)), "ok": 1},
        observed_at=__import__("datetime").datetime(2025, 1, 1),
        catalogue=CatalogueConfig(),
    )
    capped, cut = cap_alert(a, max_value_chars=4096, max_bytes=64 * 1024)
    assert set(cut) == {"big", "items", "evidence_text"}
    assert alert_bytes(capped) <= 64 * 1024
    assert capped.alert_id == a.alert_id and capped.evidence["ok"] == 1
    assert capped.evidence[CUT_KEY] == cut
    same, _ = cap_alert(capped, max_value_chars=4096, max_bytes=64 * 1024)
    assert same.evidence["big"] == capped.evidence["big"] and alert_bytes(same) <= 64 * 1024
    small, nothing = cap_alert(alert_from_fault(
        cluster="c", node="n", kind="xid", code=13, gpu=None, evidence_text="t",
        evidence={}, observed_at=a.observed_at, catalogue=CatalogueConfig()),
        max_value_chars=4096, max_bytes=64 * 1024)
    assert nothing == [] and CUT_KEY not in small.evidence


async def test_three_megabyte_attribute_never_wedges_the_node(
    temporal_dev_env: Any, ledger_pool: Any
) -> None:
    client = temporal_dev_env.client
    tq = "dl-" + uuid.uuid4().hex[:8]
    cluster = "c-" + uuid.uuid4().hex[:6]
    config = cfg()
    ledger = Ledger(ledger_pool)
    activities = [*LedgerActivities(ledger_pool).all(), *PolicyActivities(config).all(),
                  NotifyActivities(config.notifications).notify,
                  *GuardReplyActivities(client).all()]
    sink = TemporalAlertSink(client, tq, max_value_chars=config.ingest.max_evidence_value_chars,
                             max_alert_bytes=config.ingest.max_alert_bytes,
                             dead_letters=LedgerStore(ledger))
    svc = IngestService(config, sink)
    async with Worker(client, task_queue=tq, workflows=WORKFLOWS, activities=activities):
        await svc.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
                line = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception"
                # a 3 MB attribute: refused by the decoder's per-value limit
                # (ingest.max_attribute_value_bytes), reported in partial_success
                huge = make_fault_request(
                    cluster, "gpu-01", kind="xid", code=13, gpu="0000:3b:00", body=line,
                    time_ns=1_699_999_999 * 10**9, evidence={"dump": "A" * THREE_MB})
                r = await c.post("/v1/logs", headers=PB, content=huge.SerializeToString())
                assert r.status_code == 200, r.content
                assert ExportLogsServiceResponse.FromString(
                    r.content).partial_success.rejected_log_records == 1
                # ~2 MB inside the decoder's limits: a 100-element array of 16 000-character
                # strings and a 16 000-character string outside the fault prefix
                big = make_fault_request(
                    cluster, "gpu-01", kind="xid", code=13, gpu="0000:3b:00", body=line,
                    time_ns=1_700_000_000 * 10**9)
                rec = big.resource_logs[0].scope_logs[0].log_records[0]
                kv = rec.attributes.add()
                kv.key = "autorepair.node.dump"
                kv.value.string_value = "A" * 16_000
                kv = rec.attributes.add()
                kv.key = FAULT_PREFIX + "related_evidence"
                kv.value.array_value.values.extend(
                    [type(kv.value)(string_value="B" * 16_000) for _ in range(100)])
                assert big.ByteSize() > 1_600_000
                r = await c.post("/v1/logs", headers=PB, content=big.SerializeToString())
                assert r.status_code == 200, r.content
                assert not ExportLogsServiceResponse.FromString(
                    r.content).partial_success.rejected_log_records
                nxt = make_fault_request(cluster, "gpu-01", kind="xid", code=13,
                                         gpu="0000:3b:00", body=line + " again",
                                         time_ns=1_700_000_001 * 10**9)
                r = await c.post("/v1/logs", headers=PB, content=nxt.SerializeToString())
                assert r.status_code == 200
            for _ in range(300):
                if sink.counts["delivered"] >= 2:
                    break
                await asyncio.sleep(0.1)
            assert sink.counts["delivered"] == 2 and sink.counts["dead_lettered"] == 0
            alerts = await ledger.list_alerts(cluster=cluster)
            assert len(alerts) == 2
            capped = next(a for a in alerts if a.evidence.get(CUT_KEY))
            assert set(capped.evidence[CUT_KEY]) == {"node.dump", "related_evidence"}
            assert alert_bytes(capped) < config.ingest.max_alert_bytes
            assert all(r.outcome != AlertOutcome.deduplicated for r in sink.last_results.values())
        finally:
            await svc.stop()
            try:
                await client.get_workflow_handle(f"node/{cluster}/gpu-01").terminate("done")
            except Exception:
                pass


@workflow.defn(name="NodeWorkflow", sandboxed=False)
class StubbornNodeWorkflow:
    """Answers like the entity, except: node ``wedged`` never answers an update, node
    ``refuses`` refuses every update."""

    def __init__(self) -> None:
        self.node = ""

    @workflow.run
    async def run(self, inp: NodeInput) -> None:
        self.node = inp.node
        await workflow.wait_condition(lambda: False)

    @workflow.update(name=NODE_UPDATE_DELIVER_ALERT)
    async def deliver_alert(self, alert: Alert) -> AlertDelivery:
        if alert.node == "wedged":
            await workflow.wait_condition(lambda: False)
        if alert.node == "refuses":
            raise ApplicationError("alert refused", non_retryable=True)
        return AlertDelivery(alert_id=alert.alert_id, outcome=AlertOutcome.new)


async def test_undeliverable_alert_is_dead_lettered_without_blocking_the_shard(
    temporal_dev_env: Any, ledger_pool: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = temporal_dev_env.client
    tq = "dl-" + uuid.uuid4().hex[:8]
    cluster = "c-" + uuid.uuid4().hex[:6]
    ledger = Ledger(ledger_pool)
    config = cfg(handoff_max_attempts=3)
    service: IngestService
    # one shard: the wedged node, the refusing node and the healthy node share one queue
    sink = TemporalAlertSink(
        client, tq, shards=1, rpc_timeout_s=1.0, max_backoff_s=0.5,
        max_attempts=config.ingest.handoff_max_attempts, dead_letters=LedgerStore(ledger),
        on_dead_letter=lambda r: service.metrics.alerts_dead_lettered_total.labels(r).inc(),
    )
    service = IngestService(config, sink)
    caplog.set_level(logging.ERROR, logger="autorepair.ingest.handoff")
    async with Worker(client, task_queue=tq, workflows=[StubbornNodeWorkflow]):
        await service.start()
        await sink.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}") as c:
                for i, node in enumerate(["wedged", "refuses", "healthy", "wedged",
                                          "healthy"]):
                    body = make_fault_request(cluster, node, kind="xid", code=13,
                                              body=f"NVRM: Xid (PCI:0000:3b:00): 13, {i}",
                                              time_ns=(1_700_000_000 + i) * 10**9)
                    r = await c.post("/v1/logs", headers=PB, content=body.SerializeToString())
                    assert r.status_code == 200
                # the healthy node's alerts go out while the wedged one waits for retries
                for _ in range(100):
                    if sink.counts["delivered"] >= 2:
                        break
                    await asyncio.sleep(0.05)
                assert sink.counts["delivered"] == 2
                assert sink.counts["dead_lettered"] == 1  # only "refuses" so far
                for _ in range(200):
                    if sink.depth() == 0:
                        break
                    await asyncio.sleep(0.1)
                assert sink.depth() == 0
                metrics = (await c.get(f"http://127.0.0.1:{service.api_port}/metrics")).text
            rows = {r["node"] + ":" + r["reason"]: r for r in
                    await ledger.list_dead_letters(cluster=cluster)}
            assert set(rows) == {"wedged:retries_exhausted", "refuses:rejected"}
            assert rows["wedged:retries_exhausted"]["attempts"] == 3
            assert rows["wedged:retries_exhausted"]["alert"]["node"] == "wedged"
            # the wedged node's second alert was not lost behind the first: it too ran out
            # of attempts (its own), in order
            assert sink.counts["dead_lettered"] == 3
            assert ('autorepair_alerts_dead_lettered_total{reason="retries_exhausted"} 2.0'
                    in metrics)
            assert 'autorepair_alerts_dead_lettered_total{reason="rejected"} 1.0' in metrics
            assert any("event=alert_dead_lettered" in r.message and "wedged" in r.message
                       for r in caplog.records)
        finally:
            await service.stop()
            for node in ("wedged", "refuses", "healthy"):
                try:
                    await client.get_workflow_handle(f"node/{cluster}/{node}").terminate("done")
                except Exception:
                    pass
