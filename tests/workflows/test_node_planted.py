"""The recording interpreter bites on the node's shell too (issue 26 item 5): a
``NodeWorkflow`` that decides one thing itself — it takes an alert as recorded without
the ledger write its machine commanded — fails its workflow at its next call; and one
that runs the policy read its ``calls`` promise as a local activity through the server
instead (issue 30 item 2) fails at that call: the check tells local activities apart."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.ledger_activities import LedgerActivities
from tests.workflows import fidelity
from tests.workflows.conftest import Harness, make_alert
from tests.workflows.fidelity import FidelityInterceptor, FidelityViolation
from workflows.activity_api import ACT, NodePolicy, NodeRef
from workflows.lifecycle import node as nm
from workflows.models import AlertDelivery, NodeInput
from workflows.node import NodeWorkflow
from workflows.protocol import NODE_UPDATE_DELIVER_ALERT


@workflow.defn(name="planted-node-skips-the-ledger-write", sandboxed=False)
class NodeThatSkipsTheLedgerWrite(NodeWorkflow):
    """Planted shell defect: it answers the ledger write itself instead of making it."""

    @workflow.run
    async def run(self, inp: NodeInput) -> None:
        await super().run(inp)

    async def _execute(self, cmd: nm.Command) -> nm.Event | None:
        if isinstance(cmd, nm.RecordAlert):
            return nm.AlertRecorded(alert_id=cmd.alert.alert_id)
        return await super()._execute(cmd)


@workflow.defn(name="planted-node-reads-policy-through-the-server", sandboxed=False)
class NodeThatReadsPolicyThroughTheServer(NodeWorkflow):
    """Planted shell defect: the policy read its ``calls`` say is a local activity runs
    as a regular one (a round trip through the Temporal server)."""

    @workflow.run
    async def run(self, inp: NodeInput) -> None:
        await super().run(inp)

    async def _execute(self, cmd: nm.Command) -> nm.Event | None:
        if isinstance(cmd, nm.LoadPolicy):
            self._spawn(workflow.start_activity(
                ACT.load_node_policy, NodeRef(cluster=self._inp.cluster, node=self._inp.node),
                result_type=NodePolicy, start_to_close_timeout=timedelta(seconds=30)),
                self._policy_event)
            return None
        return await super()._execute(cmd)


@pytest.mark.parametrize("planted,name,wants", [
    (NodeThatSkipsTheLedgerWrite, "planted-node-skips-the-ledger-write",
     "commanded local_activity 'ledger_record_alert'"),
    (NodeThatReadsPolicyThroughTheServer, "planted-node-reads-policy-through-the-server",
     "activity 'load_node_policy' made where the machine commanded local_activity "
     "'load_node_policy'"),
])
async def test_the_check_finds_a_node_shell_that_departs_from_its_machine(
    harness: Harness, planted: type[NodeWorkflow], name: str, wants: str,
) -> None:
    h = harness
    queue = f"planted-node-{uuid.uuid4().hex[:8]}"
    seen = len(fidelity.VIOLATIONS)
    async with Worker(
        h.client,
        task_queue=queue,
        workflows=[planted],
        activities=[*h.policy_activities(), *LedgerActivities(h.ledger.pool).all()],
        interceptors=[FidelityInterceptor()],
        workflow_failure_exception_types=[FidelityViolation],
    ):
        handle = await h.client.start_workflow(
            name,
            NodeInput(cluster=h.cluster.cluster, node="gpu-13"),
            id=f"planted/{queue}",
            task_queue=queue,
        )
        update = asyncio.create_task(handle.execute_update(
            NODE_UPDATE_DELIVER_ALERT, make_alert(h.cluster.cluster, "gpu-13", 1),
            result_type=AlertDelivery))
        result = asyncio.create_task(handle.result())
        try:
            # a violation inside the update's handler fails the update (the SDK rejects
            # an update whose handler raises a failure type); one in a later step (an
            # activity's outcome, a timer) fails the workflow: which comes first depends
            # on whether the policy read answered before the update arrived
            done, _ = await asyncio.wait({update, result}, timeout=60,
                                         return_when=asyncio.FIRST_COMPLETED)
            assert done, "neither the update nor the workflow failed"
            err = next(iter(done)).exception()
            assert isinstance(err, (WorkflowFailureError, WorkflowUpdateFailedError)), err
            assert "FidelityViolation" in repr(err.cause) or isinstance(
                err, WorkflowFailureError), err.cause
        finally:
            for t in (update, result):
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t
            with contextlib.suppress(RPCError):
                await handle.terminate("test finished")
    new = fidelity.VIOLATIONS[seen:]  # (a retried first task may report it again)
    assert new and all(wants in v for v in new), new
