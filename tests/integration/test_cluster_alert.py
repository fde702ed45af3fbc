"""A cluster-level alert (ingest panic mode) reaches the real ClusterGuardWorkflow by
signal-with-start and lands in the real ledger (dev server, embedded PostgreSQL)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from activities.notify import NotifyActivities
from activities.policy_activities import PolicyActivities
from ingest.handoff import TemporalAlertSink
from workflows.alerts import alert_from_fault
from workflows.config import AutorepairConfig, CatalogueConfig
from workflows.guard import ClusterGuardWorkflow
from workflows.models import AlertOutcome


async def test_panic_alert_recorded_by_the_guard(temporal_dev_env: Any, ledger_pool: Any) -> None:
    client = temporal_dev_env.client
    tq = "guard-" + uuid.uuid4().hex[:8]
    cluster = "c-" + uuid.uuid4().hex[:6]
    cfg = AutorepairConfig()
    alert = alert_from_fault(
        cluster=cluster, node="*", kind="straggler_panic", code=None, gpu=None,
        evidence_text="panic: 12 of 20 active nodes below the threshold",
        evidence={"flagged": 12, "active_nodes": 20}, observed_at=datetime.now(UTC),
        catalogue=CatalogueConfig(), level=True, source="ingest",
    )
    activities = [*LedgerActivities(ledger_pool).all(), PolicyActivities(cfg).load_policy,
                  NotifyActivities(cfg.notifications).notify,
                  *GuardReplyActivities(client).all()]
    async with Worker(client, task_queue=tq, workflows=[ClusterGuardWorkflow],
                      activities=activities):
        sink = TemporalAlertSink(client, tq)
        first = await sink.deliver(alert)
        again = await sink.deliver(alert)  # guard already running: same workflow, signalled
        assert first.outcome == again.outcome == AlertOutcome.new
        ledger = Ledger(ledger_pool)
        for _ in range(100):
            got = await ledger.get_alert(alert.alert_id)
            if got is not None:
                break
            await asyncio.sleep(0.1)
        assert got is not None and got.node == "*" and got.severity.value == "critical"
        assert got.mnemonic == "STRAGGLER_PANIC" and got.evidence["flagged"] == 12
        desc = await client.get_workflow_handle(f"guard/{cluster}").describe()
        assert desc.workflow_type == "ClusterGuardWorkflow"
        await client.get_workflow_handle(f"guard/{cluster}").terminate("test over")
