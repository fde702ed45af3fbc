"""The guard's answer to a lease request can reach the repair in the same workflow task as
the completion of the request's own send (a loaded worker picks that task up late). The
signal is handled first; the repair must keep the answer, not clear it when the send
completes and then wait :data:`workflows.protocol.LEASE_RESEND_S` (5 min) for a re-send.

Found by CI (stop 24): ``test_second_repair_on_the_same_node_is_queued`` saw the second
repair stay "waiting for a lease from the cluster guard" for 30 s on a loaded machine.
Here the ordering is forced: the second repair runs on its own worker, whose executor
holds the activation that resolves the send until the guard has delivered its answer (the
guard's history says so; the server buffers the answer behind the held task), then fails
that workflow task; the retry carries both events in one task. The worker's 2 s deadlock
detector is off, so the task fails only once the answer is buffered, however loaded the
machine.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger_activities import LedgerActivities
from tests.workflows.conftest import OWN_WORKFLOWS, Harness
from tests.workflows.fake_validation import FakeValidationWorkflow
from tests.workflows.helpers import (
    eventually,
    guard_status,
    repair_status,
    terminate_between_tasks,
    wait_stage,
)
from workflows.activity_api import ACT
from workflows.models import Action, RepairRequest, RepairStatus, Requester, RequesterKind, Stage
from workflows.protocol import workflow_id_guard, workflow_id_repair

USER = Requester(kind=RequesterKind.user, name="ops")


class _HoldSendCompletion(ThreadPoolExecutor):
    """Workflow-task executor that holds the first activation of ``workflow_id`` resolving
    an external signal (the repair's send to the guard) until :attr:`release` is set, then
    fails it, so the workflow task is retried with every event recorded meanwhile.
    :attr:`held` is set once it holds."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(max_workers=8)
        self.workflow_id = workflow_id
        self.held = threading.Event()
        self.release = threading.Event()
        self._runs: dict[str, str] = {}
        self._done = False

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        act = args[0] if args else None
        jobs = list(getattr(act, "jobs", ()))
        for job in jobs:
            if job.HasField("initialize_workflow"):
                self._runs[act.run_id] = job.initialize_workflow.workflow_id
        if (
            not self._done
            and act is not None
            and self._runs.get(act.run_id) == self.workflow_id
            and any(job.HasField("resolve_signal_external_workflow") for job in jobs)
        ):
            self._done = True

            def hold(*_: Any, **__: Any) -> Any:
                self.held.set()
                self.release.wait(60)
                raise RuntimeError("activation held by the test, then failed on purpose")

            return super().submit(hold, *args, **kwargs)
        return super().submit(fn, *args, **kwargs)


async def _guard_answered(h: Harness, wid: str) -> bool:
    """Whether the guard's history shows a ``lease`` reply to ``wid`` delivered: a
    ``guard_send_leases`` activity whose input names ``wid`` completed (issue 30 item 1:
    the replies go out as one activity per batch, which returns once each signal was
    accepted by the server)."""
    scheduled: set[int] = set()
    async for ev in h.client.get_workflow_handle(
        workflow_id_guard(h.cluster.cluster)
    ).fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = ev.activity_task_scheduled_event_attributes
            if a.activity_type.name == ACT.guard_send_leases and any(
                    wid.encode() in p.data for p in a.input.payloads):
                scheduled.add(ev.event_id)
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a2 = ev.activity_task_completed_event_attributes
            if a2.scheduled_event_id in scheduled and any(
                    b'"delivered"' in p.data for p in a2.result.payloads):
                return True
    return False


async def test_guard_answer_in_the_same_task_as_the_send_is_kept(
    harness: Harness, ledger_pool: Any
) -> None:
    h = harness
    h.gpu_nodes = 100
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls["gpu-01"] = 10_000
    c = h.cluster.cluster
    first = RepairRequest(
        repair_id="n1", cluster=c, node="gpu-01", action=Action.reboot, requester=USER, alerts=[]
    )
    await h.client.start_workflow(
        "RepairWorkflow", first, id=workflow_id_repair(c, "gpu-01", "n1"),
        task_queue=h.task_queue, result_type=RepairStatus,
    )
    await wait_stage(h, "gpu-01", "n1", Stage.waiting_for_idle)

    wid = workflow_id_repair(c, "gpu-01", "n2")
    executor = _HoldSendCompletion(wid)
    queue = f"{h.task_queue}-held"
    ledger_acts = LedgerActivities(ledger_pool)
    worker = Worker(
        h.client,
        task_queue=queue,
        workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
        activities=[*ledger_acts.all(), *h.cluster.scheduler_activities(), *h.policy_activities(),
                    *GuardReplyActivities(h.client).all()],
        workflow_task_executor=executor,
        max_concurrent_workflow_tasks=8,
    )
    # the held task must fail when the test says, not when the 2 s detector fires
    wf_worker = worker._workflow_worker
    assert wf_worker is not None and hasattr(wf_worker, "_deadlock_timeout_seconds")
    wf_worker._deadlock_timeout_seconds = None
    try:
        async with worker:
            second = first.model_copy(update={"repair_id": "n2"})
            b = await h.client.start_workflow(
                "RepairWorkflow", second, id=wid, task_queue=queue, result_type=RepairStatus
            )

            async def held() -> bool:
                return executor.held.is_set()

            await eventually(held, "the send's completion held on the second repair's worker")

            async def answered() -> bool:
                return await _guard_answered(h, wid)

            await eventually(answered, "the guard's answer delivered to the second repair")
            executor.release.set()

            async def queued() -> bool:
                st = await repair_status(h, "gpu-01", "n2")
                return "node gpu-01 busy with repair n1" in st.detail

            async def detail() -> str:
                return (await repair_status(h, "gpu-01", "n2")).detail

            # well within LEASE_RESEND_S: the answer was kept, not waited for again
            await eventually(queued, "the guard's answer kept", explain=detail)
            g = await guard_status(h)
            assert [x.repair_id for x in g.leases] == ["n1"]
            assert [p.repair_id for p in g.pending] == ["n2"]
            assert h.cluster.count("cordon", "gpu-01") == 1
            # the forced ordering happened: the held task failed, and the answer was
            # delivered before it did
            types = [ev.event_type async for ev in b.fetch_history_events()]
            failed = types.index(EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
            assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED in types[failed:]
            await terminate_between_tasks(h, wid)
    finally:
        executor.release.set()
        executor.shutdown(wait=False)
