"""Issue 26 reproductions for the cluster guard, on the real workflows (time-skipping
server, real ledger): I23 (queued is queued; a reset starts a fresh window) and the
guard half of I21 (a rebuilt guard decides only on what the ledger says)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.workflows.conftest import Harness
from tests.workflows.helpers import (
    eventually,
    guard_status,
    guard_worker_in_ledger_outage,
    result_skipping,
    start_repair,
    terminate_between_tasks,
    wait_stage,
)
from workflows.activity_api import (
    GuardStateQuery,
    RepairRecord,
    TransitionRecord,
)
from workflows.models import Action, Requester, RequesterKind, Stage
from workflows.protocol import (
    GUARD_SIGNAL_RESET_BREAKER,
    ResetBreakerSignal,
    workflow_id_guard,
)

USER = Requester(kind=RequesterKind.user, name="ops")


async def _trip_with_one_holder_and_two_queued(h: Harness, prefix: str, busy: int = 3
                                               ) -> None:
    """gpu-01 holds the only lease (budget 1); gpu-02 waits for the budget; gpu-03's
    request is the third automatic one in the window and trips the breaker (threshold 2).
    Every repair is a power cycle on an Xid (an event fault)."""
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60  # one idle check a minute
    h.cluster.busy_polls["gpu-01"] = busy
    await start_repair(h, "gpu-01", Action.power_cycle, f"{prefix}1")
    await wait_stage(h, "gpu-01", f"{prefix}1", Stage.waiting_for_idle)
    for i in (2, 3):
        await start_repair(h, f"gpu-0{i}", Action.power_cycle, f"{prefix}{i}")

        async def pending(n: int = i - 1) -> bool:
            return len((await guard_status(h)).pending) == n

        await eventually(pending, f"{prefix}{i} queued")

    async def tripped() -> bool:
        return (await guard_status(h)).breaker_open

    await eventually(tripped, "breaker trip")


async def _holder_acted_and_the_queued_resolved(h: Harness, prefix: str) -> None:
    """After the reset: the holder (gpu-01) power-cycled once and succeeded; both queued
    repairs auto-resolved on their pre-reset Xid evidence and touched nothing."""
    st = await result_skipping(h, "gpu-01", f"{prefix}1")
    assert st.stage == Stage.succeeded, st
    for i in (2, 3):
        st = await result_skipping(h, f"gpu-0{i}", f"{prefix}{i}")
        assert st.stage == Stage.auto_resolved and "breaker reset" in st.detail, st
        assert h.cluster.count("power_cycle", f"gpu-0{i}") == 0
    assert h.cluster.count("power_cycle", "gpu-01") == 1


async def test_budget_queued_repair_acts_only_on_evidence_after_a_quick_reset(
    harness: Harness,
) -> None:
    """Reproduction 7 (I23): the breaker is reset within 5 minutes of the trip (before
    any re-send). The budget-queued repair is treated as the breaker-queued one: both are
    granted with the reset time, their Xid evidence predates it, so both auto-resolve and
    neither machine is power-cycled (on main the budget-queued one power-cycled)."""
    h = harness
    await _trip_with_one_holder_and_two_queued(h, "q")
    guard = h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster))
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))
    await _holder_acted_and_the_queued_resolved(h, "q")


async def test_requests_a_guard_restart_lost_are_told_of_a_reset_sent_before_they_return(
    harness: Harness,
) -> None:
    """I23 across a guard restart (found by ``make model-check`` at guard depth 6): the
    breaker trips with q2 (budget-queued) and q3 (breaker-queued) waiting; the guard is
    terminated (its queue lost) and started afresh, and the operator resets the breaker
    before either re-sends. Their re-sent requests name when they first asked
    (``requested_at``), before the reset the rebuilt guard keeps (``open_reset_at``), so
    both are granted with ``reset_at``, find their Xid evidence stale and auto-resolve;
    before, the reset marked only a queue that no longer held them and q2 power-cycled."""
    h = harness
    c = h.cluster.cluster
    await _trip_with_one_holder_and_two_queued(h, "g", busy=3)

    async def trip_recorded() -> bool:
        st = await h.ledger.guard_state(GuardStateQuery(cluster=c, since=datetime(
            2000, 1, 1, tzinfo=UTC)))
        return st.breaker_open

    await eventually(trip_recorded, "the trip in the ledger")
    wid = workflow_id_guard(c)
    await terminate_between_tasks(h, wid)
    await h.client.start_workflow(
        "ClusterGuardWorkflow", {"cluster": c}, id=wid, task_queue=h.task_queue)

    async def rebuilt() -> bool:
        g = await guard_status(h)
        return g.rebuilt_at is not None and g.breaker_open and g.pending == []

    await eventually(rebuilt, "the fresh guard rebuilt (breaker open, nobody queued)")
    guard = h.client.get_workflow_handle(wid)
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))

    async def reset() -> bool:
        g = await guard_status(h)
        return not g.breaker_open and g.reset_by == "alice"

    await eventually(reset, "breaker reset")

    async def reset_recorded() -> bool:  # what a guard rebuilt after now would read
        st = await h.ledger.guard_state(GuardStateQuery(cluster=c, since=datetime(
            2000, 1, 1, tzinfo=UTC)))
        return not st.breaker_open and st.reset_at == (await guard_status(h)).reset_at

    await eventually(reset_recorded, "the reset's time in the ledger")
    await _holder_acted_and_the_queued_resolved(h, "g")
    g = await guard_status(h)
    assert g.recent_automatic == [], g.recent_automatic  # nothing counted twice


async def test_breaker_reset_starts_a_fresh_window(harness: Harness) -> None:
    """I23: after a reset, the queued repairs' re-sent requests (every LEASE_RESEND_S)
    are not counted again: the window holds nothing from before the reset (on main the
    reset forgot who was counted and every re-send counted anew)."""
    h = harness
    # the holder stays ~30 min: the others re-send meanwhile
    await _trip_with_one_holder_and_two_queued(h, "f", busy=30)
    guard = h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster))
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))

    async def reset() -> bool:
        g = await guard_status(h)
        return not g.breaker_open and g.reset_by == "alice"

    await eventually(reset, "breaker reset")
    await h.env.sleep(timedelta(minutes=11))  # two re-sends of each waiter
    g = await guard_status(h)
    assert {p.repair_id for p in g.pending} == {"f2", "f3"}, g
    assert g.recent_automatic == [], g.recent_automatic
    assert not g.breaker_open


async def test_rebuilt_guard_grants_nothing_until_the_ledger_answers(
    harness: Harness, ledger_pool: Any
) -> None:
    """I21 (guard half): the guard is terminated while gpu-01 holds the only lease; the
    fresh guard cannot read the ledger. It keeps retrying and grants nothing meanwhile
    (on main it gave up after one read and granted gpu-02 beside the holder); once the
    ledger answers it rebuilds the holder and gpu-02 waits for it."""
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls["gpu-01"] = 40  # ~40 min in flight
    await start_repair(h, "gpu-01", Action.reboot, "d1", requester=USER, alerts=[])
    await wait_stage(h, "gpu-01", "d1", Stage.waiting_for_idle)
    wid = workflow_id_guard(h.cluster.cluster)
    await terminate_between_tasks(h, wid)

    async with guard_worker_in_ledger_outage(h, ledger_pool) as (queue, down):
        await h.client.start_workflow(
            "ClusterGuardWorkflow", {"cluster": h.cluster.cluster}, id=wid, task_queue=queue
        )
        await start_repair(h, "gpu-02", Action.reboot, "d2", requester=USER, alerts=[])
        await h.env.sleep(timedelta(minutes=4))
        g = await guard_status(h)
        assert h.cluster.count("cordon", "gpu-02") == 0  # nothing granted beside d1
        assert g.rebuilt_at is None and g.leases == [], g
        assert "d2" in {p.repair_id for p in g.pending}, g
        assert down.reads >= 2, down  # it kept asking the ledger
        down.on = False

        async def rebuilt() -> bool:
            g = await guard_status(h)
            return (
                g.rebuilt_at is not None
                and [x.repair_id for x in g.leases] == ["d1"]
                and "d2" in {p.repair_id for p in g.pending}
            )

        await eventually(rebuilt, "the holder rebuilt once the ledger answered")
        assert h.cluster.count("cordon", "gpu-02") == 0
        for i in (1, 2):
            st = await result_skipping(h, f"gpu-0{i}", f"d{i}")
            assert st.stage == Stage.succeeded, st


async def test_rebuilt_guard_counts_a_holder_waiting_for_a_person_after_it_acted(
    harness: Harness,
) -> None:
    """I21 (guard half): a repair that cordoned, acted and now waits for a person
    (the ladder escalated) still holds its node and its lease, as it records
    (``lease_held``): the ledger's guard state lists it, so a rebuilt guard keeps its
    slot (on main only cordoning … running counted). One that never cordoned (waiting
    for its first approval) holds nothing, nor does one that handed its lease back after
    its cordon found an ended repair's (a person looks at the stale cordon)."""
    h = harness
    c = h.cluster.cluster
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for rid, node, stages, holding in (
        ("held", "gpu-01", [Stage.cordoning, Stage.draining, Stage.repairing,
                            Stage.awaiting_approval], True),
        ("asking", "gpu-02", [Stage.awaiting_approval], False),
        ("handed_back", "gpu-03", [Stage.cordoning, Stage.awaiting_approval], False),
    ):
        await h.ledger.upsert_repair(RepairRecord(
            repair_id=rid, cluster=c, node=node, action=Action.reboot,
            stage=Stage.recommended, requester=USER, workflow_id=f"repair/{c}/{node}/{rid}",
            updated_at=t0, lease_held=holding))
        for k, stage in enumerate(stages):
            await h.ledger.record_transition(TransitionRecord(
                repair_id=rid, stage=stage, at=t0 + timedelta(minutes=k + 1)))
    st = await h.ledger.guard_state(GuardStateQuery(cluster=c, since=t0))
    assert [(x.repair_id, x.stage) for x in st.holders] == [("held", Stage.awaiting_approval)]
