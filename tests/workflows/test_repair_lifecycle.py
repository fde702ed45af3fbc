"""The repair lifecycle's decisions that issue 26 names (reproductions 4, 5 and 6, I18,
I19, "an approval covers one action at one rung"), driven through the real workflows on
the time-skipping server with the project's harness and the real ledger.

A call's ``while_out`` hook (tests/workflows/conftest.py ``FakeCluster``) sends a signal
while that activity is out, so the workflow learns of it together with the outcome.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import (
    eventually,
    guard_status,
    repair_status,
    start_repair,
    wait_stage,
)
from workflows.activity_api import AttemptRecord
from workflows.models import Action, ApproveSignal, CancelSignal, RejectSignal, Stage


def _cordoned_by(h: Harness, node: str) -> str | None:
    return h.cluster.cordons.get(node)


# ---- reproduction 5: a cancel / reject while the action fails for good -------------------
async def test_cancel_while_power_cycle_fails_for_good_takes_no_next_action(
    harness: Harness,
) -> None:
    """ForceOff went out, then the activity fails for good while a cancel arrives: the
    host is powered on again (safe state), no second power cycle, no reprovision; the
    repair ends ``cancelled`` with a note, left cordoned for a person (it touched)."""
    h = harness
    h.cluster.fail_actions["power_cycle"] = 1
    handle = await start_repair(h, "gpu-01", Action.power_cycle, "c5")

    async def cancel(node: str) -> None:
        if h.cluster.count("power_cycle", node) == 1:
            await handle.signal("cancel", CancelSignal(by="oncall", reason="hands off"))

    h.cluster.while_out["power_cycle"] = cancel
    st = await handle.result()
    assert st.stage == Stage.cancelled, st.history[-1]
    # the failure reported ForceOff sent (the fake raises after it without logging it):
    # the one call after it only powers the host on; nothing acts again
    assert [r for n, r in h.cluster.resets if n == "gpu-01"] == ["ON"]
    assert h.cluster.count("power_cycle", "gpu-01") == 2
    assert h.cluster.count("reprovision") == 0 and h.cluster.count("reboot") == 0
    assert "hands off" in st.history[-1].reason
    assert any("safe power state" in t.reason for t in st.history)
    assert _cordoned_by(h, "gpu-01") == "c5"  # touched: a person looks at it


async def test_reject_while_power_cycle_fails_for_good_takes_no_next_action(
    harness: Harness,
) -> None:
    h = harness
    h.cluster.fail_actions["power_cycle"] = 1
    handle = await start_repair(h, "gpu-02", Action.power_cycle, "r5")

    async def reject(node: str) -> None:
        if h.cluster.count("power_cycle", node) == 1:
            await handle.signal("reject", RejectSignal(by="oncall", reason="not now"))

    h.cluster.while_out["power_cycle"] = reject
    st = await handle.result()
    assert st.stage == Stage.rejected, st.history[-1]
    assert h.cluster.count("power_cycle", "gpu-02") == 2  # the act, then On only
    assert h.cluster.count("reprovision") == 0
    assert [r for n, r in h.cluster.resets if n == "gpu-02"] == ["ON"]
    assert _cordoned_by(h, "gpu-02") == "r5"


# ---- an approval covers one action at one rung ------------------------------------------
async def test_approval_of_the_first_rung_does_not_cover_the_second(harness: Harness) -> None:
    """Consent ``approve``: a person approves the power cycle; the fault recurs after it and
    the ladder picks the next rung (another attempt). The approval covered one action at one
    rung, so the person is asked again before anything more touches the machine; a cancel
    then ends it with one power cycle."""
    h = harness
    h.policy.consent.mode = "approve"
    h.policy.rails.rejoin_poll_s = 60
    h.cluster.unhealthy.add("gpu-03")
    handle = await start_repair(h, "gpu-03", Action.power_cycle, "a1")
    await wait_stage(h, "gpu-03", "a1", Stage.awaiting_approval)
    await handle.signal("approve", ApproveSignal(by="alice"))
    await wait_stage(h, "gpu-03", "a1", Stage.joining)
    again = make_alert(h.cluster.cluster, "gpu-03", "again",
                       observed_at=await h.env.get_current_time(),
                       evidence={"boot_id": "boot-1"})
    await handle.signal("attach_alert", again)

    async def asked() -> bool:
        st = await repair_status(h, "gpu-03", "a1")
        return st.stage == Stage.awaiting_approval and st.history[-1].stage == (
            Stage.awaiting_approval) and "recurred" in st.history[-1].reason

    await eventually(asked, "the person asked again for the next rung")
    st = await repair_status(h, "gpu-03", "a1")
    assert h.cluster.power_cycles == 1
    assert "after fault recurred after power_cycle" in (st.decided_by_rule or "")
    await handle.signal("cancel", CancelSignal(by="alice", reason="enough"))
    done = await handle.result()
    assert done.stage == Stage.cancelled
    assert h.cluster.power_cycles == 1
    assert h.cluster.count("reprovision") == 0


async def test_approval_before_another_repair_acted_is_asked_again_for_the_same_action(
    harness: Harness,
) -> None:
    """Consent ``approve``, no cap in the way: the second repair of a node is approved while
    the first still holds it; the first power-cycles meanwhile. At grant time the ladder
    counts that attempt: same action, next rung. The approval covered the earlier rung, so
    the person is asked again; their second approval stands and names both steps."""
    h = harness
    h.policy.consent.mode = "approve"
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls["gpu-04"] = 5
    first = await start_repair(h, "gpu-04", Action.power_cycle, "b1")
    await wait_stage(h, "gpu-04", "b1", Stage.awaiting_approval)
    await first.signal("approve", ApproveSignal(by="oncall"))
    await wait_stage(h, "gpu-04", "b1", Stage.waiting_for_idle)
    second = await start_repair(h, "gpu-04", Action.power_cycle, "b2")
    await wait_stage(h, "gpu-04", "b2", Stage.awaiting_approval)
    await second.signal("approve", ApproveSignal(by="oncall"))

    async def queued() -> bool:
        return "b2" in {p.repair_id for p in (await guard_status(h)).pending}

    await eventually(queued, "the approved second repair queued behind the first")
    assert (await first.result()).stage == Stage.succeeded

    async def asked_again() -> bool:
        st = await repair_status(h, "gpu-04", "b2")
        return st.stage == Stage.awaiting_approval and "acted on the node meanwhile" in st.detail

    await eventually(asked_again, "the second repair asking the person again")
    assert h.cluster.power_cycles == 1
    await second.signal("approve", ApproveSignal(by="bob"))
    done = await second.result()
    assert done.stage == Stage.succeeded, done.history[-1]
    assert h.cluster.power_cycles == 2
    assert done.approved_by == "bob"
    assert "approved by bob" in (done.decided_by_rule or "")


# ---- reproduction 6: a cancel as the wait for idle continues as new -----------------------
async def test_cancel_as_the_idle_wait_continues_as_new_is_not_lost(harness: Harness) -> None:
    """The cancel arrives while the idle check that fills the run's history is out: the run
    must not continue as new without it (nor the next run drain or reboot)."""
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 30
    h.policy.wait_for_idle.poll_max_s = 30
    h.cluster.busy_polls["gpu-05"] = 10_000
    limit = 100
    handle = await start_repair(h, "gpu-05", Action.reboot, "c6",
                                carried={"history_limit": limit})
    sent: list[int] = []

    async def cancel_near_the_limit(node: str) -> None:
        if sent:
            return
        desc = await handle.describe()
        length = desc.raw_description.workflow_execution_info.history_length
        if length + 12 >= limit:
            sent.append(length)
            await handle.signal("cancel", CancelSignal(by="oncall", reason="keep it"))

    h.cluster.while_out["check_idle"] = cancel_near_the_limit
    st = await handle.result()
    assert sent, "the cancel was never sent"
    assert st.stage == Stage.cancelled, st.history[-1]
    assert "keep it" in st.history[-1].reason
    assert h.cluster.count("drain", "gpu-05") == 0
    assert h.cluster.count("reboot", "gpu-05") == 0
    assert _cordoned_by(h, "gpu-05") is None


# ---- reproduction 4 / I18: a removed machine stays out ----------------------------------
async def test_repair_of_a_machine_held_for_rma_never_cordons(harness: Harness) -> None:
    h = harness
    await h.ledger.record_attempt(AttemptRecord(
        repair_id="r-rma", cluster=h.cluster.cluster, node="gpu-06", machine_id="m-gpu-06",
        action=Action.remove, alert_kind="xid", code=79, outcome="succeeded",
        at=datetime.now(UTC) - timedelta(hours=1)))
    st = await (await start_repair(h, "gpu-06", Action.power_cycle, "h1")).result()
    assert st.stage == Stage.cancelled, st.history[-1]
    last = st.history[-1]
    assert last.by == "system"
    assert "m-gpu-06" in last.reason and "held for RMA" in last.reason
    assert "r-rma" in last.reason
    assert h.cluster.count("cordon", "gpu-06") == 0
    assert h.cluster.count("drain", "gpu-06") == 0
    assert h.cluster.count("power_cycle", "gpu-06") == 0
    # once an operator returns the machine, a repair acts again
    assert await h.ledger.return_machine(h.cluster.cluster, "m-gpu-06", "alice", "fixed")
    st = await (await start_repair(h, "gpu-06", Action.power_cycle, "h2")).result()
    assert st.stage == Stage.succeeded, st.history[-1]


async def test_cordon_left_by_an_ended_repair_asks_a_person(harness: Harness) -> None:
    """A cordon left by a repair that has ended is never adopted silently: the new repair
    waits for a person, naming the stale cordon; an approval goes on (the old cordon is
    never lifted by this repair)."""
    h = harness
    h.cluster.cordons["gpu-07"] = "r-old"
    h.cluster.repair_cordoned.add("gpu-07")
    handle = await start_repair(h, "gpu-07", Action.power_cycle, "s1")

    async def asked() -> bool:
        st = await repair_status(h, "gpu-07", "s1")
        return st.stage == Stage.awaiting_approval

    await eventually(asked, "the repair asking a person about the stale cordon")
    st = await repair_status(h, "gpu-07", "s1")
    assert "cordon left by repair r-old" in st.detail
    assert h.cluster.count("drain", "gpu-07") == 0
    assert h.cluster.power_cycles == 0
    await handle.signal("approve", ApproveSignal(by="alice"))
    done = await handle.result()
    assert done.stage == Stage.succeeded, done.history[-1]
    assert h.cluster.power_cycles == 1
    assert h.cluster.cordons["gpu-07"] == "r-old"  # never lifted by s1
