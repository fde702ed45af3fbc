"""Repair drain defects a break-test found open (each test failed before its fix):

- the drain deadline restarted on every activity retry: each try (and each batch of
  tries after a pause) handed the scheduler the full ``policy.rails.drain_deadline_s``
  again, so a drain ran well past its deadline.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from temporalio import activity

from activities.scheduler.base import Heartbeat, no_heartbeat
from activities.scheduler_activities import SchedulerActivities
from tests.workflows.conftest import Harness
from tests.workflows.helpers import start_repair
from workflows.activity_api import ERR_DRAIN_DEADLINE, DrainResult, permanent
from workflows.config import AutorepairConfig
from workflows.models import Action, Stage


class _JobsThatNeverLeave:
    """A scheduler whose job ``job-7`` never leaves the node: its drain ends only at the
    deadline it is handed. It records, per call, when the try was scheduled (the test
    server's clock) and the deadline handed to it, and reports the deadline passed at once
    (the time-skipping server cannot skip a real wait inside an activity)."""

    def __init__(self, returns: bool = False) -> None:
        self.seen: list[tuple[datetime, float]] = []
        self.returns = returns

    async def drain(self, node: str, repair_id: str, deadline_s: float,
                    heartbeat: Heartbeat = no_heartbeat) -> DrainResult:
        self.seen.append((activity.info().current_attempt_scheduled_time, deadline_s))
        if self.returns:  # a scheduler that answers instead of raising
            return DrainResult(drained=False, remaining=["job-7"])
        raise permanent(ERR_DRAIN_DEADLINE, f"node {node}: jobs still running after the "
                        f"{deadline_s:.0f}s drain deadline: job-7",
                        DrainResult(drained=False, remaining=["job-7"]).model_dump())


def _drain_through(h: Harness, fake: _JobsThatNeverLeave) -> None:
    """The real ``drain_node`` activity over ``fake`` answers the harness's drain."""
    acts = SchedulerActivities(AutorepairConfig(), schedulers={h.cluster.cluster: fake})  # type: ignore[dict-item]
    h.cluster.drain_with = acts.drain_node


def _draining_at(st: Any) -> datetime:
    return next(t.at for t in st.history if t.stage == Stage.draining)


async def test_the_drain_deadline_does_not_restart_on_a_retry(harness: Harness) -> None:
    """The scheduler refuses the drain's first six tries (two batches of three: the
    workflow pauses 30 s, then 60 s between them); the seventh reaches it about 96 s after
    draining started. With ``drain_deadline_s`` 60 the deadline had passed, yet the try
    was handed the full 60 s again (each retry restarted it): a drain bounded at 30 min
    could run for hours while the scheduler flapped. Rail (docs/design.md §5): the drain
    deadline counts from when draining started, across every retry."""
    h = harness
    node, rid = "gpu-03", "dd-retry"
    h.policy.rails.drain_deadline_s = 60
    fake = _JobsThatNeverLeave()
    _drain_through(h, fake)
    h.cluster.transient["drain"] = 6
    handle = await start_repair(h, node, Action.power_cycle, rid)
    st = await handle.result()
    assert h.cluster.count("drain", node) == 7
    assert len(fake.seen) == 1, fake.seen
    end = _draining_at(st) + timedelta(seconds=60)
    scheduled, deadline_s = fake.seen[0]
    assert scheduled > end, "the last try should come after the deadline (test timing)"
    # the time left until the deadline (none: it passed), whatever the retries
    assert deadline_s <= max(0.0, (end - scheduled).total_seconds()) + 1, (
        f"the try scheduled {(scheduled - _draining_at(st)).total_seconds():g} s after "
        f"draining started was handed {deadline_s:g} s more: the deadline restarted")
    assert st.stage == Stage.failed
