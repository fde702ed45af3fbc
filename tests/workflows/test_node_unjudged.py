"""I20: a recurrence of the repaired fault that reaches the repair after its last check
(while the node rejoins: the agent of the new boot reports the fault still there) was
judged by nobody. The repair succeeds, as nothing it checked failed, but it tells the
node which reports it did not judge (``RepairFinished.unjudged_alert_ids``) and the node
keeps that fault open instead of retiring it as fixed. Before the fix the fault was
retired with the repair's success, with or without a boot id in the report, and the
GPU that was still lost was never repaired again."""
from __future__ import annotations

import pytest

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.test_node import node_status, repair_result
from workflows.models import AlertOutcome, Stage


@pytest.mark.parametrize("evidence", [{}, {"boot_id": "boot-1"}],
                         ids=["no_boot_id", "new_boot_id"])
async def test_recurrence_during_rejoin_stays_open(harness: Harness,
                                                   evidence: dict[str, str]) -> None:
    h = harness
    c = h.cluster.cluster
    h.policy.rails.persistence_by_kind = {"gpu_lost": 0}
    sent: dict[str, object] = {}

    async def during_rejoin(node: str) -> None:
        if sent:
            return
        now = await h.env.get_current_time()
        again = make_alert(c, node, "lost-again", kind="gpu_lost", code=None, gpu=None,
                           level=True, action="power_cycle", summary="3 of 4 GPUs",
                           observed_at=now, received_at=now, evidence=dict(evidence))
        sent["d"] = await h.deliver(again)

    h.cluster.while_out["rejoin"] = during_rejoin
    now = await h.env.get_current_time()
    lost = make_alert(c, "gpu-01", "lost-first", kind="gpu_lost", code=None, gpu=None,
                      level=True, action="power_cycle", summary="3 of 4 GPUs",
                      observed_at=now, received_at=now, evidence={"boot_id": "boot-0"})
    d = await h.deliver(lost)
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    st = await repair_result(h, "gpu-01", d.repair_id)
    assert st.stage == Stage.succeeded
    assert sent, "the re-report was not sent while the node rejoined"
    ns = await node_status(h, "gpu-01")
    assert [a.alert_id.rsplit("/", 1)[-1] for a in ns.active_alerts
            if a.kind == "gpu_lost"] == ["lost-again"], \
        ns.active_alerts
