"""The cluster guard's pure machine (workflows/lifecycle/guard.py), without Temporal:
the decisions behind I21 and I23 step by step."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.leases import LeaseRelease, LeaseRequest, ResetBreakerSignal
from workflows.lifecycle import guard as gm

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = gm.PolicyView(gpu_nodes=3, budget=1, breaker_threshold=2, breaker_window_s=600.0,
                       one_per_pool=False, detector_cap=3, lease_ttl_s=3600.0)


def _req(n: int, renew: bool = False) -> LeaseRequest:
    return LeaseRequest(repair_id=f"r{n}", workflow_id=f"w{n}", cluster="c", node=f"n{n}",
                        renew=renew)


def _serving() -> gm.GuardState:
    s = gm.new_state("c", POLICY)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, T0)
    assert s.status == gm.Status.serving
    return s


def _grants(cmds: list[gm.Command]) -> list[gm.SendLease]:
    return [c for c in cmds if isinstance(c, gm.SendLease) and c.reply.granted]


def test_reset_marks_the_budget_queued_request_too() -> None:
    s = _serving()
    s, c1 = gm.step(s, gm.Request(req=_req(1)), T0)
    s, _ = gm.step(s, gm.Request(req=_req(2)), T0)  # budget
    s, c3 = gm.step(s, gm.Request(req=_req(3)), T0)  # third in the window: trips
    assert [g.reply.repair_id for g in _grants(c1)] == ["r1"]
    assert s.breaker_open and any(isinstance(c, gm.Notify) for c in c3)
    reset = T0 + timedelta(seconds=60)
    s, _ = gm.step(s, gm.ResetBreaker(sig=ResetBreakerSignal(by="op")), reset)
    assert {q.req.repair_id: q.evidence_after for q in s.queue} == {"r2": reset, "r3": reset}
    s, cmds = gm.step(s, gm.Release(rel=LeaseRelease(repair_id="r1")), reset)
    (grant,) = _grants(cmds)
    assert grant.reply.repair_id == "r2" and grant.reply.reset_at == reset


def test_a_reset_starts_a_fresh_window_without_recounting() -> None:
    s = _serving()
    for n in (1, 2, 3):
        s, _ = gm.step(s, gm.Request(req=_req(n)), T0)
    s, _ = gm.step(s, gm.ResetBreaker(sig=ResetBreakerSignal(by="op")), T0)
    later = T0 + timedelta(seconds=300)
    for n in (2, 3):  # the waiters re-send
        s, _ = gm.step(s, gm.Request(req=_req(n)), later)
    assert gm.window_count(s, later) == [] and not s.breaker_open


def test_a_fresh_guard_defers_requests_and_retries_the_ledger() -> None:
    s = gm.new_state("c", POLICY)
    s, _ = gm.step(s, gm.Started(fresh=True), T0)
    s, cmds = gm.step(s, gm.PolicyRead(view=POLICY), T0)
    assert any(isinstance(c, gm.ReadLedger) for c in cmds)
    s, cmds = gm.step(s, gm.LedgerUnavailable(message="down"), T0)
    (timer,) = [c for c in cmds if isinstance(c, gm.StartTimer)]
    assert timer.name == gm.LEDGER_TIMER and s.status == gm.Status.rebuilding
    s, cmds = gm.step(s, gm.Request(req=_req(2)), T0)
    assert not _grants(cmds) and [c.reply.queued for c in cmds
                                  if isinstance(c, gm.SendLease)] == [True]
    s, cmds = gm.step(s, gm.TimerFired(name=gm.LEDGER_TIMER), timer.at)
    assert any(isinstance(c, gm.ReadLedger) for c in cmds)
    holder = gm.HeldRepair(repair_id="r1", node="n1", workflow_id="w1")
    s, cmds = gm.step(s, gm.LedgerRead(view=gm.LedgerView(holders=[holder])), timer.at)
    assert [x.repair_id for x in s.leases] == ["r1"]
    assert [(c.reply.repair_id, c.purpose) for c in _grants(cmds)] == [("r1", "rebuilt")]
    assert [q.req.repair_id for q in s.queue] == ["r2"] and s.queue[0].why == gm.Why.budget


def test_an_expired_lease_of_a_gone_holder_frees_its_slot() -> None:
    s = _serving()
    s, _ = gm.step(s, gm.Request(req=_req(1)), T0)
    s, _ = gm.step(s, gm.Request(req=_req(2)), T0)
    due = T0 + timedelta(seconds=POLICY.lease_ttl_s)
    s, cmds = gm.step(s, gm.TimerFired(name=gm.EXPIRY_TIMER), due)
    assert [c.purpose for c in cmds if isinstance(c, gm.SendLease)] == ["extend"]
    s, cmds = gm.step(s, gm.ReplyUndeliverable(repair_id="r1", purpose="extend"), due)
    assert [x.repair_id for x in s.expired] == ["r1"]
    assert [g.reply.repair_id for g in _grants(cmds)] == ["r2"]


def test_state_survives_continue_as_new() -> None:
    s = _serving()
    s, _ = gm.step(s, gm.Request(req=_req(1)), T0)
    s, cmds = gm.step(s, gm.HistoryLong(), T0)
    assert any(isinstance(c, gm.ContinueAsNew) for c in cmds)
    carried = gm.GuardState.model_validate_json(s.model_dump_json())
    assert carried == s


def test_released_repairs_still_count_for_the_breaker() -> None:
    """A rolling failure: automatic repairs one after another, each released (ended)
    before the next asks. The breaker counts starts in its window, so the one that goes
    past the threshold trips it, as a guard rebuilt from the ledger would (before the
    fix the release forgot the start and the breaker never tripped)."""
    from datetime import UTC, datetime, timedelta

    from workflows.leases import LeaseRelease, LeaseRequest
    from workflows.lifecycle import guard as gm

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    view = gm.PolicyView(gpu_nodes=100, budget=10, breaker_threshold=3,
                         breaker_window_s=600.0, one_per_pool=False, detector_cap=3,
                         lease_ttl_s=3600.0)
    s = gm.new_state("c", view)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=view),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, t0)
    for i in range(4):
        at = t0 + timedelta(seconds=60 * i)
        req = LeaseRequest(repair_id=f"r{i}", workflow_id=f"w{i}", cluster="c",
                           node=f"n{i}", automatic=True)
        s, cmds = gm.step(s, gm.Request(req=req), at)
        granted = [c for c in cmds if isinstance(c, gm.SendLease) and c.reply.granted]
        if i < 3:
            assert granted and not s.breaker_open, (i, cmds)
            s, _ = gm.step(s, gm.Release(rel=LeaseRelease(repair_id=f"r{i}",
                                                          outcome="succeeded")),
                           at + timedelta(seconds=30))
    assert s.breaker_open and not granted  # the 4th start in 600 s exceeds 3
    # outside the window the old starts no longer count
    s2 = s.model_copy(update={"breaker_open": False})
    late = t0 + timedelta(seconds=1300)
    req = LeaseRequest(repair_id="r9", workflow_id="w9", cluster="c", node="n9",
                       automatic=True)
    s2, cmds = gm.step(s2, gm.Request(req=req), late)
    assert not s2.breaker_open
