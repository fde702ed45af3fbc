"""A machine action the BMC activity skipped because the host had already rebooted
(its boot identity changed since the attempt began; ``ActionResult.skipped_reason``):
nothing was sent, so nothing is an attempt (I22), unless a try of this attempt had
already reported the disruptive phase, or ended without reporting its phase itself (a
worker died, a time-out): then the reboot may be ours and counts."""

from __future__ import annotations

from datetime import UTC, datetime

from workflows.lifecycle.machine_action import (
    ActivityFailed,
    ActivityOk,
    Cancel,
    Finish,
    RecordAttempt,
    Start,
    TimerFired,
    WorkerRestart,
    new_state,
    step,
)
from workflows.models import Action

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SKIP = ActivityOk(phase="booted", detail="host already came back", skipped=True)


def _run(*events: object) -> tuple[Finish, list[object]]:
    m = new_state(Action.power_cycle, "r/power_cycle/1", 300.0)
    out: list[object] = []
    for ev in (Start(), *events):
        m, cmds = step(m, ev, NOW)  # type: ignore[arg-type]
        out += cmds
    fin = [c for c in out if isinstance(c, Finish)]
    assert len(fin) == 1, out
    return fin[0], out


def test_skipped_on_the_first_try_is_a_success_that_touched_nothing() -> None:
    fin, out = _run(SKIP)
    assert (fin.outcome, fin.touched) == ("succeeded", False)
    assert not any(isinstance(c, RecordAttempt) for c in out)


def test_skipped_after_a_try_that_found_nothing_sent_is_still_untouched() -> None:
    fin, _ = _run(ActivityFailed(outcome="transient", phase="not_started", message="503"),
                  TimerFired(), SKIP)
    assert (fin.outcome, fin.touched) == ("succeeded", False)


def test_skipped_after_a_try_that_sent_forceoff_is_ours() -> None:
    fin, _ = _run(ActivityFailed(outcome="transient", phase="off_sent", message="503"),
                  TimerFired(), SKIP)
    assert (fin.outcome, fin.touched) == ("succeeded", True)


def test_skipped_with_a_cancel_pending_ends_cancelled_untouched() -> None:
    fin, out = _run(Cancel(by="oncall"), SKIP)
    assert (fin.outcome, fin.touched) == ("cancelled", False)
    assert "nothing sent" in fin.detail
    assert not any(isinstance(c, RecordAttempt) for c in out)


def test_skipped_after_a_try_that_died_without_reporting_is_counted() -> None:
    """The worker died mid-try (its last heartbeat said ``not_started``; it may have sent
    ForceOff after it): the reboot the next try finds may be ours, so the attempt counts
    (scenario 11: a worker killed during the power cycle)."""
    fin, _ = _run(WorkerRestart(phase="not_started"), TimerFired(), SKIP)
    assert (fin.outcome, fin.touched) == ("succeeded", True)
    fin, _ = _run(ActivityFailed(outcome="timed_out", phase="not_started", message="hb"),
                  TimerFired(), SKIP)
    assert (fin.outcome, fin.touched) == ("succeeded", True)
