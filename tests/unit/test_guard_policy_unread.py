"""A fresh guard whose first policy read fails (the pure machine,
workflows/lifecycle/guard.py; I21: decide only on what you know).

The guard served on the defaults after a failed first ``load_policy``: they know no
failure domain's nodes (nor pools), so a domain hold rebuilt from the ledger held nothing
until the next refresh (up to ``POLICY_REFRESH_S``) and an automatic lease was granted
inside the held domain. A guard that never read its policy now stays ``starting``,
retries the read every ``POLICY_RETRY_S``, tells new requests they wait, grants nothing,
and decides them in order once the policy is read.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.leases import DomainHold, LeaseRelease, LeaseRequest
from workflows.lifecycle import guard as gm

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RACK = ["n1", "n2", "n3"]
#: What the interpreter serves before any read (``policy_view(None)``): no domains, no pools.
DEFAULTS = gm.PolicyView(gpu_nodes=0, budget=1, breaker_threshold=2, breaker_window_s=600.0,
                         one_per_pool=True, detector_cap=3, lease_ttl_s=3600.0)
POLICY = DEFAULTS.model_copy(update={"gpu_nodes": 40, "budget": 2,
                                     "domains": {n: ["rack-a"] for n in RACK}})
HOLD = DomainHold(domain="rack-a", opened_at=T0, nodes=RACK, kinds=["nvlink_down"],
                  alert_id="domain/c/rack-a/x", reason="failure domain rack-a held")
LEDGER = gm.LedgerView(holds=[HOLD])


def _req(node: str, renew: bool = False) -> LeaseRequest:
    return LeaseRequest(repair_id=f"r-{node}", workflow_id=f"w-{node}", cluster="c",
                        node=node, renew=renew, fault_kinds=["nvlink_down"])


def _replies(cmds: list[gm.Command]) -> list[gm.SendLease]:
    return [c for c in cmds if isinstance(c, gm.SendLease)]


def _failed_start(defects: frozenset[str] = frozenset()
                  ) -> tuple[gm.GuardState, list[gm.Command]]:
    s = gm.new_state("c", DEFAULTS)
    s, _ = gm.step(s, gm.Started(fresh=True), T0, defects)
    s, _ = gm.step(s, gm.Request(req=_req("n1")), T0, defects)  # came during the read
    return gm.step(s, gm.PolicyFailed(message="policy.rails: broken"), T0, defects)


def test_a_failed_first_read_is_retried_and_nothing_is_granted_meanwhile() -> None:
    s, cmds = _failed_start()
    assert s.status == gm.Status.starting and s.reading is None
    assert not any(isinstance(c, gm.ReadLedger) for c in cmds)  # nothing read on a guess
    (timer,) = [c for c in cmds if isinstance(c, gm.StartTimer)]
    assert timer.name == gm.POLICY_TIMER
    assert timer.at == T0 + timedelta(seconds=gm.POLICY_RETRY_S)
    assert [(r.reply.repair_id, r.reply.granted, r.reply.queued) for r in _replies(cmds)] \
        == [("r-n1", False, True)]
    assert "load_policy failed" in " ".join(s.errors)
    # a re-send while waiting: told again, not granted; a renewal is kept for later
    s, cmds = gm.step(s, gm.Request(req=_req("n1")), T0 + timedelta(seconds=10))
    assert [(r.reply.granted, r.reply.queued) for r in _replies(cmds)] == [(False, True)]
    s, cmds = gm.step(s, gm.Request(req=_req("n4", renew=True)), T0 + timedelta(seconds=10))
    assert _replies(cmds) == [] and s.leases == []
    # a second failure: retried again
    s, cmds = gm.step(s, gm.TimerFired(name=gm.POLICY_TIMER), timer.at)
    assert any(isinstance(c, gm.LoadPolicy) for c in cmds) and s.reading == "policy"
    s, cmds = gm.step(s, gm.PolicyFailed(message="still broken"), timer.at)
    assert s.status == gm.Status.starting and gm.POLICY_TIMER in s.timers
    assert not any(r.reply.granted for r in _replies(cmds))


def test_once_read_the_rebuilt_hold_keeps_its_domains_requests_waiting() -> None:
    s, _ = _failed_start()
    at = s.timers[gm.POLICY_TIMER]
    s, _ = gm.step(s, gm.TimerFired(name=gm.POLICY_TIMER), at)
    s, cmds = gm.step(s, gm.PolicyRead(view=POLICY), at)
    assert s.policy.loaded and s.status == gm.Status.rebuilding
    assert any(isinstance(c, gm.ReadLedger) for c in cmds)
    s, cmds = gm.step(s, gm.LedgerRead(view=LEDGER), at)
    assert s.status == gm.Status.serving and s.leases == []
    assert [(q.req.repair_id, q.why) for q in s.queue] == [("r-n1", gm.Why.domain)]
    assert not any(r.reply.granted for r in _replies(cmds))
    # a node outside the domain is granted: the policy is known now
    s, cmds = gm.step(s, gm.Request(req=_req("n9")), at)
    assert [r.reply.repair_id for r in _replies(cmds) if r.reply.granted] == ["r-n9"]


def test_a_failed_refresh_of_a_policy_once_read_keeps_serving_on_it() -> None:
    s = gm.new_state("c", DEFAULTS)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY), gm.LedgerRead(view=LEDGER)):
        s, _ = gm.step(s, ev, T0)
    later = T0 + timedelta(seconds=gm.POLICY_REFRESH_S)
    s, cmds = gm.step(s, gm.Request(req=_req("n9")), later)  # stale: re-read first
    assert any(isinstance(c, gm.LoadPolicy) for c in cmds)
    s, cmds = gm.step(s, gm.PolicyFailed(message="timeout"), later)
    assert s.status == gm.Status.serving and gm.POLICY_TIMER not in s.timers
    assert [r.reply.repair_id for r in _replies(cmds) if r.reply.granted] == ["r-n9"]
    assert s.policy.domains == POLICY.domains  # the hold still knows its nodes


def test_the_planted_defect_grants_inside_the_held_domain() -> None:
    s, _ = _failed_start(frozenset({"grant_before_policy"}))
    assert s.status == gm.Status.rebuilding
    s, cmds = gm.step(s, gm.LedgerRead(view=LEDGER), T0, frozenset({"grant_before_policy"}))
    assert [h.domain for h in s.holds] == ["rack-a"]
    assert [r.reply.repair_id for r in _replies(cmds) if r.reply.granted] == ["r-n1"]


def test_a_long_outage_keeps_one_request_per_repair_and_continues_as_new() -> None:
    """Each waiting repair re-sends every ``LEASE_RESEND_S``: a guard that waits out a
    long outage kept every re-send and never continued as new (``HistoryLong`` was
    ignored until it served), so its state and history grew until the server's event
    limit ended it. A re-send replaces the repair's deferred request in place (its first
    place kept); a request after the same repair's release is a new one; the guard
    continues as new while it waits to retry, and the new run still rebuilds from the
    ledger once the policy is read (I21)."""
    s, _ = _failed_start()
    for k in range(1, 6):  # five re-sends of n1, one of n2 between
        s, _ = gm.step(s, gm.Request(req=_req("n1")), T0 + timedelta(seconds=300 * k))
        if k == 2:
            s, _ = gm.step(s, gm.Request(req=_req("n2")), T0 + timedelta(seconds=601))
    assert [d.req.repair_id for d in s.deferred if isinstance(d, gm.Request)] == [
        "r-n1", "r-n2"]
    rel = gm.Release(rel=LeaseRelease(repair_id="r-n1"))
    s, _ = gm.step(s, rel, T0 + timedelta(seconds=1700))
    s, _ = gm.step(s, gm.Request(req=_req("n1")), T0 + timedelta(seconds=1800))
    assert [d.kind for d in s.deferred] == ["request", "request", "release", "request"]
    # the history is long while it waits for the retry: continue as new, carrying it
    s, cmds = gm.step(s, gm.HistoryLong(), T0 + timedelta(seconds=1801))
    assert any(isinstance(c, gm.ContinueAsNew) for c in cmds)
    carried = gm.GuardState.model_validate_json(s.model_dump_json())
    s, cmds = gm.step(carried, gm.Started(fresh=False), T0 + timedelta(seconds=1802))
    assert s.fresh and any(isinstance(c, gm.LoadPolicy) for c in cmds)
    s, cmds = gm.step(s, gm.PolicyRead(view=POLICY), T0 + timedelta(seconds=1803))
    assert s.status == gm.Status.rebuilding  # never served: it reads the ledger first
    assert any(isinstance(c, gm.ReadLedger) for c in cmds)


def test_the_planted_defect_serves_without_the_ledger_after_continue_as_new() -> None:
    bad = frozenset({"can_skips_rebuild"})
    s, _ = _failed_start(bad)
    s, _ = gm.step(s, gm.HistoryLong(), T0, bad)
    s, _ = gm.step(gm.GuardState.model_validate_json(s.model_dump_json()),
                   gm.Started(fresh=False), T0, bad)
    s, cmds = gm.step(s, gm.PolicyRead(view=POLICY), T0, bad)
    assert s.status == gm.Status.serving and not any(
        isinstance(c, gm.ReadLedger) for c in cmds)
