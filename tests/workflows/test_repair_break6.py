"""Repair drain defects a break-test found open (each test failed before its fix):

- the drain deadline restarted on every activity retry: each try (and each batch of
  tries after a pause) handed the scheduler the full ``policy.rails.drain_deadline_s``
  again, so a drain ran well past its deadline;
- a drain past its deadline ended ``failed`` and the cleanup uncordoned the node with its
  fault standing (the "nothing touched → uncordon" rule): a node with a hard fault went
  back into service because its jobs would not leave (the workflow, and the pure repair
  machine that models the same ending).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity

from activities.scheduler.base import Heartbeat, no_heartbeat
from activities.scheduler_activities import SchedulerActivities
from tests.workflows.conftest import Harness
from tests.workflows.helpers import start_repair
from workflows.activity_api import ERR_DRAIN_DEADLINE, DrainResult, permanent
from workflows.config import AutorepairConfig
from workflows.lifecycle import repair as rm
from workflows.models import Action, Requester, RequesterKind, Stage


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


@pytest.mark.parametrize("returns", [False, True], ids=["raised", "answered"])
async def test_a_drain_past_its_deadline_leaves_the_node_cordoned(
    harness: Harness, returns: bool,
) -> None:
    """The drain's deadline passes with ``job-7`` still running on a node with a standing
    hard fault (Xid 79). The repair ended ``failed`` and the cleanup uncordoned the node
    ("nothing touched"): the scheduler put new jobs on a GPU that had fallen off the bus.
    Rail: the node stays cordoned for a person; the repair ends ``failed`` naming what
    still runs and saying the node is left cordoned, with a critical notification."""
    h = harness
    node, rid = "gpu-04", f"dd-held-{int(returns)}"
    h.policy.rails.drain_deadline_s = 60
    _drain_through(h, _JobsThatNeverLeave(returns=returns))
    handle = await start_repair(h, node, Action.power_cycle, rid)
    st = await handle.result()
    last = st.history[-1].reason
    assert st.stage == Stage.failed, last
    assert h.cluster.cordons.get(node) == rid, f"node uncordoned after the drain deadline: {last}"
    assert "job-7" in last and "left cordoned" in last, last
    assert h.cluster.count("power_cycle", node) == 0
    assert any(n.severity == "critical" and "left cordoned" in n.subject
               for n in h.cluster.notifications), h.cluster.notifications


@pytest.mark.parametrize("remaining", [["job-7"], []], ids=["listed", "none-listed"])
def test_the_repair_machine_leaves_the_node_cordoned_after_the_drain_deadline(
    remaining: list[str],
) -> None:
    """The pure repair machine (workflows/lifecycle/repair.py) decides the drain deadline's
    ending as the workflow does: it ended ``failed`` with the cordon lifted ("drain
    incomplete"); now ``failed`` naming what still runs, the node left cordoned for a
    person, the lease released."""
    s = rm.RepairState(
        repair_id="r1", cluster="c1", node="gpu-04", requested=Action.power_cycle,
        requester=Requester(kind=RequesterKind.system, name="node"),
        action=Action.power_cycle, status=rm.Status.draining, stage=Stage.draining,
        cordoned_by_us=True, lease="granted")
    s2, cmds = rm.step(s, rm.CallOk(drained=False, remaining=remaining),
                       datetime(2026, 1, 1, tzinfo=UTC))
    fin = next(c for c in cmds if isinstance(c, rm.Finish))
    assert fin.stage == Stage.failed and not fin.uncordon, fin
    assert fin.held is not None and "left cordoned for a human" in fin.held, fin
    assert ("job-7" in fin.reason) == bool(remaining) and "still running" in fin.reason
    assert any(isinstance(c, rm.SignalGuard) and c.what == "release" for c in cmds)
    assert s2.status == rm.Status.ended
