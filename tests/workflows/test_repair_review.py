"""Defects a fresh review found by driving RepairWorkflow through this harness (session
2026-12-04), each a test that failed before its fix:

- an approval given with ``action`` that the ladder or the migrate gate turned into
  another action ran that action unasked (an approval covers one action at one rung);
- a cancel that arrived after the last check before the machine action (while the
  pre-action health read retried) was followed by the power cycle (I19);
- a touched machine whose later step failed for good (a 403 on the health read or the
  uncordon) left no attempt in the ledger (I22);
- a cancel while the repair waited for the node to come back was dropped, and the repair
  put the node back in service (I19);
- after a breaker reset, a sender clock minutes fast made pre-reset evidence current
  (I17, I23: judged on the control plane's receive time);
- a workflow cancelled from the Temporal UI during a power cycle's back-off after
  ForceOff left the host off and recorded no attempt (I19, I22);
- a cancel while the idle check retried (the scheduler down) waited for the scheduler
  to come back (I19);
- a holder that lost its lease and re-acquired it after a breaker reset drained and
  acted on evidence received before the reset (I23).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import (
    attempt_outcomes,
    closed,
    eventually,
    guard_status,
    repair_status,
    result_skipping,
    start_repair,
    wait_stage,
)
from workflows.activity_api import ERR_AUTH, AttemptRecord
from workflows.models import Action, ApproveSignal, CancelSignal, RejectSignal, Stage
from workflows.protocol import GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal, workflow_id_guard


async def _asked_again(h: Harness, node: str, rid: str, action: Action) -> None:
    async def asked() -> bool:
        st = await repair_status(h, node, rid)
        asks = [x for x in st.history if x.stage == Stage.awaiting_approval]
        return (st.stage == Stage.awaiting_approval and st.action == action and len(asks) == 2
                and f"decides {action.value}" in asks[-1].reason)

    await eventually(asked, f"{rid} asks again for {action.value}")


async def test_approval_of_a_lighter_action_the_ladder_moves_up_asks_again(
        harness: Harness) -> None:
    """The person approves ``reboot`` for a node the ladder already rebooted twice for
    this fault: the decision is reprovision, which nobody approved, so they are asked
    again; their reject ends it with nothing run."""
    h = harness
    h.policy.consent.mode = "approve"
    now = await h.env.get_current_time()
    for i in range(2):
        await h.ledger.record_attempt(AttemptRecord(
            repair_id=f"old-{i}", cluster=h.cluster.cluster, node="gpu-09",
            machine_id="m-gpu-09", action=Action.reboot, alert_kind="xid", code=79,
            outcome="succeeded", at=now - timedelta(hours=1 + i)))
    handle = await start_repair(h, "gpu-09", Action.power_cycle, "ov1")
    await wait_stage(h, "gpu-09", "ov1", Stage.awaiting_approval)
    await handle.signal("approve", ApproveSignal(by="alice", action=Action.reboot))
    await _asked_again(h, "gpu-09", "ov1", Action.reprovision)
    st = await repair_status(h, "gpu-09", "ov1")
    assert "alice approved reboot" in st.detail and "reprovision" in st.detail, st.detail
    await handle.signal("reject", RejectSignal(by="alice", reason="not a reprovision"))
    done = await handle.result()
    assert done.stage == Stage.rejected
    assert h.cluster.count("reprovision") == h.cluster.count("reboot") == 0
    assert "gpu-09" not in h.cluster.cordons


async def test_approval_of_migrate_the_gate_turns_into_reprovision_asks_again(
        harness: Harness) -> None:
    """``approve --action migrate`` without critical evidence: the gate makes it a
    reprovision, which is asked for again; approving that runs it."""
    h = harness
    h.policy.consent.mode = "approve"
    now = await h.env.get_current_time()
    a = make_alert(h.cluster.cluster, "gpu-13", "g", severity="warning",
                   observed_at=now - timedelta(minutes=1))
    handle = await start_repair(h, "gpu-13", Action.power_cycle, "ag1", alerts=[a])
    await wait_stage(h, "gpu-13", "ag1", Stage.awaiting_approval)
    await handle.signal("approve", ApproveSignal(by="alice", action=Action.migrate))
    await _asked_again(h, "gpu-13", "ag1", Action.reprovision)
    assert h.cluster.count("reprovision") == h.cluster.count("migrate") == 0
    await handle.signal("approve", ApproveSignal(by="alice"))
    done = await handle.result()
    assert done.stage == Stage.succeeded, done.history[-1]
    assert (h.cluster.count("reprovision"), h.cluster.count("migrate")) == (1, 0)
    assert done.approved_by == "alice"


async def test_cancel_while_the_pre_action_health_read_retries_touches_nothing(
        harness: Harness) -> None:
    h = harness
    h.cluster.transient["node_health"] = 10_000
    handle = await start_repair(h, "gpu-05", Action.power_cycle, "pc1")

    async def reading() -> bool:
        return h.cluster.count("node_health", "gpu-05") >= 2

    await eventually(reading, "pre-action node_health retrying")
    await handle.signal("cancel", CancelSignal(by="oncall", reason="hands off"))
    h.cluster.transient["node_health"] = 0
    st = await handle.result()
    assert st.stage == Stage.cancelled, st.history[-1]
    assert h.cluster.resets == [], "power cycle sent after a cancel that came before it"
    assert "gpu-05" not in h.cluster.cordons
    assert await attempt_outcomes(h, "pc1") == []


@pytest.mark.parametrize("call", ["rejoin", "node_health"])
async def test_a_later_step_failing_for_good_keeps_the_attempt(harness: Harness,
                                                               call: str) -> None:
    h = harness
    node = "gpu-07" if call == "rejoin" else "gpu-08"

    async def break_after(n: str) -> None:
        h.cluster.broken[call] = ERR_AUTH

    h.cluster.while_out["power_cycle"] = break_after
    st = await (await start_repair(h, node, Action.power_cycle, f"a-{call}")).result()
    assert st.stage == Stage.failed
    assert h.cluster.power_cycles == 1
    # node_health: touched and not verified, the attempt failed; rejoin: verified
    # healthy before the uncordon failed, the attempt succeeded (break4)
    outcome = "succeeded" if call == "rejoin" else "failed"
    assert await attempt_outcomes(h, f"a-{call}") == [("power_cycle", outcome)]
    assert node in h.cluster.cordons  # left for a person (not verified / uncordon refused)


async def test_cancel_while_waiting_for_the_node_to_come_back_ends_at_once(
        harness: Harness) -> None:
    h = harness
    h.policy.rails.rejoin_poll_s = 60
    h.cluster.unhealthy.add("gpu-11")
    handle = await start_repair(h, "gpu-11", Action.power_cycle, "cj1")
    await wait_stage(h, "gpu-11", "cj1", Stage.joining)
    await handle.signal("cancel", CancelSignal(by="oncall", reason="hands off"))
    done = await handle.result()
    assert done.stage == Stage.cancelled, done.history[-1]
    assert done.history[-1].by == "oncall"
    # the power cycle ran and the node was never verified: it stays cordoned, and the
    # attempt counts (I22)
    assert "gpu-11" in h.cluster.cordons
    assert await attempt_outcomes(h, "cj1") == [("power_cycle", "failed")]
    h.cluster.unhealthy.discard("gpu-11")


@pytest.mark.parametrize("skew", [0, 240])
async def test_breaker_reset_judges_evidence_on_receive_time(harness: Harness,
                                                             skew: int) -> None:
    """Two repairs queued by the breaker with an Xid received before the reset, their
    sender's clock ``skew`` seconds fast (ingest accepts up to 300 s): both auto-resolve
    after the reset, whatever the sender's clock says."""
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls["gpu-01"] = 3
    await start_repair(h, "gpu-01", Action.power_cycle, "k1")
    await wait_stage(h, "gpu-01", "k1", Stage.waiting_for_idle)
    now = await h.env.get_current_time()
    for i in (2, 3):
        node = f"gpu-0{i}"
        skewed = make_alert(h.cluster.cluster, node, f"k{i}",
                            observed_at=now + timedelta(seconds=skew), received_at=now)
        await start_repair(h, node, Action.power_cycle, f"k{i}", alerts=[skewed])

        async def pending(n: int = i - 1) -> bool:
            return len((await guard_status(h)).pending) == n

        await eventually(pending, f"k{i} queued")

    async def tripped() -> bool:
        return (await guard_status(h)).breaker_open

    await eventually(tripped, "breaker trip")
    guard = h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster))
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))

    async def reset() -> bool:
        return not (await guard_status(h)).breaker_open

    await eventually(reset, "breaker reset")
    assert (await result_skipping(h, "gpu-01", "k1")).stage == Stage.succeeded
    for i in (2, 3):
        st = await result_skipping(h, f"gpu-0{i}", f"k{i}")
        assert st.stage == Stage.auto_resolved, (i, st.stage, st.detail)
        assert h.cluster.count("power_cycle", f"gpu-0{i}") == 0


async def test_workflow_cancel_during_a_power_cycle_back_off_powers_the_host_on(
        harness: Harness) -> None:
    """A cancel from the Temporal UI / CLI during the back-off after ForceOff is the
    cancel signal's: On is sent (a safe power state), the attempt counts as cancelled,
    and the workflow closes cancelled."""
    h = harness
    h.policy.rails.action_retry_max_s = 3600
    h.cluster.bmc_read_failures_after_off["gpu-12"] = 2
    handle = await start_repair(h, "gpu-12", Action.power_cycle, "wfc")

    async def backing_off() -> bool:
        return "transient failure" in (await repair_status(h, "gpu-12", "wfc")).detail

    await eventually(backing_off, "power cycle backing off after ForceOff")
    await handle.cancel()
    await closed(handle, "repair closed")
    row = await h.ledger.get_repair("wfc")
    assert row is not None and row["stage"] == "cancelled"
    assert [r for n, r in h.cluster.resets if n == "gpu-12"] == ["FORCE_OFF", "ON"], \
        "host left powered off"
    assert await attempt_outcomes(h, "wfc") == [("power_cycle", "cancelled")]
    assert "gpu-12" in h.cluster.cordons  # touched: a person looks


async def test_cancel_while_the_idle_check_retries_ends_at_once(harness: Harness) -> None:
    """The scheduler is down, so the idle check retries; a cancel does not wait for it
    to come back: the read is cancelled, the repair ends cancelled and the cleanup
    uncordons (the cordon is the only thing it did)."""
    h = harness
    h.cluster.transient["check_idle"] = 10_000
    handle = await start_repair(h, "gpu-14", Action.power_cycle, "ci1")

    async def retrying() -> bool:
        return h.cluster.count("check_idle", "gpu-14") >= 2

    await eventually(retrying, "idle check retrying")
    await handle.signal("cancel", CancelSignal(by="oncall", reason="hands off"))
    done = await handle.result()
    assert done.stage == Stage.cancelled and done.history[-1].by == "oncall"
    assert h.cluster.count("check_idle", "gpu-14") < 50  # not after hours of retries
    assert "gpu-14" not in h.cluster.cordons
    assert h.cluster.resets == []


async def test_a_lease_re_acquired_after_a_breaker_reset_counts_only_later_evidence(
        harness: Harness) -> None:
    """A holder whose lease was lost (the guard forgot it) re-acquires before it drains;
    the breaker tripped and was reset while it was queued, so the grant says so, and its
    Xid — received before the reset — no longer counts (I23): it ends auto_resolved
    without draining, like a repair whose first grant came after the reset."""
    from workflows.protocol import GUARD_SIGNAL_RELEASE, LeaseRelease

    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    h.cluster.busy_polls["gpu-01"] = 40
    h.cluster.busy_polls["gpu-02"] = 90  # holds the budget past the reset
    now = await h.env.get_current_time()
    xid = make_alert(h.cluster.cluster, "gpu-01", "l1", observed_at=now, received_at=now)
    await start_repair(h, "gpu-01", Action.power_cycle, "l1", alerts=[xid])
    await wait_stage(h, "gpu-01", "l1", Stage.waiting_for_idle)
    guard = h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster))
    await guard.signal(GUARD_SIGNAL_RELEASE, LeaseRelease(repair_id="l1", outcome="forgotten"))
    # l2 first, holding the budget before l3 asks: were l3 granted first (the two
    # repairs' first tasks race), it would finish at once and free the budget, and l1's
    # renewal (not held by the breaker) would be granted: nothing to re-acquire
    await start_repair(h, "gpu-02", Action.power_cycle, "l2")
    await wait_stage(h, "gpu-02", "l2", Stage.waiting_for_idle)
    await start_repair(h, "gpu-03", Action.power_cycle, "l3")

    async def tripped() -> bool:
        return (await guard_status(h)).breaker_open

    await eventually(tripped, "breaker trip")

    async def l1_queued() -> bool:
        return "lease not held before drain" in " ".join(
            t.reason for t in (await repair_status(h, "gpu-01", "l1")).history)

    await h.env.sleep(timedelta(minutes=45))  # l1 renews (refused), goes idle, re-queues
    async def l1_history() -> object:
        st = await repair_status(h, "gpu-01", "l1")
        return [(t.stage, t.reason) for t in st.history], st.detail, await guard_status(h)

    await eventually(l1_queued, "l1 re-acquiring before its drain", explain=l1_history)
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))
    st = await result_skipping(h, "gpu-01", "l1")
    assert st.stage == Stage.auto_resolved, (st.stage, st.history[-1])
    assert h.cluster.count("drain", "gpu-01") == 0
    assert h.cluster.count("power_cycle", "gpu-01") == 0
    assert "gpu-01" not in h.cluster.cordons


async def test_an_approve_signal_naming_action_none_approves_the_proposed_action(
        harness: Harness) -> None:
    """A signal sent by hand (``temporal workflow signal``) with ``action: none``: no
    action to run, so it is taken as no override. Before, the repair cordoned, drained
    and then hung at ``repairing none`` (a KeyError every workflow task) with the node
    drained for nothing. The API refuses the value (422)."""
    h = harness
    h.policy.consent.mode = "approve"
    handle = await start_repair(h, "gpu-07", Action.reboot, "none1")
    await wait_stage(h, "gpu-07", "none1", Stage.awaiting_approval)
    await handle.signal("approve", ApproveSignal(by="alice", action=Action.none))
    done = await handle.result()
    assert done.stage == Stage.succeeded and done.action == Action.reboot, done
    assert h.cluster.count("reboot", "gpu-07") == 1
