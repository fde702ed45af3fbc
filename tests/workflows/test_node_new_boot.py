"""I20: a level fault first reported from the boot a power cycle brought, received while
the power cycle is still out (another fault than the one repaired, so no recurrence of
it), is not retired by the repair's success: it is a fresh observation after the new
boot. Before the fix it was retired with the new boot as "replaced", and every later
report of it from that boot was ignored as stale."""
from __future__ import annotations

from datetime import timedelta

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.test_node import node_status, repair_result
from workflows.models import AlertOutcome, Stage


async def test_new_boot_level_fault_survives_success(harness: Harness) -> None:
    h = harness
    c = h.cluster.cluster
    h.policy.rails.persistence_by_kind = {"gpu_lost": 0}
    sent: dict[str, object] = {}

    async def during_cycle(node: str) -> None:
        if sent:
            return
        now = await h.env.get_current_time()
        lost = make_alert(c, node, "lost-newboot", kind="gpu_lost", code=None, gpu=None,
                          level=True, action="power_cycle", summary="3 of 4 GPUs",
                          observed_at=now, received_at=now,
                          evidence={"boot_id": "boot-1"})
        sent["d"] = await h.deliver(lost)

    h.cluster.while_out["power_cycle"] = during_cycle
    now = await h.env.get_current_time()
    x = make_alert(c, "gpu-01", 1, observed_at=now, received_at=now,
                   evidence={"boot_id": "boot-0"})
    d = await h.deliver(x)
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    st = await repair_result(h, "gpu-01", d.repair_id)
    assert st.stage == Stage.succeeded
    ns = await node_status(h, "gpu-01")
    assert any(a.kind == "gpu_lost" for a in ns.active_alerts), ns.active_alerts
    # the agent of boot-1 re-reports the fault (still there), received after the end
    await h.env.sleep(timedelta(minutes=1))
    now = await h.env.get_current_time()
    again = make_alert(c, "gpu-01", "lost-again", kind="gpu_lost", code=None, gpu=None,
                       level=True, action="power_cycle", summary="3 of 4 GPUs",
                       observed_at=now, received_at=now, evidence={"boot_id": "boot-1"})
    d2 = await h.deliver(again)
    assert d2.outcome != AlertOutcome.ignored, d2
