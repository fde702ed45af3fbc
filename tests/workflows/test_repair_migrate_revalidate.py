"""The machine a node left by a migrate goes to re-validation, however the repair goes
on after it (a break-test of bb83125: only the success path started it)."""

from __future__ import annotations

import asyncio

from temporalio.service import RPCError

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import eventually, start_repair, wait_stage
from workflows.models import Action, Stage
from workflows.protocol import workflow_id_validation


async def _exists(h: Harness, wid: str) -> bool:
    try:
        await h.client.get_workflow_handle(wid).describe()
        return True
    except RPCError:
        return False


async def test_machine_left_by_a_migrate_whose_fault_recurred_is_revalidated(
    harness: Harness,
) -> None:
    """migrate moves gpu-21's node off m-gpu-21 onto a spare; the fault recurs while it
    rejoins, so the ladder runs another migrate (off the spare). The node left m-gpu-21
    for good, so m-gpu-21 must go to re-validation (docs/design.md §1 step 5: a machine
    that a node leaves by a migrate is re-validated: passed → pool, failed → ticket);
    only the spare, left by the second migrate, is."""
    h = harness
    node, rid = "gpu-11", "mg1"
    h.policy.rails.rejoin_poll_s = 60
    h.cluster.unhealthy.add(node)
    now = await h.env.get_current_time()
    fresh = make_alert(h.cluster.cluster, node, rid, observed_at=now)
    handle = await start_repair(h, node, Action.migrate, rid, alerts=[fresh])
    await wait_stage(h, node, rid, Stage.joining)
    again = make_alert(h.cluster.cluster, node, "again",
                       observed_at=await h.env.get_current_time(),
                       evidence={"boot_id": "boot-1"})
    await handle.signal("attach_alert", again)

    async def second() -> bool:
        return h.cluster.count("migrate", node) == 2

    await eventually(second, "a second migrate after the recurrence")
    h.cluster.unhealthy.discard(node)
    st = await handle.result()
    assert st.stage == Stage.succeeded, st.history[-1]
    await asyncio.sleep(0.5)
    left = workflow_id_validation(f"m-{node}", rid)
    assert await _exists(h, left), (
        f"no re-validation of m-{node} (the machine the first migrate left); "
        f"spare validated: {await _exists(h, workflow_id_validation(f'spare-{node}', rid))}; "
        f"history: {[t.reason[:70] for t in st.history]}")
