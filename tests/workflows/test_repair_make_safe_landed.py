"""Through the harness: a cancel while the power cycle's ForceOff was only possibly sent
(answer lost, never landed). The make-safe run proves it never landed: the repair ends
``cancelled`` with no attempt recorded and the node uncordoned (nothing was touched),
where it recorded a cancelled attempt and left the node cordoned "for a human"."""

from __future__ import annotations

from datetime import timedelta

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import start_repair
from workflows.activity_api import AttemptQuery
from workflows.models import Action, CancelSignal, Stage


async def test_a_cancel_while_a_forceoff_that_never_landed_was_out_touches_nothing(
    harness: Harness,
) -> None:
    h = harness
    node = "gpu-07"
    h.cluster.force_off_lost.add(node)
    now = await h.env.get_current_time()
    handle = await start_repair(h, node, Action.power_cycle, "ml-1",
                                alerts=[make_alert(h.cluster.cluster, node, "ml-1",
                                                   observed_at=now)])
    sent: list[bool] = []

    async def cancel_once(_: str) -> None:
        if not sent:
            sent.append(True)
            await handle.signal("cancel", CancelSignal(by="oncall", reason="wrong node"))

    h.cluster.while_out["power_cycle"] = cancel_once
    st = await handle.result()
    assert st.stage == Stage.cancelled, st
    assert ("FORCE_OFF" not in [k for n, k in h.cluster.resets if n == node]
            and ("ON" not in [k for n, k in h.cluster.resets if n == node])), h.cluster.resets
    hist = await h.ledger.attempt_history(AttemptQuery(
        cluster=h.cluster.cluster, node=node, machine_id=f"m-{node}",
        since=now - timedelta(days=30)))
    assert not [a for a in hist.attempts if a.repair_id == "ml-1"], hist.attempts
    assert node not in h.cluster.cordons, h.cluster.cordons
