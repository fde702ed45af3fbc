"""One repair per node pool across a guard rebuilt from the ledger (break-test of the
guard's rebuild; real workflows, time-skipping server, real ledger).

The guard takes a node's pool from its configuration, and from the request for a node the
configuration does not place in a pool (the pool the node's alerts reported,
``RepairRequest.node_pool``). A guard rebuilt from the ledger re-registered each holder
with the configuration's pool only: a holder whose pool came from its request held its
node with no pool, and a second repair of the same pool was granted beside it (two
nodes of one pool drained at once, ``one_per_pool``). The repair row now records the
pool the repair asked with (``RepairRecord.node_pool``, migration 0019) and the rebuild
reads it (``HeldRepair.node_pool``)."""

from __future__ import annotations

from tests.workflows.conftest import Harness
from tests.workflows.helpers import (
    eventually,
    guard_status,
    repair_status,
    start_repair,
    terminate_between_tasks,
    wait_stage,
)
from workflows.models import Action, Stage
from workflows.protocol import workflow_id_guard


async def test_a_rebuilt_guard_keeps_a_holders_pool_from_its_request(harness: Harness) -> None:
    h = harness
    c = h.cluster.cluster
    h.gpu_nodes = 40  # budget 2: the pool, not the budget, holds the second repair
    assert h.pools == {} and h.policy.rails.one_per_pool
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls["gpu-01"] = 30  # p1 holds its lease ~30 min past its cordon
    await start_repair(h, "gpu-01", Action.reboot, "p1", node_pool="pool-a")
    await wait_stage(h, "gpu-01", "p1", Stage.waiting_for_idle)
    await start_repair(h, "gpu-02", Action.reboot, "p2", node_pool="pool-a")

    async def pool_queued() -> bool:
        return "node pool pool-a busy" in (await repair_status(h, "gpu-02", "p2")).detail

    await eventually(pool_queued, "p2 waiting for pool-a")
    g = await guard_status(h)
    assert [(x.repair_id, x.node_pool) for x in g.leases] == [("p1", "pool-a")]

    gid = workflow_id_guard(c)
    await terminate_between_tasks(h, gid)
    await h.client.start_workflow("ClusterGuardWorkflow", {"cluster": c}, id=gid,
                                  task_queue=h.task_queue)

    async def rebuilt() -> bool:
        g = await guard_status(h)
        return g.rebuilt_at is not None and [x.repair_id for x in g.leases] == ["p1"]

    await eventually(rebuilt, "the fresh guard rebuilt p1's lease")
    # p2 re-sends (every LEASE_RESEND_S) while p1 still holds pool-a: it keeps waiting
    await h.env.sleep(600)
    g = await guard_status(h)
    assert [x.repair_id for x in g.leases] == ["p1"], g.leases
    assert h.cluster.count("cordon", "gpu-02") == 0
    assert [(x.repair_id, x.node_pool) for x in g.leases] == [("p1", "pool-a")], g.leases
