"""RepairWorkflow safety rails on the unhappy paths (time-skipping server, real ledger).

Every ending cleans up (uncordon unless held, terminal ledger row with the cause, lease
released, NodeWorkflow told); evidence is re-checked before every disruptive step; an
early approval is kept; transient action failures are retried before they count; the
per-node action cap and the recurrence check hand the node to a person or the ladder;
a remove stays removed; a wait of days keeps each run's history bounded.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError
from temporalio.service import RPCError

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import (
    between_tasks,
    closed,
    eventually,
    guard_status,
    repair_status,
    start_repair,
    wait_stage,
)
from workflows.activity_api import ERR_AUTH, ERR_CONFIGURATION, AttemptRecord
from workflows.models import (
    Action,
    AlertOutcome,
    ApproveSignal,
    CancelSignal,
    RejectSignal,
    RepairRequest,
    RepairStatus,
    Stage,
)
from workflows.protocol import (
    LEASE_RENEW_S,
    REPAIR_SIGNAL_APPROVE,
    REPAIR_SIGNAL_ATTACH_ALERT,
    REPAIR_SIGNAL_LEASE,
    LeaseReply,
    NodeStatus,
    workflow_id_node,
    workflow_id_repair,
)

TERMINAL = {"succeeded", "failed", "rejected", "cancelled", "auto_resolved", "timed_out"}


async def ledger_row(h: Harness, rid: str) -> dict[str, Any]:
    row = await h.ledger.get_repair(rid)
    assert row is not None, rid
    return row


async def assert_ended_cleanly(h: Harness, node: str, rid: str, stage: Stage) -> dict[str, Any]:
    """I1: terminal ledger row with a cause, node not cordoned by us, lease released."""
    row = await ledger_row(h, rid)
    assert row["stage"] == stage.value, row["transitions"][-1]
    last = row["transitions"][-1]
    assert last["stage"] == stage.value and last["reason"]
    assert h.cluster.cordons.get(node) != rid, f"{node} left cordoned by {rid}"
    try:
        g = await guard_status(h)
    except RPCError:
        return row  # no guard: this repair never asked for a lease
    assert rid not in {lease.repair_id for lease in g.leases}
    assert rid not in {p.repair_id for p in g.pending}
    return row


def busy(h: Harness, node: str) -> None:
    h.cluster.busy_polls[node] = 10_000
    h.policy.wait_for_idle.do_not_interrupt = True


# ---- I1: every ending cleans up ---------------------------------------------------
async def test_idle_check_403_fails_the_repair_and_uncordons(harness: Harness) -> None:
    h = harness
    h.cluster.broken["check_idle"] = ERR_AUTH  # Kubernetes answers 403 Forbidden
    handle = await start_repair(h, "gpu-01", Action.reboot, "i403")
    st = await handle.result()
    assert st.stage == Stage.failed
    row = await assert_ended_cleanly(h, "gpu-01", "i403", Stage.failed)
    assert "check_idle failed" in row["transitions"][-1]["reason"]
    assert "AuthFailure" in row["transitions"][-1]["reason"]
    # Temporal (the UI's workflow list) shows it failed, not a green Completed, with the
    # final status as the failure's detail
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
    from temporalio.exceptions import ApplicationError

    assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
    raw = h.client.get_workflow_handle(handle.id, result_type=RepairStatus)
    with pytest.raises(WorkflowFailureError) as ei:
        await raw.result()
    cause = ei.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "RepairFailed"
    assert cause.non_retryable and "check_idle failed" in cause.message
    assert RepairStatus.model_validate(cause.details[0]).stage == Stage.failed
    assert h.cluster.count("cordon") == 1 and h.cluster.count("rejoin") == 1
    assert h.cluster.count("reboot") == 0
    assert any(n.subject == "repair i403 failed" for n in h.cluster.notifications)


async def test_configuration_error_at_cordon_ends_failed(harness: Harness) -> None:
    h = harness
    h.cluster.broken["cordon"] = ERR_CONFIGURATION  # the slurm binary is missing
    st = await (await start_repair(h, "gpu-02", Action.reboot, "icfg")).result()
    assert st.stage == Stage.failed and "cordon_node failed" in st.history[-1].reason
    await assert_ended_cleanly(h, "gpu-02", "icfg", Stage.failed)
    assert h.cluster.count("rejoin") == 0  # nothing of ours to lift


async def test_failure_tells_the_node_workflow(harness: Harness) -> None:
    h = harness
    h.cluster.broken["check_idle"] = ERR_AUTH
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-03", "n1"))
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    node = h.client.get_workflow_handle(workflow_id_node(h.cluster.cluster, "gpu-03"))

    async def released() -> bool:
        st = await node.query("status", result_type=NodeStatus)
        return st.repair_id is None

    await eventually(released, "the NodeWorkflow to learn the repair ended")
    await assert_ended_cleanly(h, "gpu-03", d.repair_id, Stage.failed)


async def test_reject_while_waiting_for_idle_uncordons(harness: Harness) -> None:
    h = harness  # between cordon and drain
    busy(h, "gpu-04")
    handle = await start_repair(h, "gpu-04", Action.reboot, "irej")
    await wait_stage(h, "gpu-04", "irej", Stage.waiting_for_idle)
    assert h.cluster.cordons.get("gpu-04") == "irej"
    await handle.signal("reject", RejectSignal(by="carol", reason="training run"))
    st = await handle.result()
    assert st.stage == Stage.rejected and h.cluster.count("drain") == 0
    row = await assert_ended_cleanly(h, "gpu-04", "irej", Stage.rejected)
    assert row["transitions"][-1]["by_whom"] == "carol"


async def test_cancel_signal_while_waiting_for_idle_uncordons(harness: Harness) -> None:
    h = harness
    busy(h, "gpu-05")
    handle = await start_repair(h, "gpu-05", Action.reboot, "icnl")
    await wait_stage(h, "gpu-05", "icnl", Stage.waiting_for_idle)
    await handle.signal("cancel", CancelSignal(by="frank", reason="not now"))
    assert (await handle.result()).stage == Stage.cancelled
    await assert_ended_cleanly(h, "gpu-05", "icnl", Stage.cancelled)
    assert h.cluster.count("drain") == 0 and h.cluster.count("reboot") == 0


async def test_workflow_cancel_from_temporal_ui_cleans_up(harness: Harness) -> None:
    h = harness
    busy(h, "gpu-06")
    handle = await start_repair(h, "gpu-06", Action.reboot, "iui")
    await wait_stage(h, "gpu-06", "iui", Stage.waiting_for_idle)
    # between two idle checks: the time-skipping test server, asked to cancel a workflow
    # whose activity is scheduled, at times loses the activity and leaves the next
    # workflow task started for good (its clock stops; real Temporal does not)
    await between_tasks(handle)
    await handle.cancel()
    await closed(handle, "the cancelled repair cleaning up and closing")
    with pytest.raises(WorkflowFailureError) as exc:
        await handle.result()
    assert isinstance(exc.value.cause, CancelledError)  # Temporal records it cancelled
    row = await assert_ended_cleanly(h, "gpu-06", "iui", Stage.cancelled)
    assert "cancelled from Temporal" in row["transitions"][-1]["reason"]
    assert h.cluster.count("drain") == 0


async def test_workflow_cancel_while_awaiting_approval(harness: Harness) -> None:
    h = harness
    h.policy.consent.mode = "approve"
    handle = await start_repair(h, "gpu-07", Action.reboot, "iuia")
    await wait_stage(h, "gpu-07", "iuia", Stage.awaiting_approval)
    await between_tasks(handle)  # as above
    await handle.cancel()
    await closed(handle, "the cancelled repair cleaning up and closing")
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    await assert_ended_cleanly(h, "gpu-07", "iuia", Stage.cancelled)
    assert h.cluster.count("cordon") == 0


async def test_failing_uncordon_is_noted_and_the_row_still_ends(harness: Harness) -> None:
    h = harness
    h.cluster.broken["check_idle"] = ERR_AUTH
    h.cluster.broken["rejoin"] = ERR_AUTH
    st = await (await start_repair(h, "gpu-08", Action.reboot, "iunc")).result()
    assert st.stage == Stage.failed
    row = await ledger_row(h, "iunc")
    assert row["stage"] == "failed"
    assert "uncordon failed" in row["transitions"][-1]["reason"]
    assert h.cluster.cordons.get("gpu-08") == "iunc"  # a human must lift it, and is told
    assert any("left cordoned" in n.subject for n in h.cluster.notifications)
    g = await guard_status(h)
    assert "iunc" not in {lease.repair_id for lease in g.leases}


async def test_remove_keeps_the_node_out_with_a_ticket(harness: Harness) -> None:
    h = harness
    handle = await start_repair(h, "gpu-09", Action.remove, "irm")
    await wait_stage(h, "gpu-09", "irm", Stage.awaiting_approval)
    await handle.signal("approve", ApproveSignal(by="tech"))
    st = await handle.result()
    assert st.stage == Stage.succeeded
    assert h.cluster.cordons.get("gpu-09") == "irm"  # documented hold: removed for RMA
    row = await ledger_row(h, "irm")
    assert "RMA-m-gpu-09" in row["transitions"][-1]["reason"]
    assert any("left cordoned" in n.subject for n in h.cluster.notifications)
    # the re-validation it starts may never return the machine (I11)
    val = h.client.get_workflow_handle("validate/m-gpu-09/irm")
    await val.result()
    hist = await val.fetch_history()
    start = hist.events[0].workflow_execution_started_event_attributes
    assert json.loads(start.input.payloads[0].data)["return_to"] == "hold"


async def test_rejoin_timeout_holds_the_node_and_notifies(harness: Harness) -> None:
    h = harness
    h.cluster.unhealthy.add("gpu-10")
    st = await (await start_repair(h, "gpu-10", Action.reboot, "ito")).result()
    assert st.stage == Stage.timed_out
    assert h.cluster.cordons.get("gpu-10") == "ito"
    assert any("left cordoned" in n.subject for n in h.cluster.notifications)
    row = await ledger_row(h, "ito")
    assert row["stage"] == "timed_out" and "left cordoned" in row["transitions"][-1]["reason"]


# ---- I5: evidence before every disruptive step -------------------------------------
async def test_cleared_evidence_never_cordons(harness: Harness) -> None:
    h = harness  # automatic consent: nothing waits before the lease and the cordon
    cleared = make_alert(
        h.cluster.cluster, "gpu-11", "lvl", kind="ib_link_down", code=None, level=True,
        action="reboot", active=False,
    )
    st = await (await start_repair(h, "gpu-11", Action.reboot, "iev", alerts=[cleared])).result()
    assert st.stage == Stage.auto_resolved, st.history
    assert "cleared" in st.history[-1].reason, st.history[-1]
    assert h.cluster.count("cordon") == 0 and h.cluster.count("drain") == 0
    await assert_ended_cleanly(h, "gpu-11", "iev", Stage.auto_resolved)


async def test_evidence_clearing_during_idle_wait_uncordons_without_drain(
    harness: Harness,
) -> None:
    h = harness
    busy(h, "gpu-12")
    lvl = make_alert(
        h.cluster.cluster, "gpu-12", "lvl", kind="ib_link_down", code=None, level=True,
        action="reboot",
    )
    handle = await start_repair(h, "gpu-12", Action.reboot, "iidl", alerts=[lvl])
    await wait_stage(h, "gpu-12", "iidl", Stage.waiting_for_idle)
    await handle.signal("attach_alert", lvl.model_copy(update={"alert_id": "c", "active": False}))
    st = await handle.result()
    assert st.stage == Stage.auto_resolved and "before draining" in st.history[-1].reason
    assert h.cluster.count("drain") == 0 and h.cluster.count("reboot") == 0
    await assert_ended_cleanly(h, "gpu-12", "iidl", Stage.auto_resolved)


# ---- I9: an early approval is kept --------------------------------------------------
async def test_approval_before_awaiting_approval_is_kept(harness: Harness) -> None:
    h = harness
    h.policy.consent.mode = "approve"
    req = RepairRequest(
        repair_id="iapp", cluster=h.cluster.cluster, node="gpu-13", action=Action.reboot,
        alerts=[make_alert(h.cluster.cluster, "gpu-13", "iapp")],
    )
    handle: WorkflowHandle[Any, RepairStatus] = await h.client.start_workflow(
        "RepairWorkflow", req, id=workflow_id_repair(h.cluster.cluster, "gpu-13", "iapp"),
        task_queue=h.task_queue, result_type=RepairStatus,
        start_signal=REPAIR_SIGNAL_APPROVE, start_signal_args=[ApproveSignal(by="alice")],
    )
    st = await handle.result()
    assert st.stage == Stage.succeeded and st.approved_by == "alice"
    assert Stage.awaiting_approval in [t.stage for t in st.history]
    assert h.cluster.count("reboot") == 1


# ---- I14: transient is not failure -------------------------------------------------
async def test_transient_bmc_outage_is_retried_not_counted(harness: Harness) -> None:
    h = harness
    h.cluster.transient["power_cycle"] = 6  # ~10+20+40+80+120+120 s of refused connections
    st = await (await start_repair(h, "gpu-14", Action.power_cycle, "itr")).result()
    assert st.stage == Stage.succeeded and st.action == Action.power_cycle
    assert h.cluster.count("power_cycle") == 7 and h.cluster.power_cycles == 1
    row = await ledger_row(h, "itr")
    assert [a["outcome"] for a in row["attempts"]] == ["succeeded"]


async def test_outage_beyond_the_bound_touched_nothing_so_no_attempt(harness: Harness) -> None:
    """I22 (issue 26): the BMC never answers, so the power cycle never sent ForceOff; once
    ``action_retry_max_s`` is spent the repair fails without recording an attempt (on
    de70c4e: two failed attempts counted, then a reprovision) and the node is
    uncordoned, nothing having been touched."""
    h = harness
    h.policy.rails.action_retry_max_s = 300
    h.cluster.transient["power_cycle"] = 10_000  # the BMC never answers
    st = await (await start_repair(h, "gpu-15", Action.power_cycle, "ibnd")).result()
    row = await ledger_row(h, "ibnd")
    assert row["attempts"] == []
    assert st.stage == Stage.failed and "touched nothing" in st.history[-1].reason
    assert h.cluster.count("reprovision", "gpu-15") == 0
    assert "gpu-15" not in h.cluster.cordons
    tries = h.cluster.count("power_cycle")
    assert 5 <= tries <= 8, tries  # 10, 20, 40, 80, 120, ... s within 300 s


# ---- I15: per-node cap, the ladder follows the fault --------------------------------
async def record(h: Harness, node: str, machine: str, action: Action, n: int, **kw: Any) -> None:
    now = await h.env.get_current_time()
    for i in range(n):
        await h.ledger.record_attempt(
            AttemptRecord(
                repair_id=kw.get("repair_id") or f"old-{node}-{action.value}-{i}",
                cluster=h.cluster.cluster,
                node=node, machine_id=machine, action=action,
                alert_kind=kw.get("kind", "xid"), code=kw.get("code", 79),
                outcome=kw.get("outcome", "succeeded"), at=now - timedelta(hours=1 + i),
            )
        )


async def test_node_action_cap_asks_a_human(harness: Harness) -> None:
    h = harness
    h.policy.rails.max_actions_per_node = 4
    # one earlier repair's four reboots: the cap counts actions, and one repair is no
    # repeat offender (issue 31 item 2 counts repairs)
    await record(h, "gpu-16", "m-gpu-16", Action.reboot, 4, kind="ib_link_down", code=None,
                 repair_id="old-gpu-16")
    handle = await start_repair(h, "gpu-16", Action.power_cycle, "icap")
    st = await wait_stage(h, "gpu-16", "icap", Stage.awaiting_approval)
    assert "node cap: 4 disruptive actions" in st.detail
    assert h.cluster.count("cordon") == 0

    async def recorded() -> bool:
        row = await ledger_row(h, "icap")
        return row["stage"] == "awaiting_approval" and "node cap" in row["transitions"][-1][
            "reason"
        ]

    await eventually(recorded, "the ledger to show the cap")
    await handle.signal("approve", ApproveSignal(by="oncall"))
    st = await handle.result()
    assert st.stage == Stage.succeeded and h.cluster.power_cycles == 1
    assert st.decided_by_rule and "approved by oncall" in st.decided_by_rule


async def test_migrate_attempt_is_recorded_against_the_faulty_machine(harness: Harness) -> None:
    h = harness
    fresh = make_alert(h.cluster.cluster, "gpu-17", "m", observed_at=await h.env.get_current_time())
    st = await (await start_repair(h, "gpu-17", Action.migrate, "imig", alerts=[fresh])).result()
    assert st.stage == Stage.succeeded and st.machine_id == "spare-gpu-17"
    rows = await h.ledger.pool.fetch(
        "SELECT machine_id, outcome FROM repair_attempts WHERE repair_id = 'imig'"
    )
    assert [(r["machine_id"], r["outcome"]) for r in rows] == [("m-gpu-17", "succeeded")]


async def test_ladder_follows_the_node_after_migrate(harness: Harness) -> None:
    h = harness
    h.policy.consent.mode = "approve"
    # the node already migrated twice for this fault (off m-old-a, m-old-b)
    await record(h, "gpu-18", "m-old-a", Action.migrate, 1)
    await record(h, "gpu-18", "m-old-b", Action.migrate, 1)
    fresh = make_alert(h.cluster.cluster, "gpu-18", "f", observed_at=await h.env.get_current_time())
    handle = await start_repair(h, "gpu-18", Action.migrate, "ilad", alerts=[fresh])
    st = await wait_stage(h, "gpu-18", "ilad", Stage.awaiting_approval)
    assert st.action == Action.migrate and "exhausted" in (st.decided_by_rule or "")
    await handle.signal("reject", RejectSignal(by="oncall", reason="RMA"))
    assert (await handle.result()).stage == Stage.rejected
    assert h.cluster.count("migrate") == 0


async def test_fault_recurring_while_joining_goes_back_to_the_ladder(harness: Harness) -> None:
    h = harness
    h.policy.rails.rejoin_poll_s = 60
    h.cluster.unhealthy.add("gpu-19")  # the node does not come back at first
    handle = await start_repair(h, "gpu-19", Action.power_cycle, "irec")
    await wait_stage(h, "gpu-19", "irec", Stage.joining)
    again = make_alert(
        h.cluster.cluster, "gpu-19", "again", observed_at=await h.env.get_current_time(),
        evidence={"boot_id": "boot-1"},
    )
    await handle.signal("attach_alert", again)
    await eventually(
        lambda: _async(h.cluster.power_cycles == 2), "a second power cycle after the recurrence"
    )
    h.cluster.unhealthy.discard("gpu-19")
    st = await handle.result()
    assert st.stage == Stage.succeeded
    assert any("fault recurred after power_cycle" in t.reason for t in st.history)
    row = await ledger_row(h, "irec")
    assert [a["outcome"] for a in row["attempts"]] == ["failed", "succeeded"]


async def _async(value: bool) -> bool:
    return value


# ---- I7: bounded history during a wait of days ---------------------------------------
async def test_do_not_interrupt_wait_of_days_keeps_history_bounded(harness: Harness) -> None:
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 30
    h.policy.wait_for_idle.poll_max_s = 600
    polls = 437  # 30 s doubling to 600 s: about 3 days of a busy node
    h.cluster.busy_polls["gpu-20"] = polls
    limit = 1000
    handle = await start_repair(h, "gpu-20", Action.reboot, "ilong", carried={"history_limit": limit})
    st = await handle.result()
    assert st.stage == Stage.succeeded
    assert [t.stage for t in st.history].count(Stage.waiting_for_idle) == 1
    assert h.cluster.count("check_idle") == polls + 1
    idle = [t.at for t in st.history if t.stage in (Stage.waiting_for_idle, Stage.draining)]
    assert idle[-1] - idle[0] > timedelta(days=2.9)
    # walk the continue-as-new chain back from the last run
    lengths: list[int] = []
    run_id: str | None = None
    while True:
        hist = await h.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        lengths.append(len(hist.events))
        prev = hist.events[0].workflow_execution_started_event_attributes
        if not prev.continued_execution_run_id:
            break
        run_id = prev.continued_execution_run_id
    assert len(lengths) >= 4, lengths  # ~4,800 events in all, continued as new
    assert max(lengths) <= limit + 40, lengths  # each run stays under its bound
    row = await ledger_row(h, "ilong")
    assert row["stage"] == "succeeded"


async def test_observed_alert_attached_later_does_not_keep_the_evidence_current(
    harness: Harness,
) -> None:
    """Rule zero: a repair acts only on actionable evidence. A node that goes silent during
    the repair raises an observed, level ``node_unreachable``; once the fault that opened
    the repair clears, that observed alert must not keep the repair going."""
    h = harness
    h.policy.consent.mode = "approve"
    fault = make_alert(h.cluster.cluster, "gpu-07", "xfs", kind="xfs_shutdown", code=None,
                       level=True, action="reboot")
    handle = await start_repair(h, "gpu-07", Action.reboot, "r-obs", alerts=[fault])
    await wait_stage(h, "gpu-07", "r-obs", Stage.awaiting_approval)
    silent = make_alert(h.cluster.cluster, "gpu-07", "unreach", kind="node_unreachable",
                        code=None, level=True, actionable=False, action="none",
                        severity="warning")
    await handle.signal(REPAIR_SIGNAL_ATTACH_ALERT, silent)
    await handle.signal(REPAIR_SIGNAL_ATTACH_ALERT,
                        fault.model_copy(update={"alert_id": "clear-xfs", "active": False}))
    st = await handle.result()
    assert st.stage == Stage.auto_resolved, st.history[-1]
    assert any(a.kind == "node_unreachable" for a in st.evidence)  # still shown
    assert h.cluster.count("cordon") == 0 and h.cluster.count("reboot") == 0
    await assert_ended_cleanly(h, "gpu-07", "r-obs", Stage.auto_resolved)


async def test_operator_cited_observed_alert_is_evidence(harness: Harness) -> None:
    """An operator who cites an observed alert (``repairs create --evidence-alert``) makes
    it the repair's evidence: the repair acts on it while it stays active."""
    h = harness
    cited = make_alert(h.cluster.cluster, "gpu-08", "req", kind="repair_request", code=None,
                       actionable=False, action="none", severity="warning")
    handle = await start_repair(h, "gpu-08", Action.reboot, "r-cited", alerts=[cited])
    st = await handle.result()
    assert st.stage == Stage.succeeded, st.history[-1]
    assert h.cluster.count("reboot") == 1


async def _held_by_first(h: Harness, node: str) -> WorkflowHandle[Any, RepairStatus]:
    """Repair ``r-first`` awaiting approval (no lease), with its cordon on ``node`` left
    from before its lease was forgotten: the guard lets a second repair through."""
    h.policy.consent.mode = "approve"
    first = await start_repair(h, node, Action.reboot, "r-first")
    await wait_stage(h, node, "r-first", Stage.awaiting_approval)
    h.cluster.cordons[node] = "r-first"
    h.cluster.repair_cordoned.add(node)
    h.policy.consent.mode = "automatic"
    return first


async def test_cordon_finding_the_node_held_by_a_running_repair_ends_this_one(
    harness: Harness,
) -> None:
    """I2 at the scheduler: whatever the leases say, a repair whose cordon finds the node
    held by another repair that still runs ends without acting and leaves that cordon."""
    h = harness
    first = await _held_by_first(h, "gpu-09")
    st = await (await start_repair(h, "gpu-09", Action.power_cycle, "r-second")).result()
    assert st.stage == Stage.cancelled and "held by repair r-first" in st.history[-1].reason
    assert h.cluster.count("power_cycle") == 0 and h.cluster.count("drain") == 0
    assert h.cluster.cordons["gpu-09"] == "r-first"
    await first.signal("reject", RejectSignal(by="test", reason="not needed"))
    assert (await first.result()).stage == Stage.rejected


async def test_cordon_left_by_an_ended_repair_is_kept_once_a_person_approves(
    harness: Harness,
) -> None:
    """I18: the stale cordon is named to a person, never adopted silently; once they
    approve, the repair goes on beside it and never lifts it."""
    h = harness
    first = await _held_by_first(h, "gpu-11")
    await first.signal("reject", RejectSignal(by="test", reason="not needed"))
    assert (await first.result()).stage == Stage.rejected
    second = await start_repair(h, "gpu-11", Action.power_cycle, "r-second")
    st = await wait_stage(h, "gpu-11", "r-second", Stage.awaiting_approval)
    assert "cordon left by repair r-first" in st.detail
    assert h.cluster.power_cycles == 0
    await second.signal(REPAIR_SIGNAL_APPROVE, ApproveSignal(by="oncall"))
    st = await second.result()
    assert st.stage == Stage.succeeded, st.history[-1]
    assert any("cordon left by repair r-first" in t.reason for t in st.history)
    assert h.cluster.cordons["gpu-11"] == "r-first"  # never lifted by r-second


async def test_idle_check_detail_is_recorded_on_the_repair(harness: Harness) -> None:
    """What the idle check did beyond looking (the Kubernetes out-of-service taint on a
    host the BMC reports off) is in the repair's record, once."""
    h = harness
    h.cluster.busy_polls["gpu-10"] = 2
    h.cluster.idle_detail["gpu-10"] = "tainted out-of-service: the BMC reports the host off"
    handle = await start_repair(h, "gpu-10", Action.reboot, "r-oos")
    st = await handle.result()
    assert st.stage == Stage.succeeded
    notes = [t.reason for t in st.history if t.reason.startswith("idle check:")]
    assert notes == ["idle check: tainted out-of-service: the BMC reports the host off"]


async def test_node_action_cap_holds_for_a_repair_queued_on_the_same_node(
    harness: Harness,
) -> None:
    """Found by the rails property test (programs queueing four repairs on one node with a
    cap of 3). Cap 1: the first repair acts once; a second one on the node, which read the
    attempt history while the first still waited for idle, waits for the lease and must
    then ask a person instead of acting a second time."""
    h = harness
    h.policy.rails.max_actions_per_node = 1
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60  # no back-off
    h.cluster.busy_polls["gpu-17"] = 5
    first = await start_repair(h, "gpu-17", Action.power_cycle, "qcap1")
    await wait_stage(h, "gpu-17", "qcap1", Stage.waiting_for_idle)
    second = await start_repair(h, "gpu-17", Action.power_cycle, "qcap2")

    async def queued() -> bool:
        return "qcap2" in {p.repair_id for p in (await guard_status(h)).pending}

    await eventually(queued, "the second repair queued behind the first on the node")
    assert (await first.result()).stage == Stage.succeeded

    async def decided() -> bool:
        st = await repair_status(h, "gpu-17", "qcap2")
        return st.stage == Stage.awaiting_approval or st.stage.value in TERMINAL

    await eventually(decided, "the second repair asking a person (or ending)")
    st = await repair_status(h, "gpu-17", "qcap2")
    assert h.cluster.power_cycles == 1, f"acted beyond the cap: {st.history[-1]}"
    assert st.stage == Stage.awaiting_approval and "node cap: 1 disruptive actions" in st.detail
    await second.signal("reject", RejectSignal(by="oncall"))
    assert (await second.result()).stage == Stage.rejected
    await assert_ended_cleanly(h, "gpu-17", "qcap2", Stage.rejected)
    assert h.cluster.power_cycles == 1


async def test_approval_given_before_another_repair_acted_is_asked_again(
    harness: Harness,
) -> None:
    """Cap 1, every action needs consent: a person approves the second repair of a node
    while the first still holds the node; the first acts meanwhile, so at grant time the
    approval no longer covers what the node went through — the person is asked again
    (lease handed back), and their second approval over the new history stands. A grant
    arriving after the lease was handed back is not renewed meanwhile."""
    h = harness
    h.policy.rails.max_actions_per_node = 1
    h.policy.consent.mode = "approve"
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls["gpu-18"] = 5
    first = await start_repair(h, "gpu-18", Action.power_cycle, "qap1")
    await wait_stage(h, "gpu-18", "qap1", Stage.awaiting_approval)
    await first.signal("approve", ApproveSignal(by="oncall"))
    await wait_stage(h, "gpu-18", "qap1", Stage.waiting_for_idle)
    second = await start_repair(h, "gpu-18", Action.power_cycle, "qap2")
    await wait_stage(h, "gpu-18", "qap2", Stage.awaiting_approval)
    await second.signal("approve", ApproveSignal(by="oncall"))

    async def queued() -> bool:
        return "qap2" in {p.repair_id for p in (await guard_status(h)).pending}

    await eventually(queued, "the approved second repair queued behind the first")
    assert (await first.result()).stage == Stage.succeeded

    async def asked_again() -> bool:
        st = await repair_status(h, "gpu-18", "qap2")
        return st.stage == Stage.awaiting_approval and "acted on the node meanwhile" in st.detail

    await eventually(asked_again, "the second repair asking the person again")
    st = await repair_status(h, "gpu-18", "qap2")
    assert h.cluster.power_cycles == 1
    assert "node cap: 1 disruptive actions" in st.detail
    assert "qap2" not in {lease.repair_id for lease in (await guard_status(h)).leases}
    # A grant that arrives now (the guard's answer to a re-send that crossed the
    # release) is not renewed from the approval wait: the guard never holds the node
    # for a repair that waits for a person.
    late = LeaseReply(repair_id="qap2", granted=True, reason="already held",
                      expires_at=datetime.now(UTC) + timedelta(days=1))
    await second.signal(REPAIR_SIGNAL_LEASE, late)
    await h.env.sleep(timedelta(seconds=3 * LEASE_RENEW_S))  # renewals would be due
    g = await guard_status(h)
    assert "qap2" not in {x.repair_id for x in g.leases}
    assert "qap2" not in {x.repair_id for x in g.pending}
    assert (await repair_status(h, "gpu-18", "qap2")).stage == Stage.awaiting_approval
    await second.signal("approve", ApproveSignal(by="oncall"))
    done = await second.result()
    assert done.stage == Stage.succeeded, done.history[-1]
    assert h.cluster.power_cycles == 2


# ---- I17 (issue 26 reproduction 3): the control plane's clock judges recurrence ----------
async def test_agent_clock_fast_cannot_make_a_pre_action_report_a_recurrence(
    harness: Harness,
) -> None:
    h = harness
    h.policy.rails.rejoin_poll_s = 60
    h.cluster.unhealthy.add("gpu-16")  # held in joining while the late report arrives
    before = await h.env.get_current_time()
    handle = await start_repair(h, "gpu-16", Action.power_cycle, "iskew")
    await wait_stage(h, "gpu-16", "iskew", Stage.joining)
    # received by ingest before the action, sender clock 4 min fast (ingest accepts
    # up to 300 s ahead); delivered late (an outbox re-delivery)
    late = make_alert(
        h.cluster.cluster, "gpu-16", "late", observed_at=before + timedelta(minutes=4),
        received_at=before,
    )
    await handle.signal("attach_alert", late)
    h.cluster.unhealthy.discard("gpu-16")
    st = await handle.result()
    assert st.stage == Stage.succeeded
    assert h.cluster.power_cycles == 1
    assert not any("recurred" in t.reason for t in st.history)


async def test_cancel_while_joining_stops_before_the_next_rung(harness: Harness) -> None:
    """I19 (issue 26 reproduction 5's family): a cancel sent while the node rejoins after a
    power cycle, then a recurrence that would send the ladder to its next rung. The
    repair ends cancelled with one power cycle; nothing more touches the machine, and the
    node stays cordoned for a person (the action ran, the fault stands)."""
    h = harness
    h.policy.rails.rejoin_poll_s = 60
    h.cluster.unhealthy.add("gpu-20")  # the node does not come back at first
    handle = await start_repair(h, "gpu-20", Action.power_cycle, "icj")
    await wait_stage(h, "gpu-20", "icj", Stage.joining)
    await handle.signal("cancel", CancelSignal(by="oncall", reason="hands off"))
    again = make_alert(
        h.cluster.cluster, "gpu-20", "again", observed_at=await h.env.get_current_time(),
        evidence={"boot_id": "boot-1"},
    )
    await handle.signal("attach_alert", again)
    st = await handle.result()
    assert st.stage == Stage.cancelled, st.history
    assert h.cluster.power_cycles == 1
    assert h.cluster.count("reprovision", "gpu-20") == 0
    assert h.cluster.cordons.get("gpu-20") == "icj"
