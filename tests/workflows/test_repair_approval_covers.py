"""What an approval covers (a break-test of bb83125; each failed there): an early
approve of the action shown does not authorise the heavier action the ladder or the
repeat-offender rule makes of it; the recorded rule keeps the ladder step; an operator's
own request is not turned into an unasked heavier action; a double approve does not
cover the next rung."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio.client import WorkflowHandle

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import repair_status
from workflows.activity_api import AttemptRecord
from workflows.models import Action, ApproveSignal, RejectSignal, RepairRequest, RepairStatus, Stage
from workflows.protocol import REPAIR_SIGNAL_APPROVE, workflow_id_repair


async def record(h: Harness, node: str, action: Action, n: int) -> None:
    now = await h.env.get_current_time()
    for i in range(n):
        await h.ledger.record_attempt(AttemptRecord(
            repair_id=f"old-{node}-{action.value}-{i}", cluster=h.cluster.cluster,
            node=node, machine_id=f"m-{node}", action=action, alert_kind="xid", code=79,
            outcome="succeeded", at=now - timedelta(hours=1 + i)))


async def test_early_approval_of_reboot_does_not_authorize_the_ladders_reprovision(
    harness: Harness,
) -> None:
    """The person approves the repair as shown (reboot, stage recommended) before it
    asks; the ladder then moves it to reprovision (reboot ran twice already). An
    approval covers one action at one rung: reprovision (heavier, local data lost) must
    be asked for again, not run on the approval of reboot."""
    h = harness
    h.policy.consent.mode = "approve"
    node = "gpu-07"
    await record(h, node, Action.reboot, 2)
    req = RepairRequest(
        repair_id="ea1", cluster=h.cluster.cluster, node=node, action=Action.reboot,
        alerts=[make_alert(h.cluster.cluster, node, "ea1",
                           observed_at=await h.env.get_current_time())],
    )
    handle: WorkflowHandle[Any, RepairStatus] = await h.client.start_workflow(
        "RepairWorkflow", req, id=workflow_id_repair(h.cluster.cluster, node, "ea1"),
        task_queue=h.task_queue, result_type=RepairStatus,
        start_signal=REPAIR_SIGNAL_APPROVE, start_signal_args=[ApproveSignal(by="alice")],
    )
    # either it asks again (a second awaiting_approval) or it goes on to cordon
    for _ in range(400):
        st = await repair_status(h, node, "ea1")
        stages = [t.stage for t in st.history]
        if stages.count(Stage.awaiting_approval) >= 2 or Stage.cordoning in stages:
            break
        await asyncio.sleep(0.05)
    if Stage.cordoning in stages:
        await handle.result()
    else:
        await handle.signal("reject", RejectSignal(by="alice", reason="test over"))
        await handle.result()
    assert h.cluster.count("reprovision", node) == 0, (
        f"reprovision ran on alice's approval of reboot; rule: {st.decided_by_rule}; "
        f"approved_by={st.approved_by}")


async def test_rule_recorded_after_approving_an_escalated_action_names_the_ladder(
    harness: Harness,
) -> None:
    """The ladder moves reboot to reprovision (reboot ran twice); the repair asks; the
    person approves what is shown (reprovision). The recorded rule must still name the
    ladder step that changed the decision (issue 26: 'the recorded rule names every step
    that changed it')."""
    from tests.workflows.helpers import start_repair, wait_stage

    h = harness
    h.policy.consent.mode = "approve"
    node = "gpu-08"
    await record(h, node, Action.reboot, 2)
    fresh = make_alert(h.cluster.cluster, node, "ea2", observed_at=await h.env.get_current_time())
    handle = await start_repair(h, node, Action.reboot, "ea2", alerts=[fresh])
    st = await wait_stage(h, node, "ea2", Stage.awaiting_approval)
    asked_rule = st.decided_by_rule
    assert st.action == Action.reprovision and "reboot x2" in (asked_rule or ""), asked_rule
    await handle.signal("approve", ApproveSignal(by="alice"))
    done = await handle.result()
    assert done.stage == Stage.succeeded
    assert "reboot x2" in (done.decided_by_rule or ""), (
        f"asked with rule {asked_rule!r}; recorded after approval: {done.decided_by_rule!r}")


async def test_operators_own_reboot_is_not_turned_into_an_unasked_reprovision(
    harness: Harness,
) -> None:
    """An operator creates a reboot (their create counts as their approval of reboot,
    docs/design.md §4.1). The ladder moves it to reprovision (reboot ran twice; local
    data lost). Consent mode is approve-before-repair, reprovision is not in the
    automatic actions: an approval covers one action, so the operator must be asked
    about reprovision, not have it run on their approval of reboot."""
    from tests.workflows.helpers import start_repair
    from workflows.models import Requester, RequesterKind

    h = harness
    h.policy.consent.mode = "approve"
    node = "gpu-09"
    await record(h, node, Action.reboot, 2)
    fresh = make_alert(h.cluster.cluster, node, "ou1", observed_at=await h.env.get_current_time())
    handle = await start_repair(h, node, Action.reboot, "ou1", alerts=[fresh],
                                requester=Requester(kind=RequesterKind.user, name="ops"))
    for _ in range(400):
        st = await repair_status(h, node, "ou1")
        stages = [t.stage for t in st.history]
        if Stage.awaiting_approval in stages or Stage.cordoning in stages:
            break
        await asyncio.sleep(0.05)
    if Stage.cordoning in stages:
        st = await handle.result()
    else:
        await handle.signal("reject", RejectSignal(by="ops", reason="test over"))
        await handle.result()
    assert h.cluster.count("reprovision", node) == 0, (
        f"ops asked for reboot; reprovision ran unasked: rule {st.decided_by_rule!r}, "
        f"approved_by={st.approved_by}")


async def test_early_approval_of_reboot_does_not_remove_a_repeat_offender(
    harness: Harness,
) -> None:
    """The same early approval (sent with the start, while the repair shows reboot) on a
    machine that the repeat-offender rule sends to ``remove`` for a person: the person
    approved a reboot, never saw ``remove``; the machine must not be pulled for RMA on
    that approval."""
    h = harness
    h.policy.consent.mode = "approve"
    node = "gpu-10"
    now = await h.env.get_current_time()
    for i in range(3):  # three earlier repairs, another fault kind (the ladder is quiet)
        await h.ledger.record_attempt(AttemptRecord(
            repair_id=f"old-ro-{i}", cluster=h.cluster.cluster, node=node,
            machine_id=f"m-{node}", action=Action.reboot, alert_kind="ib_link_down",
            code=None, outcome="succeeded", at=now - timedelta(days=1 + i)))
    req = RepairRequest(
        repair_id="ea3", cluster=h.cluster.cluster, node=node, action=Action.reboot,
        alerts=[make_alert(h.cluster.cluster, node, "ea3", observed_at=now)],
    )
    handle: WorkflowHandle[Any, RepairStatus] = await h.client.start_workflow(
        "RepairWorkflow", req, id=workflow_id_repair(h.cluster.cluster, node, "ea3"),
        task_queue=h.task_queue, result_type=RepairStatus,
        start_signal=REPAIR_SIGNAL_APPROVE, start_signal_args=[ApproveSignal(by="alice")],
    )
    for _ in range(400):
        st = await repair_status(h, node, "ea3")
        stages = [t.stage for t in st.history]
        if stages.count(Stage.awaiting_approval) >= 2 or Stage.cordoning in stages:
            break
        await asyncio.sleep(0.05)
    if Stage.cordoning in stages:
        st = await handle.result()
    else:
        await handle.signal("reject", RejectSignal(by="alice", reason="test over"))
        await handle.result()
    assert h.cluster.count("remove", node) == 0, (
        f"machine removed for RMA on alice's approval of reboot: rule {st.decided_by_rule!r}")


async def test_double_approval_does_not_cover_the_next_rung(harness: Harness) -> None:
    """Held: approve sent twice (a double click); the reboot fails (touched) → the next
    attempt is asked for again, the second approve is not taken as its approval."""
    from tests.workflows.helpers import start_repair, wait_stage

    h = harness
    h.policy.consent.mode = "approve"
    node = "gpu-17"
    h.cluster.fail_actions["reboot"] = 1
    fresh = make_alert(h.cluster.cluster, node, "da1", observed_at=await h.env.get_current_time())
    handle = await start_repair(h, node, Action.reboot, "da1", alerts=[fresh])
    await wait_stage(h, node, "da1", Stage.awaiting_approval)
    await handle.signal("approve", ApproveSignal(by="alice"))
    await handle.signal("approve", ApproveSignal(by="alice"))
    for _ in range(400):
        st = await repair_status(h, node, "da1")
        if [t.stage for t in st.history].count(Stage.awaiting_approval) >= 2 or (
                st.stage.value in ("succeeded", "failed")):
            break
        await asyncio.sleep(0.05)
    assert h.cluster.count("reboot", node) == 1, st.history
    assert st.stage == Stage.awaiting_approval, st.stage
    await handle.signal("reject", RejectSignal(by="alice", reason="over"))
    await handle.result()
