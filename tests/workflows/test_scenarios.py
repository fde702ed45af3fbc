"""Orchestration scenarios from shared/scenarios.md (4, 5, 7, 8, 10) on the time-skipping
server with the real ledger. Scenarios 1, 2 and 6 are in test_node.py; 11 is in
test_scenario_11_devserver.py."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import (
    eventually,
    guard_status,
    repair_handle,
    result_skipping,
    start_repair,
    wait_stage,
)
from workflows.models import (
    Action,
    AlertOutcome,
    ApproveSignal,
    RejectSignal,
    Requester,
    RequesterKind,
    Stage,
)
from workflows.protocol import GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal, workflow_id_guard


async def test_scenario_4_rejoin_uncordons_only_our_cordon(harness: Harness) -> None:
    h = harness
    ours = await (await start_repair(h, "gpu-01", Action.reboot, "s4a")).result()
    assert ours.stage == Stage.succeeded and "gpu-01" not in h.cluster.cordons
    h.cluster.cordons["gpu-02"] = "other"  # an operator's maintenance cordon
    theirs = await (await start_repair(h, "gpu-02", Action.reboot, "s4b")).result()
    assert theirs.stage == Stage.succeeded
    assert h.cluster.cordons["gpu-02"] == "other"
    assert any("node left cordoned" in t.reason for t in theirs.history)


async def test_scenario_5_node_returns_after_remove_and_validation(harness: Harness) -> None:
    h = harness
    a = await start_repair(h, "gpu-03", Action.remove, "s5a")
    await wait_stage(h, "gpu-03", "s5a", Stage.awaiting_approval)
    await a.signal("approve", ApproveSignal(by="tech"))
    st = await a.result()
    assert st.stage == Stage.succeeded
    val = h.client.get_workflow_handle("validate/m-gpu-03/s5a")
    assert await val.result() == "validated m-gpu-03"
    # I18: the removed machine stays out until an operator returns it — a repair of the
    # node meanwhile touches nothing and names the hold
    drains = h.cluster.count("drain", "gpu-03")
    # the node entity starts fresh with this alert and learns of the removal from the
    # ledger: its cooldown holds (30 min after any repair), so the alert comes after it
    await h.env.sleep(timedelta(seconds=h.policy.rails.cooldown_s + 60))
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-03", "held"))
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    held = await result_skipping(h, "gpu-03", d.repair_id)
    assert held.stage == Stage.cancelled and "held for RMA" in held.history[-1].reason
    assert h.cluster.count("drain", "gpu-03") == drains
    # nothing sticky: once the operator returns it (their command, no database edit) the
    # node takes a new alert and a new repair (after the cooldown of the one above); the
    # removal's cordon is named to a person, who approves going on beside it
    assert await h.ledger.return_machine(h.cluster.cluster, "m-gpu-03", "tech", "fixed")
    await h.env.sleep(timedelta(seconds=h.policy.rails.cooldown_s + 60))
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-03", "after"))
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    st = await wait_stage(h, "gpu-03", d.repair_id, Stage.awaiting_approval)
    assert "cordon left by repair s5a" in st.detail
    await repair_handle(h, "gpu-03", d.repair_id).signal(
        "approve", ApproveSignal(by="tech"))
    assert (await result_skipping(h, "gpu-03", d.repair_id)).stage == Stage.succeeded


async def test_scenario_7_cordon_storm_trips_breaker(harness: Harness) -> None:
    h = harness  # 20 GPU nodes: budget 1, breaker threshold max(2, ceil(0.1 × 20)) = 2
    h.policy.rails.persistence_by_kind = {"xfs_shutdown": 0}
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    storm = [f"gpu-{i:02d}" for i in range(1, 16)]  # 75 % of the cluster
    for n in storm:
        h.cluster.busy_polls[n] = 10_000  # the first repair stays in flight
    raised = {}
    for n in storm:
        a = make_alert(
            h.cluster.cluster,
            n,
            "xfs",
            kind="xfs_shutdown",
            code=None,
            level=True,
            action="reboot",
            severity="critical",
        )
        raised[n] = a
        d = await h.deliver(a)
        assert d.outcome == AlertOutcome.recommended, d

    async def storm_queued() -> bool:
        g = await guard_status(h)
        return g.breaker_open and len(g.pending) == len(storm) - 1

    await eventually(storm_queued, "breaker open with the storm queued")
    g = await guard_status(h)
    assert len(g.leases) <= g.budget == 1
    assert len(h.cluster.cordons) <= g.budget  # cordons count, not only drains
    alerts = await h.ledger.list_alerts(cluster=h.cluster.cluster, node="*")
    assert [a.kind for a in alerts] == ["circuit_breaker"]
    assert any(n.severity == "critical" for n in h.cluster.notifications)
    # storage comes back: every node but one clears; then the operator resets
    for n in storm[1:-1]:
        clr = raised[n].model_copy(update={"alert_id": f"{n}-clr", "active": False})
        await h.deliver(clr)
    guard = h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster))
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))
    for n in storm:
        h.cluster.busy_polls[n] = 0
    results = {}
    for n in storm:
        rows = await h.ledger.list_repairs(cluster=h.cluster.cluster, node=n)
        assert len(rows) == 1
        results[n] = await result_skipping(h, n, rows[0]["repair_id"])
    resolved = [n for n, st in results.items() if st.stage == Stage.auto_resolved]
    done = [n for n, st in results.items() if st.stage == Stage.succeeded]
    assert sorted(done) == sorted([storm[0], storm[-1]])  # evidence still current
    assert len(resolved) == len(storm) - 2
    assert h.cluster.count("reboot") == 2


async def test_scenario_8_ladder_then_human(harness: Harness) -> None:
    h = harness
    for act in ("reboot", "reprovision", "migrate"):
        h.cluster.fail_actions[act] = 100
    # migrate needs critical evidence within 10 days (docs/design.md §5): the fault is fresh
    fresh = make_alert(h.cluster.cluster, "gpu-04", "s8", observed_at=await h.env.get_current_time())
    handle = await start_repair(h, "gpu-04", Action.reboot, "s8", alerts=[fresh])
    await wait_stage(h, "gpu-04", "s8", Stage.awaiting_approval)
    calls = [c for c, n in h.cluster.calls if c in ("reboot", "reprovision", "migrate")]
    assert calls == ["reboot", "reboot", "reprovision", "reprovision", "migrate", "migrate"]
    assert h.cluster.count("remove") == 0  # remove is never automatic
    await handle.signal("reject", RejectSignal(by="oncall", reason="RMA ticket opened"))
    st = await handle.result()
    assert st.stage == Stage.rejected
    row = await h.ledger.get_repair("s8")
    assert row is not None and [a["outcome"] for a in row["attempts"]] == ["failed"] * 6
    # a new repair for the same fault on the same machine starts at the top rung
    h.policy.consent.mode = "approve"
    nxt = await start_repair(h, "gpu-04", Action.reboot, "s8b", alerts=[fresh])
    st2 = await wait_stage(h, "gpu-04", "s8b", Stage.awaiting_approval)
    assert st2.action == Action.migrate and "exhausted" in (st2.decided_by_rule or "")
    await nxt.signal("reject", RejectSignal(by="oncall"))


async def test_scenario_10_duplicate_detector_requests(harness: Harness) -> None:
    h = harness
    det = Requester(kind=RequesterKind.detector, name="scanner")
    kw = dict(requester=det, detector="scanner", request_id="req-42")
    a, b = await asyncio.gather(
        start_repair(h, "gpu-05", Action.reboot, "s10a", **kw),
        start_repair(h, "gpu-05", Action.reboot, "s10b", **kw),
    )
    ra, rb = await asyncio.gather(a.result(), b.result())
    stages = sorted([ra.stage, rb.stage])
    assert stages == [Stage.cancelled, Stage.succeeded]
    dup = ra if ra.stage == Stage.cancelled else rb
    assert "duplicate of repair" in dup.detail
    # the detector re-asserts after the repair finished: still one repair
    c = await (await start_repair(h, "gpu-05", Action.reboot, "s10c", **kw)).result()
    assert c.stage == Stage.cancelled and "duplicate" in c.detail
    assert len(await h.ledger.list_repairs(cluster=h.cluster.cluster)) == 1
    assert h.cluster.count("reboot") == 1


async def test_actions_that_cannot_run_are_not_said_to_have_run(harness: Harness) -> None:
    """The demo's runbook path before it had an image and a spare: reprovision (no
    provision image) → migrate (no spare) → a person; a cancel then left the node
    cordoned with a note that both actions 'ran' though neither touched it."""
    from workflows.models import CancelSignal

    h = harness
    h.cluster.broken.update({"reprovision": "UnsupportedAction", "migrate": "UnsupportedAction"})
    fresh = make_alert(h.cluster.cluster, "gpu-06", "nr", observed_at=await h.env.get_current_time())
    handle = await start_repair(h, "gpu-06", Action.reprovision, "nr", alerts=[fresh])
    st = await wait_stage(h, "gpu-06", "nr", Stage.awaiting_approval)
    # Current Details name the action asked for now (the static Summary keeps the first),
    # why, and what a person can do
    from temporalio.api.sdk.v1 import WorkflowMetadata

    current = ""
    for _ in range(100):
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        current = meta.current_details
        if "why:" in current:
            break
        await asyncio.sleep(0.05)
    assert f"waiting for approval of {st.action.value} on gpu-06" in current, current
    assert "why: " in current and "cannot run, nothing touched" in current, current
    assert "reject nr" in current and "cancel nr" in current and "--action" in current
    await handle.signal("cancel", CancelSignal(by="oncall", reason="not now"))
    st = await handle.result()
    assert st.stage == Stage.cancelled
    row = await h.ledger.get_repair("nr")
    assert row is not None
    reasons = [t["reason"] for t in row["transitions"]]
    assert any("reprovision cannot run, nothing touched" in r for r in reasons), reasons
    assert not any(" ran and the node was not verified healthy" in r for r in reasons), reasons
    assert "gpu-06" not in h.cluster.cordons  # uncordoned: nothing was done to it
