"""Requests a guard kept while it could not read its policy are decided in order once it
can, each granted as it would have been on its own (real guard workflow, time-skipping
server, real ledger).

A fresh guard whose ``load_policy`` fails retryably (``guard_policy_outage``) stays
``starting`` and keeps every request (``deferred``); once the policy and the ledger
answer it decides them (``_drain`` in workflows/lifecycle/guard.py). It granted only
after the last of them: here three automatic repairs asked during the outage with the
breaker threshold at 2, the third trips the breaker, and the first two, which a serving
guard grants before the trip (budget 3), were held behind the breaker too and never
heard an answer after "waiting for its policy" — three repairs waiting for an operator's
reset instead of two working.
"""

from __future__ import annotations

from datetime import timedelta

from tests.workflows.conftest import Harness
from tests.workflows.helpers import (
    eventually,
    guard_status,
    lease_recorders,
    lease_replies,
    start_guard_without_policy,
)
from workflows.lifecycle.guard import POLICY_RETRY_S, POLICY_WAIT_REASON
from workflows.protocol import GUARD_SIGNAL_ACQUIRE, LeaseRequest

NODES = ["gpu-01", "gpu-02", "gpu-03"]


async def test_requests_kept_through_a_policy_outage_are_granted_in_order(
    harness: Harness,
) -> None:
    h = harness
    c = h.cluster.cluster
    h.gpu_nodes = 60  # budget 3
    h.policy.rails.breaker_fraction = 0.01  # threshold breaker_min = 2
    h.guard_policy_outage = "ledger unreachable"
    guard = await start_guard_without_policy(h)
    async with lease_recorders(h, len(NODES)) as recs:
        for i, (node, rec) in enumerate(zip(NODES, recs, strict=True)):
            await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
                repair_id=f"d{i + 1}", workflow_id=rec.id, cluster=c, node=node,
                automatic=True, fault_kinds=["xid_79"]))

        async def all_told() -> bool:
            got = [[r.reason for r in await lease_replies(rec)] for rec in recs]
            return all(g == [POLICY_WAIT_REASON] for g in got)

        await eventually(all_told, "each request told it waits for the policy")

        h.guard_policy_outage = None
        await h.env.sleep(timedelta(seconds=POLICY_RETRY_S + 5))

        async def decided() -> bool:
            g = await guard_status(h)
            return g.rebuilt_at is not None and g.breaker_open and bool(g.pending)

        await eventually(decided, "the policy read, the guard rebuilt and the breaker "
                                  "tripped", explain=lambda: guard_status(h))
        g = await guard_status(h)
        # before: leases [] and d1, d2, d3 all pending behind the breaker
        assert sorted(x.repair_id for x in g.leases) == ["d1", "d2"], g
        assert [p.repair_id for p in g.pending] == ["d3"], g.pending

        async def answered() -> bool:
            got = [await lease_replies(rec) for rec in recs]
            return all(len(g) >= 2 for g in got)

        await eventually(answered, "each repair answered once the policy was read")
        last = [(await lease_replies(rec))[-1] for rec in recs]
        assert [r.granted for r in last] == [True, True, False], last
        assert "circuit breaker open" in last[2].reason, last[2]
