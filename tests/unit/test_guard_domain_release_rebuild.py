"""A failure-domain hold's release across a guard rebuilt from the ledger (the pure
machine, workflows/lifecycle/guard.py).

A release marks the requests its hold kept queued (``evidence_after`` = the release: the
repair acts only on evidence observed after it). A guard rebuilt from scratch lost that
queue; a request the hold kept waiting, re-sent after the release, was granted without
``reset_at`` and its repair acted on evidence from before the hold. The guard now keeps
each domain's last release (``released_at``, rebuilt from the ledger's clear of the hold,
``LedgerView.releases``) and marks an automatic request of the domain first asked for at
or before it, as it keeps the last breaker reset (``open_reset_at``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.leases import DomainRelease, LeaseRelease, LeaseRequest, ReleaseDomainSignal
from workflows.lifecycle import guard as gm
from workflows.models import RequesterKind

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RACK = [f"n{i}" for i in range(1, 5)]
#: budget 2: two of the rack hold leases, a third is held by the domain and then by the
#: budget (the release does not grant it at once)
POLICY = gm.PolicyView(
    gpu_nodes=100, budget=2, breaker_threshold=50, breaker_window_s=600.0,
    one_per_pool=False, detector_cap=3, lease_ttl_s=3600.0,
    domains={n: ["rack-1"] for n in RACK}, domain_threshold=3, domain_window_s=600.0)
RELEASED = T0 + timedelta(seconds=120)


def _req(node: str, asked: datetime = T0, *, automatic: bool = True,
         kind: RequesterKind = RequesterKind.system) -> LeaseRequest:
    return LeaseRequest(repair_id=f"r-{node}", workflow_id=f"w-{node}", cluster="c",
                        node=node, automatic=automatic, requester_kind=kind,
                        fault_kinds=["nvlink_down"], requested_at=asked)


def _fresh(view: gm.LedgerView, at: datetime) -> gm.GuardState:
    s = gm.new_state("c", POLICY)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY), gm.LedgerRead(view=view)):
        s, _ = gm.step(s, ev, at)
    assert s.status == gm.Status.serving
    return s


def _granted(cmds: list[gm.Command], repair_id: str) -> gm.SendLease | None:
    return next((c for c in cmds if isinstance(c, gm.SendLease)
                 and c.reply.repair_id == repair_id and c.reply.granted), None)


def _held_then_released() -> gm.GuardState:
    """n1, n2 hold the budget; n3 opens the hold and waits; the release marks it."""
    s = _fresh(gm.LedgerView(), T0)
    for n in RACK[:3]:
        s, _ = gm.step(s, gm.Request(req=_req(n)), T0)
    assert [h.domain for h in s.holds] == ["rack-1"]
    s, cmds = gm.step(s, gm.ReleaseDomain(sig=ReleaseDomainSignal(
        domain="rack-1", by="alice", reason="PSU replaced")), RELEASED)
    assert _granted(cmds, "r-n3") is None  # the budget still holds it
    assert [(q.req.repair_id, q.evidence_after) for q in s.queue] == [("r-n3", RELEASED)]
    return s


def _ledger_after(s: gm.GuardState) -> gm.LedgerView:
    """What ``ledger_guard_state`` answers a guard rebuilt after ``s`` was lost: the two
    holders and the release's clear (no hold in force)."""
    holders = [gm.HeldRepair(repair_id=x.repair_id, node=x.node, workflow_id=x.workflow_id,
                             automatic=True, requested_at=T0) for x in s.leases]
    return gm.LedgerView(holders=holders, releases=[DomainRelease(
        domain="rack-1", by="alice", reason="PSU replaced", at=RELEASED, opened_at=T0)])


def test_a_request_re_sent_to_a_rebuilt_guard_after_a_release_acts_on_later_evidence(
) -> None:
    s = _held_then_released()
    later = RELEASED + timedelta(seconds=300)
    fresh = _fresh(_ledger_after(s), later)  # the guard lost: its queue is gone
    assert fresh.queue == [] and fresh.holds == []
    fresh, cmds = gm.step(fresh, gm.Request(req=_req("n3")), later)  # its re-send
    assert _granted(cmds, "r-n3") is None  # the budget
    fresh, cmds = gm.step(fresh, gm.Release(rel=LeaseRelease(repair_id="r-n1")), later)
    grant = _granted(cmds, "r-n3")
    assert grant is not None and grant.reply.reset_at == RELEASED, cmds
    lease = next(x for x in fresh.leases if x.repair_id == "r-n3")
    assert lease.evidence_after == RELEASED  # every later answer carries it too
    # the release as the rebuilt guard keeps it (and shows it to operators)
    assert fresh.released_at == {"rack-1": RELEASED}
    assert [(r.domain, r.by, r.at) for r in fresh.domain_releases] == [
        ("rack-1", "alice", RELEASED)]


def test_the_planted_defect_grants_it_on_pre_release_evidence() -> None:
    s = _held_then_released()
    later = RELEASED + timedelta(seconds=300)
    fresh = _fresh(_ledger_after(s), later)
    defects = frozenset({"release_marks_queue_only"})
    fresh, _ = gm.step(fresh, gm.Request(req=_req("n3")), later, defects)
    _, cmds = gm.step(fresh, gm.Release(rel=LeaseRelease(repair_id="r-n1")), later, defects)
    grant = _granted(cmds, "r-n3")
    assert grant is not None and grant.reply.reset_at is None


def test_only_automatic_requests_of_the_domain_first_asked_before_the_release_are_marked(
) -> None:
    s = _held_then_released()
    later = RELEASED + timedelta(seconds=300)
    view = gm.LedgerView(releases=_ledger_after(s).releases)  # nobody holds a lease
    cases = {
        # first asked after the release: its evidence may be newer, as on a live guard
        "asked after": (_req("n3", RELEASED + timedelta(seconds=1)), None),
        # a person's decision is not held by a hold, nor marked by its release
        "person": (_req("n3", automatic=False), None),
        "user": (_req("n3", kind=RequesterKind.user), None),
        # another domain's node (and an unlabelled one)
        "elsewhere": (_req("x9"), None),
        "asked at": (_req("n3", RELEASED), RELEASED),
        "asked before": (_req("n4"), RELEASED),
    }
    for what, (req, want) in cases.items():
        _, cmds = gm.step(_fresh(view, later), gm.Request(req=req), later)
        grant = _granted(cmds, req.repair_id)
        assert grant is not None, what
        assert grant.reply.reset_at == want, what


def test_a_live_guard_marks_a_request_its_queue_did_not_keep() -> None:
    """The same rule on the guard that released (no restart): a request it never kept
    (the queue was full, or it was never delivered before the release) re-sent after the
    release acts on evidence after it."""
    s = _held_then_released()
    s = s.model_copy(update={"queue": []})  # as if the queue could not keep it
    s, _ = gm.step(s, gm.Release(rel=LeaseRelease(repair_id="r-n1")), RELEASED)
    _, cmds = gm.step(s, gm.Request(req=_req("n3")), RELEASED + timedelta(seconds=5))
    grant = _granted(cmds, "r-n3")
    assert grant is not None and grant.reply.reset_at == RELEASED


def test_the_release_survives_continue_as_new_and_the_later_of_two_is_kept() -> None:
    s = _held_then_released()
    carried = gm.GuardState.model_validate(s.model_dump(mode="json"))
    assert carried.released_at == {"rack-1": RELEASED}
    older, newer = RELEASED - timedelta(seconds=60), RELEASED + timedelta(seconds=60)
    for ledger, want in ((older, RELEASED), (newer, newer)):
        rebuilding = s.model_copy(update={"status": gm.Status.rebuilding, "reading": "ledger"})
        out, _ = gm.step(rebuilding, gm.LedgerRead(view=gm.LedgerView(releases=[
            DomainRelease(domain="rack-1", by="bob", at=ledger)])), newer)
        assert out.released_at == {"rack-1": want}
