"""Local activities on the alert → repair path (issue 30 item 2, ``workflows/local.py``).

- the node's first task and the repair's ledger and policy calls leave markers, not
  activity round trips, in their histories; the scheduler, BMC and notification calls
  stay regular activities;
- a ledger write that keeps failing past its local tries (cut here to 3) goes on
  as the same regular activity with the same retry policy, and the repair completes with
  the write in the ledger (retried without end, as before);
- a permanent failure of a local call ends the repair as the regular activity's did.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

import workflows.local as local
from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from tests.workflows.conftest import OWN_WORKFLOWS, FakeCluster, Harness, make_alert
from tests.workflows.fake_validation import FakeValidationWorkflow
from tests.workflows.helpers import as_repair_handle, result_skipping
from workflows.activity_api import ACT, NodePolicy, NodeRef, PolicySnapshot, TransitionRecord
from workflows.config import PolicyConfig
from workflows.models import Action, RepairRequest, RepairStatus, Stage
from workflows.protocol import workflow_id_guard, workflow_id_node, workflow_id_repair

#: The short ledger and policy calls of the alert → repair path (the issue's list).
LOCAL = {ACT.ledger_record_alert, ACT.load_node_policy, ACT.ledger_upsert_repair,
         ACT.ledger_record_transition, ACT.ledger_attempt_history}


async def _history(h: Harness, wid: str) -> tuple[set[str], int]:
    """Regular activity types scheduled in ``wid``'s history, and its marker count."""
    scheduled: set[str] = set()
    markers = 0
    async for e in h.client.get_workflow_handle(wid).fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled.add(e.activity_task_scheduled_event_attributes.activity_type.name)
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            markers += 1
    return scheduled, markers


async def test_the_alert_to_repair_path_makes_no_round_trip_for_ledger_and_policy(
    harness: Harness,
) -> None:
    h = harness
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-03", 1))
    assert d.repair_id
    status = await result_skipping(h, "gpu-03", d.repair_id)
    assert status.stage == Stage.succeeded
    node_acts, node_markers = await _history(h, workflow_id_node(h.cluster.cluster, "gpu-03"))
    rep_acts, rep_markers = await _history(
        h, workflow_id_repair(h.cluster.cluster, "gpu-03", d.repair_id))
    assert not (node_acts | rep_acts) & LOCAL, node_acts | rep_acts
    assert node_markers >= 3 and rep_markers >= 5, (node_markers, rep_markers)
    # long or external calls stay regular activities (Temporal dispatches and retries them)
    assert {ACT.cordon_node, ACT.check_idle, ACT.drain_node, ACT.node_health,
            ACT.power_cycle_machine} <= rep_acts
    # and the ledger holds what the local calls wrote
    row = await h.ledger.get_repair(d.repair_id)
    assert row is not None and row["stage"] == Stage.succeeded.value
    assert row["transitions"][0]["stage"] == Stage.recommended.value


def _worker(h: Harness, pool: Any, queue: str, transition: Any) -> Worker:
    """The harness's worker with ``transition`` as ``ledger_record_transition``."""
    acts = [a for a in LedgerActivities(pool).all()
            if a.__temporal_activity_definition.name != ACT.ledger_record_transition]
    return Worker(h.client, task_queue=queue,
                  workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
                  activities=[*acts, transition, *h.cluster.scheduler_activities(),
                              *h.policy_activities(), *GuardReplyActivities(h.client).all()])


async def _repair(client: Client, cluster: str, queue: str, rid: str) -> RepairStatus:
    req = RepairRequest(repair_id=rid, cluster=cluster, node="gpu-04",
                        action=Action.power_cycle, alerts=[make_alert(cluster, "gpu-04", rid)])
    handle = as_repair_handle(await client.start_workflow(
        "RepairWorkflow", req, id=workflow_id_repair(cluster, "gpu-04", rid),
        task_queue=queue, result_type=RepairStatus))
    return await handle.result()


@pytest.mark.devserver
async def test_a_ledger_write_failing_past_the_local_bound_goes_on_as_an_activity(
    temporal_dev_env: WorkflowEnvironment, ledger_pool: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the local tries cut to 3: the write fails six times, the local tries stop
    after three and the same write goes on through the server, where it succeeds."""
    monkeypatch.setattr(local, "LOCAL_ATTEMPTS", 3)
    env = temporal_dev_env
    sfx = uuid.uuid4().hex[:8]
    fake = FakeCluster(cluster=f"l-{sfx}", nodes=["gpu-04"])
    policy = PolicyConfig()
    policy.consent.mode = "automatic"
    queue, bmc = f"local-{sfx}", f"local-bmc-{sfx}"
    real = LedgerActivities(ledger_pool)
    calls: list[str] = []

    @activity.defn(name=ACT.ledger_record_transition)
    async def flaky(t: TransitionRecord) -> None:
        """PostgreSQL unreachable for the first six writes of ``recommended``."""
        calls.append("local" if activity.info().is_local else "regular")
        if t.stage == Stage.recommended and len(calls) <= 6:
            raise ApplicationError("connection refused (injected)")
        await real.record_transition(t)

    @activity.defn(name=ACT.load_policy)
    async def load_policy(cluster: str) -> PolicySnapshot:
        return PolicySnapshot(cluster=cluster, policy=policy, gpu_nodes=8, scheduler="slurm",
                              bmc_task_queue=bmc)

    @activity.defn(name=ACT.load_node_policy)
    async def load_node_policy(ref: NodeRef) -> NodePolicy:
        return NodePolicy.of(await load_policy(ref.cluster), ref.node)

    acts = [a for a in real.all()
            if a.__temporal_activity_definition.name != ACT.ledger_record_transition]
    async with (
        # not sandboxed: the workflows read the monkeypatched workflows.local (the
        # sandbox imports a copy of its own)
        Worker(env.client, task_queue=queue, workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
               activities=[*acts, flaky, load_policy, load_node_policy,
                           *fake.scheduler_activities(),
                           *GuardReplyActivities(env.client).all()],
               workflow_runner=UnsandboxedWorkflowRunner()),
        Worker(env.client, task_queue=bmc, activities=fake.machine_activities()),
    ):
        status = await asyncio.wait_for(_repair(env.client, fake.cluster, queue, "flaky-1"), 120)
        assert status.stage == Stage.succeeded, status.detail
        # local tries within the 3 s bound, then the same call through the server
        assert calls[0] == "local" and "regular" in calls[:7], calls
        assert calls[:4] == ["local", "local", "local", "regular"], calls
        scheduled: set[str] = set()
        handle = env.client.get_workflow_handle(workflow_id_repair(fake.cluster, "gpu-04",
                                                                   "flaky-1"))
        async for e in handle.fetch_history_events():
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled.add(e.activity_task_scheduled_event_attributes.activity_type.name)
        assert ACT.ledger_record_transition in scheduled
        with contextlib.suppress(RPCError):
            await env.client.get_workflow_handle(workflow_id_guard(fake.cluster)).terminate()
    row = await Ledger(ledger_pool).get_repair("flaky-1")
    assert row is not None
    assert row["transitions"][0]["stage"] == Stage.recommended.value


async def test_a_permanent_ledger_failure_ends_the_repair_as_before(
    harness: Harness, ledger_pool: Any,
) -> None:
    h = harness
    calls: list[bool] = []

    @activity.defn(name=ACT.ledger_record_transition)
    async def broken(t: TransitionRecord) -> None:
        calls.append(activity.info().is_local)
        raise ApplicationError("ledger.dsn: schema missing (injected)",
                               type="ConfigurationError", non_retryable=True)

    queue = f"{h.task_queue}-broken-{uuid.uuid4().hex[:6]}"
    async with _worker(h, ledger_pool, queue, broken):
        status = await _repair(h.client, h.cluster.cluster, queue, "broken-1")
    assert status.stage == Stage.failed
    assert "ledger_record_transition failed" in status.history[-1].reason
    # one try per write (non-retryable), never retried through the server
    assert calls and all(calls)
    assert h.cluster.count("cordon") == 0
