"""A breaker reset across a guard rebuilt while the breaker is open again (break-test of
the guard's rebuild; real workflows, time-skipping server, real ledger).

I23: a reset of the open breaker marks every request queued then, whatever queued it (a
person's budget-queued request too): its grant carries ``reset_at`` and the repair acts
only on evidence observed after the reset. A rebuilt guard knows the last reset from the
ledger (``ledger_guard_state`` ``reset_at``) — but only while the newest breaker row was
that reset's clear. Once the breaker tripped again, a guard rebuilt then forgot the
reset: a person's repair queued for the budget across it (a person's request is not held
by the breaker), whose queue entry the lost guard took with it, was granted without
``reset_at`` and power-cycled its node on an Xid from before the reset. The ledger now
answers the last reset whatever came after it.
"""

from __future__ import annotations

from datetime import UTC, datetime

from tests.workflows.conftest import Harness
from tests.workflows.helpers import (
    eventually,
    guard_status,
    result_skipping,
    start_repair,
    terminate_between_tasks,
    wait_stage,
)
from workflows.activity_api import GuardStateQuery
from workflows.models import Action, Requester, RequesterKind, Stage
from workflows.protocol import (
    GUARD_SIGNAL_RESET_BREAKER,
    ResetBreakerSignal,
    workflow_id_guard,
)

USER = Requester(kind=RequesterKind.user, name="ops")
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


async def test_a_persons_request_queued_across_a_reset_keeps_it_after_a_rebuild_while_open(
    harness: Harness,
) -> None:
    h = harness
    c = h.cluster.cluster
    gid = workflow_id_guard(c)
    # budget 1, breaker threshold 2 (20 GPU nodes)
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls["gpu-01"] = 40  # a1 holds the only lease ~40 min past its cordon
    await start_repair(h, "gpu-01", Action.power_cycle, "a1")
    await wait_stage(h, "gpu-01", "a1", Stage.waiting_for_idle)
    # a person's repair waits for the budget (never held by the breaker)
    await start_repair(h, "gpu-02", Action.power_cycle, "p", requester=USER)
    waiting = 1
    for node, rid in (("gpu-03", "a2"), ("gpu-04", "a3")):  # a3 trips the breaker
        await start_repair(h, node, Action.power_cycle, rid)
        waiting += 1

        async def queued(n: int = waiting) -> bool:
            return len((await guard_status(h)).pending) == n

        await eventually(queued, f"{rid} queued")

    async def tripped() -> bool:
        return (await guard_status(h)).breaker_open

    await eventually(tripped, "the first trip")
    guard = h.client.get_workflow_handle(gid)
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))

    async def reset() -> bool:
        g = await guard_status(h)
        return not g.breaker_open and g.reset_by == "alice"

    await eventually(reset, "the reset")
    reset_at = (await guard_status(h)).reset_at
    assert reset_at is not None
    # three more automatic repairs in the fresh window trip it again
    for node, rid in (("gpu-05", "a4"), ("gpu-06", "a5"), ("gpu-07", "a6")):
        await start_repair(h, node, Action.power_cycle, rid)
    await eventually(tripped, "the second trip")

    async def trip_recorded() -> bool:
        return (await h.ledger.guard_state(GuardStateQuery(cluster=c, since=EPOCH))
                ).breaker_open

    await eventually(trip_recorded, "the second trip in the ledger")

    # the guard is lost and started afresh while the breaker is open: its queue is gone
    await terminate_between_tasks(h, gid)
    await h.client.start_workflow("ClusterGuardWorkflow", {"cluster": c}, id=gid,
                                  task_queue=h.task_queue)

    async def rebuilt() -> bool:
        g = await guard_status(h)
        return g.rebuilt_at is not None and g.breaker_open

    await eventually(rebuilt, "the fresh guard rebuilt (breaker open)")
    # the operators' view keeps the last reset across the restart (it was blank)
    g = await guard_status(h)
    assert (g.reset_at, g.reset_by) == (reset_at, "alice"), g
    # a1 ends; p (re-sent, a person's: the open breaker does not hold it) is granted by
    # the rebuilt guard. It waited through the reset: its Xid predates it
    st = await result_skipping(h, "gpu-02", "p")
    assert st.stage == Stage.auto_resolved, st
    assert reset_at.isoformat() in st.detail, st
    assert h.cluster.count("power_cycle", "gpu-02") == 0
    st_ledger = await h.ledger.guard_state(GuardStateQuery(cluster=c, since=EPOCH))
    assert st_ledger.breaker_open and st_ledger.reset_at == reset_at
    assert st_ledger.reset_by == "alice"
