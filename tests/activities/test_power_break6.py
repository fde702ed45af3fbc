"""Break-test round 6: power activities against the sushy-tools Redfish emulator.

- a GracefulRestart sent to a hung OS reported the reboot done at once: the BMC accepted
  the request, the OS never acted on it, and only the repair's rejoin timeout (30 min)
  noticed;
- a power cycle's ``ForceOff`` whose HTTP answer was lost was sent again by the retry
  when the BMC had not applied it yet (the host still read On).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import power
from activities.power import PowerActivities, RedfishMachine
from tests.activities.test_redfish_power import _config, _inp
from workers.devpeers import RedfishEmulator
from workflows.activity_api import ActionResult, NodeHealth


def _kind(reset_type: object) -> str:
    return str(getattr(reset_type, "value", reset_type))


class _Host:
    """What the BMC was asked (``sent``) and the scheduler's view of the host: its boot id
    changes only when a restart reached a host that acts on it."""

    def __init__(self, hung: bool) -> None:
        self.hung = hung
        self.sent: list[str] = []
        self.boot = "boot-A"

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = RedfishMachine.reset
        host = self

        async def reset(self: RedfishMachine, reset_type: str) -> None:
            kind = _kind(reset_type)
            host.sent.append(kind)
            if kind == "GracefulRestart" and host.hung:
                return  # the BMC accepts it (204); the hung OS never acts on the request
            await original(self, reset_type)
            if "Restart" in kind:
                host.boot = "boot-B"  # the host restarts (the emulator powers it Off, On)

        monkeypatch.setattr(RedfishMachine, "reset", reset)

    async def health(self, cluster: str, node: str) -> NodeHealth:
        return NodeHealth(ready=True, boot_id=self.boot)


async def test_a_graceful_restart_a_hung_os_ignores_falls_back_to_force_restart(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OS hangs (the fault the reboot is for): the BMC accepts ``GracefulRestart``,
    the OS never restarts, the power stays On and the boot id never changes. The activity
    answered "GracefulRestart sent", done, at once; the repair then waited the whole
    rejoin timeout for a reboot that never happened. Rail: a reboot action's purpose is a
    reboot — the restart must be seen (power through Off, or a new boot identity) within
    ``RESTART_SEEN_S``, else ``ForceRestart`` is sent, once, as a phase of its own."""
    monkeypatch.setattr(power, "RESTART_SEEN_S", 3.0, raising=False)
    host = _Host(hung=True)
    host.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file), health=host.health)
    inp = _inp("gpu-01", boot_id_before="boot-A")
    # the call that sent it ends in phase restart_unseen; its retry forces the restart
    # (test_power_break9.py: never the call that waited, a cancel is decided between)
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.reboot_machine, inp)
    assert ei.value.details[0]["phase"] == "restart_unseen"
    res = await ActivityEnvironment().run(
        acts.reboot_machine, inp.model_copy(update={"resume_phase": "restart_unseen"}))
    assert host.sent == ["GracefulRestart", "ForceRestart"], (host.sent, res)
    assert res.done and res.phase == "booted", res
    assert "ForceRestart" in res.detail and "3 s" in res.detail, res.detail
    assert (await acts.machine(inp).power_state()).lower() == "on"

    # a retry of the same attempt resumed after the ForceRestart sends nothing again (I16)
    host.sent.clear()
    host.boot = "boot-A"  # the scheduler has not seen the new boot yet
    again = inp.model_copy(update={"resume_phase": "force_restart_sent"})
    res2 = await ActivityEnvironment().run(acts.reboot_machine, again)
    assert host.sent == [] and res2.done, (host.sent, res2)


async def test_a_graceful_restart_the_os_honours_sends_nothing_more(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A healthy OS restarts on ``GracefulRestart``: seen, no ForceRestart follows."""
    monkeypatch.setattr(power, "RESTART_SEEN_S", 30.0, raising=False)
    host = _Host(hung=False)
    host.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file), health=host.health)
    res = await ActivityEnvironment().run(acts.reboot_machine,
                                          _inp("gpu-01", boot_id_before="boot-A"))
    assert host.sent == ["GracefulRestart"], (host.sent, res)
    assert res.done and res.phase == "booted" and "restart seen" in res.detail, res.detail


class _LostAnswer:
    """A BMC whose answer to the first ``ForceOff`` is lost (the connection drops after
    the request went out). ``lands``: the request reached the BMC, which applies it
    ``after_s`` later (real BMCs: seconds); else it never reached it. ``sent`` lists every
    reset request the activity made."""

    def __init__(self, lands: bool, after_s: float = 2.0) -> None:
        self.lands, self.after_s = lands, after_s
        self.sent: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = RedfishMachine.reset
        bmc = self

        async def reset(self: RedfishMachine, reset_type: str) -> None:
            kind = _kind(reset_type)
            bmc.sent.append(kind)
            if kind == "ForceOff" and bmc.sent.count("ForceOff") == 1:
                if bmc.lands:
                    async def later() -> None:
                        await asyncio.sleep(bmc.after_s)
                        await original(self, reset_type)

                    bmc.tasks.append(asyncio.create_task(later()))
                raise power.BmcUnavailable(f"{self._where()} unavailable: ConnectionError")
            await original(self, reset_type)

        monkeypatch.setattr(RedfishMachine, "reset", reset)


async def _first_try_then_retry(acts: PowerActivities, node: str) -> ActionResult:
    """The first try fails (the answer lost); the retry resumes from the phase its
    failure reported (as the workflow carries it: ``resume_phase``)."""
    inp = _inp(node)
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.power_cycle_machine, inp)
    phase = ei.value.details[0]["phase"]
    assert not ei.value.non_retryable
    return await ActivityEnvironment().run(
        acts.power_cycle_machine, inp.model_copy(update={"resume_phase": phase}))


async def test_a_forceoff_whose_answer_was_lost_is_not_sent_again(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The power cycle's ``ForceOff`` reached the BMC, but the HTTP answer was lost; the
    try failed in phase ``not_started`` and the retry, reading power ``On`` (the BMC had
    not applied it yet), sent ``ForceOff`` again: the disruptive command twice in one
    attempt (I16). Rail: the phase "ForceOff possibly sent" is carried; the retry waits a
    bounded time for ``Off`` before it sends anything."""
    monkeypatch.setattr(power, "FORCE_OFF_LANDED_S", 30.0, raising=False)
    bmc = _LostAnswer(lands=True)
    bmc.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    res = await _first_try_then_retry(acts, "gpu-02")
    assert bmc.sent == ["ForceOff", "On"], (bmc.sent, res)
    assert res.done and res.phase == "booted", res
    assert (await acts.machine(_inp("gpu-02")).power_state()).lower() == "on"


async def test_a_forceoff_that_never_landed_is_sent_once_more_after_the_bound(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lost ``ForceOff`` never reached the BMC: the host stays On for the whole bound,
    so the first one demonstrably did not land and the retry sends it (the only one that
    reaches the host), then completes the cycle."""
    monkeypatch.setattr(power, "FORCE_OFF_LANDED_S", 2.0, raising=False)
    bmc = _LostAnswer(lands=False)
    bmc.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    res = await _first_try_then_retry(acts, "gpu-02")
    assert bmc.sent == ["ForceOff", "ForceOff", "On"], (bmc.sent, res)
    assert res.done and "did not land" in res.detail, res.detail
    assert (await acts.machine(_inp("gpu-02")).power_state()).lower() == "on"
