"""The machine action carries when the attempt's restart was sent (``sent_at``, UTC, as
the activity reported it in its failure details or last heartbeat) into every retry, so
a reboot's ``RESTART_SEEN_S`` window is counted from the send, not afresh per retry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

from workflows.lifecycle import machine_action as ma
from workflows.models import Action
from workflows.repair import _failure_event

NOW = datetime(2026, 12, 7, 12, tzinfo=UTC)
SENT = NOW - timedelta(seconds=300)


def _err(cause: BaseException) -> ActivityError:
    err = ActivityError("activity failed", scheduled_event_id=1, started_event_id=2,
                        identity="w", activity_type="x", activity_id="1", retry_state=None)
    err.__cause__ = cause
    return err


def _retry(s: ma.MachineActionState, ev: ma.Event) -> tuple[ma.MachineActionState,
                                                              ma.RunActivity]:
    s, cmds = ma.step(s, ev, NOW)
    s, cmds = ma.step(s, ma.TimerFired(), NOW + timedelta(seconds=10))
    run = [c for c in cmds if isinstance(c, ma.RunActivity)]
    assert run, cmds
    return s, run[0]


def test_the_send_time_is_carried_into_every_retry_and_never_moved() -> None:
    s = ma.new_state(Action.reboot, "r/reboot/1", 3600)
    s, cmds = ma.step(s, ma.Start(), NOW)
    first = cmds[-1]
    assert isinstance(first, ma.RunActivity) and first.sent_at is None
    s, run = _retry(s, ma.WorkerRestart(phase="restart_sent", sent_at=SENT))
    assert run.resume_phase == "restart_sent" and run.sent_at == SENT, run
    # a later try reports a later time (its own fallback): the first one stands
    s, run = _retry(s, ma.BmcReadFailed(phase="restart_sent", sent_at=NOW))
    assert run.sent_at == SENT and s.sent_at == SENT, run


def test_the_workflow_reads_the_send_time_from_failure_and_heartbeat_details() -> None:
    failed = _failure_event(Action.reboot, _err(ApplicationError(
        "power read failed", {"phase": "restart_sent", "sent_at": SENT.isoformat()},
        type="BmcUnavailable")), "not_started")
    assert isinstance(failed, ma.BmcReadFailed) and failed.sent_at == SENT, failed
    died = _failure_event(Action.reboot, _err(TimeoutError(
        "timed out", type=TimeoutType.HEARTBEAT,
        last_heartbeat_details=[{"phase": "restart_sent", "power": "On",
                                 "sent_at": SENT.isoformat()}])), "not_started")
    assert isinstance(died, ma.WorkerRestart) and died.sent_at == SENT, died
    plain = _failure_event(Action.reboot, _err(ApplicationError(
        "x", {"phase": "restart_sent"}, type="BmcUnavailable")), "not_started")
    assert isinstance(plain, ma.BmcReadFailed) and plain.sent_at is None
