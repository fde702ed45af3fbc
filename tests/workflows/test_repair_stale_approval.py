"""An approve sent while a rung ran is cleared when the rung fails and the ladder asks a
person for the next (an approval covers one action at one rung), and it is answered with
a note: an approval never vanishes without a word (it was dropped silently before)."""

from __future__ import annotations

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import eventually, repair_status, start_repair, wait_stage
from workflows.lifecycle import decision
from workflows.lifecycle import repair as rm
from workflows.models import Action, ApproveSignal, RejectSignal, Stage
from workflows.protocol import STATE_AWAITING_APPROVAL


async def test_an_approve_sent_while_a_rung_ran_is_answered_when_the_next_is_asked(
    harness: Harness,
) -> None:
    h = harness
    h.policy.consent.mode = "approve"
    node = "gpu-05"
    now = await h.env.get_current_time()
    handle = await start_repair(h, node, Action.power_cycle, "sa-1",
                                alerts=[make_alert(h.cluster.cluster, node, "sa-1",
                                                   observed_at=now)])
    await wait_stage(h, node, "sa-1", Stage.awaiting_approval)
    await handle.signal("approve", ApproveSignal(by="oncall"))

    async def approve_while_out(_: str) -> None:
        # bob approves what the repair shows while the power cycle is under way
        await handle.signal("approve", ApproveSignal(by="bob"))

    h.cluster.while_out["power_cycle"] = approve_while_out
    h.cluster.fail_actions["power_cycle"] = 1

    async def asked_again() -> bool:
        st = await repair_status(h, node, "sa-1")
        return (st.stage == Stage.awaiting_approval and st.state == STATE_AWAITING_APPROVAL
                and h.cluster.count("power_cycle", node) == 1)

    await eventually(asked_again, "the repair asking a person for the next rung")
    st = await repair_status(h, node, "sa-1")
    notes = " | ".join(t.reason for t in st.history)
    assert "approve by bob of power_cycle not applied" in notes, notes
    assert h.cluster.count("power_cycle", node) == 1  # bob's approve ran nothing
    await handle.signal("reject", RejectSignal(by="bob", reason="test over"))
    assert (await handle.result()).stage == Stage.rejected


def test_the_repair_machine_answers_an_approve_cleared_at_the_next_question() -> None:
    """The pure machine decides the same: asking after a rung with an approve pending
    records the stale-approval note before the question, and clears the approve."""
    from tests.model.repair_world import T0, _new

    s, _ = _new(False)
    s = s.model_copy(update={
        "acted": [Action.reboot],
        "pending_approve": decision.Approval(by="bob", action=Action.reboot, rung=0,
                                             fingerprint=""),
    })
    s2, cmds = rm._ask(s, T0, "reboot failed")
    reasons = [c.reason for c in cmds if isinstance(c, rm.RecordTransition)]
    assert reasons[0] == decision.stale_approval_note("bob", Action.reboot, s.action), reasons
    assert reasons[1].startswith("approval needed"), reasons
    assert s2.pending_approve is None and s2.status == rm.Status.awaiting_approval
