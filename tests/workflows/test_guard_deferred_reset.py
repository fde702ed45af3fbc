"""An operator resets the open breaker while a fresh guard cannot read its policy (real
guard workflow, time-skipping server, real ledger).

The reset waits with the requests until the policy is read (the guard decides them in
order then). It was decided as of then: d2, which first asked after the operator's
reset, was granted with that later time as ``reset_at``, so its repair would act only on
evidence newer than the policy read and throw its own away. The reset now takes the time
it came: d1 (asked before it) is told it, d2 is not.
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
from workflows.lifecycle.guard import BREAKER_KIND, POLICY_RETRY_S
from workflows.models import Alert, Severity
from workflows.protocol import (
    GUARD_SIGNAL_ACQUIRE,
    GUARD_SIGNAL_RESET_BREAKER,
    LeaseRequest,
    ResetBreakerSignal,
)


async def test_a_reset_during_a_policy_outage_is_the_reset_of_when_it_came(
    harness: Harness,
) -> None:
    h = harness
    c = h.cluster.cluster
    h.gpu_nodes = 60  # budget 3
    now = await h.env.get_current_time()
    await h.ledger.record_alert(Alert(
        alert_id=f"breaker/{c}/x", cluster=c, node="*", kind=BREAKER_KIND,
        severity=Severity.critical, summary="tripped", description="tripped",
        level=True, source="guard", observed_at=now - timedelta(minutes=1)))
    h.guard_policy_outage = "ledger unreachable"
    guard = await start_guard_without_policy(h)
    async with lease_recorders(h, 2) as recs:
        async def ask(i: int) -> None:
            await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
                repair_id=f"d{i + 1}", workflow_id=recs[i].id, cluster=c,
                node=f"gpu-0{i + 1}", automatic=True, fault_kinds=["xid_79"],
                requested_at=await h.env.get_current_time()))

        await ask(0)
        await h.env.sleep(timedelta(seconds=5))
        reset_at = await h.env.get_current_time()
        await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))
        await h.env.sleep(timedelta(seconds=5))
        await ask(1)
        h.guard_policy_outage = None
        await h.env.sleep(timedelta(seconds=POLICY_RETRY_S + 5))

        async def both_granted() -> bool:
            got = [await lease_replies(rec) for rec in recs]
            return all(g and g[-1].granted for g in got)

        await eventually(both_granted, "d1 and d2 granted once the policy was read",
                         explain=lambda: guard_status(h))
        g = await guard_status(h)
        assert not g.breaker_open and g.reset_by == "alice"
        assert g.reset_at is not None
        assert abs((g.reset_at - reset_at).total_seconds()) < 5, (g.reset_at, reset_at)
        d1, d2 = [(await lease_replies(rec))[-1] for rec in recs]
        assert d1.reset_at == g.reset_at, d1
        assert d2.reset_at is None, d2  # before: the policy read's time
