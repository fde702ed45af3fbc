"""Break-test round 9: repair defects a hostile review of the drain deadline, the reboot's
ForceRestart fallback and the power cycle's ``off_requested`` found open (each test failed
before its fix):

- a cancel during a reboot's wait for the restart to show (up to ``RESTART_SEEN_S``) was
  followed by a ``ForceRestart``: the activity sent it itself, before the workflow could
  tell it of the cancel (I19). The fallback is now the retry of phase ``restart_unseen``,
  which the pure machine never runs once a stop came.
"""

from __future__ import annotations

from tests.workflows.conftest import Harness
from tests.workflows.helpers import attempt_outcomes, start_repair
from workflows.models import Action, CancelSignal, Stage


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
