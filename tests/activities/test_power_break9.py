"""Break-test round 9: power activities against the sushy-tools Redfish emulator (each
test failed before its fix).

- a reboot's ``ForceRestart`` fallback was sent by the same activity call that sent the
  ``GracefulRestart``, up to ``RESTART_SEEN_S`` (15 min) later: the workflow hears of a
  cancel only when the call returns, so a person's cancel during that wait was followed
  by a ``ForceRestart`` (I19: a cancel takes no further action). The call now ends in
  phase ``restart_unseen`` (a transient failure) and the ``ForceRestart`` is the retry's,
  which the workflow runs only when no stop came;
- a ``GracefulRestart`` whose HTTP answer was lost was sent again by the retry (the try
  failed in phase ``not_started``), as ``ForceOff`` was before ``off_requested``;
- a ``ForceRestart`` whose HTTP answer was lost was sent again by the next retry;
- an ``On`` (the reboot of a host found Off) whose HTTP answer was lost was followed by
  a ``GracefulRestart`` from the retry, to the host it had just powered on;
- a boot identity the scheduler could not give during the whole wait counted as
  "unchanged", so a host that restarted warm (power never Off) got a ``ForceRestart``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sushy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import power
from activities.power import PowerActivities, RedfishMachine
from tests.activities.test_power_break6 import _Host
from tests.activities.test_redfish_power import _config, _inp
from workers.devpeers import RedfishEmulator
from workflows.activity_api import NodeHealth


async def _settled(acts: PowerActivities, node: str, quiet_s: float = 12.0) -> None:
    """Wait until ``node``'s power has read On for ``quiet_s`` in a row (the emulator
    applies a reset up to ~11 s late): the next test finds the host at rest."""
    m = acts.machine(_inp(node))
    loop = asyncio.get_running_loop()
    deadline, since = loop.time() + 90, loop.time()
    while loop.time() - since < quiet_s:
        assert loop.time() < deadline, "the emulated host never settled On"
        if (await m.power_state()).lower() != "on":
            since = loop.time()
        await asyncio.sleep(0.5)


async def test_the_force_restart_is_not_sent_by_the_call_a_cancel_cannot_reach(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OS hangs: ``GracefulRestart`` is accepted and never acted on. The call that
    sent it waited ``RESTART_SEEN_S`` and then sent ``ForceRestart`` itself, so a cancel
    the workflow received meanwhile could not stop it. Rail: that call ends once the
    window passed, in phase ``restart_unseen`` (retryable), having sent only the
    ``GracefulRestart``; the retry from ``restart_unseen`` (the workflow's, when no stop
    came) sends ``ForceRestart`` once."""
    monkeypatch.setattr(power, "RESTART_SEEN_S", 2.0, raising=False)
    host = _Host(hung=True)
    host.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file), health=host.health)
    inp = _inp("gpu-01", boot_id_before="boot-A")
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.reboot_machine, inp)
    assert host.sent == ["GracefulRestart"], host.sent
    assert not ei.value.non_retryable, ei.value
    assert ei.value.details[0]["phase"] == "restart_unseen", ei.value.details
    assert "2 s" in str(ei.value), ei.value

    res = await ActivityEnvironment().run(
        acts.reboot_machine, inp.model_copy(update={"resume_phase": "restart_unseen"}))
    assert host.sent == ["GracefulRestart", "ForceRestart"], (host.sent, res)
    assert res.done and res.phase == "booted" and "ForceRestart" in res.detail, res
    await _settled(acts, "gpu-01")


class _LostRestart:
    """A BMC whose answer to the first ``GracefulRestart`` is lost (the connection drops
    after the request went out); the request landed, and the host restarts ``after_s``
    later (its boot id changes then). ``host.sent`` lists every reset request made."""

    def __init__(self, host: _Host, after_s: float = 2.0) -> None:
        self.host, self.after_s = host, after_s
        self.tasks: list[asyncio.Task[None]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = RedfishMachine.reset
        bmc = self

        async def reset(self: RedfishMachine, reset_type: str) -> None:
            kind = str(getattr(reset_type, "value", reset_type))
            bmc.host.sent.append(kind)
            if kind == "GracefulRestart" and bmc.host.sent.count(kind) == 1:
                async def later() -> None:
                    await asyncio.sleep(bmc.after_s)
                    await original(self, reset_type)
                    bmc.host.boot = "boot-B"

                bmc.tasks.append(asyncio.create_task(later()))
                raise power.BmcUnavailable(f"{self._where()} unavailable: ConnectionError")
            await original(self, reset_type)
            if "Restart" in kind:
                bmc.host.boot = "boot-B"

        monkeypatch.setattr(RedfishMachine, "reset", reset)


async def test_a_graceful_restart_whose_answer_was_lost_is_not_sent_again(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reboot's ``GracefulRestart`` reached the BMC but its HTTP answer was lost: the
    try failed in phase ``not_started``, so the retry (the host still On, its boot id
    unchanged: the BMC had not applied it yet) sent the restart again — two restarts in
    one attempt (I16); a retry after the host came back found it "already rebooted" and
    the attempt went unrecorded (I22). Rail: the restart counts as possibly sent from the
    moment it goes out (phase ``restart_sent``); the retry waits for it to show."""
    monkeypatch.setattr(power, "RESTART_SEEN_S", 30.0, raising=False)
    host = _Host(hung=False)
    bmc = _LostRestart(host)
    bmc.install(monkeypatch)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file), health=host.health)
    inp = _inp("gpu-01", boot_id_before="boot-A")
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.reboot_machine, inp)
    phase = ei.value.details[0]["phase"]
    assert not ei.value.non_retryable
    assert phase == "restart_sent", phase
    res = await ActivityEnvironment().run(
        acts.reboot_machine, inp.model_copy(update={"resume_phase": phase}))
    await asyncio.gather(*bmc.tasks)
    await _settled(acts, "gpu-01")
    assert host.sent == ["GracefulRestart"], (host.sent, res)
    assert res.done and res.phase == "booted" and "restart seen" in res.detail, res


async def test_a_boot_identity_that_cannot_be_read_forces_no_restart(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler cannot be read during the whole wait (its API down), and the host
    restarts warm (the power never reads Off). With no boot identity to compare the
    restart cannot be judged, yet an unreadable one counted as "unchanged": a
    ``ForceRestart`` followed, a second restart of a host that had acted on the first
    (I16). Rail: an identity that could not be read is one that is not there — the power
    alone decides, as without a recorded identity (wait for On, say not observed)."""
    monkeypatch.setattr(power, "RESTART_SEEN_S", 2.0, raising=False)
    host = _Host(hung=True)  # power stays On: a warm restart shows nothing else
    host.install(monkeypatch)

    async def unreachable(cluster: str, node: str) -> NodeHealth:
        raise ConnectionError("scheduler API unreachable")

    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file), health=unreachable)
    res = await ActivityEnvironment().run(acts.reboot_machine,
                                          _inp("gpu-01", boot_id_before="boot-A"))
    assert host.sent == ["GracefulRestart"], (host.sent, res)
    assert res.done and res.phase == "booted", res
    assert "not observed" in res.detail and "could not be read" in res.detail, res.detail


async def test_a_force_restart_whose_answer_was_lost_is_not_sent_again(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry from ``restart_unseen`` sends ``ForceRestart``; its HTTP answer is lost
    (the request landed, the BMC applies it 2 s later). The try failed in phase
    ``restart_unseen``, so the next retry, reading power On (a forced restart need not
    show Off), sent ``ForceRestart`` again (I16). Rail: it counts as sent from the moment
    it goes out (``force_restart_sent``); the next retry only waits for power On."""
    host = _Host(hung=True)
    original = RedfishMachine.reset
    tasks: list[asyncio.Task[None]] = []

    async def reset(self: RedfishMachine, reset_type: str) -> None:
        kind = str(getattr(reset_type, "value", reset_type))
        host.sent.append(kind)
        if kind == "ForceRestart" and host.sent.count(kind) == 1:
            async def later() -> None:
                await asyncio.sleep(2.0)
                await original(self, reset_type)

            tasks.append(asyncio.create_task(later()))
            raise power.BmcUnavailable(f"{self._where()} unavailable: ConnectionError")
        await original(self, reset_type)

    monkeypatch.setattr(RedfishMachine, "reset", reset)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file), health=host.health)
    inp = _inp("gpu-01", boot_id_before="boot-A", resume_phase="restart_unseen")
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.reboot_machine, inp)
    phase = ei.value.details[0]["phase"]
    assert not ei.value.non_retryable
    res = await ActivityEnvironment().run(
        acts.reboot_machine, inp.model_copy(update={"resume_phase": phase}))
    await asyncio.gather(*tasks)
    await _settled(acts, "gpu-01")
    assert host.sent == ["ForceRestart"], (host.sent, res)
    assert phase == "force_restart_sent", phase
    assert res.done and res.phase == "booted", res


async def test_an_on_whose_answer_was_lost_is_not_followed_by_a_restart(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reboot finds the host Off and sends ``On``; its HTTP answer is lost (the BMC
    applies it 2 s later). The try failed in phase ``not_started``, so the retry (after
    the workflow's 10 s back-off, the host On and booting) sent ``GracefulRestart``: a
    second restart command in one attempt, to a host still booting (I16). Rail: the
    ``On`` counts as sent from the moment it goes out (``restart_seen``: the retry only
    waits for power On)."""
    host = _Host(hung=False)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file), health=host.health)
    inp = _inp("gpu-01", boot_id_before="boot-A")
    m = acts.machine(inp)
    await m.reset(sushy.RESET_FORCE_OFF)
    await m.wait_power("Off", "test", limit_s=60)
    original = RedfishMachine.reset
    tasks: list[asyncio.Task[None]] = []

    async def reset(self: RedfishMachine, reset_type: str) -> None:
        kind = str(getattr(reset_type, "value", reset_type))
        host.sent.append(kind)
        if kind == "On" and host.sent.count(kind) == 1:
            async def later() -> None:
                await asyncio.sleep(2.0)
                await original(self, reset_type)

            tasks.append(asyncio.create_task(later()))
            raise power.BmcUnavailable(f"{self._where()} unavailable: ConnectionError")
        await original(self, reset_type)

    monkeypatch.setattr(RedfishMachine, "reset", reset)
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.reboot_machine, inp)
    phase = ei.value.details[0]["phase"]
    await asyncio.gather(*tasks)
    await m.wait_power("On", "test", limit_s=60)  # the back-off: the On landed meanwhile
    res = await ActivityEnvironment().run(
        acts.reboot_machine, inp.model_copy(update={"resume_phase": phase}))
    await _settled(acts, "gpu-01")
    assert host.sent == ["On"], (host.sent, res)
    assert res.done and res.phase == "booted", res
