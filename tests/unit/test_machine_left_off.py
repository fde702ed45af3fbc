"""A power cycle that fails for good after ForceOff and before On (BMC reads exhausted,
a permanent error) may leave the host powered off: the failure says so, so the person
the repair hands the node to checks its power; a failure after On says nothing of it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workflows.lifecycle.machine_action import (
    ActivityFailed,
    Finish,
    Start,
    TimerFired,
    new_state,
    step,
)
from workflows.models import Action

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _finish(*events: object, retry_max_s: float = 300.0) -> Finish:
    m = new_state(Action.power_cycle, "r/power_cycle/1", retry_max_s)
    out: list[object] = []
    at = NOW
    for ev in (Start(), *events):
        m, cmds = step(m, ev, at)  # type: ignore[arg-type]
        out += cmds
        at += timedelta(seconds=200)
    fin = [c for c in out if isinstance(c, Finish)]
    assert len(fin) == 1, out
    return fin[0]


@pytest.mark.parametrize("phase", ["off_sent", "off_seen"])
def test_a_failure_between_forceoff_and_on_says_the_host_may_be_off(phase: str) -> None:
    permanent = _finish(ActivityFailed(outcome="permanent", phase=phase, message="403"))
    assert permanent.outcome == "failed" and permanent.touched
    assert f"host may be off after {phase}" in permanent.detail
    exhausted = _finish(
        ActivityFailed(outcome="transient", phase=phase, message="BMC 503"), TimerFired(),
        ActivityFailed(outcome="transient", phase=phase, message="BMC 503"))
    assert exhausted.outcome == "failed"
    assert f"host may be off after {phase}" in exhausted.detail


@pytest.mark.parametrize("phase", ["not_started", "on_sent"])
def test_a_failure_before_forceoff_or_after_on_says_nothing_of_power(phase: str) -> None:
    fin = _finish(ActivityFailed(outcome="permanent", phase=phase, message="403"))
    assert fin.outcome == "failed"
    assert "may be off" not in fin.detail
