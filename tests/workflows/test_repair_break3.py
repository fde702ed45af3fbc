"""Repair rails a break-test of bb83125 found open, each a reproduction that failed
there (the real RepairWorkflow on the time-skipping server, the project's harness):

- a request naming action ``none`` (typed by hand) cordoned and drained the node, then
  its workflow task failed for ever (KeyError), the node left cordoned, the lease held;
- I18: the RMA hold was not read again after a person chose what runs instead of an
  action that could not run (``acted`` popped back to the rung the hold was read for);
- an approve naming no action (a typo) was dropped by the SDK without a trace, and a
  cancel with a payload missing ``by`` too;
- I20: after a GPU reset (no reboot) the same fault reported again from the same boot
  was taken for a late report of "the boot before the action": the reset that did not
  hold ended ``succeeded``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from temporalio import activity

from tests.workflows.conftest import FakeCluster, Harness, make_alert
from tests.workflows.helpers import (
    attempt_outcomes,
    eventually,
    repair_result,
    repair_status,
    start_repair,
    wait_stage,
)
from tests.workflows.test_node import repair_result as node_repair_result
from workflows.activity_api import ACT, ActionResult, AttemptRecord, MachineActionInput
from workflows.models import Action, AlertOutcome, ApproveSignal, Stage


async def test_a_request_for_action_none_fails_before_touching_the_node(
    harness: Harness,
) -> None:
    h = harness
    node, rid = "gpu-12", "bad1"
    st = await repair_result(await start_repair(h, node, Action.none, rid))
    assert st.stage == Stage.failed, st.history[-1]
    assert "action 'none' is not an action a repair can run" in st.history[-1].reason
    assert "RepairRequest.action" in st.history[-1].reason
    assert h.cluster.count("cordon", node) == 0 and h.cluster.count("drain", node) == 0
    assert node not in h.cluster.repair_cordoned


async def _held_by_another(h: Harness, node: str, rid: str) -> None:
    await h.ledger.record_attempt(AttemptRecord(
        repair_id=rid, cluster=h.cluster.cluster, node=node, machine_id=f"m-{node}",
        action=Action.remove, alert_kind="xid", code=79, outcome="succeeded",
        at=datetime.now(UTC) - timedelta(hours=1)))
    assert await h.ledger.machine_hold(h.cluster.cluster, f"m-{node}") is not None


async def test_hold_is_read_again_after_a_person_chose_another_action(harness: Harness) -> None:
    """reprovision cannot run (no image: nothing touched) → a person decides; meanwhile
    another repair removes the machine for RMA; the person approves ``--action reboot``:
    the held machine is not rebooted (I18), the repair ends ``cancelled`` naming it."""
    h = harness
    node = "gpu-05"
    h.cluster.broken["reprovision"] = "UnsupportedAction"
    fresh = make_alert(h.cluster.cluster, node, "hb1", observed_at=await h.env.get_current_time())
    handle = await start_repair(h, node, Action.reprovision, "hb1", alerts=[fresh])
    st = await wait_stage(h, node, "hb1", Stage.awaiting_approval)
    assert "cannot run" in st.detail, st.detail
    await _held_by_another(h, node, "r-rma-other")
    await handle.signal("approve", ApproveSignal(by="oncall", action=Action.reboot))
    done = await handle.result()
    assert h.cluster.count("reboot", node) == 0, done.history[-1]
    assert done.stage == Stage.cancelled and "held for RMA" in done.history[-1].reason


class _ResetCannotRun(FakeCluster):
    @activity.defn(name=ACT.reset_gpu)
    async def reset_gpu(self, inp: MachineActionInput) -> ActionResult:
        self._log("reset_gpu", inp.node)
        return ActionResult(done=False, not_run=f"reset job not placed on {inp.node}: "
                            "GPU in use by a process outside the scheduler")


@pytest.fixture
def reset_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeCluster, "reset_gpu", _ResetCannotRun.reset_gpu)


async def test_hold_is_read_again_after_reset_gpu_could_not_run_and_a_person_approved(
    reset_cannot_run: None, harness: Harness,
) -> None:
    """reset_gpu cannot run (nothing touched) → reboot, which a person approves; the
    machine was removed for RMA meanwhile: it is not rebooted (I18)."""
    h = harness
    node = "gpu-16"
    h.policy.consent.mode = "approve"
    h.policy.consent.automatic_actions = [Action.reset_gpu]
    alert = make_alert(h.cluster.cluster, node, "hb2", code=48, action="reset_gpu",
                       observed_at=await h.env.get_current_time())
    handle = await start_repair(h, node, Action.reset_gpu, "hb2", alerts=[alert])
    for _ in range(400):
        st = await wait_stage(h, node, "hb2", Stage.awaiting_approval)
        if "cannot run" in st.detail:
            break
    assert h.cluster.count("reset_gpu", node) == 1, st.detail
    await _held_by_another(h, node, "r-rma-other2")
    await handle.signal("approve", ApproveSignal(by="oncall"))
    done = await handle.result()
    assert h.cluster.count("reboot", node) == 0, done.history[-1]
    assert done.stage == Stage.cancelled and "held for RMA" in done.history[-1].reason


async def test_a_reset_that_did_not_hold_is_seen_from_the_same_boot(harness: Harness) -> None:
    """After a ``reset_gpu`` (no reboot) the same fault received after the reset, from the
    same boot, is the fault coming back (I20): the attempt is failed and the ladder moves
    on; the boot rule "a late report of the boot before the action" is for rebooting
    actions only."""
    h = harness
    c = h.cluster.cluster
    node = "gpu-07"
    h.cluster.unhealthy.add(node)  # the node is slow to report ready after the reset
    now = await h.env.get_current_time()
    x1 = make_alert(c, node, "dbe-1", code=48, action="reset_gpu",
                    summary="Xid 48: double-bit ECC", evidence={"boot_id": "boot-0"},
                    observed_at=now, received_at=now)
    d = await h.deliver(x1)
    assert d.outcome == AlertOutcome.recommended and d.repair_id, d
    for _ in range(60):
        if h.cluster.count("reset_gpu", node):
            break
        await h.env.sleep(timedelta(seconds=10))
    assert h.cluster.count("reset_gpu", node) == 1
    later = await h.env.get_current_time()
    x2 = make_alert(c, node, "dbe-2", code=48, action="reset_gpu",
                    summary="Xid 48: double-bit ECC", evidence={"boot_id": "boot-0"},
                    observed_at=later, received_at=later)
    d2 = await h.deliver(x2)
    assert d2.outcome == AlertOutcome.attached, d2
    h.cluster.unhealthy.discard(node)
    st = await node_repair_result(h, node, d.repair_id)
    outcomes = await attempt_outcomes(h, d.repair_id)
    assert outcomes and outcomes[0] == ("reset_gpu", "failed"), (st.stage, outcomes)
    assert "fault recurred after reset_gpu" in " | ".join(t.reason for t in st.history)


async def test_an_approve_naming_an_unknown_action_is_refused_in_the_history(
    harness: Harness,
) -> None:
    """``approve {"by": "oncall", "action": "reprovison"}`` (a typo typed in the UI/CLI)
    approves nothing and says why, naming the field and the value; the repair keeps
    waiting for a readable answer. A cancel whose payload cannot be read still cancels
    (a person said stop, I19)."""
    h = harness
    h.policy.consent.mode = "approve"
    node, rid = "gpu-13", "bad2"
    handle = await start_repair(h, node, Action.reboot, rid)
    await wait_stage(h, node, rid, Stage.awaiting_approval)
    await handle.signal("approve", {"by": "oncall", "action": "reprovison"})

    async def said() -> bool:
        st = await repair_status(h, node, rid)
        return any("approve signal refused: action: 'reprovison'" in t.reason
                   for t in st.history)

    await eventually(said, "the refused approve in the history")
    st = await repair_status(h, node, rid)
    assert st.stage == Stage.awaiting_approval and h.cluster.count("reboot", node) == 0
    await handle.signal("cancel", {"reason": "typo, stop it"})  # no "by"
    done = await handle.result()
    assert done.stage == Stage.cancelled and done.history[-1].by == "unknown", done.history[-1]
    assert h.cluster.count("reboot", node) == 0
