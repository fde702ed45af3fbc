"""Time-skipping tests of NodeWorkflow: dedup, persistence, auto-resolve, attach,
cooldown, continue-as-new (scenarios 1, 2, 6 and 10's alert side)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio.api.sdk.v1 import WorkflowMetadata

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import as_repair_handle
from workflows.models import Action, Alert, AlertOutcome, RepairStatus, Stage
from workflows.protocol import NodeStatus, workflow_id_guard, workflow_id_node, workflow_id_repair


async def node_status(h: Harness, node: str) -> NodeStatus:
    handle = h.client.get_workflow_handle(workflow_id_node(h.cluster.cluster, node))
    return await handle.query("status", result_type=NodeStatus)


async def repair_result(h: Harness, node: str, rid: str) -> RepairStatus:
    """Result of a repair this client did not start (skipping time while it runs: only
    handles from ``start_workflow`` unlock time skipping by themselves)."""
    handle = h.client.get_workflow_handle(
        workflow_id_repair(h.cluster.cluster, node, rid), result_type=RepairStatus
    )
    for _ in range(500):
        desc = await handle.describe()
        if desc.close_time is not None:
            return await as_repair_handle(handle).result()
        await h.env.sleep(timedelta(seconds=30))
    raise AssertionError(f"repair {rid} did not finish")


async def wait_for(pred: Any, what: str, tries: int = 200) -> None:
    for _ in range(tries):
        if await pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_event_fault_recommends_at_once_and_dedups(harness: Harness) -> None:
    h = harness
    a = make_alert(h.cluster.cluster, "gpu-01", 1)
    d1 = await h.deliver(a)
    assert d1.outcome == AlertOutcome.recommended and d1.repair_id
    d2 = await h.deliver(a)
    assert d2.outcome == AlertOutcome.deduplicated
    st = await repair_result(h, "gpu-01", d1.repair_id)
    assert st.stage == Stage.succeeded and st.action.value == "power_cycle"
    assert h.cluster.power_cycles == 1
    assert (await h.ledger.get_alert(a.alert_id)) is not None
    # the Temporal UI's console text of the child repair and of the guard it started
    desc = await h.env.client.get_workflow_handle(
        workflow_id_repair(h.cluster.cluster, "gpu-01", d1.repair_id)).describe()
    assert await desc.static_summary() == (
        f"power_cycle gpu-01 · {a.summary} · requested by system autorepair")
    assert a.evidence_text in (await desc.static_details() or "")
    desc = await h.env.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster)).describe()
    assert await desc.static_summary() == (
        f"cluster guard {h.cluster.cluster} · repair budget and circuit breaker")


async def test_level_fault_waits_for_persistence(harness: Harness) -> None:
    h = harness
    lvl = make_alert(
        h.cluster.cluster,
        "gpu-02",
        1,
        kind="xfs_shutdown",
        code=None,
        level=True,
        action="reboot",
        severity="critical",
    )
    d = await h.deliver(lvl)
    assert d.outcome == AlertOutcome.new and "persistence" in d.reason
    st = await node_status(h, "gpu-02")
    assert st.degraded and st.repair_id is None
    await h.env.sleep(timedelta(seconds=61))

    async def started() -> bool:
        return (await node_status(h, "gpu-02")).recommendations == 1

    await wait_for(started, "repair after persistence")


async def test_clear_before_persistence_auto_resolves(harness: Harness) -> None:
    h = harness
    lvl = make_alert(
        h.cluster.cluster, "gpu-03", 1, kind="xfs_shutdown", code=None, level=True, action="reboot"
    )
    assert (await h.deliver(lvl)).outcome == AlertOutcome.new
    clr = lvl.model_copy(update={"alert_id": "clr-3", "active": False})
    d = await h.deliver(clr)
    assert d.outcome == AlertOutcome.cleared and "auto-resolved" in d.reason
    await h.env.sleep(timedelta(minutes=5))
    st = await node_status(h, "gpu-03")
    assert st.repair_id is None and st.recommendations == 0 and not st.degraded
    assert h.cluster.count("cordon") == 0


async def test_scenario_1_secondary_xid_storm_no_repair(harness: Harness) -> None:
    h = harness
    for node in ("gpu-04", "gpu-05", "gpu-06"):
        for i in range(8):
            x45 = make_alert(
                h.cluster.cluster,
                node,
                f"x45-{i}",
                code=45,
                action="none",
                actionable=False,
                severity="warning",
                gpu=f"gpu{i % 4}",
            )
            d = await h.deliver(x45)
            assert d.outcome == AlertOutcome.ignored, d
    for node in ("gpu-04", "gpu-05", "gpu-06"):
        st = await node_status(h, node)
        assert st.recommendations == 0 and not st.diagnostics
    alerts = await h.ledger.list_alerts(cluster=h.cluster.cluster)
    assert len(alerts) == 24  # recorded and counted
    assert h.cluster.count("cordon") == 0


async def test_scenario_2_repeated_app_xid_asks_for_diagnostics(harness: Harness) -> None:
    h = harness
    x13 = dict(
        code=13, action="none", actionable=False, severity="warning", evidence={"gpc": "GPC 2"}
    )
    d1 = await h.deliver(make_alert(h.cluster.cluster, "gpu-07", "a", **x13))
    assert d1.outcome == AlertOutcome.ignored
    await h.env.sleep(timedelta(hours=3))
    d2 = await h.deliver(make_alert(h.cluster.cluster, "gpu-07", "b", **x13))
    assert d2.outcome == AlertOutcome.recommended and "diagnostic" in d2.reason
    assert d2.repair_id is None  # a validation run is recommended, not a reboot
    # the same Xid on different GPUs of different nodes: no action at all
    for i, node in enumerate(("gpu-08", "gpu-09")):
        d = await h.deliver(make_alert(h.cluster.cluster, node, f"c{i}", gpu=f"g{i}", **x13))
        assert d.outcome == AlertOutcome.ignored
    assert h.cluster.count("cordon") == 0
    assert any("diagnostic" in n.subject for n in h.cluster.notifications)
    # a third repeat within the window does not recommend (or notify) again
    sent = len(h.cluster.notifications)
    d3 = await h.deliver(make_alert(h.cluster.cluster, "gpu-07", "d", **x13))
    assert d3.outcome == AlertOutcome.ignored and "already recommended" in d3.reason
    assert len(h.cluster.notifications) == sent


async def test_straggler_from_two_sources_is_one_diagnostic(harness: Harness) -> None:
    h = harness
    slow = dict(kind="straggler", code=None, action="none", actionable=False,
                severity="warning", level=True)
    first = await h.deliver(make_alert(h.cluster.cluster, "gpu-11", "agent", **slow))
    second = await h.deliver(make_alert(h.cluster.cluster, "gpu-11", "ingest", **slow))
    assert first.outcome == AlertOutcome.recommended and "diagnostic" in first.reason
    assert second.outcome == AlertOutcome.ignored
    assert h.cluster.count("cordon") == 0
    # the Temporal UI's Current Details say it (they said only "node gpu-11 of ...")
    handle = h.client.get_workflow_handle(workflow_id_node(h.cluster.cluster, "gpu-11"))
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert "diagnostic validation recommended" in meta.current_details
    assert "autorepair validate gpu-11" in meta.current_details


async def test_scenario_6_flapping_attaches_and_cooldown_applies(harness: Harness) -> None:
    h = harness
    h.policy.wait_for_idle.poll_s = 60
    h.cluster.busy_polls["gpu-10"] = 5  # the repair stays in flight for ~5 min
    lvl = make_alert(
        h.cluster.cluster, "gpu-10", 1, kind="xfs_shutdown", code=None, level=True, action="reboot"
    )
    h.policy.rails.persistence_by_kind = {"xfs_shutdown": 0}
    d = await h.deliver(lvl)
    assert d.outcome == AlertOutcome.recommended
    rid = d.repair_id
    assert rid
    # unhealthy → healthy → unhealthy while the repair is in flight
    t = lvl.observed_at
    clr = lvl.model_copy(update={"alert_id": "clr", "active": False,
                                 "observed_at": t + timedelta(minutes=1)})
    again = lvl.model_copy(update={"alert_id": "again", "observed_at": t + timedelta(minutes=2)})
    assert (await h.deliver(clr)).outcome == AlertOutcome.cleared
    d3 = await h.deliver(again)
    assert d3.outcome == AlertOutcome.attached and d3.repair_id == rid
    st = await repair_result(h, "gpu-10", rid)
    assert st.stage == Stage.succeeded
    assert {a.alert_id for a in st.evidence} >= {lvl.alert_id, "again"}
    ns = await node_status(h, "gpu-10")
    assert ns.cooldown_until is not None and ns.recommendations == 1
    # the success retired the fault it acted on (I20): no second repair inside the
    # cooldown, nor after it, until the fault is reported again after the new boot
    await h.env.sleep(timedelta(minutes=20))
    assert (await node_status(h, "gpu-10")).recommendations == 1
    assert h.cluster.count("reboot") == 1
    await h.env.sleep(timedelta(minutes=11))
    ns = await node_status(h, "gpu-10")
    assert ns.recommendations == 1 and not ns.active_alerts
    # a fresh report after the boot: acted on again, the cooldown being over
    fresh = lvl.model_copy(update={"alert_id": "after-boot",
                                   "observed_at": t + timedelta(minutes=40)})
    assert (await h.deliver(fresh)).outcome == AlertOutcome.recommended

    async def second() -> bool:
        return (await node_status(h, "gpu-10")).recommendations == 2

    await wait_for(second, "second repair after cooldown")


async def test_continue_as_new_carries_state(harness: Harness) -> None:
    h = harness
    first = make_alert(
        h.cluster.cluster, "gpu-11", "first", code=45, action="none", actionable=False
    )
    await h.deliver(first, history_limit=40)
    for i in range(25):
        await h.deliver(
            make_alert(
                h.cluster.cluster, "gpu-11", f"n{i}", code=45, action="none", actionable=False
            )
        )
    handle = h.client.get_workflow_handle(workflow_id_node(h.cluster.cluster, "gpu-11"))
    desc = await handle.describe()
    assert desc.run_id != desc.raw_description.workflow_execution_info.first_run_id
    # de-duplication keys survived continue-as-new
    assert (await h.deliver(first)).outcome == AlertOutcome.deduplicated
    assert (await node_status(h, "gpu-11")).seen_alert_ids == 26


def test_repair_starts_with_its_search_attributes() -> None:
    """A repair the node starts is searchable from its first event (not only after its
    own first upsert): the values its upsert would set."""
    from workflows.models import RepairRequest, Requester, RequesterKind
    from workflows.node import _repair_search_attributes
    from workflows.protocol import (
        SA_ACTION,
        SA_ALERT_KIND,
        SA_CLUSTER,
        SA_MACHINE,
        SA_NODE,
        SA_REQUESTER,
        SA_STAGE,
        SA_STATE,
    )

    req = RepairRequest(
        repair_id="r1", cluster="c1", node="gpu-01", machine_id="m-01", action=Action.reboot,
        requester=Requester(kind=RequesterKind.system, name="autorepair"),
        alerts=[make_alert("c1", "gpu-01", 1)],
    )
    sa = _repair_search_attributes(req)
    assert sa.get(SA_NODE) == "gpu-01" and sa.get(SA_CLUSTER) == "c1"
    assert sa.get(SA_MACHINE) == "m-01" and sa.get(SA_ACTION) == "reboot"
    assert sa.get(SA_ALERT_KIND) == "xid" and sa.get(SA_REQUESTER) == "system:autorepair"
    assert sa.get(SA_STAGE) == "recommended" and sa.get(SA_STATE) == "in_progress"
    no_machine = _repair_search_attributes(req.model_copy(update={"machine_id": None}))
    assert no_machine.get(SA_MACHINE) is None


def _level_raise(h: Harness, node: str, at: datetime) -> Alert:
    """A level fault's raise (``xfs_shutdown``, mapped to ``reboot``) observed and
    received (ingest's stamp) ``at``."""
    return make_alert(h.cluster.cluster, node, "r1", kind="xfs_shutdown", code=None,
                      level=True, action="reboot", observed_at=at, received_at=at)


def _at(at: datetime) -> dict[str, datetime]:
    """An edge sent and received ``at`` (a right sender clock, ingest's stamp)."""
    return {"observed_at": at, "received_at": at}


async def test_raise_arriving_after_its_clear_is_stale(harness: Harness) -> None:
    """Edges out of order (two ingest replicas, an outbox re-delivery, a replayed dead
    letter): the clear received 5 s after the raise arrives first, then the raise. The
    raise is stale: the fault stays cleared and nothing is repaired, however long the
    node waits. A raise received after the clear is a new episode again (I17: ingest's
    receipt stamps order the edges)."""
    h = harness
    t0 = await h.env.get_current_time() - timedelta(seconds=30)
    lvl = _level_raise(h, "gpu-04", t0)
    clr = lvl.model_copy(update={"alert_id": "c1", "active": False,
                                 **_at(t0 + timedelta(seconds=5))})
    assert (await h.deliver(clr)).outcome == AlertOutcome.cleared
    d = await h.deliver(lvl)
    assert d.outcome == AlertOutcome.ignored and d.reason.startswith("stale raise")
    await h.env.sleep(timedelta(minutes=10))  # past the persistence window
    st = await node_status(h, "gpu-04")
    assert not st.degraded and st.recommendations == 0 and h.cluster.count("cordon") == 0
    again = lvl.model_copy(update={"alert_id": "r2",
                                   **_at(await h.env.get_current_time())})
    assert (await h.deliver(again)).outcome == AlertOutcome.new
    assert (await node_status(h, "gpu-04")).degraded


async def test_clear_arriving_after_a_newer_raise_is_stale(harness: Harness) -> None:
    """Received raised at t, cleared at t+5 s, raised again at t+10 s; the clear arrives
    last. It must not clear the second episode: the fault waits out its persistence
    window and is repaired."""
    h = harness
    t0 = await h.env.get_current_time() - timedelta(seconds=20)
    r1 = _level_raise(h, "gpu-05", t0)
    c1 = r1.model_copy(update={"alert_id": "c1", "active": False,
                               **_at(t0 + timedelta(seconds=5))})
    r2 = r1.model_copy(update={"alert_id": "r2", **_at(t0 + timedelta(seconds=10))})
    assert (await h.deliver(r1)).outcome == AlertOutcome.new
    assert (await h.deliver(r2)).outcome == AlertOutcome.new
    d = await h.deliver(c1)
    assert d.outcome == AlertOutcome.ignored and d.reason.startswith("stale clear")
    st = await node_status(h, "gpu-05")
    assert st.degraded and [a.alert_id for a in st.active_alerts] == ["r2"]
    await h.env.sleep(timedelta(seconds=61))

    async def started() -> bool:
        return (await node_status(h, "gpu-05")).recommendations == 1

    await wait_for(started, "repair of the second episode after persistence")


async def test_edge_order_is_the_control_planes_not_the_senders(harness: Harness) -> None:
    """I17 (review of issue 26: ``_stale_edge`` ordered edges by the sender's
    ``observed_at``): the agent's clock runs 4 min fast for the clear and right for the
    next raise. The raise was received after the clear, so it is a new episode, not a
    stale raise (by the sender's stamps it looked older than the clear)."""
    h = harness
    now = await h.env.get_current_time()
    r1 = _level_raise(h, "gpu-06", now - timedelta(seconds=30))
    clr = r1.model_copy(update={"alert_id": "c1", "active": False,
                                "observed_at": now + timedelta(minutes=4),
                                "received_at": now - timedelta(seconds=20)})
    r2 = r1.model_copy(update={"alert_id": "r2", "observed_at": now - timedelta(seconds=10),
                               "received_at": now - timedelta(seconds=10)})
    assert (await h.deliver(r1)).outcome == AlertOutcome.new
    assert (await h.deliver(clr)).outcome == AlertOutcome.cleared
    d = await h.deliver(r2)
    assert d.outcome == AlertOutcome.new, d
    st = await node_status(h, "gpu-06")
    assert st.degraded and [a.alert_id for a in st.active_alerts] == ["r2"]


async def test_level_fault_fixed_by_a_repair_is_retired(harness: Harness) -> None:
    """Issue 26 reproduction 1 (I20): the agent reports ``gpu_lost``, the power cycle
    fixes it, the restarted agent sends no clear: the success retires the fault, so the
    healthy node is not repaired again after the cooldown; a raise received before the
    repair ended and delivered late is stale."""
    h = harness
    h.policy.rails.persistence_by_kind = {"gpu_lost": 0}
    now = await h.env.get_current_time()
    lost = make_alert(h.cluster.cluster, "gpu-11", "lost", kind="gpu_lost", code=None,
                      gpu=None, level=True, action="power_cycle", summary="3 of 4 GPUs",
                      observed_at=now, received_at=now)
    d = await h.deliver(lost)
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    st = await repair_result(h, "gpu-11", d.repair_id)
    assert st.stage == Stage.succeeded and h.cluster.power_cycles == 1
    # an ingest outbox re-delivers a raise it received before the repair ended
    late = lost.model_copy(update={"alert_id": "lost-late"})
    late_d = await h.deliver(late)
    assert late_d.outcome == AlertOutcome.ignored and "stale raise" in late_d.reason
    await h.env.sleep(timedelta(hours=3))
    ns = await node_status(h, "gpu-11")
    assert ns.recommendations == 1 and not ns.active_alerts
    assert h.cluster.power_cycles == 1


async def test_node_runs_only_what_its_machine_commanded(harness: Harness) -> None:
    """Issue 26 item 5 for the node: every call NodeWorkflow makes (here the ledger
    read, the alert's ledger write and the policy read of a non-actionable alert, then
    a repair child for an actionable one) is checked against what ``step`` commanded,
    and none departs from it."""
    from tests.workflows import fidelity

    h = harness
    before, seen = dict(fidelity.CHECKED), len(fidelity.VIOLATIONS)
    noise = make_alert(h.cluster.cluster, "gpu-12", "n", code=45, action="none",
                       actionable=False)
    assert (await h.deliver(noise)).outcome == AlertOutcome.ignored
    assert fidelity.CHECKED["calls"] - before["calls"] == 3  # only the node ran
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-12", "x"))
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    await repair_result(h, "gpu-12", d.repair_id)
    assert fidelity.VIOLATIONS[seen:] == []
