"""Planned maintenance windows take effect (issue 29 item 1): an alert of a node inside a
window is marked on the delivery path every alert takes (``TemporalAlertSink``) and the
node entity records it without recommending anything; outside the window, the same alert
repairs. The sender cannot set or clear the mark itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.maintenance_store import MaintenanceStore
from ingest.handoff import TemporalAlertSink
from ingest.maintenance_marks import MAINTENANCE_REASON, MaintenanceMarks
from tests.workflows.conftest import Harness, make_alert
from workflows.config import CatalogueConfig
from workflows.maintenance import IN_MAINTENANCE, MAINTENANCE_UNTIL, MaintenanceWindow
from workflows.models import Action, AlertOutcome
from workflows.policy import decide_node_action

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _window(**kw: object) -> MaintenanceWindow:
    base: dict[str, object] = {"window_id": "mw-aaaaaaaaaaaa", "cluster": "c", "scope": "nodes",
                               "nodes": ["gpu-01"], "reason": "cable swap", "created_by": "ops",
                               "starts_at": T0, "ends_at": T0 + timedelta(hours=1)}
    return MaintenanceWindow.model_validate({**base, **kw})


async def _none() -> list[MaintenanceWindow]:
    return []


def test_marks_follow_the_control_plane_clock_and_strip_sender_marks() -> None:
    marks = MaintenanceMarks(_none)
    w = _window()
    inside = make_alert("c", "gpu-01", 79, received_at=T0 + timedelta(minutes=5),
                        observed_at=T0 - timedelta(hours=3))  # sender clock far behind
    m = marks.mark_with(inside, [w])
    assert not m.actionable and m.action == Action.none
    assert m.evidence[IN_MAINTENANCE] == w.window_id
    assert m.evidence[MAINTENANCE_REASON] == "cable swap"
    # the window's scheduled end: a level fault raised inside is judged after it
    assert m.evidence[MAINTENANCE_UNTIL] == (T0 + timedelta(hours=1)).isoformat()
    # received after the window: not marked, whatever the sender's clock says
    after = make_alert("c", "gpu-01", 79, received_at=T0 + timedelta(hours=2),
                       observed_at=T0 + timedelta(minutes=5))
    assert marks.mark_with(after, [w]).actionable == after.actionable
    # another node, another cluster: not marked
    assert IN_MAINTENANCE not in marks.mark_with(
        make_alert("c", "gpu-02", 79, received_at=T0 + timedelta(minutes=5)), [w]).evidence
    assert IN_MAINTENANCE not in marks.mark_with(
        make_alert("d", "gpu-01", 79, received_at=T0 + timedelta(minutes=5)), [w]).evidence
    # a sender's own mark is removed where no window covers it
    forged = make_alert("c", "gpu-02", 79, evidence={IN_MAINTENANCE: "mw-forged",
                                                     MAINTENANCE_REASON: "x"})
    clean = marks.mark_with(forged, [w])
    assert IN_MAINTENANCE not in clean.evidence and MAINTENANCE_REASON not in clean.evidence
    # a clear passes unmarked (it ends a fault; it never starts one)
    clear = make_alert("c", "gpu-01", 79, active=False, received_at=T0 + timedelta(minutes=5))
    assert IN_MAINTENANCE not in marks.mark_with(clear, [w]).evidence


async def test_a_failed_read_keeps_the_last_view() -> None:
    calls = {"n": 0}
    w = _window(ends_at=datetime.now(UTC) + timedelta(hours=1),
                starts_at=datetime.now(UTC) - timedelta(minutes=1))

    async def load() -> list[MaintenanceWindow]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError("ledger down")
        return [w]

    t = {"now": 0.0}
    marks = MaintenanceMarks(load, refresh_s=10, clock=lambda: t["now"])
    a = make_alert("c", "gpu-01", 79)
    assert (await marks.mark(a)).evidence[IN_MAINTENANCE] == w.window_id
    t["now"] = 11.0  # due again; the read fails
    assert (await marks.mark(a)).evidence[IN_MAINTENANCE] == w.window_id
    assert calls["n"] == 2


def test_the_node_decision_treats_the_mark_as_final() -> None:
    a = make_alert("c", "gpu-01", 79, evidence={IN_MAINTENANCE: "mw-1"})
    d = decide_node_action(a, CatalogueConfig())
    assert not d.actionable and d.action == Action.none and d.rule == "maintenance:mw-1"


async def test_no_repair_inside_a_window_and_a_repair_after_it(harness: Harness) -> None:
    """The real path: an operator window in the ledger, the real sink's marks read it, the
    node entity on the time-skipping server records the Xid 79 and starts nothing; after
    the window is ended the same fault repairs."""
    h = harness
    c = h.cluster.cluster
    store = MaintenanceStore(h.ledger.pool)
    w = await store.start(cluster=c, scope="nodes", nodes=["gpu-03"], duration_s=3600,
                          reason="planned rack reboot", created_by="ops")

    async def load() -> list[MaintenanceWindow]:
        return await store.list(c, active_at=datetime.now(UTC))

    marks = MaintenanceMarks(load, refresh_s=0.001)
    sink = TemporalAlertSink(h.client, h.task_queue, maintenance=marks)
    inside = await _deliver(h, sink, make_alert(c, "gpu-03", 1))
    assert inside.outcome != AlertOutcome.recommended and not inside.repair_id, inside
    assert "maintenance" in inside.reason, inside
    assert await h.ledger.list_repairs(cluster=c, node="gpu-03") == []
    await store.end(w.window_id, "ops")
    await marks.refresh(force=True)
    after = await _deliver(h, sink, make_alert(c, "gpu-03", 2))
    assert after.repair_id, after


async def _deliver(h: Harness, sink: TemporalAlertSink, alert: object) -> object:
    """The sink's marking, then the harness's delivery (the time-skipping server has no
    update-with-start, which ``TemporalAlertSink.deliver`` uses)."""
    assert sink.maintenance is not None
    marked = await sink.maintenance.mark(alert)  # type: ignore[arg-type]
    return await h.deliver(marked)


async def test_a_repair_not_yet_cordoned_waits_for_the_window_to_end(harness: Harness) -> None:
    """Issue 29: a window opened while a repair has not cordoned holds it before the
    cordon (named in its record, no lease held); ending the window early frees it within
    the re-check interval, the evidence is checked again, and the repair acts."""
    from tests.workflows.helpers import start_repair
    from tests.workflows.test_repair_rails import ledger_row
    from workflows.models import Action, Stage
    from workflows.repair import MAINTENANCE_RECHECK_S

    h = harness
    c = h.cluster.cluster
    store = MaintenanceStore(h.ledger.pool)
    # on the workflows' clock (the time-skipping server's; a full run's runs far ahead)
    w = await store.start(cluster=c, scope="nodes", nodes=["gpu-09"], duration_s=7200,
                          reason="rack 9 firmware", created_by="ops",
                          now=await h.env.get_current_time())
    handle = await start_repair(h, "gpu-09", Action.power_cycle, "mw-hold")
    await h.env.sleep(120)
    assert h.cluster.count("cordon") == 0 and h.cluster.power_cycles == 0
    row = await ledger_row(h, "mw-hold")
    notes = " ".join(t["reason"] for t in row["transitions"])
    assert w.window_id in notes and "paused before cordoning" in notes, notes
    await store.end(w.window_id, "ops", now=await h.env.get_current_time())
    await h.env.sleep(MAINTENANCE_RECHECK_S + 60)
    st = await handle.result()
    assert st.stage == Stage.succeeded and h.cluster.power_cycles == 1
    assert any("maintenance over" in t.reason for t in st.history), st.history


async def test_an_operators_own_repair_is_not_held_by_a_window(harness: Harness) -> None:
    from tests.workflows.helpers import start_repair
    from workflows.models import Action, Requester, RequesterKind, Stage

    h = harness
    c = h.cluster.cluster
    await MaintenanceStore(h.ledger.pool).start(
        cluster=c, scope="all", duration_s=7200, reason="whole cluster", created_by="ops",
        now=await h.env.get_current_time())
    st = await (await start_repair(h, "gpu-10", Action.power_cycle, "mw-op",
                                   requester=Requester(kind=RequesterKind.user,
                                                       name="alice"))).result()
    assert st.stage == Stage.succeeded and h.cluster.power_cycles == 1
