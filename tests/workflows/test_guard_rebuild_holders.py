"""I21 / the budget across a guard restart: the rebuilt guard counts exactly the repairs
that hold a lease, as the holders record it (``repairs.lease_held``). Found by a review
(both failed before the fix)."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger_activities import LedgerActivities
from tests.workflows.conftest import OWN_WORKFLOWS, Harness
from tests.workflows.fake_validation import FakeValidationWorkflow
from tests.workflows.helpers import (
    eventually,
    guard_status,
    repair_status,
    result_skipping,
    start_repair,
    terminate_between_tasks,
    wait_stage,
)
from workflows.activity_api import ACT, MachineHold, MachineHoldQuery
from workflows.models import Action, RepairRequest, RepairStatus, Requester, RequesterKind, Stage
from workflows.protocol import workflow_id_guard, workflow_id_repair

USER = Requester(kind=RequesterKind.user, name="ops")


async def test_guard_restart_between_grant_and_cordon_keeps_the_holder_counted(
    harness: Harness, ledger_pool: Any
) -> None:
    """Budget 1. Repair r1 on gpu-01 is granted the only lease; before its cordon is
    recorded in the ledger (its last check before the cordon, the RMA-hold read, is out),
    the guard is terminated and started afresh. The rebuilt guard reads the ledger's
    holders: r1 is still at ``recommended`` there, so it is not one. r1 then cordons and
    waits for idle holding what it believes is a lease; a new repair r2 on gpu-02 asks and
    is granted the slot: two repairs in flight with a budget of 1 (r1 renews only every
    15 min and does not wait for the answer before draining).

    Expected: a repair holding a grant is counted by a guard rebuilt before its cordon
    (or it re-confirms its lease before cordoning), so r2 waits while r1 is in flight."""
    h = harness
    c = h.cluster.cluster
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls["gpu-01"] = 20  # ~20 min waiting for idle after the cordon

    # the guard runs on the harness's worker
    gid = workflow_id_guard(c)
    await h.client.start_workflow("ClusterGuardWorkflow", {"cluster": c}, id=gid,
                                  task_queue=h.task_queue)

    async def serving() -> bool:
        return (await guard_status(h)).rebuilt_at is not None

    await eventually(serving, "the first guard serving")

    # r1 runs on a worker whose RMA-hold read right before the cordon waits for the test
    real = LedgerActivities(ledger_pool)
    calls = {"n": 0}
    gate = asyncio.Event()
    at_gate = asyncio.Event()

    @activity.defn(name=ACT.ledger_machine_held)
    async def machine_held(q: MachineHoldQuery) -> MachineHold:
        if q.machine_id == "m-gpu-01":
            calls["n"] += 1
            if calls["n"] == 2:  # the check right before the cordon (after the grant)
                at_gate.set()
                await gate.wait()
        return await real.machine_held(q)

    others = [fn for fn in real.all()
              if activity._Definition.must_from_callable(fn).name != ACT.ledger_machine_held]
    q2 = h.task_queue + "-r1"
    async with Worker(
        h.client, task_queue=q2, workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
        activities=[*others, machine_held, *h.cluster.scheduler_activities(),
                    *h.policy_activities(), *GuardReplyActivities(h.client).all()],
    ):
        req = RepairRequest(repair_id="r1", cluster=c, node="gpu-01", action=Action.reboot,
                            alerts=[], requester=USER)
        await h.client.start_workflow("RepairWorkflow", req,
                                      id=workflow_id_repair(c, "gpu-01", "r1"),
                                      task_queue=q2, result_type=RepairStatus)
        await asyncio.wait_for(at_gate.wait(), 30)
        g = await guard_status(h)
        assert [x.repair_id for x in g.leases] == ["r1"], g  # r1 was granted

        # the guard is terminated (Temporal UI) and started afresh: it rebuilds
        await terminate_between_tasks(h, gid)
        await h.client.start_workflow("ClusterGuardWorkflow", {"cluster": c}, id=gid,
                                      task_queue=h.task_queue)
        await eventually(serving, "the fresh guard rebuilt from the ledger")
        gate.set()
        await wait_stage(h, "gpu-01", "r1", Stage.waiting_for_idle)
        assert h.cluster.cordons.get("gpu-01") == "r1"

        # another repair asks while r1 holds gpu-01 cordoned
        await start_repair(h, "gpu-02", Action.reboot, "r2", requester=USER, alerts=[])

        async def decided() -> bool:
            st = await repair_status(h, "gpu-02", "r2")
            return "lease queued" in st.detail or h.cluster.count("cordon", "gpu-02") > 0

        await eventually(decided, "r2 queued or cordoned")
        r1 = await repair_status(h, "gpu-01", "r1")
        g = await guard_status(h)
        assert r1.stage == Stage.waiting_for_idle, r1
        assert h.cluster.count("cordon", "gpu-02") == 0, (
            f"budget {g.budget} exceeded: r2 cordoned gpu-02 while r1 holds gpu-01 "
            f"(guard leases {[x.repair_id for x in g.leases]})")
        st = await result_skipping(h, "gpu-01", "r1")
        assert st.stage == Stage.succeeded, st


async def test_rebuilt_guard_does_not_count_a_repair_that_handed_its_lease_back(
    harness: Harness,
) -> None:
    """Budget 1. r1 on gpu-01 cordons and finds the cordon of an ended repair (r-old): it
    hands its lease back and waits for a person (I18), up to 3 days. The live guard frees
    the slot; a guard rebuilt from the ledger meanwhile (terminated, started afresh)
    re-registers r1 as a holder, because the ledger's holder query counts any repair
    ``awaiting_approval`` that ever recorded ``cordoning``. r2 on gpu-02 then waits for a
    budget that nobody uses, and ends ``timed_out`` after ``lease_wait_max_s`` (24 h) while
    r1 still waits for its approval; r1 never asked for that lease, so it never releases
    it either.

    Expected: the rebuilt guard counts as holders only repairs that hold a lease (the live
    guard's view), so r2 is granted as it would be without the restart."""
    h = harness
    c = h.cluster.cluster
    h.cluster.cordons["gpu-01"] = "r-old"
    h.cluster.repair_cordoned.add("gpu-01")
    await start_repair(h, "gpu-01", Action.reboot, "r1", requester=USER, alerts=[])

    async def asked() -> bool:
        st = await repair_status(h, "gpu-01", "r1")
        return st.stage == Stage.awaiting_approval and "cordon left by" in st.detail

    await eventually(asked, "r1 asking a person about the stale cordon")

    async def freed() -> bool:
        return (await guard_status(h)).leases == []

    await eventually(freed, "the live guard freed r1's slot")
    gid = workflow_id_guard(c)
    await terminate_between_tasks(h, gid)
    await h.client.start_workflow("ClusterGuardWorkflow", {"cluster": c}, id=gid,
                                  task_queue=h.task_queue)

    async def rebuilt() -> bool:
        return (await guard_status(h)).rebuilt_at is not None

    await eventually(rebuilt, "the fresh guard rebuilt")
    g = await guard_status(h)
    await start_repair(h, "gpu-02", Action.reboot, "r2", requester=USER, alerts=[])

    async def decided() -> bool:
        st = await repair_status(h, "gpu-02", "r2")
        return "lease queued" in st.detail or h.cluster.count("cordon", "gpu-02") > 0

    await eventually(decided, "r2 queued or cordoned")
    st = await repair_status(h, "gpu-02", "r2")
    assert h.cluster.count("cordon", "gpu-02") == 1, (
        f"r2 waits for a budget nobody uses: {st.detail}; rebuilt leases "
        f"{[x.repair_id for x in g.leases]}")
