"""How RepairWorkflow turns an activity failure into the machine action's event
(``workflows.repair._failure_event``): an activity that reports no phase and times out
(its worker died, or it hung past its heartbeat) may have touched the machine, so it
counts as touched and is never sent again (I16, I22; found in review of issue 26)."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ActivityError, TimeoutError, TimeoutType

from workflows.lifecycle.machine_action import DISRUPTIVE, ActivityFailed, WorkerRestart
from workflows.models import Action
from workflows.repair import _failure_event


def _timed_out(kind: TimeoutType, details: list[object] | None = None) -> ActivityError:
    err = ActivityError("activity timed out", scheduled_event_id=1, started_event_id=2,
                        identity="w", activity_type="x", activity_id="1", retry_state=None)
    err.__cause__ = TimeoutError("timed out", type=kind, last_heartbeat_details=details or [])
    return err


@pytest.mark.parametrize("action", [Action.reprovision, Action.reset_gpu, Action.migrate,
                                    Action.remove])
@pytest.mark.parametrize("kind", [TimeoutType.HEARTBEAT, TimeoutType.START_TO_CLOSE])
def test_unphased_action_that_timed_out_counts_as_touched(action: Action,
                                                          kind: TimeoutType) -> None:
    ev = _failure_event(action, _timed_out(kind), "not_started")
    assert isinstance(ev, ActivityFailed)
    assert ev.outcome == "permanent" and ev.phase == DISRUPTIVE[action]


def test_phased_action_that_lost_its_worker_resumes_from_its_heartbeat() -> None:
    ev = _failure_event(Action.power_cycle,
                        _timed_out(TimeoutType.HEARTBEAT, [{"phase": "on_sent"}]), "off_sent")
    assert isinstance(ev, WorkerRestart) and ev.phase == "on_sent"
