"""``guard_send_leases`` (issue 30 item 1): the guard's ``lease`` replies as one activity
per batch, on the real time-skipping server with real requester workflows.

- a retried attempt re-sends with the same idempotency keys, and the requester ends with
  the same reply (the keys are per attempt-independent: run id, activity id, index);
- a requester that is gone is reported ``gone``, and the guard drops its queue entry;
- a transient RPC failure is retried inside the activity and the reply is delivered; one
  that persists is ``failed``, noted in the guard's errors, and nothing else changes.
"""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.api.workflowservice.v1 import SignalWorkflowExecutionRequest
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities import guard_replies
from activities.guard_replies import GuardReplyActivities
from activities.ledger_activities import LedgerActivities
from tests.workflows.conftest import Harness
from tests.workflows.fidelity import FidelityInterceptor, FidelityViolation
from tests.workflows.helpers import eventually, guard_status
from tests.workflows.lease_recorder import RECORDER, LeaseRecorder
from workflows.activity_api import ACT, LeaseDeliveries, LeaseDelivery
from workflows.guard import ClusterGuardWorkflow
from workflows.protocol import (
    GUARD_SIGNAL_ACQUIRE,
    GUARD_WORKFLOW,
    GuardInput,
    LeaseReply,
    LeaseRequest,
    workflow_id_guard,
)


class FlakyReplies(GuardReplyActivities):
    """``guard_send_leases`` whose first ``failures`` signal calls answer UNAVAILABLE (a
    frontend restarting), then reach the server."""

    def __init__(self, client: Any, failures: int) -> None:
        super().__init__(client)
        self.failures = failures
        self.calls = 0

    async def _signal(self, req: SignalWorkflowExecutionRequest) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise RPCError("frontend unavailable (injected)", RPCStatusCode.UNAVAILABLE, b"")
        await super()._signal(req)


async def _recorder(env: WorkflowEnvironment, queue: str) -> WorkflowHandle[Any, Any]:
    return await env.client.start_workflow(RECORDER, id=f"rec-{uuid.uuid4().hex[:8]}",
                                           task_queue=queue)


def _deliveries(*pairs: tuple[str, LeaseReply]) -> LeaseDeliveries:
    return LeaseDeliveries(guard_id="guard/test", commands=[
        LeaseDelivery(workflow_id=wid, reply=r) for wid, r in pairs])


async def _replies(h: WorkflowHandle[Any, Any], n: int) -> list[LeaseReply]:
    got: list[LeaseReply] = []

    async def arrived() -> bool:
        got[:] = await h.query("replies", result_type=list[LeaseReply])
        return len(got) >= n
    await eventually(arrived, f"{n} lease replies at {h.id}")
    return got


async def test_a_retried_attempt_resends_with_the_same_keys_and_the_requester_keeps_the_reply(
    ts_env: WorkflowEnvironment, monkeypatch: Any
) -> None:
    queue = f"replies-{uuid.uuid4().hex[:8]}"
    acts = GuardReplyActivities(ts_env.client)
    keys: list[str] = []
    real = acts._signal

    async def keyed(req: SignalWorkflowExecutionRequest) -> None:
        keys.append(req.request_id)
        await real(req)
    monkeypatch.setattr(acts, "_signal", keyed)
    async with Worker(ts_env.client, task_queue=queue, workflows=[LeaseRecorder]):
        a, b = await _recorder(ts_env, queue), await _recorder(ts_env, queue)
        ra = LeaseReply(repair_id="r-a", granted=True)
        rb = LeaseReply(repair_id="r-b", granted=False, queued=True, reason="budget")
        inp = _deliveries((a.id, ra), (b.id, rb))
        env = ActivityEnvironment()
        first = await env.run(acts.guard_send_leases, inp)
        again = await env.run(acts.guard_send_leases, inp)  # the same attempt, retried
        assert [o.status for o in first.outcomes] == ["delivered", "delivered"]
        assert again == first
        # one key per delivery, the same on the retry (the server's dedup key)
        assert keys[:2] == keys[2:] and len(set(keys[:2])) == 2, keys
        assert all(k.startswith("guard/test/") for k in keys)
        # whether the server dropped the duplicate or not, each requester's last reply is
        # the one commanded, and it never saw another
        for h, want in ((a, ra), (b, rb)):
            got = await _replies(h, 1)
            assert got[-1] == want and set(r.model_dump_json() for r in got) == {
                want.model_dump_json()}, got
        await a.terminate()
        await b.terminate()


async def test_a_transient_failure_is_retried_and_a_persistent_one_reported_failed(
    ts_env: WorkflowEnvironment, monkeypatch: Any
) -> None:
    monkeypatch.setattr(guard_replies, "BACKOFF_S", (0.01, 0.01))
    queue = f"replies-{uuid.uuid4().hex[:8]}"
    async with Worker(ts_env.client, task_queue=queue, workflows=[LeaseRecorder]):
        rec = await _recorder(ts_env, queue)
        reply = LeaseReply(repair_id="r-t", granted=True)
        flaky = FlakyReplies(ts_env.client, failures=guard_replies.TRIES - 1)
        out = await ActivityEnvironment().run(flaky.guard_send_leases,
                                              _deliveries((rec.id, reply)))
        assert [o.status for o in out.outcomes] == ["delivered"]
        assert flaky.calls == guard_replies.TRIES
        assert await _replies(rec, 1) == [reply]

        down = FlakyReplies(ts_env.client, failures=guard_replies.TRIES)
        out = await ActivityEnvironment().run(down.guard_send_leases,
                                              _deliveries((rec.id, reply)))
        assert [o.status for o in out.outcomes] == ["failed"]
        assert "UNAVAILABLE" in out.outcomes[0].message and rec.id in out.outcomes[0].message
        await rec.terminate()


async def test_a_gone_requester_is_reported_and_the_guard_drops_its_entry(
    harness: Harness, ledger_pool: Any
) -> None:
    """Through the real guard (fidelity interceptor on): a request naming a workflow that
    does not run is answered by a ``guard_send_leases`` whose outcome is ``gone``; the
    guard forgets the request. A live requester's grant beside it is delivered."""
    h = harness
    queue = f"guard-replies-{uuid.uuid4().hex[:8]}"
    cluster = h.cluster.cluster
    async with Worker(
        h.client, task_queue=queue, workflows=[ClusterGuardWorkflow, LeaseRecorder],
        activities=[*LedgerActivities(ledger_pool).all(), h.load_policy,
                    *GuardReplyActivities(h.client).all()],
        interceptors=[FidelityInterceptor()],
        workflow_failure_exception_types=[FidelityViolation],
    ):
        guard = await h.client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=cluster),
                                              id=workflow_id_guard(cluster), task_queue=queue)
        live = await _recorder(h.env, queue)
        # gpu-01 is granted to the live requester; the gone one asks for the same node
        # and is queued behind it, and its "queued" answer cannot be delivered
        await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
            repair_id="r-live", workflow_id=live.id, cluster=cluster, node="gpu-01",
            automatic=False))
        got = await _replies(live, 1)
        assert got[0].granted
        await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
            repair_id="r-gone", workflow_id=f"nobody-{uuid.uuid4().hex[:6]}",
            cluster=cluster, node="gpu-01", automatic=False))

        async def dropped() -> bool:
            st = await guard_status(h)
            return not st.pending and [x.repair_id for x in st.leases] == ["r-live"]

        async def seen() -> object:
            st = await guard_status(h)
            return {"pending": [p.repair_id for p in st.pending],
                    "leases": [x.repair_id for x in st.leases], "errors": st.errors}

        await eventually(dropped, "the gone requester's entry dropped", explain=seen)
        assert not (await guard_status(h)).errors
        await guard.terminate()
        await live.terminate()


async def test_a_reply_that_cannot_be_sent_is_noted_and_the_decision_kept(
    harness: Harness, ledger_pool: Any, monkeypatch: Any
) -> None:
    """A reply the activity reports ``failed`` (the server did not take it after its
    tries) is noted in the guard's errors; the lease stays granted (the requester re-sends
    its request and is told again)."""
    monkeypatch.setattr(guard_replies, "BACKOFF_S", (0.01, 0.01))
    h = harness
    queue = f"guard-replies-{uuid.uuid4().hex[:8]}"
    cluster = h.cluster.cluster
    down = FlakyReplies(h.client, failures=10 ** 6)
    async with Worker(
        h.client, task_queue=queue, workflows=[ClusterGuardWorkflow, LeaseRecorder],
        activities=[*LedgerActivities(ledger_pool).all(), h.load_policy, *down.all()],
        interceptors=[FidelityInterceptor()],
        workflow_failure_exception_types=[FidelityViolation],
    ):
        guard = await h.client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=cluster),
                                              id=workflow_id_guard(cluster), task_queue=queue)
        rec = await _recorder(h.env, queue)
        await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
            repair_id="r-x", workflow_id=rec.id, cluster=cluster, node="gpu-02",
            automatic=False))

        async def noted() -> bool:
            return any("lease reply to r-x failed" in e for e in (await guard_status(h)).errors)

        await eventually(noted, "the failed reply noted in the guard's errors")
        st = await guard_status(h)
        assert [x.repair_id for x in st.leases] == ["r-x"]
        assert await rec.query("replies", result_type=list[LeaseReply]) == []
        await guard.terminate()
        await rec.terminate()


async def test_the_worker_process_registers_guard_send_leases(
    ts_env: WorkflowEnvironment, ledger_pool: Any
) -> None:
    """``autorepair worker`` (``build_workers``) runs ``guard_send_leases`` on the main
    task queue, where the guard schedules it: without it every lease reply would wait."""
    from workers.worker import build_workers
    from workflows.config import AutorepairConfig

    workers = build_workers(ts_env.client, AutorepairConfig(), ledger_pool, workflows=[])
    acts = workers[0]._activity_worker
    assert acts is not None and ACT.guard_send_leases in acts._activities


async def test_the_replies_of_one_batch_are_one_activity_not_a_signal_each(
    harness: Harness, ledger_pool: Any
) -> None:
    """20 requests decided in one step (they are all in the guard's first workflow task)
    are answered by one ``guard_send_leases`` carrying 20 replies, and the guard's history
    holds no external signal: its workflow tasks grow with batches, not with decisions
    (issue 30 item 1; before, each reply was an external signal whose completion woke the
    guard for another task). Each requester gets exactly one reply."""
    from temporalio.api.enums.v1 import EventType

    h = harness
    cluster = h.cluster.cluster
    guard_queue = f"guard-one-batch-{uuid.uuid4().hex[:8]}"
    rec_queue = f"recorders-{uuid.uuid4().hex[:8]}"
    async with Worker(h.client, task_queue=rec_queue, workflows=[LeaseRecorder]):
        recs = [await _recorder(h.env, rec_queue) for _ in h.cluster.nodes]
        # started with no worker on its queue: every request waits in its history
        guard = await h.client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=cluster),
                                              id=workflow_id_guard(cluster),
                                              task_queue=guard_queue)
        for node, rec in zip(h.cluster.nodes, recs, strict=True):
            await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
                repair_id=f"r-{node}", workflow_id=rec.id, cluster=cluster, node=node,
                automatic=False))
        async with Worker(
            h.client, task_queue=guard_queue, workflows=[ClusterGuardWorkflow],
            activities=[*LedgerActivities(ledger_pool).all(), h.load_policy,
                        *GuardReplyActivities(h.client).all()],
            interceptors=[FidelityInterceptor()],
            workflow_failure_exception_types=[FidelityViolation],
        ):
            for rec in recs:
                got = await _replies(rec, 1)
                assert len(got) == 1, got
            sizes: list[int] = []
            external = 0
            async for ev in guard.fetch_history_events():
                if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    a = ev.activity_task_scheduled_event_attributes
                    if a.activity_type.name == ACT.guard_send_leases:
                        body = LeaseDeliveries.model_validate_json(a.input.payloads[0].data)
                        sizes.append(len(body.commands))
                elif ev.event_type == \
                        EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
                    external += 1
            assert external == 0
            assert sizes == [len(recs)], sizes
            st = await guard_status(h)
            assert len(st.leases) + len(st.pending) == len(recs)
            await guard.terminate()
        for rec in recs:
            await rec.terminate()
