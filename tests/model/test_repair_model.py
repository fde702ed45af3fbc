"""The model checker over the repair lifecycle (issue 26 item 4): the CI bound, every
(status, event) pair decided, and each planted defect found."""

from __future__ import annotations

import pytest

from tests.model.repair_world import check
from workflows.lifecycle.repair import DEFECTS, EVENT_KINDS, TRANSITIONS, Status
from workflows.models import Action

#: The CI bound: every repair event sequence of up to 16 events (about 6 s here), deep
#: enough for a first rung to fail and the person to be asked for the next.
CI_DEPTH = 16


def test_repair_machine_holds_every_invariant_to_the_ci_bound() -> None:
    res = check(CI_DEPTH)
    assert not res.violations, res.violations[:3]
    assert res.states > 3_000  # the whole bounded space, not a sample


def test_every_repair_status_event_pair_is_in_the_table() -> None:
    assert set(TRANSITIONS) == {(s, k) for s in Status for k in EVENT_KINDS}
    assert all(TRANSITIONS.values())


@pytest.mark.parametrize(
    ("defect", "invariant", "depth"),
    [
        ("cancel_lost_across_can", "I19", 16),
        ("approval_carried_over", "approval", 15),
        ("act_on_held_machine", "I18", 10),
        ("adopt_stale_cordon", "I18", 13),
        # a cancel while the node rejoins, a recurrence, the next rung approved
        ("cancel_ignored_between_rungs", "I19", 18),
        # shadow mode ignored: the cordon is commanded once the lease is granted
        ("act_in_shadow", "shadow", 9),
        # the renewal refused while the node drains towards idle, then the drain or the
        # action on the lapsed lease
        ("reuse_lapsed_lease", "lease", 13),
        # a window opens while the lease is asked for; the repair cordons inside it
        ("cordon_in_maintenance", "maintenance", 10),
        # the machine is removed while the node is busy; the drain follows the idle check
        ("hold_read_only_before_cordon", "I18", 14),
    ],
)
def test_checker_finds_each_planted_repair_defect(defect: str, invariant: str,
                                                  depth: int) -> None:
    assert defect in DEFECTS
    res = check(depth, defects=frozenset({defect}), stop_at_first=True)
    assert res.violations, f"{defect} not found"
    what, trace = res.violations[0]
    assert invariant in what, (what, trace)
    assert len(trace) <= depth  # BFS: the shortest trace


def test_a_shadow_repair_decides_then_ends_shadowed_without_a_disruptive_command() -> None:
    """The shadow world's happy path: policy read in shadow, a person approves, the lease
    is granted, no maintenance window covers the node, the hold is asked again — then ``shadowed`` with the attempt it stood for,
    the lease released, and no cordon / drain / machine command anywhere."""
    from tests.model.repair_world import POLICY, T0, _new
    from workflows.lifecycle import repair as rm

    s, _ = _new(False, shadow=True)
    events: list[rm.Event] = [
        rm.Start(), rm.PolicyRead(policy=POLICY, machine="m1", mode="shadow"),
        rm.HoldRead(held=False), rm.HistoryRead(attempts=[]), rm.Approve(by="alice"),
        rm.LeaseReply(granted=True), rm.HistoryRead(attempts=[]), rm.MaintenanceRead(),
        rm.HoldRead(held=False)]
    every: list[rm.Command] = []
    for ev in events:
        s, cmds = rm.step(s, ev, T0)
        every += cmds
    assert s.status == rm.Status.ended and s.stage.value == "shadowed"
    assert not any((isinstance(c, rm.RunActivity) and c.name in ("cordon_node", "drain_node"))
                   or isinstance(c, rm.MachineCommand | rm.StartValidation) for c in every)
    kinds = [c.kind for c in every[-4:]]
    assert kinds == ["record_attempt", "signal_guard", "record_transition", "finish"], kinds
    rec = every[-4]
    assert isinstance(rec, rm.RecordAttempt) and rec.outcome == "shadowed"
    fin = every[-1]
    assert isinstance(fin, rm.Finish) and "would cordon n1" in fin.reason
    assert "then reboot m1" in fin.reason and not fin.uncordon


def _queued_then_moved(approve_named: Action | None) -> tuple[object, list[object]]:
    """Approved reboot, the lease queued; a second approve comes (``approve_named``) and
    another repair's two reboots make the ladder move to reprovision at grant time."""
    from datetime import timedelta

    from tests.model.repair_world import POLICY, T0, _new
    from workflows.lifecycle import repair as rm
    from workflows.models import AttemptRecord

    s, _ = _new(False)
    moved = [AttemptRecord(repair_id=f"other-{i}", cluster="c1", node="n1", machine_id="m1",
                           action=Action.reboot, alert_kind="xid", code=79,
                           outcome="succeeded", at=T0 - timedelta(hours=i + 1))
             for i in range(2)]
    events: list[rm.Event] = [
        rm.Start(), rm.PolicyRead(policy=POLICY, machine="m1"), rm.HoldRead(held=False),
        rm.HistoryRead(attempts=[]), rm.Approve(by="alice"),
        rm.Approve(by="bob", action=approve_named), rm.LeaseReply(granted=True),
        rm.HistoryRead(attempts=moved)]
    every: list[rm.Command] = []
    for ev in events:
        s, cmds = rm.step(s, ev, T0)
        every += cmds
    return s, list(every)


def test_an_approve_naming_the_new_action_while_queued_is_applied_by_the_machine() -> None:
    """The pure machine agrees with RepairWorkflow (test_repair_break7.py): bob's approve
    of reprovision, sent while the approved reboot's lease was queued, is applied when the
    ladder moves there; it is not dropped and the person is not left asked."""
    from workflows.lifecycle import repair as rm

    s, _ = _queued_then_moved(Action.reprovision)
    assert isinstance(s, rm.RepairState)
    assert s.action == Action.reprovision and s.status != rm.Status.awaiting_approval
    assert s.approval is not None and s.approval.by == "bob"


def test_an_approve_of_the_earlier_decision_while_queued_is_answered_by_the_machine() -> None:
    """An approve naming nothing (of the reboot shown) while queued is not applied to the
    reprovision the ladder moved to: a note says so and the person is asked again."""
    from workflows.lifecycle import repair as rm

    s, every = _queued_then_moved(None)
    assert isinstance(s, rm.RepairState)
    assert s.status == rm.Status.awaiting_approval and s.pending_approve is None
    notes = [c.reason for c in every if isinstance(c, rm.RecordTransition)]
    assert any("approve by bob of reboot not applied" in n for n in notes), notes
