"""Failure-domain holds judged on faults (issue 29 item 2): a node of a domain reports a
new actionable fault to its cluster's guard (``fault_seen``) when it is raised, and the
guard counts the report on arrival, so a rack whose faults wait out a grace period after
maintenance is held before the first of its repairs asks for a lease. Pure machines: the
node's (workflows/lifecycle/node.py) and the guard's (workflows/lifecycle/guard.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.unit.test_guard_domains import POLICY, RACK, _replies, _req, _serving
from tests.unit.test_guard_domains import T0 as GT0
from tests.unit.test_node_machine import CAT, RAILS, known, lost, raised, run, starts
from workflows.leases import FaultReport
from workflows.lifecycle import guard as gm
from workflows.lifecycle import node as nm
from workflows.maintenance import (
    IN_GRACE,
    IN_MAINTENANCE,
    MAINTENANCE_REASON,
    MAINTENANCE_UNTIL,
    MAINTENANCE_WINDOW,
)
from workflows.models import Action, Alert

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)  # the node tests' clock


def _report(node: str, n: int = 1, domains: list[str] | None = None) -> gm.FaultSeen:
    return gm.FaultSeen(report=FaultReport(cluster="c", node=node, alert_id=f"x-{node}-{n}",
                                           kind="nvlink_down", code=74,
                                           domains=domains if domains is not None else []))


# ---- the guard ---------------------------------------------------------------------
def test_three_fault_reports_hold_the_domain_before_any_request() -> None:
    s = _serving()
    cmds: list[gm.Command] = []
    for n in RACK[:3]:
        s, more = gm.step(s, _report(n), GT0)
        cmds += more
    (hold,) = s.holds
    assert (hold.domain, hold.nodes, hold.kinds) == ("rack-1", RACK[:3], ["nvlink_down"])
    alerts = [c.alert for c in cmds if isinstance(c, gm.WriteAlert)]
    assert [(a.kind, a.active) for a in alerts] == [("failure_domain", True)]
    assert "raised nvlink_down" in hold.reason
    # the first repair of the rack to ask waits: nothing of the rack was granted
    s, cmds = gm.step(s, gm.Request(req=_req(RACK[0])), GT0 + timedelta(seconds=60))
    reply = _replies(cmds)[f"r-{RACK[0]}"].reply
    assert not reply.granted and "failure domain rack-1 held" in reply.reason
    assert not s.leases


def test_a_flapping_node_counts_once_and_its_request_adds_no_node() -> None:
    s = _serving()
    for k in range(5):
        s, _ = gm.step(s, _report(RACK[0], k), GT0 + timedelta(seconds=k))
    s, cmds = gm.step(s, gm.Request(req=_req(RACK[0])), GT0 + timedelta(seconds=10))
    assert _replies(cmds)[f"r-{RACK[0]}"].reply.granted  # one node is no shared cause
    s, _ = gm.step(s, _report(RACK[1]), GT0 + timedelta(seconds=20))
    assert not s.holds and {f.node for f in s.domain_faults} == set(RACK[:2])
    assert len(s.domain_faults) == 3  # one report per node, plus n1's request


def test_reports_outside_the_window_or_of_no_domain_hold_nothing() -> None:
    s = _serving()
    s, _ = gm.step(s, _report(RACK[0]), GT0)
    s, _ = gm.step(s, _report(RACK[1]), GT0 + timedelta(seconds=300))
    s, _ = gm.step(s, _report(RACK[2]), GT0 + timedelta(seconds=POLICY.domain_window_s + 1))
    assert not s.holds  # n1's report left the window before n3's came
    for n in ("x1", "x2", "x3"):  # unlabelled nodes, reporting no domain either
        s, _ = gm.step(s, _report(n), GT0 + timedelta(seconds=700))
    assert not s.holds and all(f.node not in ("x1", "x2", "x3") for f in s.domain_faults)


def test_the_domains_a_node_reports_count_when_the_guard_has_not_read_them() -> None:
    s = _serving()
    for n in ("y1", "y2", "y3"):
        s, _ = gm.step(s, _report(n, domains=["rack-9"]), GT0)
    assert [h.domain for h in s.holds] == ["rack-9"]


def test_a_report_while_the_guard_rebuilds_is_counted_once_it_serves() -> None:
    s = gm.new_state("c", POLICY)
    s, _ = gm.step(s, gm.Started(fresh=True), GT0)
    s, _ = gm.step(s, gm.PolicyRead(view=POLICY), GT0)
    for n in RACK[:3]:
        s, _ = gm.step(s, _report(n), GT0)
    assert s.status == gm.Status.rebuilding and not s.holds
    s, _ = gm.step(s, gm.LedgerRead(view=gm.LedgerView()), GT0 + timedelta(seconds=5))
    assert [h.domain for h in s.holds] == ["rack-1"]


def test_a_released_domain_counts_afresh() -> None:
    s = _serving()
    for n in RACK[:3]:
        s, _ = gm.step(s, _report(n), GT0)
    s, _ = gm.step(s, gm.ReleaseDomain(sig=gm.ReleaseDomainSignal(domain="rack-1", by="ops")),
                   GT0 + timedelta(seconds=60))
    assert not s.holds and not s.domain_faults
    s, _ = gm.step(s, _report(RACK[3]), GT0 + timedelta(seconds=61))
    assert not s.holds


# ---- the node ----------------------------------------------------------------------
def _in_rack(now: datetime = T0) -> nm.NodeState:
    s = known(now)
    s, _ = nm.step(s, nm.PolicyLoaded(catalogue=CAT, rails=RAILS, domains=["rack-1"]), now)
    assert s.domains == ["rack-1"]
    return s


def _reports(cmds: list[nm.Command]) -> list[nm.ReportFault]:
    return [c for c in cmds if isinstance(c, nm.ReportFault)]


def test_a_node_of_a_domain_reports_a_new_fault_once() -> None:
    s = _in_rack()
    s, cmds = run(s, raised(lost(1, T0)), T0)
    (rep,) = _reports(cmds)
    assert (rep.report.node, rep.report.alert_id, rep.report.kind, rep.report.domains) == (
        "n", "lost-1", "gpu_lost", ["rack-1"])
    s, cmds = run(s, raised(lost(2, T0 + timedelta(seconds=5))), T0 + timedelta(seconds=5))
    assert _reports(cmds) == []  # the same fault again: the guard already counts the node


def test_a_fault_held_by_a_grace_period_is_reported_at_once() -> None:
    s = _in_rack()
    end = T0 + timedelta(seconds=900)
    a = lost(1, T0).model_copy(update={"evidence": {
        "boot_id": "b0", IN_GRACE: end.isoformat(), MAINTENANCE_WINDOW: "mw-1"}})
    s, cmds = run(s, raised(a), T0)
    assert [r.report.alert_id for r in _reports(cmds)] == ["lost-1"]
    assert not [c for c in cmds if isinstance(c, nm.StartRepair)]  # held to the grace end


def test_no_report_inside_a_window_or_without_a_domain() -> None:
    s = _in_rack()
    a = lost(1, T0).model_copy(update={"evidence": {"boot_id": "b0", IN_MAINTENANCE: "mw-1"}})
    _, cmds = run(s, raised(a), T0)
    assert _reports(cmds) == []
    _, cmds = run(known(), raised(lost(1, T0)), T0)
    assert _reports(cmds) == []


def test_an_undelivered_report_starts_the_guard_and_is_sent_once_more() -> None:
    s = _in_rack()
    rep = FaultReport(cluster="c", node="n", alert_id="lost-1", kind="gpu_lost",
                      domains=["rack-1"])
    s, cmds = nm.step(s, nm.FaultReportFailed(report=rep), T0)
    assert [c.kind for c in cmds if c.kind in ("start_guard", "report_fault")] == [
        "start_guard", "report_fault"]
    again = next(c for c in cmds if isinstance(c, nm.ReportFault))
    assert again.retried and again.report == rep
    s, cmds = nm.step(s, nm.FaultReportFailed(report=rep, retried=True), T0)
    assert not [c for c in cmds if c.kind in ("start_guard", "report_fault")]
    assert any(isinstance(c, nm.SetDetails) and "not reported" in c.text for c in cmds)


# ---- a level fault raised inside a maintenance window (issue 29 item 1) --------------
def _inside(n: int, at: datetime, until: datetime, *, level: bool = True) -> Alert:
    base = lost(n, at) if level else Alert(
        alert_id=f"x79-{n}", cluster="c", node="n", kind="xid", code=79,
        summary="Xid 79", evidence={"boot_id": "b0"}, observed_at=at, received_at=at)
    # as ingest marks it: observed, not actionable, the window's scheduled end beside
    return base.model_copy(update={"actionable": False, "action": Action.none, "evidence": {
        **base.evidence, IN_MAINTENANCE: "mw-1", MAINTENANCE_REASON: "rack reboot",
        MAINTENANCE_UNTIL: until.isoformat()}})


def _grace_policy(s: nm.NodeState, domains: list[str]) -> nm.NodeState:
    s, _ = nm.step(s, nm.PolicyLoaded(catalogue=CAT, rails=RAILS, domains=domains,
                                      grace_s=GRACE), T0)
    return s


GRACE = 900.0


#: The policy read of a node of ``rack-1`` with the grace above.
IN_RACK = nm.PolicyLoaded(catalogue=CAT, rails=RAILS, domains=["rack-1"], grace_s=GRACE)


def test_a_gpu_lost_inside_a_window_is_repaired_after_its_grace_if_still_lost() -> None:
    """A GPU that did not come back from the planned reboot: the level fault raised inside
    the window is held to the window's scheduled end + grace_s, then repaired (reported
    to the guard first: it was not reported inside the window)."""
    s = _grace_policy(known(), ["rack-1"])
    until = T0 + timedelta(seconds=600)
    s, cmds = run(s, raised(_inside(1, T0, until)), T0, IN_RACK)
    assert _reports(cmds) == [] and not starts(cmds)  # inside the window: not reported
    (f,) = s.active.values()
    assert f.held_until == until + timedelta(seconds=GRACE) and "mw-1" in f.held_why
    assert IN_MAINTENANCE not in f.alert.evidence
    s, cmds = run(s, nm.TimerFired(), until + timedelta(seconds=GRACE - 1), IN_RACK)
    assert not starts(cmds)
    s, cmds = run(s, nm.TimerFired(), until + timedelta(seconds=GRACE + 1), IN_RACK)
    (start,) = starts(cmds)
    assert start.action == Action.power_cycle
    kinds = [c.kind for c in cmds if c.kind in ("report_fault", "start_repair")]
    assert kinds == ["report_fault", "start_repair"]


def test_a_gpu_lost_inside_a_window_and_back_after_it_is_not_repaired() -> None:
    s = _grace_policy(known(), [])
    until = T0 + timedelta(seconds=600)
    s, _ = run(s, raised(_inside(1, T0, until)), T0)
    s, _ = run(s, raised(lost(2, until + timedelta(seconds=30), active=False)),
               until + timedelta(seconds=30))
    s, cmds = run(s, nm.TimerFired(), until + timedelta(seconds=GRACE + 1))
    assert not starts(cmds) and not s.active


def test_an_xid_inside_a_window_stays_observed_only() -> None:
    s = _grace_policy(known(), [])
    until = T0 + timedelta(seconds=600)
    s, cmds = run(s, raised(_inside(1, T0, until, level=False)), T0)
    assert not s.active
    s, cmds = run(s, nm.TimerFired(), until + timedelta(seconds=GRACE + 1))
    assert not starts(cmds)


def test_the_forgotten_window_fault_defect_is_what_the_test_catches() -> None:
    """With the planted defect (the first release's behaviour) the lost GPU is never
    repaired: the test above fails on it."""
    assert "window_level_fault_forgotten" in nm.DEFECTS
    s = _grace_policy(known(), [])
    until = T0 + timedelta(seconds=600)
    d = frozenset({"window_level_fault_forgotten"})
    s, _ = nm.step(s, raised(_inside(1, T0, until)), T0, d)
    for ev in (nm.AlertRecorded(alert_id="lost-1"),):
        s, _ = nm.step(s, ev, T0, d)
    s, cmds = nm.step(s, nm.TimerFired(), until + timedelta(seconds=GRACE + 1), d)
    assert not s.active and not starts(cmds)
