"""Failure-domain holds judged on faults (issue 29 item 2): a node of a domain reports a
new actionable fault to its cluster's guard (``fault_seen``) when it is raised, and the
guard counts the report on arrival, so a rack whose faults wait out a grace period after
maintenance is held before the first of its repairs asks for a lease. Pure machines: the
node's (workflows/lifecycle/node.py) and the guard's (workflows/lifecycle/guard.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.unit.test_guard_domains import POLICY, RACK, _replies, _req, _serving
from tests.unit.test_guard_domains import T0 as GT0
from tests.unit.test_node_machine import CAT, RAILS, known, lost, raised, run
from workflows.leases import FaultReport
from workflows.lifecycle import guard as gm
from workflows.lifecycle import node as nm
from workflows.maintenance import IN_GRACE, IN_MAINTENANCE, MAINTENANCE_WINDOW

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
