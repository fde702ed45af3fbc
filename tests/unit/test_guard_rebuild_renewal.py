"""A holder's renewal while a fresh guard rebuilds from the ledger (the pure machine,
workflows/lifecycle/guard.py).

A rebuilding guard told every request it waits ("guard rebuilding its state from the
ledger"), renewals included. A renewal told ``queued`` is a refused one to its holder
(workflows/repair.py ``lease``): it took its lease for lapsed, stopped renewing, and
waited for a grant before its next disruptive step, for as long as the ledger stayed
down. The ledger lists the holder and the rebuild tells it; a renewal is now kept
without an answer and decided once the guard serves, as while it waits for its policy.
Planted as ``rebuild_refuses_renewals``; the model checker finds it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.leases import LeaseRequest
from workflows.lifecycle import guard as gm

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = gm.PolicyView(gpu_nodes=3, budget=1, breaker_threshold=2, breaker_window_s=600.0,
                       one_per_pool=False, detector_cap=3, lease_ttl_s=3600.0)
HOLDER = gm.HeldRepair(repair_id="r1", node="n1", workflow_id="w1")


def _req(n: int, renew: bool = False) -> LeaseRequest:
    return LeaseRequest(repair_id=f"r{n}", workflow_id=f"w{n}", cluster="c", node=f"n{n}",
                        renew=renew)


def _replies(cmds: list[gm.Command]) -> list[tuple[str, bool, str]]:
    return [(c.reply.repair_id, c.reply.granted, c.purpose) for c in cmds
            if isinstance(c, gm.SendLease)]


def _rebuilding_ledger_down(defects: frozenset[str] = frozenset()) -> gm.GuardState:
    s = gm.new_state("c", POLICY)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY),
               gm.LedgerUnavailable(message="connection refused")):
        s, _ = gm.step(s, ev, T0, defects)
    assert s.status == gm.Status.rebuilding and gm.LEDGER_TIMER in s.timers
    return s


def test_a_renewal_while_rebuilding_is_not_refused_and_is_decided_once_rebuilt() -> None:
    s = _rebuilding_ledger_down()
    s, cmds = gm.step(s, gm.Request(req=_req(1, renew=True)), T0 + timedelta(seconds=5))
    assert _replies(cmds) == []  # before: [("r1", False, "reply")], told queued
    # a new request still hears that it waits
    s, cmds = gm.step(s, gm.Request(req=_req(2)), T0 + timedelta(seconds=5))
    assert _replies(cmds) == [("r2", False, "reply")]
    at = s.timers[gm.LEDGER_TIMER]
    s, _ = gm.step(s, gm.TimerFired(name=gm.LEDGER_TIMER), at)
    s, cmds = gm.step(s, gm.LedgerRead(view=gm.LedgerView(holders=[HOLDER])), at)
    assert [x.repair_id for x in s.leases] == ["r1"]
    assert [r for r in _replies(cmds) if r[0] == "r1"] == [("r1", True, "rebuilt"),
                                                           ("r1", True, "reply")]
    assert [q.req.repair_id for q in s.queue] == ["r2"]


def test_the_planted_defect_refuses_the_renewal() -> None:
    bad = frozenset({"rebuild_refuses_renewals"})
    s = _rebuilding_ledger_down(bad)
    _, cmds = gm.step(s, gm.Request(req=_req(1, renew=True)), T0, bad)
    assert _replies(cmds) == [("r1", False, "reply")]
