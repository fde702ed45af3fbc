"""A breaker reset that comes while the guard cannot decide (a read out or waiting to be
retried) is the operator's reset of when it came (the pure machine,
workflows/lifecycle/guard.py; I23).

A deferred reset was decided as of when the read answered: its time (``reset_at``, the
ledger's clear, ``open_reset_at``) was the drain's. A repair that first asked after the
operator's reset but before the read answered counted as one that waited through it: its
grant carried the drain's time as ``reset_at``, so its repair acted only on evidence
newer than that and its own, older, was thrown away (an event fault's repair ends
``auto_resolved``, the fault unrepaired). The reset now takes the time it came (never
before the breaker's trip). Planted as ``reset_at_drain``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.leases import DomainHold, LeaseRequest, ReleaseDomainSignal, ResetBreakerSignal
from workflows.lifecycle import guard as gm

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RESET = T0 + timedelta(seconds=10)
ASKED = T0 + timedelta(seconds=20)  # r2 first asks after the operator's reset
POLICY = gm.PolicyView(gpu_nodes=60, budget=3, breaker_threshold=2, breaker_window_s=600.0,
                       one_per_pool=False, detector_cap=3, lease_ttl_s=3600.0)
TRIPPED = gm.LedgerView(breaker_open=True, tripped_at=T0 - timedelta(seconds=60),
                        tripped_reason="3 automatic requests")


def _req(n: int, asked: datetime) -> LeaseRequest:
    return LeaseRequest(repair_id=f"r{n}", workflow_id=f"w{n}", cluster="c", node=f"n{n}",
                        automatic=True, requested_at=asked)


def _through_an_outage(defects: frozenset[str] = frozenset()
                       ) -> tuple[gm.GuardState, list[gm.Command], datetime]:
    """A fresh guard whose first policy read fails; r1 asks, the operator resets, r2
    asks; the policy is read a minute later and the ledger has the breaker open."""
    s = gm.new_state("c", POLICY)
    s, _ = gm.step(s, gm.Started(fresh=True), T0, defects)
    s, _ = gm.step(s, gm.PolicyFailed(message="ledger down"), T0, defects)
    s, _ = gm.step(s, gm.Request(req=_req(1, T0)), T0, defects)
    s, _ = gm.step(s, gm.ResetBreaker(sig=ResetBreakerSignal(by="op")), RESET, defects)
    s, _ = gm.step(s, gm.Request(req=_req(2, ASKED)), ASKED, defects)
    at = s.timers[gm.POLICY_TIMER]
    s, _ = gm.step(s, gm.TimerFired(name=gm.POLICY_TIMER), at, defects)
    s, _ = gm.step(s, gm.PolicyRead(view=POLICY), at, defects)
    s, cmds = gm.step(s, gm.LedgerRead(view=TRIPPED), at, defects)
    assert at > ASKED and s.status == gm.Status.serving
    return s, cmds, at


def _grants(cmds: list[gm.Command]) -> dict[str, datetime | None]:
    return {c.reply.repair_id: c.reply.reset_at for c in cmds
            if isinstance(c, gm.SendLease) and c.reply.granted}


def test_a_deferred_reset_takes_the_time_it_came() -> None:
    s, cmds, _ = _through_an_outage()
    assert not s.breaker_open and s.reset_at == RESET and s.reset_by == "op"
    # r1 waited through the reset; r2 asked after it: its evidence counts
    assert _grants(cmds) == {"r1": RESET, "r2": None}  # before: r2 told the drain's time
    (clear,) = [c.alert for c in cmds if isinstance(c, gm.WriteAlert)
                and c.alert.kind == gm.BREAKER_KIND]
    assert not clear.active and clear.observed_at == RESET


def test_a_deferred_reset_is_never_before_the_trip_the_drain_makes() -> None:
    """Three requests and then a reset, all deferred during a stale refresh: the third
    trips the breaker when they are decided (at the read's answer); the reset follows it
    in order and its clear is written no earlier than the trip, so the ledger's newest
    breaker row is the clear."""
    s = gm.new_state("c", POLICY)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, T0)
    stale = T0 + timedelta(seconds=gm.POLICY_REFRESH_S + 1)
    s, _ = gm.step(s, gm.Batch(events=[gm.Request(req=_req(n, stale)) for n in (1, 2, 3)]
                   + [gm.ResetBreaker(sig=ResetBreakerSignal(by="op"))]), stale)
    read = stale + timedelta(seconds=15)
    s, cmds = gm.step(s, gm.PolicyFailed(message="ledger down"), read)
    rows = [c.alert for c in cmds if isinstance(c, gm.WriteAlert)]
    assert [r.active for r in rows] == [True, False]
    assert rows[1].observed_at >= rows[0].observed_at and not s.breaker_open


def test_the_planted_defect_resets_as_of_the_read() -> None:
    s, cmds, at = _through_an_outage(frozenset({"reset_at_drain"}))
    assert s.reset_at == at and _grants(cmds) == {"r1": at, "r2": at}


def test_a_deferred_domain_release_takes_the_time_it_came() -> None:
    """The same for an operator's release of a failure-domain hold: d2 of the domain, first
    asked after the release, keeps its evidence; d1, asked before, is told the release."""
    view = POLICY.model_copy(update={"domains": {"n1": ["rack-a"], "n2": ["rack-a"]}})
    hold = DomainHold(domain="rack-a", opened_at=T0 - timedelta(seconds=60),
                      nodes=["n1", "n2", "n3"], kinds=["nvlink_down"],
                      alert_id="domain/c/rack-a/x", reason="held")
    s = gm.new_state("c", view)
    s, _ = gm.step(s, gm.Started(fresh=True), T0)
    s, _ = gm.step(s, gm.PolicyFailed(message="ledger down"), T0)
    s, _ = gm.step(s, gm.Request(req=_req(1, T0)), T0)
    s, _ = gm.step(s, gm.ReleaseDomain(sig=ReleaseDomainSignal(domain="rack-a", by="op")),
                   RESET)
    s, _ = gm.step(s, gm.Request(req=_req(2, ASKED)), ASKED)
    at = s.timers[gm.POLICY_TIMER]
    s, _ = gm.step(s, gm.TimerFired(name=gm.POLICY_TIMER), at)
    s, _ = gm.step(s, gm.PolicyRead(view=view), at)
    s, cmds = gm.step(s, gm.LedgerRead(view=gm.LedgerView(holds=[hold])), at)
    assert s.holds == [] and s.released_at == {"rack-a": RESET}
    assert _grants(cmds) == {"r1": RESET, "r2": None}  # before: both told the read's time
