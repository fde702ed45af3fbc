"""The "possibly sent" step of every disruptive reset in activities/power.py (ForceOff,
ForceOff resent, GracefulRestart, ForceRestart, and the On of a reboot of a host found
Off) is one helper, :func:`activities.power.possibly_sent`: the phase is reported before
the request goes out, a lost answer leaves it there (the command counts as sent, I16),
and a refusal the BMC answered reports the phase before the send. Each site's phase
bookkeeping, as :func:`workflows.activity_api.phased_failure` reports it, is pinned here."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sushy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import power
from activities.power import PowerActivities, RedfishMachine
from tests.activities.test_power_off_then_back import _ScriptedPower
from tests.activities.test_redfish_power import _config, _inp
from workers.devpeers import RedfishEmulator
from workflows.activity_api import ERR_UNSUPPORTED, SENT_AT_DETAIL, permanent

# site: (activity, resume phase, power reads, reset sent, phase when lost, when refused)
SITES: dict[str, tuple[str, str, list[str], str, str, str]] = {
    "ForceOff": ("power_cycle_machine", "not_started", ["On"], "ForceOff",
                 "off_requested", "not_started"),
    "ForceOff resent": ("power_cycle_machine", "off_requested", ["On"], "ForceOff",
                        "off_requested", "off_requested"),
    "GracefulRestart": ("reboot_machine", "not_started", ["On"], "GracefulRestart",
                        "restart_sent", "not_started"),
    "ForceRestart": ("reboot_machine", "restart_unseen", ["On"], "ForceRestart",
                     "force_restart_sent", "restart_unseen"),
    "On of a host found Off": ("reboot_machine", "not_started", ["Off"], "On",
                               "restart_seen", "not_started"),
}


@pytest.mark.parametrize("answer", ["lost", "refused"])
@pytest.mark.parametrize("site", list(SITES))
async def test_each_possibly_sent_reset_goes_through_one_helper(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
    monkeypatch: pytest.MonkeyPatch, site: str, answer: str,
) -> None:
    activity, resume, reads, kind, lost_phase, refused_phase = SITES[site]
    monkeypatch.setattr(power, "POWER_POLL_S", 0.01, raising=False)
    monkeypatch.setattr(power, "FORCE_OFF_LANDED_S", 0.05, raising=False)
    bmc = _ScriptedPower(reads)
    bmc.install(monkeypatch)

    async def reset(self: RedfishMachine, reset_type: str) -> None:
        bmc.sent.append(str(getattr(reset_type, "value", reset_type)))
        if answer == "lost":
            raise power.BmcUnavailable(f"{self._where()} unavailable: ConnectionError")
        raise permanent(ERR_UNSUPPORTED, f"{self._where()} refused the request")

    async def allowed(self: RedfishMachine) -> set[Any]:
        return {sushy.RESET_GRACEFUL_RESTART, sushy.RESET_FORCE_RESTART}

    monkeypatch.setattr(RedfishMachine, "reset", reset)
    monkeypatch.setattr(RedfishMachine, "allowed_resets", allowed)
    helped: list[tuple[str, str, str]] = []
    helper = power.possibly_sent

    async def spy(m: RedfishMachine, reset_type: str, sent: str, refused: str,
                  sent_at: Any = None) -> None:
        helped.append((str(getattr(reset_type, "value", reset_type)), sent, refused))
        await helper(m, reset_type, sent, refused, sent_at)

    monkeypatch.setattr(power, "possibly_sent", spy)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    env = ActivityEnvironment()
    beats: list[Any] = []
    env.on_heartbeat = lambda *d: beats.extend(d)
    with pytest.raises(ApplicationError) as ei:
        await asyncio.wait_for(env.run(getattr(acts, activity),
                                       _inp("gpu-02", resume_phase=resume)), 20)
    assert bmc.sent == [kind], bmc.sent
    assert helped == [(kind, lost_phase, refused_phase)], helped
    assert ei.value.details[0]["phase"] == (lost_phase if answer == "lost"
                                            else refused_phase), ei.value.details
    assert ei.value.non_retryable == (answer == "refused"), ei.value
    if answer == "refused":
        # a refused command went nowhere: no send time is evidence of it (the refused
        # GracefulRestart reported the sent_at it had stamped before the send)
        assert SENT_AT_DETAIL not in ei.value.details[0], ei.value.details
    # reported before the request went out
    assert any(isinstance(b, dict) and b.get("phase") == lost_phase for b in beats), beats


async def test_a_refused_force_restart_keeps_the_graceful_restarts_sent_at(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal of the ForceRestart (resumed at ``restart_unseen``) sent nothing, but
    the GracefulRestart before it did go out: its ``sent_at`` (carried in) is still
    reported, unchanged."""
    from datetime import UTC, datetime, timedelta

    monkeypatch.setattr(power, "POWER_POLL_S", 0.01, raising=False)
    bmc = _ScriptedPower(["On"])
    bmc.install(monkeypatch)

    async def reset(self: RedfishMachine, reset_type: str) -> None:
        bmc.sent.append(str(getattr(reset_type, "value", reset_type)))
        raise permanent(ERR_UNSUPPORTED, f"{self._where()} refused the request")

    monkeypatch.setattr(RedfishMachine, "reset", reset)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    sent_at = datetime.now(UTC) - timedelta(seconds=1000)
    with pytest.raises(ApplicationError) as ei:
        await asyncio.wait_for(ActivityEnvironment().run(
            acts.reboot_machine,
            _inp("gpu-02", resume_phase="restart_unseen", sent_at=sent_at)), 20)
    assert bmc.sent == ["ForceRestart"], bmc.sent
    assert ei.value.details[0]["phase"] == "restart_unseen", ei.value.details
    assert ei.value.details[0][SENT_AT_DETAIL] == sent_at.isoformat(), ei.value.details
