"""The recording interpreter bites on the node's shell too (issue 26 item 5): a
``NodeWorkflow`` that decides one thing itself — it takes an alert as recorded without
the ledger write its machine commanded — fails its workflow at its next call."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.worker import Worker

from tests.workflows import fidelity
from tests.workflows.conftest import Harness, make_alert
from tests.workflows.fidelity import FidelityInterceptor, FidelityViolation
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


async def test_the_check_finds_a_node_shell_that_departs_from_its_machine(
    harness: Harness,
) -> None:
    h = harness
    queue = f"planted-node-{uuid.uuid4().hex[:8]}"
    seen = len(fidelity.VIOLATIONS)
    async with Worker(
        h.client,
        task_queue=queue,
        workflows=[NodeThatSkipsTheLedgerWrite],
        activities=[h.load_policy],
        interceptors=[FidelityInterceptor()],
        workflow_failure_exception_types=[FidelityViolation],
    ):
        handle = await h.client.start_workflow(
            "planted-node-skips-the-ledger-write",
            NodeInput(cluster=h.cluster.cluster, node="gpu-13"),
            id=f"planted/{queue}",
            task_queue=queue,
        )
        update = asyncio.create_task(handle.execute_update(
            NODE_UPDATE_DELIVER_ALERT, make_alert(h.cluster.cluster, "gpu-13", 1),
            result_type=AlertDelivery))
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        update.cancel()
        with contextlib.suppress(BaseException):
            await update
    new = fidelity.VIOLATIONS[seen:]  # (a retried first task may report it again)
    assert new and all("commanded activity 'ledger_record_alert'" in v for v in new), new
