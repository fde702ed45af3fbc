"""Break-test round 5: power activities against the sushy-tools Redfish emulator."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from sushy import exceptions as sushy_exc
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.power import PowerActivities, RedfishMachine
from activities.provisioning import ProvisioningActivities
from tests.activities.test_redfish_power import _config, _inp, eject_media
from workers.devpeers import RedfishEmulator


async def test_power_cycle_resumed_after_on_does_not_send_on_to_a_running_host(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cycle's ``On`` reached the BMC but its HTTP answer was lost (the BMC
    blinked), so the try failed in phase ``off_seen`` and the retry resumed there. It sent
    ``On`` again to a host that was already On and booting. A Dell iDRAC answers that with
    409 Conflict ("server is already powered ON"), which the activity classed as a BMC
    outage and retried, failing the same way on every retry while the host was fine.
    The rail (scenario 15, docs/design.md §6 "check the current state, act only if
    needed"): a resumed phase looks at the power state before it acts again; a host
    already On is only waited for."""
    original = RedfishMachine.reset

    async def idrac_like(self: RedfishMachine, reset_type: str) -> None:
        if str(getattr(reset_type, "value", reset_type)) == "On" and (
                await self.power_state()).lower() == "on":
            answer = requests.Response()
            answer.status_code = 409
            answer._content = (b'{"error": {"message": "The server is already powered ON."}}')
            raise sushy_exc.HTTPError(method="POST", url=self.address, response=answer)
        await original(self, reset_type)

    monkeypatch.setattr(RedfishMachine, "reset", idrac_like)
    acts = PowerActivities(_config(redfish_emulator, bmc_secrets_file))
    m = acts.machine(_inp("gpu-03"))
    assert (await m.power_state()).lower() == "on"
    inp = _inp("gpu-03").model_copy(update={"resume_phase": "off_seen"})
    res = await ActivityEnvironment().run(acts.power_cycle_machine, inp)
    assert res.done and res.phase == "booted", res
    assert "ForceOff" not in res.detail


async def test_reprovision_leaves_the_installer_inserted_when_the_host_powers_on(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path
) -> None:
    """A quick reprovision through virtual media inserted the clean image, set a one-time
    boot from CD, restarted the host, waited for power ``On`` and then ejected the image.
    Power ``On`` is the start of POST (on most BMCs a ForceRestart never even shows Off),
    minutes before the firmware reads the CD and the installer copies the image: the host
    found no media, fell through to its disk and booted the old system, and the
    reprovision reported done with nothing reimaged. The media must stay inserted while
    the host boots from it (the override is ``Once``: later boots go to the disk); a
    later reprovision replaces it."""
    cfg = _config(redfish_emulator, bmc_secrets_file)
    prov = ProvisioningActivities(cfg)
    m = RedfishMachine(cfg, "rf", "gpu-04", "gpu-04")
    await eject_media(m)  # another test's reprovision may have left its image in
    res = await ActivityEnvironment().run(prov.reprovision_machine, _inp("gpu-04"))
    assert res.done and res.phase == "booted", res

    def media(s):  # type: ignore[no-untyped-def]
        return (getattr(s.boot.target, "value", s.boot.target),
                [(vm.inserted, vm.image) for vm in s.virtual_media.get_members()])

    # (sushy-tools' template always reports BootSourceOverrideEnabled "Continuous")
    target, inserted = await m.call(media)
    assert target == "Cd"
    assert (True, redfish_emulator.image_url) in inserted, inserted
    # a second reprovision finds its image in place and reuses it
    again = await ActivityEnvironment().run(prov.reprovision_machine, _inp("gpu-04"))
    assert again.done and "image already inserted" in again.detail
    await eject_media(m)  # the emulator is shared by the session's tests


async def test_a_node_migrated_to_a_machine_without_a_bmc_never_cycles_its_old_machine(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path
) -> None:
    """gpu-01 was migrated to the spare ``spare-9`` (a spare-pool entry with no BMC in the
    configuration; the migrate said "no BMC configured ... left as it is"), and its old
    machine went to re-validation. A later power cycle of gpu-01 followed the binding to
    spare-9, found no configuration entry for it, fell back to the node's own entry and
    sent ForceOff to the BMC of the OLD machine: the machine under validation lost power
    and the host that runs gpu-01 was never touched. An action on a machine without a
    configured BMC must fail naming that machine (non-retryable), touching nothing."""
    cfg = _config(redfish_emulator, bmc_secrets_file)

    async def bound(cluster: str, node: str) -> str | None:
        return "spare-9" if node == "gpu-01" else None

    acts = PowerActivities(cfg, bindings=bound)
    old = RedfishMachine(cfg, "rf", "gpu-01", "gpu-01")
    assert (await old.power_state()).lower() == "on"
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.power_cycle_machine, _inp("gpu-01"))
    assert ei.value.non_retryable and "spare-9" in str(ei.value)
    assert (await old.power_state()).lower() == "on"
