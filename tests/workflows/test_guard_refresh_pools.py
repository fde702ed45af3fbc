"""A policy refresh that moves a node with a held lease into another pool (real guard
workflow, time-skipping server, real ledger).

The pool rule takes a node's pool from the guard's configuration, but a held lease kept
the pool its node had when it was granted: after gpu-01 (holding) moved into gpu-02's
pool, gpu-02's request was granted beside it, two repairs in one pool. A refresh now
moves each held lease to its node's configured pool.
"""

from __future__ import annotations

from datetime import timedelta

from tests.workflows.conftest import Harness
from tests.workflows.helpers import (
    eventually,
    guard_status,
    lease_recorders,
    lease_replies,
)
from workflows.lifecycle.guard import POLICY_REFRESH_S
from workflows.protocol import (
    GUARD_SIGNAL_ACQUIRE,
    GUARD_WORKFLOW,
    GuardInput,
    LeaseRequest,
    workflow_id_guard,
)


async def test_a_lease_moves_with_its_node_to_the_pool_a_refresh_reads(
    harness: Harness,
) -> None:
    h = harness
    c = h.cluster.cluster
    h.gpu_nodes = 100  # budget 5: only the pool rule can hold r2 back
    h.pools = {"gpu-01": "pool-a", "gpu-02": "pool-b"}
    gid = workflow_id_guard(c)
    guard = h.client.get_workflow_handle(gid)
    await h.client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=c), id=gid,
                                  task_queue=h.task_queue)
    async with lease_recorders(h, 2) as recs:
        def req(i: int) -> LeaseRequest:
            return LeaseRequest(repair_id=f"r{i + 1}", workflow_id=recs[i].id,
                                cluster=c, node=f"gpu-0{i + 1}")

        await guard.signal(GUARD_SIGNAL_ACQUIRE, req(0))

        async def r1_held() -> bool:
            return [x.repair_id for x in (await guard_status(h)).leases] == ["r1"]

        await eventually(r1_held, "r1 granted in pool-a")
        h.pools = {"gpu-01": "pool-b", "gpu-02": "pool-b"}  # gpu-01 moved
        await h.env.sleep(timedelta(seconds=POLICY_REFRESH_S + 60))
        await guard.signal(GUARD_SIGNAL_ACQUIRE, req(1))

        async def r2_told() -> bool:
            return bool(await lease_replies(recs[1]))

        await eventually(r2_told, "r2 answered after the refresh")
        g = await guard_status(h)
        # before: r2 granted beside r1 (r1's lease still in pool-a)
        assert [(x.repair_id, x.node_pool) for x in g.leases] == [("r1", "pool-b")], g
        assert [p.repair_id for p in g.pending] == ["r2"], g.pending
        (told,) = await lease_replies(recs[1])
        assert not told.granted and "node pool pool-b busy with repair r1" in told.reason
