"""A holder's pool across a guard rebuilt from the ledger (the pure machine): a node the
configuration places in no pool is in the pool its request named; the rebuilt lease keeps
the pool the ledger recorded for the repair (``HeldRepair.node_pool``), so one repair per
pool holds across the restart. The configuration's pool comes first, as for a request."""

from __future__ import annotations

from datetime import UTC, datetime

from workflows.leases import LeaseRequest
from workflows.lifecycle import guard as gm

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = gm.PolicyView(gpu_nodes=100, budget=5, breaker_threshold=50, breaker_window_s=600.0,
                       one_per_pool=True, detector_cap=3, lease_ttl_s=3600.0,
                       pools={"c1": "conf"})


def _rebuilt(*holders: gm.HeldRepair) -> gm.GuardState:
    s = gm.new_state("c", POLICY)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY),
               gm.LedgerRead(view=gm.LedgerView(holders=list(holders)))):
        s, _ = gm.step(s, ev, T0)
    assert s.status == gm.Status.serving
    return s


def _ask(s: gm.GuardState, node: str, pool: str | None) -> gm.LeaseReply:
    _, cmds = gm.step(s, gm.Request(req=LeaseRequest(
        repair_id=f"r-{node}", workflow_id=f"w-{node}", cluster="c", node=node,
        node_pool=pool)), T0)
    (reply,) = [c.reply for c in cmds if isinstance(c, gm.SendLease)
                and c.reply.repair_id == f"r-{node}"]
    return reply


def test_a_rebuilt_holder_keeps_the_pool_its_repair_asked_with() -> None:
    s = _rebuilt(gm.HeldRepair(repair_id="r-a1", node="a1", workflow_id="w-a1",
                               node_pool="pool-a"))
    assert [(x.repair_id, x.node_pool) for x in s.leases] == [("r-a1", "pool-a")]
    reply = _ask(s, "a2", "pool-a")
    assert not reply.granted and "node pool pool-a busy with repair r-a1" in reply.reason
    assert _ask(s, "b1", "pool-b").granted


def test_the_configurations_pool_comes_first_and_none_recorded_is_none() -> None:
    s = _rebuilt(gm.HeldRepair(repair_id="r-c1", node="c1", workflow_id="w-c1",
                               node_pool="stale"),
                 gm.HeldRepair(repair_id="r-x1", node="x1", workflow_id="w-x1"))
    assert [(x.repair_id, x.node_pool) for x in s.leases] == [("r-c1", "conf"),
                                                              ("r-x1", None)]
