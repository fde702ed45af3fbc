"""The batched guard shell (issue 30 item 1) on the real workflow (time-skipping server,
real ledger, the fidelity interceptor): a request that arrives while the guard waits to
continue as new is carried into the next run and answered, not lost."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger_activities import LedgerActivities
from tests.bench.support.lease_sink import SINK_WORKFLOW, LeaseSink
from tests.workflows.conftest import Harness
from tests.workflows.fidelity import FidelityInterceptor, FidelityViolation
from workflows.activity_api import ACT, Notification
from workflows.guard import ClusterGuardWorkflow
from workflows.models import Alert, Severity
from workflows.protocol import (
    GUARD_SIGNAL_ACQUIRE,
    GUARD_SIGNAL_CLUSTER_ALERT,
    GUARD_WORKFLOW,
    GuardInput,
    LeaseReply,
    LeaseRequest,
    workflow_id_guard,
)


class SlowNotify:
    """``notify`` that waits until released (a slow webhook), so the guard's effect is in
    flight when it decides to continue as new."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.sent: list[Notification] = []

    @activity.defn(name=ACT.notify)
    async def notify(self, n: Notification) -> None:
        self.entered.set()
        await self.release.wait()
        self.sent.append(n)


async def test_request_arriving_while_the_guard_continues_as_new_is_answered(
    harness: Harness, ledger_pool: Any
) -> None:
    h = harness
    queue = f"guard-batch-{uuid.uuid4().hex[:8]}"
    slow = SlowNotify()
    cluster = h.cluster.cluster
    async with Worker(
        h.client,
        task_queue=queue,
        workflows=[ClusterGuardWorkflow, LeaseSink],
        activities=[*LedgerActivities(ledger_pool).all(), h.load_policy, slow.notify,
                    *GuardReplyActivities(h.client).all()],
        interceptors=[FidelityInterceptor()],
        workflow_failure_exception_types=[FidelityViolation],
    ):
        # carried history limit 1: after every batch the machine commands continue-as-new
        guard = await h.client.start_workflow(
            GUARD_WORKFLOW, GuardInput(cluster=cluster, carried={"history_limit": 1}),
            id=workflow_id_guard(cluster), task_queue=queue)
        first_run = guard.result_run_id
        alert = Alert(alert_id=f"panic/{cluster}", cluster=cluster, node="*", kind="panic",
                      severity=Severity.critical, summary="ingest panic mode",
                      description="too many faults", level=True, source="ingest",
                      observed_at=datetime.now(UTC))
        await guard.signal(GUARD_SIGNAL_CLUSTER_ALERT, alert)
        # the alert's notification is in flight: continue-as-new waits for it
        await asyncio.wait_for(slow.entered.wait(), 30)
        sink = await h.client.start_workflow(SINK_WORKFLOW, id=f"sink/{cluster}/gpu-01",
                                             task_queue=queue, result_type=LeaseReply)
        await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
            repair_id="r-late", workflow_id=sink.id, cluster=cluster, node="gpu-01",
            automatic=False))
        slow.release.set()
        reply = await asyncio.wait_for(sink.result(), 30)
        assert reply.repair_id == "r-late" and reply.granted, reply
        desc = await h.client.get_workflow_handle(guard.id).describe()
        assert desc.run_id != first_run  # it did continue as new, carrying the request
        assert slow.sent and slow.sent[0].event == "cluster_alert"
