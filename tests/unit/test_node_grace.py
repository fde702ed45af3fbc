"""Grace period after maintenance (issue 29 item 1, ``policy.maintenance.grace_s``) in
the pure node machine and the ingest mark: a fault received in the grace after a window
(or after the node's first report from a boot made during it) is held until the grace
end; recommended only if it persists (level) or recurs (event) past it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ingest.maintenance_marks import MaintenanceMarks
from tests.unit.test_node_machine import T0, known, lost, raised, replies, run, starts
from workflows.lifecycle import node as nm
from workflows.maintenance import (
    IN_GRACE,
    IN_MAINTENANCE,
    MAINTENANCE_WINDOW,
    MaintenanceWindow,
    in_grace,
)
from workflows.models import Alert, AlertOutcome, Severity

END = T0  # the window ended at T0; the default grace (900 s) runs to T0 + 15 min
GRACE_END = END + timedelta(seconds=nm.GRACE_S)


def marked(a: Alert, end: datetime = GRACE_END) -> Alert:
    return a.model_copy(update={"evidence": {**a.evidence, IN_GRACE: end.isoformat(),
                                             MAINTENANCE_WINDOW: "mw-1"}})


def xid(n: int, at: datetime, boot: str = "b0") -> Alert:
    return Alert(alert_id=f"xid-{n}", cluster="c", node="n", kind="xid", code=79,
                 severity=Severity.critical, summary="GPU fell off the bus",
                 evidence={"boot_id": boot}, observed_at=at, received_at=at)


def test_a_level_fault_cleared_within_the_grace_is_never_recommended() -> None:
    s = known()
    s, cmds = run(s, raised(marked(lost(1, END + timedelta(seconds=30)))),
                  END + timedelta(seconds=30))
    (r,) = replies(cmds)
    assert r.outcome == AlertOutcome.new and r.reason.startswith("held:"), r
    assert "mw-1" in r.reason and GRACE_END.isoformat() in r.reason
    assert s.details.startswith("gpu_lost::") and "held" in s.details
    # persistence (60 s) is over, the grace is not: nothing starts, the timer waits for it
    s, cmds = run(s, nm.TimerFired(), END + timedelta(seconds=120))
    assert not starts(cmds) and s.timer_at == GRACE_END
    s, cmds = run(s, raised(marked(lost(2, END + timedelta(seconds=300), active=False))),
                  END + timedelta(seconds=300))
    assert [r.outcome for r in replies(cmds)] == [AlertOutcome.cleared]
    s, cmds = run(s, nm.TimerFired(), GRACE_END + timedelta(seconds=1))
    assert not starts(cmds) and not s.active


def test_a_level_fault_still_raised_at_the_grace_end_is_recommended() -> None:
    s = known()
    s, _ = run(s, raised(marked(lost(1, END + timedelta(seconds=30)))),
               END + timedelta(seconds=30))
    assert s.timer_at == GRACE_END
    s, cmds = run(s, nm.TimerFired(), GRACE_END)
    (start,) = starts(cmds)
    assert start.fault_keys == ["gpu_lost::"]


def test_an_event_fault_must_recur_after_the_grace() -> None:
    s = known()
    s, cmds = run(s, raised(marked(xid(1, END + timedelta(seconds=10)))),
                  END + timedelta(seconds=10))
    assert not starts(cmds) and replies(cmds)[0].reason.startswith("held:")
    assert "reported again" in replies(cmds)[0].reason
    s, cmds = run(s, nm.TimerFired(), GRACE_END)
    assert not starts(cmds) and not s.active and "dropped" in s.details
    s, cmds = run(s, raised(xid(2, GRACE_END + timedelta(seconds=60))),
                  GRACE_END + timedelta(seconds=60))
    (start,) = starts(cmds)
    assert start.fault_keys == ["xid:79:"]


def test_an_event_fault_recurring_before_the_drop_is_recommended() -> None:
    """The recurrence arrives after the grace end but before the timer dropped it."""
    s = known()
    s, _ = run(s, raised(marked(xid(1, END + timedelta(seconds=10)))),
               END + timedelta(seconds=10))
    at = GRACE_END + timedelta(seconds=1)
    s, cmds = run(s, raised(xid(2, at)), at)
    assert len(starts(cmds)) == 1


def test_a_first_report_from_a_boot_made_in_the_window_starts_its_own_grace() -> None:
    """Reported on boot b0 inside the window; the node's first report after it comes
    from boot b1, ten minutes into the window's grace: held for grace_s from then."""
    s = known()
    inside = lost(1, END - timedelta(seconds=600)).model_copy(update={
        "evidence": {"boot_id": "b0", IN_MAINTENANCE: "mw-1"}})
    s, cmds = run(s, raised(inside), END - timedelta(seconds=600))
    assert not starts(cmds) and s.maint_boot == "b0"
    at = END + timedelta(seconds=600)
    s, cmds = run(s, raised(marked(xid(2, at, boot="b1"))), at)
    (r,) = replies(cmds)
    assert "boot b1" in r.reason and "held" in r.reason, r
    boot_end = at + timedelta(seconds=nm.GRACE_S)
    assert s.grace_until == boot_end
    # past the window's grace, still inside the boot's: a recurrence is held too
    later = GRACE_END + timedelta(seconds=60)
    s, cmds = run(s, raised(xid(3, later, boot="b1")), later)
    assert not starts(cmds) and "held" in replies(cmds)[0].reason
    s, cmds = run(s, raised(xid(4, boot_end + timedelta(seconds=1), boot="b1")),
                  boot_end + timedelta(seconds=1))
    assert len(starts(cmds)) == 1


def test_the_same_boot_after_the_window_gets_only_the_windows_grace() -> None:
    s = known()
    inside = lost(1, END - timedelta(seconds=60)).model_copy(update={
        "evidence": {"boot_id": "b0", IN_MAINTENANCE: "mw-1"}})
    s, _ = run(s, raised(inside), END - timedelta(seconds=60))
    s, _ = run(s, raised(marked(xid(2, END + timedelta(seconds=600)))),
               END + timedelta(seconds=600))
    assert s.grace_until == GRACE_END


def test_no_grace_mark_no_hold() -> None:
    s = known()
    s, cmds = run(s, raised(xid(1, T0)), T0)
    assert len(starts(cmds)) == 1


def test_policy_read_carries_grace_s() -> None:
    s = known()
    s, _ = nm.step(s, nm.PolicyLoaded(catalogue=s.catalogue or nm.CatalogueConfig(),
                                      rails=s.rails, grace_s=60.0), T0)
    assert s.grace_s == 60.0


# ---- the ingest mark ------------------------------------------------------------------
W = MaintenanceWindow(window_id="mw-1", cluster="c", scope="nodes", nodes=["n"],
                      reason="rack reboot", created_by="ops",
                      starts_at=END - timedelta(hours=1), ends_at=END)


async def _none() -> list[MaintenanceWindow]:
    return []


def test_ingest_marks_an_alert_in_the_grace_with_its_end() -> None:
    marks = MaintenanceMarks(_none, grace_s=900)
    a = marks.mark_with(xid(1, END + timedelta(seconds=10)), [W])
    assert a.action == xid(0, T0).action and a.evidence[IN_GRACE] == GRACE_END.isoformat()
    assert a.evidence[MAINTENANCE_WINDOW] == "mw-1" and IN_MAINTENANCE not in a.evidence
    assert IN_GRACE not in marks.mark_with(xid(2, GRACE_END), [W]).evidence
    assert IN_GRACE not in MaintenanceMarks(_none, grace_s=0).mark_with(
        xid(3, END + timedelta(seconds=10)), [W]).evidence
    # a sender cannot mark itself
    forged = xid(4, T0 - timedelta(days=1)).model_copy(update={
        "evidence": {IN_GRACE: GRACE_END.isoformat(), MAINTENANCE_WINDOW: "mw-x"}})
    clean = marks.mark_with(forged, [W])
    assert IN_GRACE not in clean.evidence and MAINTENANCE_WINDOW not in clean.evidence


def test_in_grace_takes_the_latest_grace_end_and_an_early_end() -> None:
    early = W.model_copy(update={"window_id": "mw-2", "ended_at": END - timedelta(minutes=30)})
    at = END - timedelta(minutes=20)
    hit = in_grace([W, early], "c", "n", None, at, 900)
    assert hit is not None and hit[0].window_id == "mw-2"
    assert hit[1] == END - timedelta(minutes=15)
    assert in_grace([W], "c", "other", None, END, 900) is None


def test_marks_reject_a_negative_grace() -> None:
    import pytest
    with pytest.raises(ValueError, match="grace_s"):
        MaintenanceMarks(_none, grace_s=-1)


def test_grace_default_is_the_configs() -> None:
    from workflows.config import MaintenanceConfig
    assert MaintenanceConfig().grace_s == 900.0 == nm.GRACE_S
    assert datetime(2026, 1, 1, tzinfo=UTC) < GRACE_END
