"""A power cycle's retry resumed at ``off_sent`` whose host went Off and came back On
between tries (the earlier try's ForceOff landed; the try died before it read Off; the
BMC's power-restore policy or a person powered the host on). Its power reads ``On``, as
that of a host the ForceOff has not reached yet, so the power alone cannot tell the two
apart; the boot identity can, once the kubelet / slurmd reports the new boot. Before, the
retry waited ``POWER_WAIT_S`` (600 s) for an Off that never came, and only the next
retry's boot-identity check saw the host back. Rail: the wait for Off asks the boot
identity at every ``On`` read and takes a new one as the cycle; ForceOff and On are
never sent again (I16). A host On with its old boot identity is still waited on (the
safe behaviour: nothing tells it from one the ForceOff never reached)."""

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
from activities.scheduler.kube import KubeScheduler
from tests.activities.test_redfish_power import _config, _inp, _wait_power
from tests.fixtures.kube import KubeApi
from workers.devpeers import RedfishEmulator


def _setup(redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, kube_api: KubeApi,
           monkeypatch: pytest.MonkeyPatch) -> tuple[PowerActivities, list[str]]:
    kube_api.add_node("gpu-02", boot_id="boot-A")
    cfg = _config(redfish_emulator, bmc_secrets_file)
    sched = KubeScheduler(cfg.cluster("rf"), api_client=kube_api.api_client)

    async def health(cluster: str, node: str):  # type: ignore[no-untyped-def]
        return await sched.node_health(node)

    sent: list[str] = []
    real_reset = RedfishMachine.reset

    async def reset(self: RedfishMachine, reset_type: str) -> None:
        sent.append(str(getattr(reset_type, "value", reset_type)))
        await real_reset(self, reset_type)

    monkeypatch.setattr(RedfishMachine, "reset", reset)
    monkeypatch.setattr(power, "POWER_POLL_S", 0.05, raising=False)
    return PowerActivities(cfg, health=health), sent


async def _off_and_back(m: RedfishMachine, sent: list[str]) -> None:
    """The earlier try's ForceOff landed, and the host came back On by itself."""
    if (await m.power_state()).lower() != "on":
        await m.reset(sushy.RESET_ON)
        await _wait_power(m, "On")
    await m.reset(sushy.RESET_FORCE_OFF)
    await _wait_power(m, "Off")
    await m.reset(sushy.RESET_ON)
    await _wait_power(m, "On")
    sent.clear()


async def _retry_sees_the_new_boot(acts: PowerActivities, sent: list[str],
                                   kube_api: KubeApi, phase: str) -> None:
    """A retry resumed at ``phase`` on a host that went off and came back between tries;
    the kubelet reports the new boot only once the retry watches the power in ``phase``
    (at its start the identity had not changed yet: the retry went on to watch)."""
    m = acts.machine(_inp("gpu-02"))
    await _off_and_back(m, sent)
    env = ActivityEnvironment()

    def on_beat(*details: Any) -> None:
        if any(isinstance(d, dict) and d.get("phase") == phase for d in details):
            kube_api.set_boot_id("gpu-02", "boot-B")

    env.on_heartbeat = on_beat
    inp = _inp("gpu-02", resume_phase=phase, boot_id_before="boot-A")
    res = await asyncio.wait_for(env.run(acts.power_cycle_machine, inp), 30)
    assert sent == [], (sent, res)
    assert res.done and res.phase == "booted" and not res.skipped_reason, res
    assert "boot id changed boot-A -> boot-B" in res.detail, res.detail
    assert "the cycle happened" in res.detail, res.detail
    assert (await m.power_state()).lower() == "on"


async def test_a_retry_at_off_sent_takes_a_new_boot_as_the_cycle(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, kube_api: KubeApi,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acts, sent = _setup(redfish_emulator, bmc_secrets_file, kube_api, monkeypatch)
    # before the fix the retry waited POWER_WAIT_S (600 s) for an Off
    await _retry_sees_the_new_boot(acts, sent, kube_api, "off_sent")


async def test_a_host_on_with_its_old_boot_is_still_waited_for(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, kube_api: KubeApi,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same host with the kubelet still reporting the old boot: nothing tells it from
    one the ForceOff has not reached, so the retry waits for Off (here 1 s) and fails
    retryably at off_sent, sending nothing."""
    acts, sent = _setup(redfish_emulator, bmc_secrets_file, kube_api, monkeypatch)
    monkeypatch.setattr(power, "POWER_WAIT_S", 1.0, raising=False)
    m = acts.machine(_inp("gpu-02"))
    await _off_and_back(m, sent)
    inp = _inp("gpu-02", resume_phase="off_sent", boot_id_before="boot-A")
    with pytest.raises(ApplicationError) as ei:
        await asyncio.wait_for(ActivityEnvironment().run(acts.power_cycle_machine, inp), 30)
    assert sent == [], sent
    assert ei.value.details[0]["phase"] == "off_sent", ei.value.details
    assert not ei.value.non_retryable and ei.value.type == "BmcUnavailable", ei.value


async def test_a_retry_at_off_requested_takes_a_new_boot_as_the_cycle(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, kube_api: KubeApi,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same between tries, on a retry resumed at ``off_requested`` (the earlier
    ForceOff's answer was lost): the retry watches the power for up to
    ``FORCE_OFF_LANDED_S`` to learn whether that ForceOff landed, reads ``On`` (the host
    is back already) and, before, sent ForceOff again at the end of the watch although
    the kubelet had reported the new boot meanwhile: a second cycle of a booting host
    (I16, reproduction 2's family). The watch asks the boot identity at every ``On``
    read now: the new boot is the cycle, nothing is sent."""
    acts, sent = _setup(redfish_emulator, bmc_secrets_file, kube_api, monkeypatch)
    monkeypatch.setattr(power, "FORCE_OFF_LANDED_S", 2.0, raising=False)
    # before the fix the watch ended with ForceOff sent to the host back from its cycle
    await _retry_sees_the_new_boot(acts, sent, kube_api, "off_requested")
