"""Repeat-offender machines on the real workflows (issue 31 item 2): a machine with 3
disruptive repairs within 30 days, whatever the faults, gets ``remove`` for a person as
its next recommendation, the rule naming the repairs; the ladder and node cap are
unchanged, and a machine with two such repairs is repaired as usual."""

from __future__ import annotations

from datetime import timedelta

from tests.workflows.conftest import Harness
from tests.workflows.helpers import start_repair, wait_stage
from workflows.activity_api import AttemptRecord
from workflows.models import Action, ApproveSignal, Stage


async def _history(h: Harness, node: str, machine: str, plan: list[tuple[str, Action, str,
                                                                          float]]) -> None:
    now = await h.env.get_current_time()
    for rid, action, kind, days in plan:
        await h.ledger.record_attempt(AttemptRecord(
            repair_id=rid, cluster=h.cluster.cluster, node=node, machine_id=machine,
            action=action, alert_kind=kind, code=None, outcome="succeeded",
            at=now - timedelta(days=days)))


async def test_third_disruptive_repair_makes_the_next_recommendation_remove(
    harness: Harness,
) -> None:
    h = harness
    await _history(h, "gpu-05", "m-gpu-05", [
        ("old-1", Action.power_cycle, "xid", 25), ("old-2", Action.reboot, "ecc", 12),
        ("old-3", Action.reset_gpu, "nvlink", 2)])
    handle = await start_repair(h, "gpu-05", Action.power_cycle, "ro-1")
    st = await wait_stage(h, "gpu-05", "ro-1", Stage.awaiting_approval)
    assert st.action == Action.remove
    assert st.decided_by_rule is not None
    assert "repeat offender: machine m-gpu-05 had 3 disruptive repairs" in st.decided_by_rule
    assert "old-1, old-2, old-3" in st.decided_by_rule
    assert h.cluster.count("cordon") == 0  # nothing touched before a person decides
    # a person decides: remove, as recommended
    await handle.signal("approve", ApproveSignal(by="oncall"))
    done = await handle.result()
    assert done.stage == Stage.succeeded and h.cluster.count("remove", "gpu-05") == 1, [(t.stage.value, t.reason) for t in done.history]
    assert h.cluster.power_cycles == 0


async def test_two_disruptive_repairs_do_not_make_a_repeat_offender(harness: Harness) -> None:
    h = harness
    await _history(h, "gpu-06", "m-gpu-06", [
        ("old-4", Action.power_cycle, "xid", 25), ("old-5", Action.reboot, "ecc", 12),
        ("old-6", Action.reboot, "ecc", 31)])  # outside the 30-day window
    st = await (await start_repair(h, "gpu-06", Action.power_cycle, "ro-2")).result()
    assert st.stage == Stage.succeeded and h.cluster.power_cycles == 1
    assert st.decided_by_rule is not None and "repeat offender" not in st.decided_by_rule
