"""Power and provisioning activities against the sushy-tools Redfish emulator."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.power import PowerActivities, RedfishMachine
from activities.provisioning import ProvisioningActivities
from activities.scheduler.kube import KubeScheduler
from tests.fixtures.kube import KubeApi
from workers.devpeers import RedfishEmulator, start_redfish_emulator
from workflows.activity_api import (
    ERR_AUTH,
    ERR_UNKNOWN_NODE,
    ERR_UNSUPPORTED,
    MachineActionInput,
)
from workflows.config import (
    AutorepairConfig,
    BmcConfig,
    ClusterConfig,
    NodeConfig,
    SecretsConfig,
)


def _config(emu: RedfishEmulator, secrets_file: Path, **cluster: object) -> AutorepairConfig:
    nodes = [NodeConfig(name=n, machine=n, bmc=BmcConfig(address=emu.url, system_id=sid))
             for n, sid in emu.systems.items()]
    return AutorepairConfig(
        clusters=[ClusterConfig(name="rf", scheduler="kubernetes", nodes=nodes,
                                provision_image=emu.image_url, **cluster)],  # type: ignore[arg-type]
        secrets=SecretsConfig(bmc_credentials_file=str(secrets_file)),
    )


def _inp(node: str, **kw: object) -> MachineActionInput:
    return MachineActionInput(cluster="rf", node=node, machine=node, repair_id="r-1", **kw)  # type: ignore[arg-type]


async def _wait_power(m: RedfishMachine, want: str, limit_s: float = 30) -> None:
    deadline = time.monotonic() + limit_s
    while (await m.power_state()).lower() != want.lower():
        assert time.monotonic() < deadline, f"power never {want}"
        await asyncio.sleep(0.3)


async def test_reboot(redfish_emulator: RedfishEmulator, bmc_secrets_file: Path) -> None:
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    res = await ActivityEnvironment().run(acts.reboot_machine, _inp("gpu-01"))
    assert res.done and "GracefulRestart" in res.detail
    assert (await acts.machine(_inp("gpu-01")).power_state()).lower() == "on"


async def test_power_cycle_crash_between_off_and_on_completes_once(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, kube_api: KubeApi
) -> None:
    kube_api.add_node("gpu-02", boot_id="boot-A")
    cfg = _config(redfish_emulator, bmc_secrets_file)
    sched = KubeScheduler(cfg.cluster("rf"), api_client=kube_api.api_client)

    async def health(cluster: str, node: str):  # type: ignore[no-untyped-def]
        return await sched.node_health(node)

    acts = PowerActivities(cfg, health=health)
    m = acts.machine(_inp("gpu-02"))
    inp = _inp("gpu-02", boot_id_before="boot-A")

    # first attempt: crash (worker killed) after ForceOff, before On
    first = asyncio.create_task(ActivityEnvironment().run(acts.power_cycle_machine, inp))
    await _wait_power(m, "Off")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert (await m.power_state()).lower() == "off"

    # the retry finds the host Off with the old boot id: only powers it on
    res = await ActivityEnvironment().run(acts.power_cycle_machine, inp)
    assert res.done and "ForceOff" not in res.detail and "resuming" in res.detail
    assert (await m.power_state()).lower() == "on"

    # the kubelet reports the new boot; another retry must not cycle again
    kube_api.set_boot_id("gpu-02", "boot-B")
    again = await ActivityEnvironment().run(acts.power_cycle_machine, inp)
    assert again.done and "boot-A -> boot-B" in again.skipped_reason
    assert (await m.power_state()).lower() == "on"


async def test_retry_after_on_sent_does_not_cycle_again(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path
) -> None:
    from temporalio.activity import Info

    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    env = ActivityEnvironment()
    env.info = Info(**{**env.info.__dict__, "heartbeat_details": [{"phase": "on_sent"}]})
    res = await env.run(acts.power_cycle_machine, _inp("gpu-03"))
    assert res.done and res.detail == "resumed at on_sent: On already sent"
    assert res.phase == "booted"


async def test_resume_phase_from_the_workflow_never_sends_forceoff_again(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path
) -> None:
    """Issue 26 reproduction 2 at the BMC: the workflow carries the phase the earlier try
    reached (``resume_phase``), no heartbeat needed; a bad phase is refused by name."""
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    m = acts.machine(_inp("gpu-03"))
    assert (await m.power_state()).lower() == "on"
    inp = _inp("gpu-03").model_copy(update={"resume_phase": "on_sent"})
    res = await ActivityEnvironment().run(acts.power_cycle_machine, inp)
    assert res.done and "ForceOff" not in res.detail and res.phase == "booted"
    assert (await m.power_state()).lower() == "on"
    bad = _inp("gpu-03").model_copy(update={"resume_phase": "halfway"})
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.power_cycle_machine, bad)
    assert ei.value.non_retryable and "resume_phase: 'halfway'" in str(ei.value)


async def test_wrong_credentials_non_retryable_without_password(
    redfish_emulator: RedfishEmulator, tmp_path: Path
) -> None:
    bad = tmp_path / "bmc.yaml"
    bad.write_text("default: {username: admin, password: wrong-pass-123}\n")
    acts = PowerActivities(_config(redfish_emulator, bad))
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.reboot_machine, _inp("gpu-01"))
    err = ei.value
    assert err.type == ERR_AUTH and err.non_retryable
    assert redfish_emulator.url in str(err) and "admin" in str(err)
    assert "wrong-pass-123" not in str(err) and err.__cause__ is None
    assert redfish_emulator.password not in repr(err)


async def test_virtual_media_reprovision(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path
) -> None:
    cfg = _config(redfish_emulator, bmc_secrets_file)
    prov = ProvisioningActivities(cfg)
    m = RedfishMachine(cfg, "rf", "gpu-04", "gpu-04")
    await eject_media(m)  # another test's reprovision may have left its image in
    res = await ActivityEnvironment().run(prov.reprovision_machine, _inp("gpu-04"))
    assert res.done, res
    assert f"inserted {redfish_emulator.image_url}" in res.detail
    assert "boot override Cd once" in res.detail and "image left inserted" in res.detail

    def boot(s):  # type: ignore[no-untyped-def]
        return (getattr(s.boot.target, "value", s.boot.target),
                [vm.inserted for vm in s.virtual_media.get_members()])

    target, inserted = await m.call(boot)
    assert target == "Cd" and any(inserted)  # the installer still needs it
    assert (await m.power_state()).lower() == "on"
    await eject_media(m)  # the emulator is shared by the session's tests


async def eject_media(m: RedfishMachine) -> None:
    """Eject every inserted virtual medium of ``m`` (a reprovision leaves its installer
    image in for the host to boot from; the emulator is shared by the session's tests)."""

    def eject(s):  # type: ignore[no-untyped-def]
        for vm in s.virtual_media.get_members():
            if vm.inserted:
                vm.eject_media()

    await m.call(eject)


async def test_reprovision_resumed_after_its_restart_sends_no_second_restart(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path
) -> None:
    """I16 at the BMC: a retry of a reprovision whose earlier try sent the restart (the
    repair carries ``resume_phase``, no heartbeat needed) only waits for the host and
    leaves the image for the installer: nothing inserted, no second restart mid-reimage.
    A bad phase is refused by name."""
    prov = ProvisioningActivities(_config(redfish_emulator, bmc_secrets_file))
    inp = _inp("gpu-04").model_copy(update={"resume_phase": "provision_started"})
    res = await ActivityEnvironment().run(prov.reprovision_machine, inp)
    assert res.done and res.phase == "booted", res
    assert "restart already sent by an earlier try of this attempt" in res.detail
    assert "ForceRestart" not in res.detail and "inserted http" not in res.detail
    bad = _inp("gpu-04").model_copy(update={"resume_phase": "restart_sent"})
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(prov.reprovision_machine, bad)
    assert ei.value.non_retryable and "resume_phase: 'restart_sent'" in str(ei.value)


async def test_redfish_migrate_without_ledger_names_the_setting(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path
) -> None:
    prov = ProvisioningActivities(_config(redfish_emulator, bmc_secrets_file))
    for act in (prov.migrate_node, prov.remove_machine):
        with pytest.raises(ApplicationError) as ei:
            await ActivityEnvironment().run(act, _inp("gpu-01"))
        assert ei.value.type == ERR_UNSUPPORTED and ei.value.non_retryable
        assert "ledger.dsn" in str(ei.value)


@pytest.fixture(scope="module")
def idrac_like_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedfishEmulator]:
    """An emulator with one system named as a Dell iDRAC names it, not after the host."""
    emu = start_redfish_emulator(tmp_path_factory.mktemp("idrac"), ("gpu-09",),
                                 password="pw-" + secrets.token_hex(8),
                                 system_ids={"gpu-09": "System.Embedded.1"})
    try:
        yield emu
    finally:
        emu.stop()


def _one_node(emu: RedfishEmulator, secrets_file: Path, node: str,
              system_id: str | None) -> AutorepairConfig:
    return AutorepairConfig(
        clusters=[ClusterConfig(name="rf", scheduler="kubernetes", nodes=[NodeConfig(
            name=node, machine=node, bmc=BmcConfig(address=emu.url, system_id=system_id))])],
        secrets=SecretsConfig(bmc_credentials_file=str(secrets_file)),
    )


async def test_single_system_is_used_without_system_id(
    idrac_like_emulator: RedfishEmulator, tmp_path: Path
) -> None:
    emu = idrac_like_emulator
    creds = tmp_path / "bmc.yaml"
    creds.write_text(f"default: {{username: {emu.username}, password: {emu.password}}}\n")
    cfg = _one_node(emu, creds, "gpu-09", None)
    m = RedfishMachine(cfg, "rf", "gpu-09", "gpu-09")
    ident = await m.call(lambda s: s.identity)
    assert ident == "System.Embedded.1"
    res = await ActivityEnvironment().run(PowerActivities(cfg).reboot_machine, MachineActionInput(
        cluster="rf", node="gpu-09", machine="gpu-09", repair_id="r-9"))
    assert res.done
    # the configured id is used as given
    cfg = _one_node(emu, creds, "gpu-09", "System.Embedded.1")
    assert await RedfishMachine(cfg, "rf", "gpu-09", "gpu-09").call(
        lambda s: s.identity) == "System.Embedded.1"


async def test_several_systems_without_system_id_lists_them(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path
) -> None:
    # the node is named like one of the systems: the host name is still not used to pick
    cfg = _one_node(redfish_emulator, bmc_secrets_file, "gpu-01", None)
    with pytest.raises(ApplicationError) as ei:
        await RedfishMachine(cfg, "rf", "gpu-01", "gpu-01").power_state()
    err = ei.value
    assert err.type == ERR_UNKNOWN_NODE and err.non_retryable
    assert "bmc.system_id is not set" in str(err)
    for sid in redfish_emulator.systems.values():
        assert f"/redfish/v1/Systems/{sid}" in str(err)
    assert "set bmc.system_id of node gpu-01" in str(err)


async def test_unknown_system_id_lists_the_members(
    idrac_like_emulator: RedfishEmulator, tmp_path: Path
) -> None:
    emu = idrac_like_emulator
    creds = tmp_path / "bmc.yaml"
    creds.write_text(f"default: {{username: {emu.username}, password: {emu.password}}}\n")
    cfg = _one_node(emu, creds, "gpu-09", "System.Embedded.2")
    with pytest.raises(ApplicationError) as ei:
        await RedfishMachine(cfg, "rf", "gpu-09", "gpu-09").power_state()
    assert ei.value.type == ERR_UNKNOWN_NODE
    assert "bmc.system_id 'System.Embedded.2' is not a system of this BMC" in str(ei.value)
    assert "/redfish/v1/Systems/System.Embedded.1" in str(ei.value)
