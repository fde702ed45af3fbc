"""Failure-domain holds in the cluster guard's pure machine (issue 29 item 2,
workflows/lifecycle/guard.py): the hold opens at ``domain_threshold`` distinct nodes of
one domain inside ``domain_window_s``, holds automatic new requests of the domain (a
person's and renewals go), survives continue-as-new and a rebuild, and an operator's
release resumes the waiting repairs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.leases import DomainHold, LeaseRequest, ReleaseDomainSignal
from workflows.lifecycle import guard as gm
from workflows.models import RequesterKind

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RACK = [f"n{i}" for i in range(1, 7)]
POLICY = gm.PolicyView(
    gpu_nodes=100, budget=10, breaker_threshold=50, breaker_window_s=600.0,
    one_per_pool=False, detector_cap=3, lease_ttl_s=3600.0,
    domains={**{n: ["rack-1"] for n in RACK}, "m1": ["rack-2"]},
    domain_threshold=3, domain_window_s=600.0)


def _req(node: str, *, automatic: bool = True, renew: bool = False,
         kind: RequesterKind = RequesterKind.system) -> LeaseRequest:
    return LeaseRequest(repair_id=f"r-{node}", workflow_id=f"w-{node}", cluster="c",
                        node=node, automatic=automatic, renew=renew, requester_kind=kind,
                        fault_kinds=["nvlink_down"])


def _serving(policy: gm.PolicyView = POLICY) -> gm.GuardState:
    s = gm.new_state("c", policy)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=policy),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, T0)
    return s


def _replies(cmds: list[gm.Command]) -> dict[str, gm.SendLease]:
    return {c.reply.repair_id: c for c in cmds if isinstance(c, gm.SendLease)}


def _held(s: gm.GuardState, nodes: list[str], at: datetime = T0
          ) -> tuple[gm.GuardState, list[gm.Command]]:
    out: list[gm.Command] = []
    for n in nodes:
        s, cmds = gm.step(s, gm.Request(req=_req(n)), at)
        out += cmds
    return s, out


def test_three_nodes_of_a_domain_open_one_hold_and_one_alert() -> None:
    s, cmds = _held(_serving(), RACK[:3])
    granted = [rid for rid, c in _replies(cmds).items() if c.reply.granted]
    assert granted == ["r-n1", "r-n2"]  # before the third there was no shared cause
    (hold,) = s.holds
    assert (hold.domain, hold.nodes, hold.kinds) == ("rack-1", RACK[:3], ["nvlink_down"])
    alerts = [c.alert for c in cmds if isinstance(c, gm.WriteAlert)]
    assert [(a.kind, a.node, a.active) for a in alerts] == [("failure_domain", "*", True)]
    assert alerts[0].evidence["nodes"] == RACK[:3]
    assert [c.event for c in cmds if isinstance(c, gm.Notify)] == ["cluster_alert"]
    third = _replies(cmds)["r-n3"].reply
    assert third.queued and not third.granted and "failure domain rack-1 held" in third.reason
    s, cmds = _held(s, RACK[3:])  # more of the domain: waits, no second alert
    assert not any(c.reply.granted for c in _replies(cmds).values())
    assert not any(isinstance(c, gm.WriteAlert) for c in cmds)
    assert {q.why for q in s.queue} == {gm.Why.domain}
    assert "autorepair domains release --cluster c rack-1" in s.queue[0].reason
    assert len(s.domain_faults) == 3  # a held domain counts no more (bounded in a storm)


def test_other_domains_and_unlabelled_nodes_are_not_held() -> None:
    s, _ = _held(_serving(), RACK[:3])
    s, cmds = gm.step(s, gm.Request(req=_req("m1")), T0)
    s, more = gm.step(s, gm.Request(req=_req("x9")), T0)
    assert _replies(cmds)["r-m1"].reply.granted and _replies(more)["r-x9"].reply.granted


def test_nodes_outside_the_window_do_not_open_a_hold() -> None:
    s = _serving()
    for i, n in enumerate(RACK[:3]):
        at = T0 + timedelta(seconds=400 * i)
        s, _ = gm.step(s, gm.Request(req=_req(n)), at)
        if s.reading == "policy":  # the policy is re-read every 300 s first
            s, _ = gm.step(s, gm.PolicyRead(view=POLICY), at)
    assert s.holds == []
    assert len(s.domain_faults) == 2  # the first fell out of the window (bounded)


def test_a_person_and_a_renewal_still_go_while_held() -> None:
    s, _ = _held(_serving(), RACK[:3])
    s, cmds = gm.step(s, gm.Request(req=_req("n4", automatic=False)), T0)  # approved
    assert _replies(cmds)["r-n4"].reply.granted
    s, cmds = gm.step(s, gm.Request(req=_req("n5", kind=RequesterKind.user)), T0)
    assert _replies(cmds)["r-n5"].reply.granted
    s, cmds = gm.step(s, gm.Request(req=_req("n1", renew=True)), T0)  # holds its lease
    assert _replies(cmds)["r-n1"].reply.granted
    assert [f.node for f in s.domain_faults] == RACK[:3]  # a person's is not counted


def test_release_grants_the_waiting_repairs_and_records_the_clear() -> None:
    s, _ = _held(_serving(), RACK)
    later = T0 + timedelta(seconds=60)
    s, cmds = gm.step(s, gm.ReleaseDomain(sig=ReleaseDomainSignal(
        domain="rack-1", by="alice", reason="PSU replaced")), later)
    assert s.holds == [] and s.queue == []
    assert sorted(rid for rid, c in _replies(cmds).items() if c.reply.granted) == [
        f"r-{n}" for n in RACK[2:]]
    (clear,) = [c.alert for c in cmds if isinstance(c, gm.WriteAlert)]
    assert (clear.kind, clear.active, clear.evidence["by"]) == ("failure_domain", False,
                                                                "alice")
    assert [(r.domain, r.by, r.at) for r in s.domain_releases] == [("rack-1", "alice", later)]
    assert s.domain_faults == []  # counting starts afresh


def test_releasing_a_domain_not_held_changes_nothing() -> None:
    s = _serving()
    s2, cmds = gm.step(s, gm.ReleaseDomain(sig=ReleaseDomainSignal(domain="rack-9",
                                                                     by="bob")), T0)
    assert s2.holds == [] and s2.domain_releases == []
    assert [type(c) for c in cmds] == [gm.Warn]


def test_the_hold_survives_continue_as_new_and_a_rebuild() -> None:
    s, _ = _held(_serving(), RACK[:4])
    carried = gm.GuardState.model_validate(s.model_dump(mode="json"))
    assert carried.holds == s.holds and carried.queue == s.queue
    fresh = gm.new_state("c", POLICY)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY)):
        fresh, _ = gm.step(fresh, ev, T0)
    fresh, cmds = gm.step(fresh, gm.LedgerRead(view=gm.LedgerView(holds=list(s.holds))), T0)
    assert [h.domain for h in fresh.holds] == ["rack-1"]
    assert any(isinstance(c, gm.SetDetails) and "rack-1" in c.text for c in cmds)
    fresh, cmds = gm.step(fresh, gm.Request(req=_req("n6")), T0)
    assert not _replies(cmds)["r-n6"].reply.granted


def test_a_queued_request_of_the_domain_is_held_from_the_queue() -> None:
    tight = POLICY.model_copy(update={"budget": 1})
    s = _serving(tight)
    s, _ = gm.step(s, gm.Request(req=_req("m1")), T0)  # takes the budget
    s, _ = _held(s, RACK[:3])  # budget-queued, then the third holds the domain
    assert [x.repair_id for x in s.leases] == ["r-m1"]
    s, cmds = gm.step(s, gm.Release(rel=gm.LeaseRelease(repair_id="r-m1")), T0)
    assert not any(c.reply.granted for c in _replies(cmds).values())
    assert {q.why for q in s.queue} == {gm.Why.domain}
    # the planted defect grants it (the model checker's target)
    s2, _ = gm.step(gm.step(_serving(tight), gm.Request(req=_req("m1")), T0)[0],
                    gm.Request(req=_req("n1")), T0)
    s2, _ = _held(s2, RACK[1:3])
    _, cmds = gm.step(s2, gm.Release(rel=gm.LeaseRelease(repair_id="r-m1")), T0,
                      defects=frozenset({"domain_hold_ignores_queue"}))
    assert _replies(cmds)["r-n1"].reply.granted


def test_every_state_and_event_pair_is_decided() -> None:
    assert all((st, "release_domain") in gm.TRANSITIONS for st in gm.Status)
    assert DomainHold.model_fields.keys() >= {"domain", "nodes", "kinds", "alert_id"}


def test_approved_requests_open_a_hold_under_the_default_consent() -> None:
    """With ``consent.mode: approve`` (the default) every request comes after a person's
    approval. Those still count: three approved repairs of one rack open the hold and
    its alert (the approvers learn of the shared cause) and are granted (a person
    decided); an automatic request of the rack then waits. An operator's own requests
    are not counted: three of them open nothing."""
    s = _serving()
    s, cmds = _held(s, [])
    out: list[gm.Command] = []
    for n in RACK[:3]:
        s, cmds = gm.step(s, gm.Request(req=_req(n, automatic=False)), T0)
        assert _replies(cmds)[f"r-{n}"].reply.granted
        out += cmds
    assert [h.domain for h in s.holds] == ["rack-1"]
    assert sum(1 for c in out if isinstance(c, gm.WriteAlert)
               and c.alert.kind == "failure_domain") == 1
    s, cmds = gm.step(s, gm.Request(req=_req(RACK[3])), T0)
    assert not _replies(cmds)[f"r-{RACK[3]}"].reply.granted
    t = _serving()
    for n in RACK[:3]:
        t, _ = gm.step(t, gm.Request(req=_req(n, kind=RequesterKind.user)), T0)
    assert not t.holds and not t.domain_faults
