"""The machine a node left by a migrate goes to re-validation, however the repair goes
on after it (a break-test of bb83125: only the success path started it)."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.service import RPCError

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import eventually, repair_status, start_repair, wait_stage
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


async def test_a_migrate_that_failed_after_binding_follows_the_node_to_its_new_machine(
    harness: Harness,
) -> None:
    """The migrate binds gpu-12 to a spare, then the spare's bring-up fails for good. The
    node now runs on the spare (the ledger's binding): the repair must follow it — its
    machine (search attribute, what a later rung or an RMA hold names) is the spare — and
    m-gpu-12, which the node left for good, goes to re-validation rather than sitting
    outside both the pool and the spare pool, unvalidated and unseen."""
    h = harness
    node, rid = "gpu-12", "mg2"
    h.cluster.fail_actions["migrate"] = 1
    now = await h.env.get_current_time()
    handle = await start_repair(h, node, Action.migrate, rid,
                                alerts=[make_alert(h.cluster.cluster, node, rid, observed_at=now)])

    async def moved_on() -> bool:
        st = await repair_status(h, node, rid)
        return any(f"bound node {node} to spare-{node}" in t.reason for t in st.history)

    await eventually(moved_on, "the repair follows the binding the failed migrate made")
    left = workflow_id_validation(f"m-{node}", rid)
    await eventually(lambda: _exists(h, left), f"re-validation of m-{node}")
    st = await repair_status(h, node, rid)
    assert st.machine_id == f"spare-{node}", st.machine_id
    attrs = (await handle.describe()).typed_search_attributes
    assert f"spare-{node}" in [p.value for p in attrs], attrs
    # the ladder's next rung (automatic consent: a second migrate) moves it off the spare
    st = await handle.result()
    assert st.stage == Stage.succeeded, st.history[-1]
    assert h.cluster.count("migrate", node) == 2



async def test_a_migrate_cancelled_after_binding_names_the_new_machine_and_revalidates_the_old(
    harness: Harness,
) -> None:
    """A person cancels while the migrate is out, after it bound gpu-14 to a spare: the
    repair ends cancelled, the node left cordoned for a human on the spare it now runs
    on (the record names that machine), and m-gpu-14, left for good, goes to
    re-validation."""
    h = harness
    node, rid = "gpu-14", "mg3"
    handle: Any = None

    async def cancel_while_out(_node: str) -> None:
        await handle.signal("cancel", {"by": "alice", "reason": "wrong node"})
        await asyncio.sleep(0.3)

    h.cluster.while_out["migrate"] = cancel_while_out
    now = await h.env.get_current_time()
    handle = await start_repair(h, node, Action.migrate, rid,
                                alerts=[make_alert(h.cluster.cluster, node, rid, observed_at=now)])
    st = await asyncio.wait_for(handle.result(), 60)
    assert st.stage == Stage.cancelled, st.history[-1]
    assert st.machine_id == f"spare-{node}", st.machine_id
    assert await _exists(h, workflow_id_validation(f"m-{node}", rid))
    assert h.cluster.count("migrate", node) == 1
