"""A power cycle whose wait for ``Off`` reads ``PoweringOff`` and then ``On``, no ``Off``
read in between: some BMCs report the power-off and the host's return within a poll (a
cycle whose Off was never observed). The run waited ``POWER_WAIT_S`` (600 s) for an Off
that had already passed and failed saying the host may be off. Rail: the host was seen
leaving On (its ForceOff landed) and is On again, so the cycle happened, as after an
``Off`` then ``On`` read (tests/activities/test_power_off_then_back.py): neither ForceOff
nor On is sent again, and the run says what it read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities import power
from activities.power import PowerActivities
from tests.activities.test_power_off_then_back import _ScriptedPower
from tests.activities.test_redfish_power import _config, _inp
from workers.devpeers import RedfishEmulator

# resume phase: (power reads, resets sent)
CASES: dict[str, tuple[list[str], list[str]]] = {
    # a fresh try: ForceOff, then PoweringOff, then On
    "not_started": (["On", "PoweringOff", "On"], ["ForceOff"]),
    # a retry after a lost ForceOff answer: leaves_on reads PoweringOff (the ForceOff
    # landed), the wait for Off reads On
    "off_requested": (["On", "PoweringOff", "On"], []),
    # a retry resumed in the wait for Off
    "off_sent": (["PoweringOff", "On"], []),
}


@pytest.mark.parametrize("resume", list(CASES))
async def test_poweringoff_then_on_is_the_cycle(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
    monkeypatch: pytest.MonkeyPatch, resume: str,
) -> None:
    reads, sent = CASES[resume]
    monkeypatch.setattr(power, "POWER_POLL_S", 0.01, raising=False)
    monkeypatch.setattr(power, "FORCE_OFF_LANDED_S", 5.0, raising=False)
    bmc = _ScriptedPower(reads)
    bmc.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *d: beats.extend(d)
    # before the fix the run waited POWER_WAIT_S (600 s) for an Off that never came
    res = await asyncio.wait_for(
        env.run(acts.power_cycle_machine, _inp("gpu-02", resume_phase=resume)), 20)
    assert bmc.sent == sent, (bmc.sent, res)
    assert res.done and res.phase == "booted" and not res.nothing_landed, res
    assert "PoweringOff, then On again" in res.detail, res.detail
    assert "not sent again" in res.detail and "already On" not in res.detail, res.detail
    assert {"phase": "on_sent"} in beats, beats


async def test_poweringoff_then_off_still_gets_its_on(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PoweringOff followed by Off is the ordinary path: the host is off, On is sent
    once."""
    monkeypatch.setattr(power, "POWER_POLL_S", 0.01, raising=False)
    bmc = _ScriptedPower(["On", "PoweringOff", "PoweringOff", "Off", "Off", "On"])
    bmc.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    res = await asyncio.wait_for(ActivityEnvironment().run(
        acts.power_cycle_machine, _inp("gpu-02")), 20)
    assert bmc.sent == ["ForceOff", "On"], (bmc.sent, res)
    assert res.done and res.phase == "booted", res
