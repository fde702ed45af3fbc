"""A power cycle's retry resumed at ``off_requested`` (the ForceOff's answer was lost)
reads the power Off — the ForceOff landed — and then On again by itself (the BMC's
power-restore policy, or someone pressed the button): the cycle happened. The retry
went on waiting for Off until its bound (``wait_power``'s ``POWER_WAIT_S``) and failed
saying the host may be off. Rail: the Off that was read proves the cycle; the host is On
again, so neither ForceOff nor On is sent again and the run goes on as after the On."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities import power
from activities.power import PowerActivities, RedfishMachine
from tests.activities.test_redfish_power import _config, _inp
from workers.devpeers import RedfishEmulator


class _ScriptedPower:
    """A BMC whose power reads follow ``reads`` (the last one repeats) and which records
    every reset request (``sent``) without applying it."""

    def __init__(self, reads: list[str]) -> None:
        self.reads = list(reads)
        self.sent: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        bmc = self

        async def power_state(self: RedfishMachine) -> str:
            return bmc.reads.pop(0) if len(bmc.reads) > 1 else bmc.reads[0]

        async def reset(self: RedfishMachine, reset_type: str) -> None:
            bmc.sent.append(str(getattr(reset_type, "value", reset_type)))

        monkeypatch.setattr(RedfishMachine, "power_state", power_state)
        monkeypatch.setattr(RedfishMachine, "reset", reset)


@pytest.mark.parametrize("make_safe", [False, True])
async def test_an_off_then_on_read_at_off_requested_is_the_cycle(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
    monkeypatch: pytest.MonkeyPatch, make_safe: bool,
) -> None:
    monkeypatch.setattr(power, "POWER_POLL_S", 0.01, raising=False)
    monkeypatch.setattr(power, "FORCE_OFF_LANDED_S", 5.0, raising=False)
    bmc = _ScriptedPower(["On", "On", "Off", "On"])
    bmc.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    inp = _inp("gpu-02", resume_phase="off_requested", make_safe=make_safe)
    # before the fix the run waited POWER_WAIT_S (600 s) for an Off that never came again
    res = await asyncio.wait_for(ActivityEnvironment().run(acts.power_cycle_machine, inp), 20)
    assert bmc.sent == [], (bmc.sent, res)
    assert res.done and res.phase == "booted" and not res.nothing_landed, res
    assert "Off, then On again" in res.detail, res.detail
    assert "not sent again" in res.detail, res.detail


async def test_an_off_read_at_off_requested_still_gets_its_on(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host stays Off after the landed ForceOff: the retry sends On, once."""
    monkeypatch.setattr(power, "POWER_POLL_S", 0.01, raising=False)
    bmc = _ScriptedPower(["On", "Off", "Off", "Off", "On"])
    bmc.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    inp = _inp("gpu-02", resume_phase="off_requested")
    res = await asyncio.wait_for(ActivityEnvironment().run(acts.power_cycle_machine, inp), 20)
    assert bmc.sent == ["On"], (bmc.sent, res)
    assert res.done and res.phase == "booted", res


async def test_an_off_then_on_read_after_a_resume_at_off_sent_is_said_so(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same in the wait for Off of a retry resumed at ``off_sent``: no On is sent,
    and the run says it read Off and then On (not "host already On" at ``off_seen``)."""
    monkeypatch.setattr(power, "POWER_POLL_S", 0.01, raising=False)
    bmc = _ScriptedPower(["On", "Off", "On"])
    bmc.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    inp = _inp("gpu-02", resume_phase="off_sent")
    res = await asyncio.wait_for(ActivityEnvironment().run(acts.power_cycle_machine, inp), 20)
    assert bmc.sent == [], (bmc.sent, res)
    assert res.done and res.phase == "booted", res
    assert "Off, then On again" in res.detail and "already On" not in res.detail, res.detail
