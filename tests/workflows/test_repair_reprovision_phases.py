"""I16 / I22 for a reprovision whose BMC stops answering after the restart (a
break-test of bb83125: each try was a fresh activity with no phase, so a one-read BMC
blip restarted the machine a second time mid-reimage, and a BMC that stayed away ended
"touched nothing", no attempt, the half-reimaged node uncordoned).

The fake behaves as ``activities/provisioning.py``'s Redfish reprovision does now: it
resumes from ``inp.resume_phase`` (the phase the repair carries), sends the restart only
from ``not_started``, and a failure after the restart carries ``{"phase":
"provision_started"}`` (:func:`workflows.activity_api.phased_failure`)."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError

from tests.workflows.conftest import FakeCluster, Harness, make_alert
from tests.workflows.helpers import attempt_outcomes, start_repair
from workflows.activity_api import ACT, ActionResult, MachineActionInput, phased_failure
from workflows.models import Action, Stage

#: node -> power-state reads still to fail after the restart (BMC unreachable)
BMC_DOWN_AFTER_RESTART: dict[str, int] = {}


class _RedfishLike(FakeCluster):
    @activity.defn(name=ACT.reprovision_machine)
    async def reprovision_machine(self, inp: MachineActionInput) -> ActionResult:
        self._log("reprovision", inp.node)
        phase = inp.resume_phase
        if phase == "not_started":
            self.resets.append((inp.node, "INSERT_MEDIA+FORCE_RESTART"))
            phase = "provision_started"
            activity.heartbeat({"phase": phase})
        left = BMC_DOWN_AFTER_RESTART.get(inp.node, 0)
        if left > 0:
            BMC_DOWN_AFTER_RESTART[inp.node] = left - 1
            raise phased_failure(ApplicationError(
                f"BMC of {inp.node} unavailable: ConnectionError", type="BmcUnavailable"),
                phase)
        self._reboot(inp.node)
        return ActionResult(done=True, detail="reimaged", phase="booted")


@pytest.fixture
def redfish_reprovision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeCluster, "reprovision_machine", _RedfishLike.reprovision_machine)
    BMC_DOWN_AFTER_RESTART.clear()


async def test_reprovision_bmc_blip_after_restart_sends_one_restart(
    redfish_reprovision: Any, harness: Harness,
) -> None:
    h = harness
    node, rid = "gpu-14", "rp1"
    BMC_DOWN_AFTER_RESTART[node] = 1
    fresh = make_alert(h.cluster.cluster, node, rid, observed_at=await h.env.get_current_time())
    st = await (await start_repair(h, node, Action.reprovision, rid, alerts=[fresh])).result()
    sent = [r for r in h.cluster.resets if r[0] == node]
    assert len(sent) == 1, (sent, st.history[-1])
    assert st.stage == Stage.succeeded
    assert await attempt_outcomes(h, rid) == [("reprovision", "succeeded")]


async def test_reprovision_whose_bmc_stays_away_after_restart_is_an_attempt(
    redfish_reprovision: Any, harness: Harness,
) -> None:
    h = harness
    node, rid = "gpu-15", "rp2"
    h.policy.rails.action_retry_max_s = 300
    BMC_DOWN_AFTER_RESTART[node] = 10_000
    fresh = make_alert(h.cluster.cluster, node, rid, observed_at=await h.env.get_current_time())
    st = await (await start_repair(h, node, Action.reprovision, rid, alerts=[fresh])).result()
    outcomes = await attempt_outcomes(h, rid)
    # one restart per attempt (the ladder may run another attempt after a failed one)
    tries = [o for o in outcomes if o[0] == "reprovision"]
    assert len([r for r in h.cluster.resets if r[0] == node]) == len(tries), outcomes
    assert outcomes and outcomes[0] == ("reprovision", "failed"), (outcomes, st.history[-1])
    # the touched attempt counts, so the ladder goes on to its next rung; had it ended
    # there, the half-reimaged node would stay cordoned for a person
    if st.stage == Stage.succeeded:
        assert len(outcomes) >= 2 and outcomes[-1][1] == "succeeded", outcomes
        assert "could not run and touched nothing" not in " | ".join(
            t.reason for t in st.history)
    else:
        assert node in h.cluster.repair_cordoned, "a half-reimaged node was uncordoned"
