"""Break-test round 9: repair defects a hostile review of the drain deadline, the reboot's
ForceRestart fallback and the power cycle's ``off_requested`` found open (each test failed
before its fix):

- a cancel during a reboot's wait for the restart to show (up to ``RESTART_SEEN_S``) was
  followed by a ``ForceRestart``: the activity sent it itself, before the workflow could
  tell it of the cancel (I19). The fallback is now the retry of phase ``restart_unseen``,
  which the pure machine never runs once a stop came;
- a cancel that came while the drain ran, whose deadline then passed, ended the repair
  ``failed`` with the node left cordoned "for a human" (the drain-deadline ending came
  before the stop): a person's cancel is final (I19), nothing was touched, so it ends
  ``cancelled`` and the cleanup uncordons, in the workflow and the pure repair machine.
"""

from __future__ import annotations

from datetime import UTC, datetime

from tests.workflows.conftest import Harness
from tests.workflows.helpers import attempt_outcomes, start_repair
from tests.workflows.test_repair_break6 import _drain_through, _JobsThatNeverLeave
from workflows.lifecycle import repair as rm
from workflows.models import Action, CancelSignal, Requester, RequesterKind, Stage


async def test_a_cancel_during_the_restart_wait_sends_no_force_restart(
    harness: Harness,
) -> None:
    """The OS hangs; the cancel arrives while the reboot waits for the restart to show.
    Rail: the repair ends ``cancelled`` with only the ``GracefulRestart`` sent, the
    attempt recorded (the machine was touched) and the node left cordoned for a person."""
    h = harness
    node, rid = "gpu-02", "rb-cancel"
    h.cluster.hung_os.add(node)
    handle = await start_repair(h, node, Action.reboot, rid)

    async def cancel_now(n: str) -> None:
        await handle.signal("cancel", CancelSignal(by="oncall", reason="hands off"))

    h.cluster.while_out["reboot"] = cancel_now
    st = await handle.result()
    assert st.stage == Stage.cancelled, st.history[-1].reason
    assert h.cluster.resets == [(node, "RESTART")], h.cluster.resets
    assert h.cluster.count("reboot", node) == 1
    assert await attempt_outcomes(h, rid) == [("reboot", "cancelled")]
    assert h.cluster.cordons.get(node) == rid


async def test_a_hung_os_gets_one_force_restart_from_the_retry(harness: Harness) -> None:
    """No stop: the retry resumes at ``restart_unseen`` and sends ``ForceRestart`` once."""
    h = harness
    node, rid = "gpu-03", "rb-force"
    h.cluster.hung_os.add(node)
    handle = await start_repair(h, node, Action.reboot, rid)
    st = await handle.result()
    assert st.stage == Stage.succeeded, st.history[-1].reason
    assert h.cluster.resets == [(node, "RESTART"), (node, "FORCE_RESTART")], h.cluster.resets
    assert await attempt_outcomes(h, rid) == [("reboot", "succeeded")]


async def test_a_cancel_during_a_drain_that_misses_its_deadline_ends_cancelled(
    harness: Harness,
) -> None:
    """The cancel arrives while the drain runs; the drain then misses its deadline
    (``job-7`` stays). Rail: the repair ends ``cancelled`` by the person (not ``failed``),
    nothing touched, no attempt, the node uncordoned."""
    h = harness
    node, rid = "gpu-05", "dd-cancel"
    h.policy.rails.drain_deadline_s = 60
    _drain_through(h, _JobsThatNeverLeave())
    handle = await start_repair(h, node, Action.power_cycle, rid)

    async def cancel_now(n: str) -> None:
        await handle.signal("cancel", CancelSignal(by="oncall", reason="hands off"))

    h.cluster.while_out["drain"] = cancel_now
    st = await handle.result()
    assert st.stage == Stage.cancelled, st.history[-1].reason
    assert st.history[-1].by == "oncall", st.history[-1]
    assert h.cluster.count("power_cycle", node) == 0
    assert await attempt_outcomes(h, rid) == []
    assert node not in h.cluster.cordons, h.cluster.cordons


def test_the_repair_machine_ends_a_cancelled_drain_past_its_deadline_cancelled() -> None:
    """The pure repair machine decides the same: a stop pending when the drain reports
    its deadline passed ends ``cancelled``, the cordon lifted."""
    s = rm.RepairState(
        repair_id="r1", cluster="c1", node="gpu-05", requested=Action.power_cycle,
        requester=Requester(kind=RequesterKind.system, name="node"),
        action=Action.power_cycle, status=rm.Status.draining, stage=Stage.draining,
        cordoned_by_us=True, lease="granted",
        stop=rm.Stop(stage="cancelled", by="oncall", reason="hands off"))
    _, cmds = rm.step(s, rm.CallOk(drained=False, remaining=["job-7"]),
                       datetime(2026, 1, 1, tzinfo=UTC))
    fin = next(c for c in cmds if isinstance(c, rm.Finish))
    assert fin.stage == Stage.cancelled and fin.uncordon and fin.held is None, fin
