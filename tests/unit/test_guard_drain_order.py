"""The messages a guard deferred while a read was out are decided in order, each with
the grants it would make alone (the pure machine, workflows/lifecycle/guard.py).

A guard that is starting (its policy read out or waiting to be retried), rebuilding from
the ledger, or refreshing a stale policy keeps each message in ``deferred`` and decides
them once the read answers (``_drain``). The drain decided every message and granted
only once after the last: a request that came before a later one tripped the breaker
was held behind it (a batch of the same messages while serving grants it), and a request
the final grant round refused (its pool taken by an earlier deferred request) was never
answered. Planted as ``drain_grants_at_end``; the model checker finds it
(tests/model/test_guard_model.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.leases import LeaseRequest
from workflows.lifecycle import guard as gm

T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Budget 3, breaker threshold 2: the third automatic request of a window trips it.
POLICY = gm.PolicyView(gpu_nodes=60, budget=3, breaker_threshold=2, breaker_window_s=600.0,
                       one_per_pool=True, detector_cap=3, lease_ttl_s=3600.0,
                       pools={"n5": "p", "n6": "p"})
STORM = (1, 2, 3)


def _req(n: int) -> LeaseRequest:
    return LeaseRequest(repair_id=f"r{n}", workflow_id=f"w{n}", cluster="c", node=f"n{n}",
                        automatic=True)


def _serving(at: datetime = T0) -> gm.GuardState:
    s = gm.new_state("c", POLICY)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, at)
    assert s.status == gm.Status.serving
    return s


def _answers(cmds: list[gm.Command]) -> dict[str, bool]:
    """repair → granted, of the last reply each repair got in ``cmds``."""
    return {c.reply.repair_id: c.reply.granted for c in cmds
            if isinstance(c, gm.SendLease) and c.purpose == "reply"}


def _outcome(s: gm.GuardState) -> tuple[list[str], list[tuple[str, gm.Why]], bool]:
    return ([x.repair_id for x in s.leases], [(q.req.repair_id, q.why) for q in s.queue],
            s.breaker_open)


#: What a serving guard decides for the storm in one batch: r1 and r2 granted, r3 trips
#: the breaker and waits behind it.
SERVED = (["r1", "r2"], [("r3", gm.Why.breaker)], True)


def test_a_batch_while_serving_grants_what_came_before_the_trip() -> None:
    """The reference: the same messages decided while serving (pins the rule the drain
    must follow)."""
    s, cmds = gm.step(_serving(), gm.Batch(events=[gm.Request(req=_req(n)) for n in STORM]),
                      T0)
    assert _outcome(s) == SERVED
    assert _answers(cmds) == {"r1": True, "r2": True, "r3": False}


def test_requests_deferred_through_a_stale_policy_refresh_are_decided_as_a_batch() -> None:
    later = T0 + timedelta(seconds=gm.POLICY_REFRESH_S + 1)
    s, cmds = gm.step(_serving(), gm.Batch(events=[gm.Request(req=_req(n)) for n in STORM]),
                      later)
    assert s.reading == "policy" and any(isinstance(c, gm.LoadPolicy) for c in cmds)
    assert [d.req.repair_id for d in s.deferred if isinstance(d, gm.Request)] == \
        ["r1", "r2", "r3"]
    for outcome in (gm.PolicyRead(view=POLICY), gm.PolicyFailed(message="ledger down")):
        s2, cmds = gm.step(s, outcome, later)
        # before: no lease, all three held by the breaker, r1 and r2 never answered
        assert _outcome(s2) == SERVED, outcome.kind
        assert _answers(cmds) == {"r1": True, "r2": True, "r3": False}, outcome.kind


def test_requests_deferred_while_the_first_policy_read_failed_are_decided_as_a_batch(
) -> None:
    s = gm.new_state("c", POLICY)
    s, _ = gm.step(s, gm.Started(fresh=True), T0)
    s, _ = gm.step(s, gm.PolicyFailed(message="ledger down"), T0)
    assert s.status == gm.Status.starting and gm.POLICY_TIMER in s.timers
    s, _ = gm.step(s, gm.Batch(events=[gm.Request(req=_req(n)) for n in STORM]), T0)
    at = s.timers[gm.POLICY_TIMER]
    s, _ = gm.step(s, gm.TimerFired(name=gm.POLICY_TIMER), at)
    s, _ = gm.step(s, gm.PolicyRead(view=POLICY), at)
    assert s.status == gm.Status.rebuilding
    s, cmds = gm.step(s, gm.LedgerRead(view=gm.LedgerView()), at)
    assert _outcome(s) == SERVED
    assert _answers(cmds) == {"r1": True, "r2": True, "r3": False}


def test_a_deferred_request_the_drain_leaves_waiting_is_told_so() -> None:
    """r5 and r6 share pool p: r5 is granted, r6 waits for the pool and is told so
    (before: r6 got no answer; its repair heard nothing until it re-sent)."""
    later = T0 + timedelta(seconds=gm.POLICY_REFRESH_S + 1)
    s, _ = gm.step(_serving(), gm.Batch(events=[gm.Request(req=_req(n)) for n in (5, 6)]),
                   later)
    s, cmds = gm.step(s, gm.PolicyRead(view=POLICY), later)
    assert [x.repair_id for x in s.leases] == ["r5"]
    assert [(q.req.repair_id, q.why) for q in s.queue] == [("r6", gm.Why.pool)]
    (told,) = [c for c in cmds if isinstance(c, gm.SendLease) and c.reply.repair_id == "r6"]
    assert told.reply.queued and not told.reply.granted and "pool p" in told.reply.reason


def test_the_planted_defect_grants_only_after_the_last_deferred_message() -> None:
    later = T0 + timedelta(seconds=gm.POLICY_REFRESH_S + 1)
    bad = frozenset({"drain_grants_at_end"})
    s, _ = gm.step(_serving(), gm.Batch(events=[gm.Request(req=_req(n)) for n in STORM]),
                   later, bad)
    s, cmds = gm.step(s, gm.PolicyRead(view=POLICY), later, bad)
    assert s.leases == [] and s.breaker_open
    assert set(_answers(cmds)) == {"r3"}
