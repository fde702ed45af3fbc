"""The circuit breaker across a guard restart (found by a break-test).

The breaker trips when more than ``breaker_threshold`` automatic repairs are counted in
``breaker_window_s``; a live guard counts an automatic request when it arrives, so at
most ``threshold`` automatic repairs are granted (and cordon) in one window. The ledger
lists an automatic start only once it recorded its cordon (``ledger_guard_state``
``automatic``: a ``cordoning`` or ``shadowed`` transition); an automatic holder granted
before a restart that has not recorded its cordon yet is re-registered as a holder
(``lease_held``, I21). The rebuilt guard counted only the listed starts, so it granted
``threshold`` more automatic repairs in the same window: 2 × threshold automatic cordons
within minutes, the breaker never tripped. It now counts every automatic holder the
ledger does not list among the starts, from when its row was recorded
(``repairs.created_at``: its first request came after), under the reset rule (one
recorded at or before the last reset stays out of the window, I23). The model checker's
ledger lists automatic starts from their cordon, as the real query does
(tests/model/guard_world.py, ``W_HOLDER``).
"""

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
    start_repair,
    terminate_between_tasks,
    wait_stage,
)
from workflows.activity_api import ACT, MachineHold, MachineHoldQuery
from workflows.models import Action, RepairRequest, RepairStatus, Stage
from workflows.protocol import workflow_id_guard, workflow_id_repair


async def test_a_rebuilt_guard_counts_automatic_holders_in_the_breaker_window(
    harness: Harness, ledger_pool: Any
) -> None:
    h = harness
    c = h.cluster.cluster
    # 20 GPU nodes: breaker threshold max(2, ceil(0.1 × 20)) = 2; a budget of 10 so the
    # budget is not what holds the third automatic repair back
    h.policy.rails.concurrency_fraction = 0.5
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    for n in ("gpu-01", "gpu-02", "gpu-03", "gpu-04"):
        h.cluster.busy_polls[n] = 30  # every repair waits for idle after its cordon

    gid = workflow_id_guard(c)
    await h.client.start_workflow("ClusterGuardWorkflow", {"cluster": c}, id=gid,
                                  task_queue=h.task_queue)

    async def serving() -> bool:
        return (await guard_status(h)).rebuilt_at is not None

    await eventually(serving, "the first guard serving")

    # r1 and r2 run on a worker whose RMA-hold read right before the cordon (after the
    # grant) waits for the test
    real = LedgerActivities(ledger_pool)
    calls: dict[str, int] = {}
    gate = asyncio.Event()
    at_gate: dict[str, asyncio.Event] = {"m-gpu-01": asyncio.Event(),
                                         "m-gpu-02": asyncio.Event()}

    @activity.defn(name=ACT.ledger_machine_held)
    async def machine_held(q: MachineHoldQuery) -> MachineHold:
        m = q.machine_id or ""
        if m in at_gate:
            calls[m] = calls.get(m, 0) + 1
            if calls[m] == 2:
                at_gate[m].set()
                await gate.wait()
        return await real.machine_held(q)

    others = [fn for fn in real.all()
              if activity._Definition.must_from_callable(fn).name != ACT.ledger_machine_held]
    q2 = h.task_queue + "-gated"
    async with Worker(
        h.client, task_queue=q2, workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
        activities=[*others, machine_held, *h.cluster.scheduler_activities(),
                    *h.policy_activities(), *GuardReplyActivities(h.client).all()],
    ):
        for node, rid in (("gpu-01", "r1"), ("gpu-02", "r2")):
            # an automatic repair (consent: automatic), as a NodeWorkflow starts it
            req = RepairRequest(repair_id=rid, cluster=c, node=node, action=Action.reboot)
            await h.client.start_workflow("RepairWorkflow", req,
                                          id=workflow_id_repair(c, node, rid),
                                          task_queue=q2, result_type=RepairStatus)
        for ev in at_gate.values():
            await asyncio.wait_for(ev.wait(), 30)
        g = await guard_status(h)
        assert sorted(x.repair_id for x in g.leases) == ["r1", "r2"], g
        assert len(g.recent_automatic) == 2 and not g.breaker_open, g

        # the guard is terminated (Temporal UI) and started afresh: it rebuilds
        await terminate_between_tasks(h, gid)
        await h.client.start_workflow("ClusterGuardWorkflow", {"cluster": c}, id=gid,
                                      task_queue=h.task_queue)
        await eventually(serving, "the fresh guard rebuilt from the ledger")
        g = await guard_status(h)
        rebuilt = (sorted(x.repair_id for x in g.leases), g.recent_automatic)
        gate.set()
        await wait_stage(h, "gpu-01", "r1", Stage.waiting_for_idle)
        await wait_stage(h, "gpu-02", "r2", Stage.waiting_for_idle)

        # two more automatic repairs, a minute later (same breaker window)
        for node, rid in (("gpu-03", "r3"), ("gpu-04", "r4")):
            await start_repair(h, node, Action.reboot, rid)

        async def decided() -> bool:
            for node, rid in (("gpu-03", "r3"), ("gpu-04", "r4")):
                st = await repair_status(h, node, rid)
                if not ("lease queued" in st.detail or h.cluster.count("cordon", node)):
                    return False
            return True

        await eventually(decided, "r3 and r4 queued or cordoned")
        g = await guard_status(h)
        cordoned = sorted(n for n in ("gpu-01", "gpu-02", "gpu-03", "gpu-04")
                          if h.cluster.count("cordon", n))
        assert rebuilt[0] == ["r1", "r2"] and len(rebuilt[1]) == 2, rebuilt
        assert len(cordoned) <= g.breaker_threshold, (
            f"{len(cordoned)} automatic repairs cordoned within minutes ({cordoned}) with "
            f"breaker threshold {g.breaker_threshold}; breaker_open={g.breaker_open}; "
            f"rebuilt guard: leases {rebuilt[0]}, counted in the window {rebuilt[1]}; now "
            f"counted {g.recent_automatic}")
