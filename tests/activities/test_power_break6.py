"""Break-test round 6: power activities against the sushy-tools Redfish emulator.

- a GracefulRestart sent to a hung OS reported the reboot done at once: the BMC accepted
  the request, the OS never acted on it, and only the repair's rejoin timeout (30 min)
  noticed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities import power
from activities.power import PowerActivities, RedfishMachine
from tests.activities.test_redfish_power import _config, _inp
from workers.devpeers import RedfishEmulator
from workflows.activity_api import NodeHealth


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
    res = await ActivityEnvironment().run(acts.reboot_machine, inp)
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
