"""Differential test (issue 26): the model-checked repair machine
(:mod:`workflows.lifecycle.repair`) and the ``RepairWorkflow`` that runs must agree on
what an operator sees.

For each scenario (tests/workflows/repair_agreement.py: consent × a stop at a point ×
the action's outcome × the node's rejoin), the real ``RepairWorkflow`` runs through the
project's harness (time-skipping server, real ledger, ``FakeCluster`` as scheduler and
BMC) and the pure machine runs in a scripted world that answers its commands as the
``FakeCluster`` answers the workflow, with the same events in the same order (a stop is
sent while the same call is out). The two are compared, never against expectations of
this file's own:

- the terminal stage;
- the ordered stages recorded (status history / the machine's ``RecordTransition``);
- the attempts recorded (ledger / ``RecordAttempt``): (action, outcome), in order;
- whether the node is left cordoned by the repair;
- which disruptive commands were sent (cordon, drain, the machine action by name).

Normalised (an operator cannot tell them apart, or it is wording): consecutive repeats
of a stage in the history are folded (a note re-records the stage the repair is in;
the two sides write notes in different places); the ``by`` and ``reason`` of each
transition are not compared; a machine action's make-safe run is not told from its act
run (both are the same BMC activity on the harness). Waiting for the lease is no stage
of either side (the repair stays in the stage before it); the ``lease`` point is
reached by queueing the repair behind another repair's lease (the harness's budget is
one) and is found in the workflow from the guard's pending list.

CI runs a slice (every stop kind and every point, both consents, every outcome and
rejoin; tests/workflows/repair_agreement.py ``CI_SLICE``); ``AUTOREPAIR_AGREEMENT_FULL=1`` runs the whole product.
The comparison is shown to bite (:data:`PLANTED`): a machine with a planted defect is
told apart from the workflow in a scenario where the defect shows.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

import pytest

from tests.workflows.conftest import Harness
from tests.workflows.helpers import attempt_outcomes, guard_status, start_repair, wait_stage
from tests.workflows.repair_agreement import (
    ACTION,
    Scenario,
    Seen,
    ci_slice,
    collapse,
    level_alert,
    policy_for,
    run_machine,
    scenarios,
)
from workflows.activity_api import ERR_AUTH, DrainInput, DrainResult
from workflows.models import (
    TERMINAL_STAGES,
    ApproveSignal,
    CancelSignal,
    RejectSignal,
    RepairStatus,
    Requester,
    RequesterKind,
    Stage,
)

FULL = os.environ.get("AUTOREPAIR_AGREEMENT_FULL") == "1"
ALL = scenarios()
RUN = ALL if FULL else ci_slice(ALL)
print(f"repair agreement: {len(RUN)} of {len(ALL)} scenarios"
      f"{'' if FULL else ' (AUTOREPAIR_AGREEMENT_FULL=1 runs all)'}")

#: Scenarios where the two sides still differ, with the exact difference (strict xfail).
KNOWN: dict[str, str] = {}

_MACHINE_CALLS = {"power_cycle", "reboot", "reprovision", "migrate", "reset_gpu", "remove"}


def _params() -> list[object]:
    out: list[object] = []
    for sc in RUN:
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN[sc.id])] if sc.id in KNOWN \
            else []
        out.append(pytest.param(sc, id=sc.id, marks=marks))
    return out


async def run_workflow(h: Harness, sc: Scenario, node: str = "gpu-01",
                       rid: str = "r1") -> Seen:
    """The real RepairWorkflow through one scenario on the harness."""
    p = policy_for(sc)
    h.policy.consent = p.consent
    h.policy.wait_for_idle = p.wait_for_idle
    h.policy.rails = p.rails
    c = h.cluster
    c.busy_polls[node] = 1  # busy once, then idle (as the machine's world)
    if sc.outcome == "flaky":
        c.bmc_read_failures_after_on[node] = 1
    if sc.outcome == "stuck":
        async def stuck(inp: DrainInput) -> DrainResult:
            return DrainResult(drained=False, remaining=["job-7"])
        c.drain_with = stuck
    if sc.outcome == "refused":
        c.broken["drain"] = ERR_AUTH
    if sc.outcome == "fail":
        c.fail_actions[ACTION.value] = 1  # once, after the disruptive phase
    t0 = await h.env.get_current_time()
    alert = level_alert(c.cluster, node, rid, t0 - timedelta(seconds=10),
                        received_at=t0 - timedelta(seconds=10))
    blocker = None
    if sc.point == "lease":
        # another repair (an operator's own: no person asked) holds the cluster's one
        # lease while its node stays busy; this repair queues behind it
        c.busy_polls["gpu-02"] = 10_000
        blocker = await start_repair(h, "gpu-02", ACTION, "blocker",
                                     requester=Requester(kind=RequesterKind.user,
                                                         name="op"))
        await wait_stage(h, "gpu-02", "blocker", Stage.waiting_for_idle)
    handle = await start_repair(h, node, ACTION, rid, alerts=[alert])

    async def stop() -> None:
        if sc.stop == "approve":
            await handle.signal("approve", ApproveSignal(by="bob"))
        elif sc.stop == "reject":
            await handle.signal("reject", RejectSignal(by="oncall", reason="not now"))
        elif sc.stop == "cancel":
            await handle.signal("cancel", CancelSignal(by="oncall", reason="hands off"))
        elif sc.stop == "clear":
            await handle.signal("attach_alert", alert.model_copy(update={"active": False}))

    def acted() -> int:
        return sum(1 for n, nd in c.calls if n in _MACHINE_CALLS and nd == node)

    async def on_idle(n: str) -> None:
        if sc.point == "idle" and c.count("check_idle", n) == 1:
            await stop()

    async def on_drain(n: str) -> None:
        if sc.point == "drain":
            await stop()

    async def on_act(n: str) -> None:
        if sc.point == "act" and acted() == 1:
            await stop()

    health_after = {"n": 0}

    async def on_health(n: str) -> None:
        if sc.rejoin == "never" and acted() > 0:
            c.unhealthy.add(n)
        st = await handle.query("status", result_type=RepairStatus)
        if st.stage != Stage.joining:
            return  # the workflow's boot-id read before each action (the machine has none)
        health_after["n"] += 1
        if health_after["n"] != 1:
            return
        if sc.outcome == "recur":
            now = await h.env.get_current_time()
            again = level_alert(c.cluster, n, "again", now, received_at=now,
                                evidence={"boot_id": "boot-1"})
            await handle.signal("attach_alert", again)
        if sc.point == "rejoin":
            await stop()

    async def on_cordon(n: str) -> None:
        if sc.point == "cordon":
            await stop()

    async def on_uncordon(n: str) -> None:
        if sc.point != "uncordon" or n != node:
            return
        st = await handle.query("status", result_type=RepairStatus)
        if st.stage == Stage.joining:  # the rejoin after the node came back, not a cleanup
            await stop()

    c.while_out["cordon"] = on_cordon
    c.while_out["rejoin"] = on_uncordon
    c.while_out["check_idle"] = on_idle
    c.while_out["drain"] = on_drain
    c.while_out[ACTION.value] = on_act
    c.while_out["node_health"] = on_health

    approved_at = -1
    asked = 0
    st: RepairStatus | None = None
    for _ in range(400):
        if (await handle.describe()).close_time is not None:
            break
        if blocker is not None and rid in {p.repair_id for p in (await guard_status(h)).pending}:
            await stop()
            await blocker.signal("cancel", CancelSignal(by="op", reason="done"))
            blocker = None
            continue
        st = await handle.query("status", result_type=RepairStatus)
        if st.stage in TERMINAL_STAGES:
            await asyncio.sleep(0.05)
            continue
        if st.stage == Stage.awaiting_approval:
            if len(st.history) != approved_at:
                approved_at = len(st.history)
                asked += 1
                if (sc.point == "approval" and asked == 1) or (
                        sc.point == "reapproval" and asked == 2):
                    await stop()
                else:
                    await handle.signal("approve", ApproveSignal(by="alice"))
            await asyncio.sleep(0.05)
            continue
        await h.env.sleep(timedelta(seconds=20))
    final = await handle.result()
    outcomes = await attempt_outcomes(h, rid)
    disruptive = set()
    for name, nd in c.calls:
        if nd != node:
            continue
        if name in ("cordon", "drain"):
            disruptive.add(name)
        elif name in _MACHINE_CALLS:
            disruptive.add(f"act:{name}")
    return Seen(stage=final.stage.value,
                history=collapse([t.stage.value for t in final.history]),
                attempts=outcomes, cordoned=c.cordons.get(node) == rid,
                disruptive=sorted(disruptive))


@pytest.mark.parametrize("sc", _params())
async def test_machine_and_workflow_agree(harness: Harness, sc: Scenario) -> None:
    machine = run_machine(sc, cluster=harness.cluster.cluster, node="gpu-01", rid="r1")
    wf = await run_workflow(harness, sc)
    assert wf.as_dict() == machine.as_dict(), (
        f"{sc.id}: workflow {wf.as_dict()} != machine {machine.as_dict()}")


#: The comparison's proof that it bites: a machine with a planted defect
#: (:data:`workflows.lifecycle.repair.DEFECTS`) against the real workflow, in a scenario
#: (of the CI slice) where the defect changes what an operator sees.
PLANTED = {
    # a second rung runs on the first rung's approval: the person's reject of the
    # re-ask never comes, the repair acts again
    "approval_carried_over": "person-reject_at_reapproval-fail-healthy",
    # a cancel sent while the health read after the action is out is ignored
    "cancel_ignored_between_rungs": "auto-cancel_at_rejoin-ok-healthy",
}


@pytest.mark.parametrize("defect", sorted(PLANTED))
async def test_agreement_check_finds_a_planted_machine_defect(
        harness: Harness, defect: str) -> None:
    sc = next(s for s in ALL if s.id == PLANTED[defect])
    clean = run_machine(sc, cluster=harness.cluster.cluster, node="gpu-01", rid="r1")
    planted = run_machine(sc, cluster=harness.cluster.cluster, node="gpu-01", rid="r1",
                          defects=frozenset({defect}))
    wf = await run_workflow(harness, sc)
    assert wf.as_dict() == clean.as_dict()
    differs = {k for k, v in wf.as_dict().items() if planted.as_dict()[k] != v}
    assert differs, f"{defect}: the comparison did not tell the planted machine apart"
    # what each defect is about shows up in the compared fields
    assert "history" in differs
    if defect == "cancel_ignored_between_rungs":
        assert planted.stage != "cancelled" and wf.stage == "cancelled"
