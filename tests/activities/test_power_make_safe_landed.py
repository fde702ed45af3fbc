"""A cancel came while a power cycle's ForceOff was only possibly sent (its answer lost):
the make-safe run finds the power On for the whole ``FORCE_OFF_LANDED_S`` wait, so the
ForceOff never landed. The run sends nothing and says so (``nothing_landed``); the
repair's machine then counts nothing touched (test_machine_action_landed.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import power
from activities.power import PowerActivities
from tests.activities.test_power_break6 import _LostAnswer
from tests.activities.test_redfish_power import _config, _inp
from workers.devpeers import RedfishEmulator


async def test_a_make_safe_run_that_finds_the_forceoff_never_landed_says_so(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(power, "FORCE_OFF_LANDED_S", 2.0, raising=False)
    bmc = _LostAnswer(lands=False)
    bmc.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    inp = _inp("gpu-03")
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.power_cycle_machine, inp)
    assert ei.value.details[0]["phase"] == "off_requested"
    res = await ActivityEnvironment().run(acts.power_cycle_machine, inp.model_copy(
        update={"resume_phase": "off_requested", "make_safe": True}))
    assert bmc.sent == ["ForceOff"], bmc.sent  # the lost one only: nothing sent since
    assert res.done and res.nothing_landed and "did not land" in res.detail, res
    assert (await acts.machine(inp).power_state()).lower() == "on"
