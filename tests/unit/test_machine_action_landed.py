"""The machine-action lifecycle (workflows/lifecycle/machine_action.py) after a cancel at
``off_requested`` (ForceOff possibly sent, its answer lost): a make-safe run that proves
the ForceOff never landed ends the attempt cancelled and untouched — no attempt recorded
(I22), the repair's cleanup uncordons (I1) — where it recorded a cancelled attempt, held
the node "cancelled after it touched the machine" and said the cycle "reached booted".
A try that ended without reporting its phase keeps the attempt touched: its ForceOff
and On may both have gone out (the power On then proves nothing)."""

from __future__ import annotations

from datetime import UTC, datetime

from workflows.lifecycle import machine_action as ma
from workflows.models import Action

NOW = datetime(2026, 12, 7, 12, tzinfo=UTC)
NOT_LANDED = ma.ActivityOk(phase="booted", nothing_landed=True,
                           detail="making safe: power stayed On for 120 s, the earlier "
                                  "ForceOff did not land; nothing sent")


def _cancelled_at_off_requested(uncertain: bool) -> tuple[ma.MachineActionState,
                                                          list[ma.Command]]:
    s = ma.new_state(Action.power_cycle, "r/power_cycle/1", 900)
    s, _ = ma.step(s, ma.Start(), NOW)
    s, _ = ma.step(s, ma.Cancel(by="oncall"), NOW)
    # the worker died (its last heartbeat said off_requested), or a BMC read failed there
    fail: ma.Event = (ma.WorkerRestart(phase="off_requested") if uncertain
                      else ma.BmcReadFailed(phase="off_requested"))
    s, cmds = ma.step(s, fail, NOW)
    run = [c for c in cmds if isinstance(c, ma.RunActivity)]
    assert run and run[0].purpose == "make_safe", cmds
    return s, cmds


def test_a_forceoff_proved_not_landed_is_no_attempt() -> None:
    s, _ = _cancelled_at_off_requested(uncertain=False)
    s, cmds = ma.step(s, NOT_LANDED, NOW)
    assert not any(isinstance(c, ma.RecordAttempt) for c in cmds), cmds
    fin = cmds[-1]
    assert isinstance(fin, ma.Finish) and fin.outcome == "cancelled" and not fin.touched, fin
    assert "never landed" in fin.detail and "reached booted" not in fin.detail, fin.detail
    assert s.status == ma.Status.cancelled and not s.touched


def test_after_a_try_that_did_not_report_its_phase_the_attempt_stays_touched() -> None:
    s, _ = _cancelled_at_off_requested(uncertain=True)
    s, cmds = ma.step(s, NOT_LANDED, NOW)
    assert [c.outcome for c in cmds if isinstance(c, ma.RecordAttempt)] == ["cancelled"]
    fin = cmds[-1]
    assert isinstance(fin, ma.Finish) and fin.outcome == "cancelled" and fin.touched, fin
