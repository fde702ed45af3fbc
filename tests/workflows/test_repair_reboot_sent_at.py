"""The reboot's retry gets when the attempt's ``GracefulRestart`` went out (``sent_at``,
reported in the failure's details beside the phase, carried in the machine action's
state), so its ``RESTART_SEEN_S`` window counts from the send, not afresh per retry
(tests/activities/test_power_restart_window.py: the activity's side)."""

from __future__ import annotations

from datetime import datetime

from tests.workflows.conftest import Harness
from tests.workflows.helpers import start_repair
from workflows.models import Action, Stage


async def test_a_reboot_retry_gets_the_restart_send_time(harness: Harness) -> None:
    h = harness
    node, rid = "gpu-04", "rb-sent-at"
    h.cluster.hung_os.add(node)
    handle = await start_repair(h, node, Action.reboot, rid)
    st = await handle.result()
    assert st.stage == Stage.succeeded, st.history[-1].reason
    runs = [(i.resume_phase, i.sent_at) for i in h.cluster.reboot_inputs]
    sent = datetime.fromisoformat(h.cluster.restart_sent_at)
    assert runs == [("not_started", None), ("restart_unseen", sent)], runs
