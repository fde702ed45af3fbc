"""autorepair_repairs_total / autorepair_breaker_open on the ingest's /metrics, read from
Temporal (dev server with our search attributes)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from ingest.metrics import IngestMetrics
    from ingest.repair_metrics import RepairMetricsPoller
    from workflows.config import ProvidersConfig
    from workflows.models import RepairStatus
    from workflows.protocol import REPAIR_FAILED, GuardStatus
    from workflows.providers import ProviderResolver

ACTION = SearchAttributeKey.for_keyword("RepairAction")
STATE = SearchAttributeKey.for_keyword("RepairState")


@workflow.defn(name="RepairWorkflow")
class EndedRepair:
    """Stands in for a repair that reached a terminal state (same type and attributes)."""

    @workflow.run
    async def run(self, outcome: str) -> str:
        workflow.upsert_search_attributes([STATE.value_set(outcome)])
        return outcome


@workflow.defn(name="RepairWorkflow")
class CostedRepair:
    """Stands in for a finished repair: returns the final status it is given."""

    @workflow.run
    async def run(self, status: RepairStatus) -> RepairStatus:
        workflow.upsert_search_attributes([STATE.value_set(status.stage.value)])
        if status.stage.value in ("failed", "timed_out"):
            # as RepairWorkflow ends such a repair: the workflow fails, the final status
            # is the failure's first detail
            raise ApplicationError(f"repair {status.stage.value}", status,
                                   type=REPAIR_FAILED, non_retryable=True)
        return status


@workflow.defn(name="ClusterGuardWorkflow")
class TrippedGuard:
    """Stands in for a guard whose breaker is open."""

    def __init__(self) -> None:
        self.done = False
        self.cluster = ""

    @workflow.run
    async def run(self, cluster: str) -> None:
        self.cluster = cluster
        await workflow.wait_condition(lambda: self.done)

    @workflow.query(name="status")
    def status(self) -> GuardStatus:
        return GuardStatus(cluster=self.cluster, gpu_nodes=8, budget=1, breaker_threshold=2,
                           breaker_window_s=600, breaker_open=True)

    @workflow.signal
    def finish(self) -> None:
        self.done = True


def _value(m: IngestMetrics, name: str, labels: dict[str, str]) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


async def test_closed_repairs_counted_once_and_breaker_state(temporal_dev_env: Any) -> None:
    client = temporal_dev_env.client
    tq = "metrics-" + uuid.uuid4().hex[:8]
    # a cluster and task queue of its own: the dev server is shared by the session and
    # other tests' repairs close while this one counts
    c1 = "cm-" + uuid.uuid4().hex[:8]
    metrics = IngestMetrics()
    poller = RepairMetricsPoller(client, metrics, lambda: [c1, "c-no-guard"], task_queue=tq,
                                 started_at=datetime.now(UTC) - timedelta(seconds=1))
    async with Worker(client, task_queue=tq, workflows=[EndedRepair, TrippedGuard]):
        for i, (action, outcome) in enumerate([("reboot", "succeeded"), ("reboot", "succeeded"),
                                               ("power_cycle", "failed")]):
            await client.execute_workflow(
                EndedRepair.run, outcome, id=f"repair/{c1}/gpu-0{i}/{uuid.uuid4().hex[:6]}",
                task_queue=tq,
                search_attributes=TypedSearchAttributes([SearchAttributePair(ACTION, action)]),
            )
        guard = await client.start_workflow(TrippedGuard.run, c1, id=f"guard/{c1}", task_queue=tq)
        counted = 0
        for _ in range(50):  # visibility is eventually consistent
            counted += await poller.count_closed()
            if counted >= 3:
                break
            await asyncio.sleep(0.2)
        assert counted == 3
        assert await poller.count_closed() == 0  # the overlap re-read counts nothing twice
        assert _value(metrics, "autorepair_repairs_total",
                      {"action": "reboot", "outcome": "succeeded"}) == 2
        assert _value(metrics, "autorepair_repairs_total",
                      {"action": "power_cycle", "outcome": "failed"}) == 1
        assert await poller.breaker_states() == {c1: True, "c-no-guard": False}
        assert _value(metrics, "autorepair_breaker_open", {"cluster_id": c1}) == 1
        assert _value(metrics, "autorepair_breaker_open", {"cluster_id": "c-no-guard"}) == 0
        await guard.signal(TrippedGuard.finish)
        await guard.result()


async def test_downtime_and_cost_of_completed_repairs(temporal_dev_env: Any) -> None:
    client = temporal_dev_env.client
    tq = "cost-" + uuid.uuid4().hex[:8]
    metrics = IngestMetrics()
    providers = ProviderResolver(ProvidersConfig.model_validate({"rules": [
        {"match": {"cluster": "cost-c"}, "gpus_per_node": 4, "hourly_rate": 2.0}]}))
    poller = RepairMetricsPoller(client, metrics, lambda: [], providers=providers, task_queue=tq,
                                 started_at=datetime.now(UTC) - timedelta(seconds=1))
    t0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)

    def status(rid: str, stages: list[tuple[str, float]], kind: str | None) -> RepairStatus:
        alerts = [] if kind is None else [{
            "alert_id": f"a-{rid}", "cluster": "cost-c", "node": "gpu-1", "kind": kind,
            "summary": "s", "observed_at": t0.isoformat()}]
        return RepairStatus.model_validate({
            "repair_id": rid, "cluster": "cost-c", "node": "gpu-1", "stage": stages[-1][0],
            "action": "reboot", "requester": {"kind": "system", "name": "autorepair"},
            "evidence": alerts,
            "history": [{"stage": st, "at": (t0 + timedelta(hours=h)).isoformat()}
                        for st, h in stages]})

    async with Worker(client, task_queue=tq, workflows=[CostedRepair]):
        for st in (
            status("r1", [("recommended", 0), ("cordoning", 0), ("waiting_for_idle", 0.25),
                          ("draining", 1.25), ("running", 3), ("succeeded", 3)], "xid"),
            status("r2", [("recommended", 0), ("cordoning", 1), ("failed", 2)], None),
        ):
            try:
                await client.execute_workflow(CostedRepair.run, st, task_queue=tq,
                                              id=f"repair/cost-c/gpu-1/{st.repair_id}-{tq}")
            except WorkflowFailureError:
                assert st.stage.value == "failed"  # counted all the same (its final status)
        for _ in range(50):  # visibility is eventually consistent
            await poller.count_closed()
            if all(_value(metrics, "autorepair_repair_downtime_gpu_hours_total",
                          {"cluster": "cost-c", "action": "reboot", "fault_kind": k})
                   for k in ("xid", "manual")):
                break
            await asyncio.sleep(0.2)
    xid = {"cluster": "cost-c", "action": "reboot", "fault_kind": "xid"}
    manual = {**xid, "fault_kind": "manual"}
    assert _value(metrics, "autorepair_repair_downtime_gpu_hours_total", xid) == 12.0  # 4 × 3 h
    assert _value(metrics, "autorepair_repair_idle_wait_gpu_hours_total", xid) == 4.0
    assert _value(metrics, "autorepair_repair_cost_total", xid) == 24.0
    assert _value(metrics, "autorepair_repair_downtime_gpu_hours_total", manual) == 4.0
    assert _value(metrics, "autorepair_repair_cost_total", manual) == 8.0
    assert "autorepair_repair_cost_total{" in metrics.render().decode()
