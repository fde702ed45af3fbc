"""Repair rails a break-test of 8a5413f found open (each test failed there)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import (
    attempt_outcomes,
    between_tasks,
    closed,
    eventually,
    guard_status,
    repair_status,
    start_repair,
    wait_stage,
)
from tests.workflows.test_repair_lease_retry import USER, lease_lost_during_backoff
from workflows.models import Action, ApproveSignal, CancelSignal, Stage


async def test_workflow_cancel_while_the_cordon_is_out_does_not_leave_the_node_cordoned(
    harness: Harness,
) -> None:
    """An operator cancels the repair from the Temporal UI while its cordon call is out
    (the scheduler is slow to answer). The repair ends ``cancelled`` having touched
    nothing; the operator then finds the node cordoned by that repair for good: the
    cleanup's uncordon ran before the abandoned cordon landed. Rail (docs/design.md §5
    rule zero, I19): an ending that touched nothing leaves the node schedulable; a try
    in flight is never abandoned (``_act_stoppable``)."""
    h = harness
    node, rid = "gpu-03", "tc-cordon"
    landed: list[bool] = []
    handle: Any = None

    async def slow_cordon(n: str) -> None:
        if landed:
            return
        landed.append(False)
        await handle.cancel()
        await asyncio.sleep(3)  # the scheduler answers late; the cordon lands then
        landed[0] = True

    h.cluster.while_out["cordon"] = slow_cordon
    handle = await start_repair(h, node, Action.reboot, rid)
    await closed(handle, "the cancelled repair closing")
    await eventually(lambda: _true(bool(landed and landed[0])), "the cordon landing")
    await asyncio.sleep(1)
    row = await h.ledger.get_repair(rid)
    assert row is not None and row["stage"] == "cancelled", row
    assert h.cluster.count("reboot", node) == 0
    assert node not in h.cluster.cordons, (
        f"node left cordoned by {h.cluster.cordons.get(node)} after a cancelled repair "
        f"that touched nothing; calls {h.cluster.calls}")


async def _true(v: bool) -> bool:
    return v


async def _until(h: Harness, done: Callable[[], bool]) -> None:
    """Skip time in steps of 17 s (off the workflows' round timers) until ``done()``."""
    for _ in range(400):
        if done():
            return
        await h.env.sleep(timedelta(seconds=17))


async def test_workflow_cancel_while_a_retry_waits_for_its_lease_uncordons(
    harness: Harness,
) -> None:
    """r1's power_cycle is refused by the BMC (nothing sent); its lease lapses and r2
    takes the pool, so r1's retry waits in the guard's queue. An operator cancels r1
    from the Temporal UI. Nothing touched gpu-01 (no ForceOff, no attempt), yet the
    operator finds it left cordoned "for a human" as if the power cycle had run.
    Rail: left cordoned only after a disruptive action touched the machine (I22,
    ``decision.left_cordoned``); the cancel signal's path uncordons here."""
    h = harness
    seen = lease_lost_during_backoff(h)
    r1 = await start_repair(h, "gpu-01", Action.power_cycle, "r1", requester=USER, alerts=[])
    for _ in range(300):
        st = await repair_status(h, "gpu-01", "r1")
        if "lease not held before retrying" in " | ".join(t.reason for t in st.history):
            break
        await h.env.sleep(timedelta(seconds=5))
    assert "lease not held before retrying" in " | ".join(t.reason for t in st.history)
    await between_tasks(r1)
    await r1.cancel()
    await closed(r1, "r1 closing")
    row = await h.ledger.get_repair("r1")
    assert row is not None and row["stage"] == "cancelled", row
    assert h.cluster.resets == []
    assert await attempt_outcomes(h, "r1") == []
    assert "gpu-01" not in h.cluster.cordons, row["transitions"][-1]["reason"]
    g = await guard_status(h)
    assert "r1" not in {x.repair_id for x in g.leases}
    await seen["r2"].signal("cancel", CancelSignal(by="t", reason="end"))


async def test_workflow_cancel_while_the_verified_node_rejoins_records_the_success(
    harness: Harness,
) -> None:
    """The power cycle ran, the node came back healthy and the fault did not recur; while
    the uncordon is out an operator cancels the repair from the Temporal UI. The operator
    then finds the attempt recorded ``failed`` (the ladder counts a failed power cycle
    that worked) and a critical "left cordoned for a human: the fault stands" although
    the node was verified healthy. Rail (I22, docs/design.md §5): the attempt records
    what the action did; a node is kept cordoned only without a verified recovery."""
    h = harness
    node, rid = "gpu-04", "tc-rejoin"
    handle: Any = None
    sent: list[bool] = []

    async def cancel_once(n: str) -> None:
        if sent:
            return
        sent.append(True)
        await handle.cancel()
        await asyncio.sleep(2)

    h.cluster.while_out["rejoin"] = cancel_once
    handle = await start_repair(h, node, Action.power_cycle, rid)
    await closed(handle, "the repair closing")
    assert sent, "the rejoin never ran"
    await asyncio.sleep(2.5)
    assert h.cluster.power_cycles == 1
    assert await attempt_outcomes(h, rid) == [("power_cycle", "succeeded")]
    row = await h.ledger.get_repair(rid)
    assert row is not None
    last = row["transitions"][-1]["reason"]
    assert "fault stands" not in last, last
    assert node not in h.cluster.cordons, last


async def test_an_uncordon_refused_after_a_verified_recovery_does_not_say_the_fault_stands(
    harness: Harness,
) -> None:
    """The power cycle ran and the node came back healthy with no recurrence; then the
    scheduler refuses the uncordon for good (Kubernetes 403). The repair ends ``failed``
    (the node is still cordoned), but the record says the power cycle *failed* and that
    "the node was not verified healthy; the fault stands" — an operator chasing the GPU
    fault finds nothing wrong with it, and the ladder counts a failed power cycle. Rail
    (I22): the attempt is recorded as what it did (succeeded); the ending names the
    uncordon failure."""
    from workflows.activity_api import ERR_AUTH

    h = harness
    node, rid = "gpu-05", "rj403"
    h.cluster.broken["rejoin"] = ERR_AUTH
    st = await (await start_repair(h, node, Action.power_cycle, rid)).result()
    assert h.cluster.power_cycles == 1
    assert st.stage == Stage.failed, st.history[-1]
    assert await attempt_outcomes(h, rid) == [("power_cycle", "succeeded")]
    last = st.history[-1].reason
    assert "not verified healthy" not in last, last
    assert "uncordon" in last, last


async def test_an_approval_after_continue_as_new_keeps_the_ladder_step_in_the_rule(
    harness: Harness,
) -> None:
    """Reboot ran twice on the machine, so the ladder makes this reboot a reprovision
    (consent automatic). The wait for idle is long and continues as new. Reprovision
    then cannot run (no image, nothing touched); a person approves what is shown. The
    rule recorded after that approval must still name the ladder step (docs/design.md
    §5: an approval is decided again from where the decision it approved was decided
    from); after the continue-as-new it is decided from reprovision instead, because
    ``_decided_from`` / ``_decided_blocked`` are not carried (``Carried``)."""
    from tests.workflows.test_repair_approval_covers import record
    from workflows.activity_api import ERR_UNSUPPORTED

    h = harness
    node, rid = "gpu-06", "can-rule"
    await record(h, node, Action.reboot, 2)
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 30
    h.policy.wait_for_idle.poll_max_s = 30
    h.cluster.busy_polls[node] = 12  # long enough for one continue-as-new at 100 events
    h.cluster.broken["reprovision"] = ERR_UNSUPPORTED
    fresh = make_alert(h.cluster.cluster, node, rid, observed_at=await h.env.get_current_time())
    handle = await start_repair(h, node, Action.reboot, rid, alerts=[fresh],
                                carried={"history_limit": 100})
    # time skips while the result is awaited, up to the reprovision that cannot run (the
    # repair then waits for a person)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(_until(
            h, lambda: h.cluster.count("reprovision", node) > 0)), 60)
    st = await wait_stage(h, node, rid, Stage.awaiting_approval)
    assert (await handle.describe()).run_id != handle.result_run_id, "never continued as new"
    assert st.action == Action.reprovision
    await handle.signal("approve", ApproveSignal(by="alice"))

    async def asked_again() -> bool:
        # the second "cannot run" question (not the first, which stays the stage while
        # the approved reprovision is tried again)
        s = await repair_status(h, node, rid)
        return s.stage == Stage.awaiting_approval and sum(
            t.stage == Stage.awaiting_approval and "cannot run" in t.reason
            for t in s.history) >= 2

    await eventually(asked_again, "reprovision tried again and the person asked again")
    st = await repair_status(h, node, rid)
    assert "reboot x2" in (st.decided_by_rule or ""), st.decided_by_rule
    await handle.signal("cancel", CancelSignal(by="alice", reason="test over"))
    await closed(handle, "the repair closing")


async def test_a_second_approve_while_queued_does_not_cover_the_ladders_next_action(
    harness: Harness,
) -> None:
    """Suspect (d), NOT a defect (passes): reboot ran once before; b1 reboots the node
    while b2 (approved for reboot) waits in the guard's queue, and a second person
    approves b2 again while it is queued. At the grant the ladder counts reboot x2 and
    makes b2 a reprovision: the queued approvals of reboot are dropped and a person is
    asked again; reprovision runs only after that."""
    from tests.workflows.test_repair_approval_covers import record

    h = harness
    node = "gpu-09"
    h.policy.consent.mode = "approve"
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls[node] = 5
    await record(h, node, Action.reboot, 1)
    now = await h.env.get_current_time()
    first = await start_repair(h, node, Action.reboot, "d1",
                               alerts=[make_alert(h.cluster.cluster, node, "d1",
                                                  observed_at=now)])
    await wait_stage(h, node, "d1", Stage.awaiting_approval)
    await first.signal("approve", ApproveSignal(by="oncall"))
    await wait_stage(h, node, "d1", Stage.waiting_for_idle)
    second = await start_repair(h, node, Action.reboot, "d2",
                                alerts=[make_alert(h.cluster.cluster, node, "d2",
                                                   observed_at=now)])
    await wait_stage(h, node, "d2", Stage.awaiting_approval)
    await second.signal("approve", ApproveSignal(by="oncall"))

    async def queued() -> bool:
        return "d2" in {p.repair_id for p in (await guard_status(h)).pending}

    await eventually(queued, "d2 queued behind d1")
    await second.signal("approve", ApproveSignal(by="bob"))
    assert (await first.result()).stage == Stage.succeeded

    async def asked_again() -> bool:
        st = await repair_status(h, node, "d2")
        return (st.stage == Stage.awaiting_approval and "acted on the node" in st.detail) \
            or h.cluster.count("reprovision", node) > 0

    await eventually(asked_again, "d2 asking again for reprovision")
    st = await repair_status(h, node, "d2")
    assert h.cluster.count("reprovision", node) == 0, st.decided_by_rule
    assert st.action == Action.reprovision, st.action
    await second.signal("cancel", CancelSignal(by="t", reason="end"))
    await second.result()


async def test_an_approval_of_a_lighter_action_at_the_next_rung_is_not_run_as_the_request(
    harness: Harness,
) -> None:
    """An operator asks for a reprovision (their request approves its first rung only).
    It fails after provisioning started, so the next rung — another reprovision — goes to
    a person (consent approve). The on-call approves ``--action reboot`` instead; reboot
    already ran twice on the machine, so the ladder makes it a reprovision. That second
    reprovision (local data lost again) then runs on the operator's original request, as
    if it were its first rung, though nobody approved it: the on-call is not asked again.
    Rail (docs/design.md §5): an operator's own request covers the action they asked for
    at its first rung only; an approval the ladder turns into another action asks again
    unless the consent policy allows it by itself."""
    from tests.workflows.test_repair_approval_covers import record

    h = harness
    node, rid = "gpu-11", "lr1"
    h.policy.consent.mode = "approve"
    h.policy.rails.repeat_offender.threshold = 10  # the ladder alone decides here
    await record(h, node, Action.reboot, 2)
    h.cluster.fail_actions["reprovision"] = 1
    fresh = make_alert(h.cluster.cluster, node, rid, observed_at=await h.env.get_current_time())
    handle = await start_repair(h, node, Action.reprovision, rid, alerts=[fresh],
                                requester=USER)

    async def asked() -> bool:
        st = await repair_status(h, node, rid)
        return st.stage == Stage.awaiting_approval or st.stage.value in (
            "succeeded", "failed", "cancelled")

    await eventually(asked, "the next rung asked for")
    st = await repair_status(h, node, rid)
    assert st.stage == Stage.awaiting_approval, st.history[-1]
    assert h.cluster.count("reprovision", node) == 1
    await handle.signal("approve", ApproveSignal(by="oncall", action=Action.reboot))

    async def decided() -> bool:
        s = await repair_status(h, node, rid)
        return h.cluster.count("reprovision", node) > 1 or h.cluster.count("reboot", node) > 0 \
            or (s.stage == Stage.awaiting_approval and "oncall approved reboot" in s.detail)

    await eventually(decided, "the approval of reboot decided")
    st = await repair_status(h, node, rid)
    assert h.cluster.count("reprovision", node) == 1, (
        f"a second reprovision ran on oncall's approval of reboot: rule {st.decided_by_rule!r}")
    await handle.signal("cancel", CancelSignal(by="oncall", reason="test over"))
    await handle.result()


async def test_a_power_cycle_cancelled_after_it_touched_the_machine_counts_for_the_node_cap(
    harness: Harness,
) -> None:
    """The node cap is one disruptive action per window. r1's power cycle runs (ForceOff,
    On) and a person cancels while it is out: the attempt is recorded ``cancelled``
    (it touched the machine, I22) and the node left cordoned. An operator looks, finds
    nothing, uncordons it. The fault fires again: r2 power-cycles the same node again at
    once, nobody asked — the cap did not count r1's power cycle because its outcome is
    ``cancelled``. Rail (docs/design.md §5): at most ``rails.max_actions_per_node``
    actions run on a node per window before a person decides; a touched attempt counts
    (I16, I22)."""
    h = harness
    node = "gpu-12"
    h.policy.rails.max_actions_per_node = 1
    r1: Any = None

    async def cancel_while_out(n: str) -> None:
        if h.cluster.power_cycles == 0:
            await r1.signal("cancel", CancelSignal(by="oncall", reason="wrong node?"))

    h.cluster.while_out["power_cycle"] = cancel_while_out
    r1 = await start_repair(h, node, Action.power_cycle, "cap1")
    done = await r1.result()
    assert done.stage == Stage.cancelled, done.history[-1]
    assert h.cluster.power_cycles == 1
    assert await attempt_outcomes(h, "cap1") == [("power_cycle", "cancelled")]
    # an operator checked the host and uncordoned it by hand
    h.cluster.cordons.pop(node, None)
    h.cluster.repair_cordoned.discard(node)
    fresh = make_alert(h.cluster.cluster, node, "cap2", observed_at=await h.env.get_current_time())
    r2 = await start_repair(h, node, Action.power_cycle, "cap2", alerts=[fresh])

    async def decided() -> bool:
        st = await repair_status(h, node, "cap2")
        return st.stage == Stage.awaiting_approval or h.cluster.power_cycles > 1 or \
            st.stage.value in ("succeeded", "failed", "cancelled")

    await eventually(decided, "r2 decided")
    st = await repair_status(h, node, "cap2")
    assert h.cluster.power_cycles == 1, (
        f"a second power cycle ran beyond the node cap: rule {st.decided_by_rule!r}")
    assert "node cap" in (st.decided_by_rule or ""), st.decided_by_rule
    await r2.signal("cancel", CancelSignal(by="t", reason="end"))
    await r2.result()
