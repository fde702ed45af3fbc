"""The repair decisions shared by the model-checked machine and RepairWorkflow
(workflows/lifecycle/decision.py): approval coverage, the fingerprint, recurrence and
what keeps a node cordoned."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.config import PolicyConfig
from workflows.lifecycle import decision
from workflows.lifecycle import repair as rm
from workflows.models import AUTO_APPROVED, Action, Alert, AttemptRecord
from workflows.models import Stage as S

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


def _alert(n: int = 1, at: datetime = NOW, **kw: object) -> Alert:
    base: dict[str, object] = dict(
        alert_id=f"c/n1/{n}", cluster="c", node="n1", kind="xid", code=79,
        severity="critical", actionable=True, action="power_cycle", summary="Xid 79",
        observed_at=at)
    base.update(kw)
    return Alert.model_validate(base)


def _attempt(action: Action, minutes_ago: float, repair: str = "other") -> AttemptRecord:
    return AttemptRecord(repair_id=repair, cluster="c", node="n1", machine_id="m1",
                         action=action, alert_kind="xid", code=79, outcome="failed",
                         at=NOW - timedelta(minutes=minutes_ago))


def _decide(attempts: list[AttemptRecord], requested: Action = Action.power_cycle,
            approver: str | None = None, policy: PolicyConfig | None = None
            ) -> decision.Decision:
    return decision.decide(requested, policy or PolicyConfig(), node="n1", machine="m1",
                           pool=None, alerts=[_alert()], attempts=attempts, now=NOW,
                           approver=approver)


def test_an_approval_covers_its_action_at_its_rung_only() -> None:
    d = _decide([])
    appr = decision.approval_of("alice", d)
    assert (appr.action, appr.rung) == (d.action, 0)
    assert decision.covers(appr, _decide([]), automatic=False)
    # another repair's attempt moved the rung: asked again, whatever the action
    moved = _decide([_attempt(Action.power_cycle, 5)])
    assert moved.rung == 1
    assert not decision.covers(appr, moved, automatic=False)
    # the consent policy's own allowance covers a changed decision by itself
    assert decision.covers(None, moved, automatic=True)
    assert not decision.covers(None, moved, automatic=False)


def test_an_approval_beyond_the_cap_stands_over_the_same_decision() -> None:
    policy = PolicyConfig.model_validate({"rails": {"max_actions_per_node": 1}})
    hist = [_attempt(Action.power_cycle, 5)]
    asked = _decide(hist, policy=policy)
    assert asked.needs_human.startswith("node cap: 1 disruptive actions on n1")
    approved = _decide(hist, approver="alice", policy=policy)
    assert approved.needs_human == ""
    assert "approved by alice beyond the ladder" in approved.rule
    # the fingerprint is the policy's own verdict, so the approval, given with the
    # approver, is compared with the decision made again without one
    assert approved.fingerprint == asked.fingerprint
    appr = decision.approval_of("alice", approved)
    assert decision.covers(appr, _decide(hist, policy=policy), automatic=True)
    # a third attempt meanwhile is another rung: asked again
    more = _decide([*hist, _attempt(Action.power_cycle, 1)], policy=policy)
    assert not decision.covers(appr, more, automatic=True)


def test_machine_and_workflow_share_the_coverage_rule() -> None:
    """The machine's ``covers`` is :func:`decision.covers` over its own state: an
    approval recorded by the machine's approve path covers the same decision and no
    heavier one."""
    s = rm.new_state("r1", "c", "n1", rm.Requester(kind="detector", name="ingest"),
                     Action.power_cycle, [_alert()])
    s = s.model_copy(update={"attempts": [], "policy": PolicyConfig()})
    s = rm._decide(s, NOW, Action.power_cycle)
    assert not rm.covers(s, NOW)  # approve_before_repair, no approval yet
    s = s.model_copy(update={"pending_approve": rm.Approval(
        by="alice", action=Action.none, rung=-1, fingerprint="")})
    s2, _ = rm._apply_approval(s, NOW, [])
    assert s2.approval is not None and s2.approval.by == "alice"
    assert rm.covers(s2, NOW)
    heavier = rm._decide(s2.model_copy(update={"attempts": [_attempt(Action.power_cycle, 5)]}),
                         NOW, Action.power_cycle)
    assert not rm.covers(heavier, NOW)
    assert rm.covers(heavier, NOW, defects=frozenset({"approval_carried_over"}))


def test_recurrence_is_judged_on_receive_time_and_boot() -> None:
    acted = NOW
    before = _alert(1, at=NOW - timedelta(minutes=10), received_at=NOW - timedelta(minutes=10))
    # an agent clock 4 min fast: observed "after" the action, received before it (I17)
    fast = _alert(2, at=NOW + timedelta(minutes=3), received_at=NOW - timedelta(minutes=1))
    assert decision.recurrence([before, fast], acted) is None
    late = _alert(3, at=NOW, received_at=NOW + timedelta(minutes=1),
                  evidence={"boot_id": "boot-a"})
    # a late report from the boot before the action is no recurrence
    assert decision.recurrence([before, late], acted, boot_before="boot-a") is None
    assert decision.recurrence([before, late], acted, boot_before="boot-b") == late
    # another fault (kind, code) than the repair had is not its recurrence
    other = _alert(4, received_at=NOW + timedelta(minutes=1), code=48)
    assert decision.recurrence([before, other], acted) is None
    # a cleared one neither
    cleared = _alert(5, received_at=NOW + timedelta(minutes=1), active=False)
    assert decision.recurrence([before, cleared], acted) is None


def test_left_cordoned_names_why() -> None:
    assert decision.left_cordoned(None, [], S.cancelled) is None
    assert decision.left_cordoned(None, [Action.power_cycle], S.succeeded) is None
    why = decision.left_cordoned(None, [Action.power_cycle, Action.reprovision], S.failed)
    assert why is not None and why.startswith("power_cycle, reprovision ran")
    assert decision.left_cordoned("removed for RMA", [Action.remove], S.succeeded) == \
        "removed for RMA"


def test_auto_approval_records_what_it_covers() -> None:
    d = _decide([])
    appr = decision.approval_of(AUTO_APPROVED, d)
    assert appr.fingerprint == "power_cycle|rung 0|policy"


def test_a_report_from_the_new_boot_during_the_action_is_a_recurrence() -> None:
    """A reboot returns only after "booted"; the agent of the new boot may report the
    fault again before that: received after the action started, from another boot than
    the one before it, it is a recurrence. A report of an older boot received before the
    action started is not."""
    started, acted = NOW, NOW + timedelta(minutes=5)
    first = _alert(1, at=NOW - timedelta(minutes=10), received_at=NOW - timedelta(minutes=10),
                   evidence={"boot_id": "boot-a"})
    again = _alert(2, at=NOW + timedelta(minutes=3), received_at=NOW + timedelta(minutes=3),
                   evidence={"boot_id": "boot-b"})
    assert decision.recurrence([first, again], acted, "boot-a", started) == again
    assert decision.recurrence([first, again], acted, "boot-a") is None  # no start known
    older = _alert(3, at=NOW - timedelta(minutes=2), received_at=NOW - timedelta(minutes=2),
                   evidence={"boot_id": "boot-0"})
    assert decision.recurrence([first, older], acted, "boot-a", started) is None


def test_migrate_gate_counts_critical_history_by_receive_time() -> None:
    """I17: a critical alert from a host whose clock is 11 days behind, received now,
    is within the gate's 10-day window; one received 11 days ago is not."""
    from workflows.config import MigrateGateConfig
    from workflows.policy import migrate_gate

    gate = MigrateGateConfig()
    slow = _alert(1, at=NOW - timedelta(days=11), received_at=NOW - timedelta(hours=1))
    old = _alert(2, at=NOW - timedelta(hours=1), received_at=NOW - timedelta(days=11))
    warn = _alert(3, severity="warning")
    assert migrate_gate(Action.migrate, [warn], [slow], NOW, gate).action == Action.migrate
    assert migrate_gate(Action.migrate, [warn], [old], NOW, gate).action == Action.reprovision
