"""A policy refresh that changes the rails under leases already held (the pure machine,
workflows/lifecycle/guard.py).

Pools: the pool rule (one repair per node pool, ``one_per_pool``) takes a node's pool
from the guard's configuration (``_pool``). A lease kept the pool its node had when it
was granted: after a refresh moved ``n1`` into pool B, a request of ``n2`` (pool B) was
granted beside ``n1``'s lease, two repairs in one pool as now configured. A refresh now
moves each held lease to its node's configured pool.

Budget: a refresh that shrinks the GPU node count (the budget falls below the leases
held) takes no lease away: holders keep renewing, new requests wait until the leases
held fall below the new budget (pinned: this held before and holds now).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.leases import LeaseRelease, LeaseRequest
from workflows.lifecycle import guard as gm

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(seconds=gm.POLICY_REFRESH_S + 1)
POLICY = gm.PolicyView(gpu_nodes=60, budget=3, breaker_threshold=5, breaker_window_s=600.0,
                       one_per_pool=True, detector_cap=3, lease_ttl_s=3600.0,
                       pools={"n1": "A", "n2": "B", "n3": "C"})
#: The configuration after ``n1`` moved to pool B.
MOVED = POLICY.model_copy(update={"pools": {"n1": "B", "n2": "B", "n3": "C"}})


def _req(n: int, renew: bool = False) -> LeaseRequest:
    return LeaseRequest(repair_id=f"r{n}", workflow_id=f"w{n}", cluster="c", node=f"n{n}",
                        renew=renew)


def _holding(*nodes: int) -> gm.GuardState:
    s = gm.new_state("c", POLICY)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, T0)
    for n in nodes:
        s, _ = gm.step(s, gm.Request(req=_req(n)), T0)
    assert [x.repair_id for x in s.leases] == [f"r{n}" for n in nodes]
    return s


def _refreshed(s: gm.GuardState, req: LeaseRequest, view: gm.PolicyView
               ) -> tuple[gm.GuardState, list[gm.Command]]:
    """``req`` comes with the policy stale: read again (``view``), then decided."""
    s, cmds = gm.step(s, gm.Request(req=req), LATER)
    assert any(isinstance(c, gm.LoadPolicy) for c in cmds)
    return gm.step(s, gm.PolicyRead(view=view), LATER)


def test_a_lease_follows_its_node_into_the_pool_a_refresh_moved_it_to() -> None:
    s, cmds = _refreshed(_holding(1), _req(2), MOVED)
    # before: r2 granted beside r1, both nodes in pool B
    assert [(x.repair_id, x.node_pool) for x in s.leases] == [("r1", "B")]
    assert [(q.req.repair_id, q.why) for q in s.queue] == [("r2", gm.Why.pool)]
    (told,) = [c for c in cmds if isinstance(c, gm.SendLease)]
    assert not told.reply.granted and "node pool B busy with repair r1" in told.reply.reason
    # and the pool it left is free: n1's old pool A no longer holds a request back
    s, _ = gm.step(s, gm.Release(rel=LeaseRelease(repair_id="r1")), LATER)
    assert [x.repair_id for x in s.leases] == ["r2"]


def test_a_failed_refresh_keeps_the_pools_of_the_last_read() -> None:
    s, _ = gm.step(_holding(1), gm.Request(req=_req(2)), LATER)
    s, _ = gm.step(s, gm.PolicyFailed(message="ledger down"), LATER)
    assert [(x.repair_id, x.node_pool) for x in s.leases] == [("r1", "A"), ("r2", "B")]


def test_a_budget_shrunk_below_the_leases_held_takes_none_away() -> None:
    small = POLICY.model_copy(update={"gpu_nodes": 20, "budget": 1})
    s = _holding(1, 2)
    s, cmds = _refreshed(s, _req(1, renew=True), small)
    assert s.policy.budget == 1 and [x.repair_id for x in s.leases] == ["r1", "r2"]
    assert [(c.reply.repair_id, c.reply.granted) for c in cmds
            if isinstance(c, gm.SendLease)] == [("r1", True)]
    s, cmds = gm.step(s, gm.Request(req=_req(2, renew=True)), LATER)
    assert [(c.reply.repair_id, c.reply.granted) for c in cmds
            if isinstance(c, gm.SendLease)] == [("r2", True)]
    s, _ = gm.step(s, gm.Request(req=_req(3)), LATER)
    assert [(q.req.repair_id, q.why) for q in s.queue] == [("r3", gm.Why.budget)]
    s, cmds = gm.step(s, gm.Release(rel=LeaseRelease(repair_id="r1")), LATER)
    assert not any(isinstance(c, gm.SendLease) and c.reply.granted for c in cmds)
    s, cmds = gm.step(s, gm.Release(rel=LeaseRelease(repair_id="r2")), LATER)
    assert [x.repair_id for x in s.leases] == ["r3"]
