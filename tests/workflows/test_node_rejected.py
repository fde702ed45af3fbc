"""A person rejected the repair of a level fault: the node sets the faults it stood for
aside until they are reported again. Before, the fault stayed active and was recommended
again once the 30-minute cooldown ended — with automatic consent the node an operator
had just said no to was cordoned again half an hour later. A new report of the fault (a
new episode) is judged as any other. Found by a review."""
from __future__ import annotations

from datetime import timedelta

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.test_node import node_status, repair_result, wait_for
from workflows.models import AlertOutcome, RejectSignal, Stage
from workflows.protocol import workflow_id_repair


async def test_a_rejected_repair_is_not_proposed_again_after_the_cooldown(
        harness: Harness) -> None:
    h = harness
    c = h.cluster.cluster
    h.policy.wait_for_idle.poll_s = 60
    h.cluster.busy_polls["gpu-10"] = 30  # the repair waits for idle: the person says no
    h.policy.rails.persistence_by_kind = {"xfs_shutdown": 0}
    lvl = make_alert(c, "gpu-10", 1, kind="xfs_shutdown", code=None, level=True,
                     action="reboot")
    d = await h.deliver(lvl)
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    rid = d.repair_id
    handle = h.client.get_workflow_handle(workflow_id_repair(c, "gpu-10", rid))
    await handle.signal("reject", RejectSignal(by="alice", reason="known, handled by hand"))
    st = await repair_result(h, "gpu-10", rid)
    assert st.stage == Stage.rejected
    cordons = h.cluster.count("cordon", "gpu-10")
    ns = await node_status(h, "gpu-10")
    assert not ns.active_alerts, ns.active_alerts
    # past the cooldown: nothing proposed again, nothing cordoned again
    await h.env.sleep(timedelta(minutes=45))
    ns = await node_status(h, "gpu-10")
    assert ns.recommendations == 1 and not ns.active_alerts, ns
    assert h.cluster.count("cordon", "gpu-10") == cordons
    # the fault reported again (a new episode): judged as any other
    fresh = lvl.model_copy(update={"alert_id": "again",
                                   "observed_at": lvl.observed_at + timedelta(minutes=50),
                                   "received_at": None})
    assert (await h.deliver(fresh)).outcome == AlertOutcome.recommended

    async def second() -> bool:
        return (await node_status(h, "gpu-10")).recommendations == 2

    await wait_for(second, "a repair for the new report")
