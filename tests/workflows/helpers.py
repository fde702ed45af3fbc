"""Small helpers shared by the workflow tests."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.testservice.v1 import UnlockTimeSkippingRequest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger_activities import LedgerActivities
from tests.workflows.conftest import Harness, make_alert
from tests.workflows.lease_recorder import RECORDER, LeaseRecorder
from workflows.activity_api import ACT, GuardLedgerState, GuardStateQuery
from workflows.guard import ClusterGuardWorkflow
from workflows.models import Action, RepairRequest, RepairStatus, Stage
from workflows.protocol import (
    GUARD_WORKFLOW,
    REPAIR_FAILED,
    REPAIR_TIMED_OUT,
    GuardInput,
    GuardStatus,
    LeaseReply,
    workflow_id_guard,
    workflow_id_repair,
)


def status_of_failure(err: WorkflowFailureError) -> RepairStatus | None:
    """The final status a RepairWorkflow failed with (a repair that ended ``failed`` or
    ``timed_out``: ``REPAIR_FAILED`` / ``REPAIR_TIMED_OUT`` carry it as their first
    detail), or None for any other failure."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in (REPAIR_FAILED, REPAIR_TIMED_OUT):
        return RepairStatus.model_validate(cause.details[0])
    return None


async def repair_result(handle: WorkflowHandle[Any, Any], **kw: Any) -> RepairStatus:
    """The final status of a repair, whatever way it ended: the workflow's result, or the
    status a failed / timed-out repair failed the workflow with. Other failures raise."""
    try:
        res = await handle.result(**kw)
    except WorkflowFailureError as err:
        st = status_of_failure(err)
        if st is None:
            raise
        return st
    return res if isinstance(res, RepairStatus) else RepairStatus.model_validate(res)


_REPAIR_HANDLE_CLASSES: dict[type, type] = {}


def as_repair_handle(handle: WorkflowHandle[Any, Any]) -> WorkflowHandle[Any, RepairStatus]:
    """``handle`` with ``result()`` = :func:`repair_result`: the final status also of a
    repair that ended failed / timed out (the workflow then fails, so the Temporal UI
    shows it red). The handle keeps its own class underneath (the time-skipping test
    server's handle lets time skip while ``result()`` waits), so it is re-classed to a
    subclass of its class rather than copied."""
    base = type(handle)
    cls = _REPAIR_HANDLE_CLASSES.get(base)
    if cls is None:

        async def result(self: Any, **kw: Any) -> RepairStatus:
            try:
                res = await base.result(self, **kw)
            except WorkflowFailureError as err:
                st = status_of_failure(err)
                if st is None:
                    raise
                return st
            return res if isinstance(res, RepairStatus) else RepairStatus.model_validate(res)

        cls = type(f"Repair{base.__name__}", (base,), {"result": result})
        _REPAIR_HANDLE_CLASSES[base] = cls
    handle.__class__ = cls
    return handle


def repair_handle(h: Harness, node: str, rid: str) -> WorkflowHandle[Any, RepairStatus]:
    """A repair handle (:func:`as_repair_handle`) of repair ``rid`` on ``node`` (e.g. one
    a NodeWorkflow started)."""
    return as_repair_handle(h.client.get_workflow_handle(
        workflow_id_repair(h.cluster.cluster, node, rid), result_type=RepairStatus))


async def start_repair(
    h: Harness, node: str, action: Action, rid: str, **kw: Any
) -> WorkflowHandle[Any, RepairStatus]:
    """Start a RepairWorkflow directly (as the repair API would); the handle's
    ``result()`` is the final status however the repair ended (:func:`as_repair_handle`)."""
    req = RepairRequest(
        repair_id=rid,
        cluster=h.cluster.cluster,
        node=node,
        action=action,
        alerts=kw.pop("alerts", [make_alert(h.cluster.cluster, node, rid)]),
        **kw,
    )
    return as_repair_handle(await h.client.start_workflow(
        "RepairWorkflow",
        req,
        id=workflow_id_repair(h.cluster.cluster, node, rid),
        task_queue=h.task_queue,
        result_type=RepairStatus,
    ))


async def eventually(
    pred: Callable[[], Awaitable[bool]],
    what: str,
    tries: int = 600,
    explain: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Poll ``pred`` every 50 ms (real time, about 30 s by default: a loaded CI machine
    runs the whole suite on two cores) until true; on time out, say what ``explain``
    returns."""
    for _ in range(tries):
        try:
            if await pred():
                return
        except RPCError:
            pass  # e.g. the guard is not started yet
        await asyncio.sleep(0.05)
    seen = ""
    if explain is not None:
        try:
            seen = f"; last seen: {await explain()}"
        except RPCError as e:
            seen = f"; last seen: {e}"
    raise AssertionError(f"timed out waiting for {what}{seen}")


async def closed(handle: WorkflowHandle[Any, Any], what: str) -> None:
    """Wait until ``handle``'s workflow closed: first about 10 s of real time with time
    skipping locked (a cancelled workflow's cleanup activities run undisturbed), then
    through ``handle.result()``, which lets the test server skip time — the test server
    at times leaves a workflow task started and unanswered until its timeout fires."""

    async def done() -> bool:
        return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING

    async def pending() -> str:
        raw = (await handle.describe()).raw_description
        acts = [(a.activity_type.name, a.attempt, a.state, a.last_failure.message[:120])
                for a in raw.pending_activities]
        events = (await handle.fetch_history()).events[-6:]
        return f"activities {acts}; last events {[e.event_type for e in events]}"

    try:
        await eventually(done, what, tries=200)
        return
    except AssertionError:
        pass
    with contextlib.suppress(WorkflowFailureError, asyncio.TimeoutError):
        await asyncio.wait_for(handle.result(), 60)
    await eventually(done, what, tries=100, explain=pending)


async def repair_status(h: Harness, node: str, rid: str) -> RepairStatus:
    handle = h.client.get_workflow_handle(workflow_id_repair(h.cluster.cluster, node, rid))
    return await handle.query("status", result_type=RepairStatus)


async def guard_status(h: Harness) -> GuardStatus:
    handle = h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster))
    return await handle.query("status", result_type=GuardStatus)


async def wait_stage(h: Harness, node: str, rid: str, stage: Stage) -> RepairStatus:
    st: RepairStatus | None = None
    for _ in range(300):
        st = await repair_status(h, node, rid)
        if st.stage == stage:
            return st
        await asyncio.sleep(0.05)
    raise AssertionError(f"{rid}: stage {stage} not reached ({st})")


async def result_skipping(h: Harness, node: str, rid: str, step_s: float = 30) -> RepairStatus:
    """Result of a repair not started by this client, skipping time while it runs."""
    handle = h.client.get_workflow_handle(
        workflow_id_repair(h.cluster.cluster, node, rid), result_type=RepairStatus
    )
    for _ in range(500):
        if (await handle.describe()).close_time is not None:
            return await as_repair_handle(handle).result()
        await h.env.sleep(timedelta(seconds=step_s))
    raise AssertionError(f"repair {rid} did not finish")


#: History events after which a workflow waits on nothing it started itself: its task
#: finished and any command it left is a timer, a bookkeeping record or an update's
#: answer. An activity or
#: child scheduled, or a signal to another workflow initiated, is an answer to come.
_SETTLED_EVENTS = frozenset({
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    EventType.EVENT_TYPE_TIMER_STARTED,
    EventType.EVENT_TYPE_TIMER_CANCELED,
    EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
    EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED,
    EventType.EVENT_TYPE_MARKER_RECORDED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,  # written after the task's end
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_REJECTED,
})


async def _settled(handle: WorkflowHandle[Any, Any]) -> int | None:
    """The history length of ``handle``'s workflow when it is between tasks (nothing
    pending in its description, and its last event settled), else None."""
    raw = (await handle.describe()).raw_description
    if raw.pending_activities or raw.HasField("pending_workflow_task"):
        return None
    events = (await handle.fetch_history()).events
    if not events or events[-1].event_type not in _SETTLED_EVENTS:
        return None
    return len(events)


async def between_tasks(handle: WorkflowHandle[Any, Any]) -> None:
    """Return once ``handle``'s workflow has no activity or workflow task in flight: on
    three reads 50 ms apart, its description shows nothing pending and its history ends
    on a settled event (the time-skipping server's description misses a workflow task
    scheduled by an activity that just completed) and does not grow."""

    async def idle() -> bool:
        seen: set[int | None] = set()
        for _ in range(3):
            seen.add(await _settled(handle))
            if None in seen or len(seen) > 1:
                return False
            await asyncio.sleep(0.05)
        return True

    await eventually(idle, f"{handle.id} between tasks")


async def unlock_if_cut(h: Harness, workflow_id: str, run_id: str | None = None) -> bool:
    """Give back the time-skipping lock of a workflow task cut by a termination.

    The test server counts a workflow task in flight as a lock on skipping time and keeps
    counting one whose workflow was terminated meanwhile (a signal or an activity's answer
    that came between the checks and the termination); its clock then stops for every
    later caller. Returns whether a lock was given back."""
    events = (await h.client.get_workflow_handle(
        workflow_id, run_id=run_id).fetch_history()).events
    if len(events) >= 2 and events[-2].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
        await h.env.client.test_service.unlock_time_skipping(UnlockTimeSkippingRequest())
        return True
    return False


async def terminate_between_tasks(h: Harness, workflow_id: str) -> None:
    """Terminate ``workflow_id`` (as an operator would from the Temporal UI) once it has
    no activity or workflow task in flight: the time-skipping test server stops skipping
    time for the rest of the session when a workflow is cut mid-task."""
    handle = h.client.get_workflow_handle(workflow_id)
    await between_tasks(handle)
    run_id = (await handle.describe()).run_id
    await handle.terminate("terminated from the Temporal UI")
    await unlock_if_cut(h, workflow_id, run_id)


async def attempt_outcomes(h: Harness, rid: str) -> list[tuple[str, str]]:
    """The ledger's attempts of repair ``rid`` as ``(action, outcome)``, in order."""
    row: dict[str, Any] | None = await h.ledger.get_repair(rid)
    assert row is not None, rid
    return [(a["action"], a["outcome"]) for a in row["attempts"]]


async def lease_replies(rec: WorkflowHandle[Any, Any]) -> list[LeaseReply]:
    """Every ``lease`` reply the :class:`LeaseRecorder` ``rec`` got, in order."""
    return await rec.query("replies", result_type=list[LeaseReply])


@contextlib.asynccontextmanager
async def lease_recorders(h: Harness, n: int) -> AsyncIterator[list[WorkflowHandle[Any, Any]]]:
    """``n`` running :class:`LeaseRecorder` workflows (lease requesters that keep every
    reply, :func:`lease_replies`), on a worker of their own queue; terminated at exit."""
    queue = f"rec-{uuid.uuid4().hex[:8]}"
    async with Worker(h.client, task_queue=queue, workflows=[LeaseRecorder]):
        recs = [await h.client.start_workflow(RECORDER, id=f"rec-{uuid.uuid4().hex[:8]}",
                                              task_queue=queue) for _ in range(n)]
        try:
            yield recs
        finally:
            for rec in recs:
                await rec.terminate()


async def start_guard_without_policy(h: Harness) -> WorkflowHandle[Any, Any]:
    """Start the cluster's guard while its policy read fails (the caller set
    ``h.guard_policy_outage`` or ``h.policy_error``); returns its handle once the first
    read failed (``load_policy failed`` in its ``errors``)."""
    gid = workflow_id_guard(h.cluster.cluster)
    await h.client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=h.cluster.cluster),
                                  id=gid, task_queue=h.task_queue)

    async def failed() -> bool:
        return any("load_policy failed" in e for e in (await guard_status(h)).errors)

    await eventually(failed, "the fresh guard's first policy read failed")
    return h.client.get_workflow_handle(gid)


class LedgerOutage:
    """A switchable outage of the guard's ledger read (:func:`guard_worker_in_ledger_outage`):
    ``ledger_guard_state`` fails non-retryably while ``on``; ``reads`` counts its calls."""

    def __init__(self) -> None:
        self.on = True
        self.reads = 0

    def __repr__(self) -> str:
        return f"LedgerOutage(on={self.on}, reads={self.reads})"


@contextlib.asynccontextmanager
async def guard_worker_in_ledger_outage(
    h: Harness, ledger_pool: Any
) -> AsyncIterator[tuple[str, LedgerOutage]]:
    """A worker running ``ClusterGuardWorkflow`` on a queue of its own with the real
    ledger activities except ``ledger_guard_state``, which fails while the yielded
    :class:`LedgerOutage` is ``on`` (the rest of the ledger answers); yields
    ``(task queue, outage)``. Start the guard on that queue."""
    outage = LedgerOutage()
    real = LedgerActivities(ledger_pool)

    @activity.defn(name=ACT.ledger_guard_state)
    async def guard_state(q: GuardStateQuery) -> GuardLedgerState:
        outage.reads += 1
        if outage.on:
            raise ApplicationError("ledger: connection refused (injected)",
                                   non_retryable=True)
        return await real.guard_state(q)

    others = [fn for fn in real.all()
              if activity._Definition.must_from_callable(fn).name != ACT.ledger_guard_state]
    queue = h.task_queue + "-guard"
    async with Worker(h.client, task_queue=queue, workflows=[ClusterGuardWorkflow],
                      activities=[*others, guard_state, h.load_policy, h.cluster.notify,
                                  *GuardReplyActivities(h.client).all()]):
        yield queue, outage
