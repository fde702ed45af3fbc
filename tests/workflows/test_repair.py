"""Time-skipping tests of RepairWorkflow stages, consent, timers and the ladder."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowHandle

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import start_repair
from workflows.models import (
    Action,
    ApproveSignal,
    CancelSignal,
    RejectSignal,
    RepairStatus,
    Requester,
    RequesterKind,
    Stage,
)


async def wait_stage(
    handle: WorkflowHandle[Any, RepairStatus], stage: Stage, tries: int = 200
) -> RepairStatus:
    for _ in range(tries):
        st = await handle.query("status", result_type=RepairStatus)
        if st.stage == stage:
            return st
        await asyncio.sleep(0.05)
    raise AssertionError(f"stage {stage} not reached; at {st.stage}: {st.detail}")


def stages(st: RepairStatus) -> list[Stage]:
    out: list[Stage] = []
    for t in st.history:
        if not out or out[-1] != t.stage:
            out.append(t.stage)
    return out


async def test_automatic_power_cycle_runs_every_stage(harness: Harness) -> None:
    h = harness
    handle = await start_repair(h, "gpu-01", Action.power_cycle, "r1")
    st = await handle.result()
    assert st.stage == Stage.succeeded, st.detail
    assert stages(st) == [
        Stage.recommended,
        Stage.cordoning,
        Stage.waiting_for_idle,
        Stage.draining,
        Stage.repairing,
        Stage.joining,
        Stage.running,
        Stage.succeeded,
    ]
    assert st.approved_by == "auto-approved" and st.decided_by_rule
    assert h.cluster.power_cycles == 1
    assert "gpu-01" not in h.cluster.cordons  # uncordoned: the cordon was ours
    row = await h.ledger.get_repair("r1")
    assert row is not None and row["stage"] == "succeeded"
    assert [t["stage"] for t in row["transitions"]][-1] == "succeeded"
    assert row["attempts"][0]["outcome"] == "succeeded"
    desc = await handle.describe()
    sa = desc.typed_search_attributes
    from workflows.protocol import SA_ACTION, SA_NODE, SA_STAGE, SA_STATE

    assert sa.get(SA_STATE) == "succeeded" and sa.get(SA_STAGE) == "succeeded"
    assert sa.get(SA_NODE) == "gpu-01" and sa.get(SA_ACTION) == "power_cycle"


async def test_attempt_and_transition_writes_carry_the_runs_write_keys(
    harness: Harness,
) -> None:
    """Every attempt and transition a repair writes from its local activities carries
    ``"<run id>/<n>"``, n counting the run's writes in order (replay counts them the
    same, so a task re-run after a worker crash replaces its rows: migration 0013)."""
    h = harness
    handle = await start_repair(h, "gpu-02", Action.power_cycle, "wk1")
    st = await handle.result()
    assert st.stage == Stage.succeeded, st.detail
    run_id = (await handle.describe()).run_id
    async with h.ledger.pool.acquire() as conn:
        trans = await conn.fetch("SELECT write_key, at FROM repair_transitions"
                                 " WHERE repair_id = 'wk1'")
        atts = await conn.fetch("SELECT write_key, action, outcome FROM repair_attempts"
                                " WHERE repair_id = 'wk1'")
    keys = [r["write_key"] for r in trans] + [r["write_key"] for r in atts]
    assert all(k is not None and k.startswith(f"{run_id}/") for k in keys), keys
    numbers = sorted(int(k.rsplit("/", 1)[1]) for k in keys)
    assert len(set(numbers)) == len(numbers) and numbers[0] >= 1
    assert [(r["action"], r["outcome"]) for r in atts] == [("power_cycle", "succeeded")]


async def test_approve_before_repair_waits_for_signal(harness: Harness) -> None:
    h = harness
    h.policy.consent.mode = "approve"
    handle = await start_repair(h, "gpu-02", Action.reboot, "r2")
    st = await wait_stage(handle, Stage.awaiting_approval)
    assert h.cluster.count("cordon") == 0
    await h.env.sleep(timedelta(hours=5))  # well inside the approval deadline (3 days)
    assert (await handle.query("status", result_type=RepairStatus)).stage == Stage.awaiting_approval
    await handle.signal("approve", ApproveSignal(by="alice"))
    st = await handle.result()
    assert st.stage == Stage.succeeded and st.approved_by == "alice"
    assert st.decided_by_rule and "approved by alice" in st.decided_by_rule
    assert h.cluster.count("reboot") == 1


async def test_unapproved_recommendation_times_out(harness: Harness) -> None:
    h = harness
    h.policy.consent.mode = "approve"
    h.policy.consent.approval_timeout_s = 3600
    handle = await start_repair(h, "gpu-12", Action.reboot, "r12")
    await wait_stage(handle, Stage.awaiting_approval)
    await h.env.sleep(timedelta(hours=2))
    st = await handle.result()
    assert st.stage == Stage.timed_out and "no approval within 3600" in st.history[-1].reason
    assert h.cluster.count("cordon") == 0


async def test_approve_may_override_action_through_the_gate(harness: Harness) -> None:
    h = harness
    h.policy.consent.mode = "approve"
    warn = make_alert(h.cluster.cluster, "gpu-03", "w", severity="warning", level=True)
    handle = await start_repair(h, "gpu-03", Action.reboot, "r3", alerts=[warn])
    await wait_stage(handle, Stage.awaiting_approval)
    await handle.signal("approve", ApproveSignal(by="bob", action=Action.migrate))
    # migrate without critical evidence runs as a quick reprovision (evidence gate); bob
    # approved migrate, not that, so he is asked again for the reprovision
    for _ in range(300):
        st = await handle.query("status", result_type=RepairStatus)
        asks = [x for x in st.history if x.stage == Stage.awaiting_approval]
        if len(asks) == 2:
            break
        await asyncio.sleep(0.05)
    assert st.action == Action.reprovision and st.stage == Stage.awaiting_approval
    assert "bob approved migrate" in asks[-1].reason and "gate:no critical" in asks[-1].reason
    assert h.cluster.count("reprovision") == 0
    await handle.signal("approve", ApproveSignal(by="bob"))
    st = await handle.result()
    assert st.action == Action.reprovision and st.stage == Stage.succeeded
    assert h.cluster.count("migrate") == 0 and h.cluster.count("reprovision") == 1


async def test_reject_and_cancel_record_who_and_why(harness: Harness) -> None:
    h = harness
    h.policy.consent.mode = "approve"
    a = await start_repair(h, "gpu-04", Action.reboot, "r4")
    b = await start_repair(h, "gpu-05", Action.reboot, "r5")
    await wait_stage(a, Stage.awaiting_approval)
    await wait_stage(b, Stage.awaiting_approval)
    await a.signal("reject", RejectSignal(by="carol", reason="job deadline"))
    await b.signal("cancel", CancelSignal(by="dave", reason="hardware swap planned"))
    sa, sb = await a.result(), await b.result()
    assert sa.stage == Stage.rejected and sa.history[-1].by == "carol"
    assert sa.history[-1].reason == "job deadline"
    assert sb.stage == Stage.cancelled and sb.history[-1].by == "dave"
    assert h.cluster.count("cordon") == 0
    row = await h.ledger.get_repair("r4")
    assert row is not None and row["transitions"][-1]["by_whom"] == "carol"


async def test_remove_always_needs_a_human(harness: Harness) -> None:
    h = harness  # consent mode automatic
    handle = await start_repair(h, "gpu-06", Action.remove, "r6")
    st = await wait_stage(handle, Stage.awaiting_approval)
    assert "remove_is_human" in st.detail
    await handle.signal("approve", ApproveSignal(by="erin"))
    st = await handle.result()
    assert st.stage == Stage.succeeded and h.cluster.count("remove") == 1
    assert any("re-validation of m-gpu-06" in t.reason for t in st.history)


async def test_wait_for_idle_bound_expires_and_is_recorded(harness: Harness) -> None:
    h = harness
    h.policy.wait_for_idle.max_wait_s = 600
    h.policy.wait_for_idle.poll_s = 60
    h.cluster.busy_polls["gpu-07"] = 10_000
    st = await (await start_repair(h, "gpu-07", Action.reboot, "r7")).result()
    assert st.stage == Stage.succeeded
    note = [t for t in st.history if "wait-for-idle expired" in t.reason]
    assert note and note[0].stage == Stage.waiting_for_idle
    # checks back off from poll_s: t = 0, 60, 180, 420 s, then the 600 s bound
    assert h.cluster.count("check_idle") == 5


async def test_do_not_interrupt_waits_until_idle(harness: Harness) -> None:
    h = harness
    h.policy.wait_for_idle.max_wait_s = 60
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 600
    h.cluster.busy_polls["gpu-08"] = 20  # 20 × 600 s ≫ 60 s max wait
    st = await (await start_repair(h, "gpu-08", Action.reboot, "r8")).result()
    assert st.stage == Stage.succeeded
    assert not any("expired" in t.reason for t in st.history)
    assert h.cluster.count("check_idle") == 21


async def test_cancel_while_waiting_for_idle_uncordons(harness: Harness) -> None:
    h = harness
    h.cluster.busy_polls["gpu-09"] = 10_000
    h.policy.wait_for_idle.do_not_interrupt = True
    handle = await start_repair(h, "gpu-09", Action.reboot, "r9")
    await wait_stage(handle, Stage.waiting_for_idle)
    # what it waits for, in the status and the Temporal UI's current details
    for _ in range(200):
        st = await handle.query("status", result_type=RepairStatus)
        # the stage's own note ("do not interrupt") comes first, then what it waits for
        if st.detail.startswith("waiting_for_idle: waiting for"):
            break
        await asyncio.sleep(0.05)
    assert st.detail.startswith("waiting_for_idle: waiting for gpu-09 to go idle ("), st.detail
    assert st.detail.endswith("still running) (no deadline)"), st.detail  # do not interrupt
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert meta.current_details == st.detail
    await handle.signal("cancel", CancelSignal(by="frank", reason="not now"))
    st = await handle.result()
    assert st.stage == Stage.cancelled and h.cluster.count("reboot") == 0
    assert h.cluster.count("drain") == 0


async def test_evidence_cleared_before_acting_auto_resolves(harness: Harness) -> None:
    h = harness
    h.cluster.busy_polls["gpu-10"] = 3
    h.policy.wait_for_idle.poll_s = 60
    lvl = make_alert(
        h.cluster.cluster,
        "gpu-10",
        "lvl",
        kind="ib_link_down",
        code=None,
        level=True,
        action="reboot",
    )
    handle = await start_repair(h, "gpu-10", Action.reboot, "r10", alerts=[lvl])
    await wait_stage(handle, Stage.waiting_for_idle)
    await handle.signal("attach_alert", lvl.model_copy(update={"alert_id": "clr", "active": False}))
    st = await handle.result()
    assert st.stage == Stage.auto_resolved and h.cluster.count("reboot") == 0
    assert "gpu-10" not in h.cluster.cordons


async def test_user_requested_repair_is_approved_by_its_creator(harness: Harness) -> None:
    h = harness
    h.policy.consent.mode = "approve"
    handle = await start_repair(
        h,
        "gpu-11",
        Action.reboot,
        "r11",
        alerts=[],
        requester=Requester(kind=RequesterKind.user, name="grace"),
        reason="manual",
    )
    st = await handle.result()
    assert st.stage == Stage.succeeded and st.approved_by == "grace"
    assert st.decided_by_rule and st.decided_by_rule.startswith("requested_by_user")
