"""Repair rails a break-test of 499221f found open (each failed there): approving the
fallback of a GPU reset that cannot run re-ran the reset and asked again for ever; a
cancel while a retry waited for its lease left a commanded run unmade (fidelity); a
signal sent with no payload wedged the repair; a refused payload was quoted in full."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from temporalio.client import WorkflowFailureError

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import (
    attempt_outcomes,
    guard_status,
    repair_status,
    start_repair,
    wait_stage,
)
from tests.workflows.test_repair_break3 import reset_cannot_run  # noqa: F401 (fixture)
from tests.workflows.test_repair_lease_retry import USER, lease_lost_during_backoff
from workflows.models import Action, ApproveSignal, CancelSignal, Stage


@pytest.mark.usefixtures("reset_cannot_run")
@pytest.mark.parametrize("named", [None, Action.reboot], ids=["shown", "explicit"])
async def test_approving_the_fallback_of_a_reset_that_cannot_run_runs_the_fallback(
    harness: Harness, named: Action | None,
) -> None:
    """reset_gpu cannot run (NotRun, nothing touched) → the policy moves to reboot and asks
    (consent mode approve). A person approves what is shown (reboot): reboot runs, and
    reset_gpu — which the node said cannot run — is not tried again under that approval."""
    h = harness
    node = "gpu-21"
    h.policy.consent.mode = "approve"
    h.policy.consent.automatic_actions = [Action.reset_gpu]
    alert = make_alert(h.cluster.cluster, node, "hc1", code=48, action="reset_gpu",
                       observed_at=await h.env.get_current_time())
    handle = await start_repair(h, node, Action.reset_gpu, "hc1", alerts=[alert])
    for _ in range(400):
        st = await wait_stage(h, node, "hc1", Stage.awaiting_approval)
        if "cannot run" in st.detail:
            break
    assert "reboot" in st.detail, st.detail
    assert h.cluster.count("reset_gpu", node) == 1, st.detail
    await handle.signal("approve", ApproveSignal(by="oncall", action=named))
    # give the repair time to act on the approval
    for _ in range(200):
        st = await repair_status(h, node, "hc1")
        if h.cluster.count("reboot", node) or h.cluster.count("reset_gpu", node) > 1:
            break
        await asyncio.sleep(0.05)
    st = await repair_status(h, node, "hc1")
    assert h.cluster.count("reset_gpu", node) == 1, (
        "approval of reboot ran reset_gpu again", st.stage, st.detail,
        [t.reason for t in st.history])
    assert h.cluster.count("reboot", node) == 1, (st.stage, st.detail)


async def test_a_cancel_while_a_retry_waits_for_its_lease_ends_clean(harness: Harness) -> None:
    """r1's power_cycle is refused by the BMC (nothing touched); meanwhile r1's lease is
    lost and r2 holds the pool. r1's retry re-acquires the lease and waits in the guard's
    queue. A cancel then: r1 ends cancelled, nothing recorded as an attempt, gpu-01 not
    left cordoned, r1 neither holding nor queued in the guard."""
    h = harness
    seen = lease_lost_during_backoff(h)
    r1 = await start_repair(h, "gpu-01", Action.power_cycle, "r1", requester=USER, alerts=[])
    for _ in range(300):
        st = await repair_status(h, "gpu-01", "r1")
        if "lease not held before retrying" in " | ".join(t.reason for t in st.history):
            break
        await h.env.sleep(timedelta(seconds=5))
    assert "lease not held before retrying" in " | ".join(t.reason for t in st.history)
    await r1.signal("cancel", CancelSignal(by="oncall", reason="stop"))
    failure: WorkflowFailureError | None = None
    try:
        await r1.result()
    except WorkflowFailureError as e:
        failure = e
    done = await repair_status(h, "gpu-01", "r1")
    g = await guard_status(h)
    # what production sees (no fidelity interceptor there)
    assert done.stage == Stage.cancelled, done.history[-1]
    assert h.cluster.resets == []
    assert await attempt_outcomes(h, "r1") == [], done.history
    assert "gpu-01" not in h.cluster.cordons, (h.cluster.cordons, done.history[-1])
    assert "r1" not in {x.repair_id for x in g.leases}
    assert "r1" not in {x.repair_id for x in g.pending}
    # the interpreter made every call its machine commanded (issue 26 item 5)
    assert failure is None, repr(failure.cause if failure else None)
    await seen["r2"].signal("cancel", CancelSignal(by="t", reason="end"))



@pytest.mark.parametrize("payload", [None, "stop it", ["oncall"], 7],
                         ids=["null", "string", "list", "int"])
async def test_an_unreadable_cancel_still_stops(harness: Harness, payload: object) -> None:
    """A cancel whose payload cannot be read still cancels (I19), whatever its shape."""
    h = harness
    h.policy.consent.mode = "approve"
    node, rid = "gpu-14", "hc-bad"
    handle = await start_repair(h, node, Action.reboot, rid)
    await wait_stage(h, node, rid, Stage.awaiting_approval)
    await handle.signal("cancel", payload)  # (passes: shapes other than "no payload")
    done = await asyncio.wait_for(handle.result(), 20)
    assert done.stage == Stage.cancelled, done.history[-1]
    assert h.cluster.count("reboot", node) == 0


@pytest.mark.parametrize("name", ["approve", "reject", "cancel"])
async def test_a_signal_sent_without_a_payload_does_not_wedge_the_repair(
    harness: Harness, name: str,
) -> None:
    """``temporal workflow signal --name <name>`` with no ``--input`` (or the UI's Send
    Signal left empty): refused by name (an approve) or taken as a stop (reject, cancel);
    either way a readable cancel sent afterwards still ends the repair."""
    from workflows.models import CancelSignal

    h = harness
    h.policy.consent.mode = "approve"
    node, rid = "gpu-15", f"hc-noarg-{name}"
    handle = await start_repair(h, node, Action.reboot, rid)
    await wait_stage(h, node, rid, Stage.awaiting_approval)
    await handle.signal(name)
    await handle.signal("cancel", CancelSignal(by="oncall", reason="stop"))
    done = await asyncio.wait_for(handle.result(), 20)
    assert done.stage in (Stage.cancelled, Stage.rejected), done.history[-1]
    assert h.cluster.count("reboot", node) == 0


async def test_a_refused_payload_is_quoted_bounded(harness: Harness) -> None:
    """An unreadable approve is refused by name, quoting the payload bounded (200
    characters of it): a 50 kB string typed or pasted into the UI does not go whole into
    the history, the ledger and the workflow's details."""
    from tests.workflows.helpers import eventually

    h = harness
    h.policy.consent.mode = "approve"
    node, rid = "gpu-17", "hc-big"
    handle = await start_repair(h, node, Action.reboot, rid)
    await wait_stage(h, node, rid, Stage.awaiting_approval)
    await handle.signal("approve", "x" * 50_000)

    async def said() -> bool:
        st = await repair_status(h, node, rid)
        return any("approve signal refused" in t.reason for t in st.history)

    await eventually(said, "the refused approve in the history")
    st = await repair_status(h, node, rid)
    note = next(t.reason for t in st.history if "approve signal refused" in t.reason)
    assert len(note) < 2_000, len(note)
    assert len(st.detail) < 4_000, len(st.detail)
