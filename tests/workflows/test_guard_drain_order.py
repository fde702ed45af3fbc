"""Requests a guard kept while it could not read its policy are decided in order once it
can, each granted as it would have been on its own (real guard workflow, time-skipping
server, real ledger).

A fresh guard whose ``load_policy`` fails retryably (``guard_policy_outage``) stays
``starting`` and keeps every request (``deferred``); once the policy and the ledger
answer it decides them (``_drain`` in workflows/lifecycle/guard.py). It granted only
after the last of them: here three automatic repairs asked during the outage with the
breaker threshold at 2, the third trips the breaker, and the first two, which a serving
guard grants before the trip (budget 3), were held behind the breaker too and never
heard an answer after "waiting for its policy" — three repairs waiting for an operator's
reset instead of two working.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.worker import Worker

from tests.workflows.conftest import Harness
from tests.workflows.helpers import eventually, guard_status
from tests.workflows.lease_recorder import RECORDER, LeaseRecorder
from workflows.lifecycle.guard import POLICY_RETRY_S, POLICY_WAIT_REASON
from workflows.protocol import (
    GUARD_SIGNAL_ACQUIRE,
    GUARD_WORKFLOW,
    GuardInput,
    LeaseReply,
    LeaseRequest,
    workflow_id_guard,
)

NODES = ["gpu-01", "gpu-02", "gpu-03"]


async def _replies(rec: WorkflowHandle[Any, Any]) -> list[LeaseReply]:
    return await rec.query("replies", result_type=list[LeaseReply])


async def test_requests_kept_through_a_policy_outage_are_granted_in_order(
    harness: Harness,
) -> None:
    h = harness
    c = h.cluster.cluster
    h.gpu_nodes = 60  # budget 3
    h.policy.rails.breaker_fraction = 0.01  # threshold breaker_min = 2
    h.guard_policy_outage = "ledger unreachable"
    gid = workflow_id_guard(c)
    guard = h.client.get_workflow_handle(gid)
    await h.client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=c), id=gid,
                                  task_queue=h.task_queue)

    async def failed() -> bool:
        return any("load_policy failed" in e for e in (await guard_status(h)).errors)

    await eventually(failed, "the fresh guard's first policy read failed")

    queue = f"rec-{uuid.uuid4().hex[:8]}"
    async with Worker(h.client, task_queue=queue, workflows=[LeaseRecorder]):
        recs = [await h.client.start_workflow(RECORDER, id=f"rec-{uuid.uuid4().hex[:8]}",
                                              task_queue=queue) for _ in NODES]
        try:
            for i, (node, rec) in enumerate(zip(NODES, recs, strict=True)):
                await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
                    repair_id=f"d{i + 1}", workflow_id=rec.id, cluster=c, node=node,
                    automatic=True, fault_kinds=["xid_79"]))

            async def all_told() -> bool:
                got = [[r.reason for r in await _replies(rec)] for rec in recs]
                return all(g == [POLICY_WAIT_REASON] for g in got)

            await eventually(all_told, "each request told it waits for the policy")

            h.guard_policy_outage = None
            await h.env.sleep(timedelta(seconds=POLICY_RETRY_S + 5))

            async def decided() -> bool:
                g = await guard_status(h)
                return g.rebuilt_at is not None and g.breaker_open and bool(g.pending)

            await eventually(decided, "the policy read, the guard rebuilt and the breaker "
                                      "tripped", explain=lambda: guard_status(h))
            g = await guard_status(h)
            # before: leases [] and d1, d2, d3 all pending behind the breaker
            assert sorted(x.repair_id for x in g.leases) == ["d1", "d2"], g
            assert [p.repair_id for p in g.pending] == ["d3"], g.pending

            async def answered() -> bool:
                got = [await _replies(rec) for rec in recs]
                return all(len(g) >= 2 for g in got)

            await eventually(answered, "each repair answered once the policy was read")
            last = [(await _replies(rec))[-1] for rec in recs]
            assert [r.granted for r in last] == [True, True, False], last
            assert "circuit breaker open" in last[2].reason, last[2]
        finally:
            for rec in recs:
                await rec.terminate()
