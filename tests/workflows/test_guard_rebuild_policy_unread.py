"""A failure-domain hold across a guard rebuilt from the ledger whose first policy read
fails (real guard workflow, time-skipping server, real ledger).

A fresh guard rebuilds its domain holds from the ledger, but which nodes a domain holds
comes from the policy (``load_policy``: ``PolicySnapshot.domains``). A guard whose first
policy read failed served on the defaults (``policy_view(None)``: no domain members), so
the rebuilt hold held nothing until the next refresh (up to ``POLICY_REFRESH_S``), and an
automatic request of a node in the held domain was granted. A guard that never read its
policy now grants nothing (I21: decide only on what you know): it keeps requests waiting
(told ``queued``), retries the read every ``POLICY_RETRY_S``, and decides them once the
policy is known.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.worker import Worker

from tests.workflows.conftest import Harness
from tests.workflows.helpers import (
    eventually,
    guard_status,
    lease_replies,
    terminate_between_tasks,
)
from tests.workflows.lease_recorder import RECORDER, LeaseRecorder
from workflows.activity_api import GuardStateQuery
from workflows.leases import FaultReport
from workflows.lifecycle.guard import POLICY_RETRY_S
from workflows.protocol import (
    GUARD_SIGNAL_ACQUIRE,
    GUARD_SIGNAL_FAULT_SEEN,
    GUARD_WORKFLOW,
    GuardInput,
    LeaseRequest,
    workflow_id_guard,
)

RACK = [f"gpu-0{i}" for i in range(1, 4)]


async def _held_then_restarted_unreadable(
        h: Harness, restart: GuardInput) -> tuple[WorkflowHandle[Any, Any], WorkflowHandle[Any, Any]]:
    """Three nodes of rack-a raise a fault (40 GPU nodes: budget 2, so only the hold keeps
    a request waiting); once the hold is in the ledger the guard is lost and started
    again with ``restart`` while the configuration cannot be read. Returns the guard's
    handle by id and the handle of the run just started."""
    c = h.cluster.cluster
    h.gpu_nodes = 40
    h.domains = {n: ["rack-a"] for n in RACK}
    gid = workflow_id_guard(c)
    guard = h.client.get_workflow_handle(gid)
    await h.client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=c), id=gid,
                                  task_queue=h.task_queue)
    for n in RACK:
        await guard.signal(GUARD_SIGNAL_FAULT_SEEN, FaultReport(
            cluster=c, node=n, alert_id=f"x-{n}", kind="nvlink_down", domains=["rack-a"]))

    async def recorded() -> bool:
        st = await h.ledger.guard_state(GuardStateQuery(
            cluster=c, since=datetime(2000, 1, 1, tzinfo=UTC)))
        return [d.domain for d in st.domain_holds] == ["rack-a"]

    await eventually(recorded, "the hold of rack-a recorded in the ledger")
    await terminate_between_tasks(h, gid)
    h.policy_error = "policy.rails: broken"
    started = await h.client.start_workflow(GUARD_WORKFLOW, restart, id=gid,
                                            task_queue=h.task_queue)
    return guard, started


@asynccontextmanager
async def _d1(h: Harness) -> AsyncIterator[tuple[WorkflowHandle[Any, Any], LeaseRequest]]:
    """A lease-recording requester (its own worker) and d1's automatic request of rack-a's
    first node naming it; the recorder is terminated afterwards."""
    queue = f"rec-{uuid.uuid4().hex[:8]}"
    async with Worker(h.client, task_queue=queue, workflows=[LeaseRecorder]):
        rec = await h.client.start_workflow(RECORDER, id=f"rec-{uuid.uuid4().hex[:8]}",
                                            task_queue=queue)
        try:
            yield rec, LeaseRequest(repair_id="d1", workflow_id=rec.id,
                                    cluster=h.cluster.cluster, node=RACK[0],
                                    automatic=True, fault_kinds=["nvlink_down"])
        finally:
            await rec.terminate()


async def _rebuilt_with_d1_held(h: Harness) -> bool:
    """The policy read, the guard rebuilt, rack-a held and d1 waiting behind it."""
    g = await guard_status(h)
    return (g.policy_loaded and g.rebuilt_at is not None
            and [d.domain for d in g.domain_holds] == ["rack-a"]
            and [p.repair_id for p in g.pending] == ["d1"])


async def test_a_guard_rebuilt_without_its_policy_grants_nothing_in_a_held_domain(
    harness: Harness,
) -> None:
    h = harness
    c = h.cluster.cluster
    guard, _ = await _held_then_restarted_unreadable(h, GuardInput(cluster=c))

    async def failed() -> bool:
        g = await guard_status(h)
        return any("load_policy failed" in e for e in g.errors)

    await eventually(failed, "the fresh guard's first policy read failed")

    async with _d1(h) as (rec, req):
        await guard.signal(GUARD_SIGNAL_ACQUIRE, req)

        async def told() -> bool:
            return bool(await lease_replies(rec))

        await eventually(told, "d1 told it waits")
        # the policy stays unreadable a while: nothing is granted on a guess
        await h.env.sleep(timedelta(seconds=3 * POLICY_RETRY_S))
        await guard.signal(GUARD_SIGNAL_ACQUIRE, req)  # d1 re-sends (LEASE_RESEND_S)
        g = await guard_status(h)
        assert g.leases == [] and [p.repair_id for p in g.pending] == ["d1"], g
        assert g.policy_loaded is False
        got = await lease_replies(rec)
        assert got and not any(r.granted for r in got), got
        assert all(r.queued for r in got), got

        # the configuration is readable again: the next retry reads it, the rebuilt
        # hold now knows its nodes and keeps d1 waiting
        h.policy_error = None
        await h.env.sleep(timedelta(seconds=POLICY_RETRY_S + 5))

        await eventually(lambda: _rebuilt_with_d1_held(h),
                         "the policy read and d1 held by rack-a")
        g = await guard_status(h)
        assert g.leases == [], g.leases

        async def told_held() -> bool:
            got = await lease_replies(rec)
            return bool(got) and "failure domain rack-a held" in got[-1].reason

        await eventually(told_held, "d1 told the rack holds it")
        assert not any(r.granted for r in await lease_replies(rec))


async def test_a_guard_waiting_out_a_long_outage_continues_as_new_and_still_rebuilds(
    harness: Harness,
) -> None:
    """A guard that cannot read its policy keeps every waiting repair's re-sends; it
    continued as new only once serving, so a long outage grew its history until the
    server's event limit ended it. It continues as new while it waits to retry now
    (here past a history limit of 60 events), keeping one request per repair, and the
    new run still rebuilds from the ledger before it grants anything (I21): the hold of
    rack-a recorded before keeps d1 waiting once the policy is readable."""
    h = harness
    c = h.cluster.cluster
    guard, first = await _held_then_restarted_unreadable(
        h, GuardInput(cluster=c, carried={"history_limit": 60}))

    async with _d1(h) as (rec, req):
        run_ids = {first.result_run_id}
        for _ in range(8):  # d1 re-sends while the policy stays unreadable
            await guard.signal(GUARD_SIGNAL_ACQUIRE, req)
            await h.env.sleep(timedelta(seconds=POLICY_RETRY_S))
            run_ids.add((await guard.describe()).run_id)
        assert len(run_ids) > 1, "the waiting guard never continued as new"
        g = await guard_status(h)
        assert g.leases == [] and g.policy_loaded is False, g
        assert [p.repair_id for p in g.pending] == ["d1"], g.pending

        h.policy_error = None
        await h.env.sleep(timedelta(seconds=POLICY_RETRY_S + 5))

        await eventually(lambda: _rebuilt_with_d1_held(h),
                         "rebuilt after continue-as-new: d1 held by rack-a")
        assert (await guard_status(h)).leases == []
        assert not any(r.granted for r in await lease_replies(rec))
