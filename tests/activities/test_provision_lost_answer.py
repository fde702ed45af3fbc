"""A reprovision's restart whose HTTP answer was lost is never sent again (I16).

The virtual-media reprovision inserts the clean image, sets a one-time boot from it and
sends ``ForceRestart`` (or ``On`` to a host found off). When the BMC applied the restart
but its answer was lost (the connection dropped after the request went out), the try
failed in phase ``not_started``: the phase was recorded only after the answer came. The
retry then inserted, overrode and restarted again — a second restart in one attempt,
into the installer the first one had just booted, and a failure after that counted no
attempt (I22). The restart is "possibly sent" from the moment it goes out: the phase is
recorded before the request; only a refusal the BMC answered puts it back. A restart
that never landed is caught by the repair's rejoin check (a reprovision must come back
with a new boot identity), never by a blind second restart.

sushy-tools Redfish emulator; the lost answer is played by wrapping ``RedfishMachine.reset``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import power
from activities.power import RedfishMachine
from activities.provisioning import ProvisioningActivities
from tests.activities.test_redfish_power import _config, _inp, eject_media
from workers.devpeers import RedfishEmulator
from workflows.activity_api import ERR_UNSUPPORTED, MachineActionInput, permanent


def _kind(reset_type: object) -> str:
    return str(getattr(reset_type, "value", reset_type))


class _Bmc:
    """Every reset request the activity makes (``sent``); the first one's answer is lost
    after the BMC applied it (``lost``), or the BMC answers the first with a refusal
    (``refuse``)."""

    def __init__(self, lost: bool = False, refuse: bool = False) -> None:
        self.lost, self.refuse = lost, refuse
        self.sent: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = RedfishMachine.reset
        bmc = self

        async def reset(self: RedfishMachine, reset_type: str) -> None:
            bmc.sent.append(_kind(reset_type))
            if len(bmc.sent) == 1 and bmc.refuse:
                raise permanent(ERR_UNSUPPORTED,
                                f"{self._where()} refused the request: BadRequestError")
            await original(self, reset_type)
            if len(bmc.sent) == 1 and bmc.lost:
                raise power.BmcUnavailable(f"{self._where()} unavailable: ConnectionError")

        monkeypatch.setattr(RedfishMachine, "reset", reset)


async def _reprovision_under(bmc: _Bmc, emu: RedfishEmulator, secrets: Path,
                             monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    """A reprovision of gpu-04 whose first try fails as ``bmc`` plays it, then (when the
    failure is retryable) its retry resumed from the phase the failure reported, as the
    workflow carries it. Returns ``(phase reported, retry's result or None)``."""
    cfg = _config(emu, secrets)
    prov = ProvisioningActivities(cfg)
    m = RedfishMachine(cfg, "rf", "gpu-04", "gpu-04")
    await eject_media(m)
    bmc.install(monkeypatch)
    inp = _inp("gpu-04")
    try:
        with pytest.raises(ApplicationError) as ei:
            await ActivityEnvironment().run(prov.reprovision_machine, inp)
        phase = ei.value.details[0]["phase"]
        if ei.value.non_retryable:
            return phase, None
        return phase, await ActivityEnvironment().run(
            prov.reprovision_machine, inp.model_copy(update={"resume_phase": phase}))
    finally:
        monkeypatch.undo()
        await eject_media(m)


async def test_a_reprovision_restart_whose_answer_was_lost_is_not_sent_again(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bmc = _Bmc(lost=True)
    phase, res = await _reprovision_under(bmc, redfish_emulator, bmc_secrets_file, monkeypatch)
    assert phase == "provision_started", phase  # touched: counts as an attempt (I22)
    assert len(bmc.sent) == 1, bmc.sent  # one restart in the attempt (I16)
    assert res is not None and res.done and res.phase == "booted", res
    assert "restart already sent" in res.detail, res.detail


async def test_a_reprovision_restart_the_bmc_refused_reports_nothing_touched(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bmc = _Bmc(refuse=True)
    phase, res = await _reprovision_under(bmc, redfish_emulator, bmc_secrets_file, monkeypatch)
    assert phase == "not_started", phase  # the BMC answered: nothing was sent
    assert res is None and len(bmc.sent) == 1, (bmc.sent, res)


async def test_a_migrate_restart_whose_answer_was_lost_is_not_sent_again(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, ledger_pool: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same for a migrate's bring-up of the spare (no provision image: power On /
    ForceRestart of the new machine): the retry finds its binding (``started``) and,
    with the restart possibly sent, only waits for the spare to be On."""
    from tests.activities.test_provisioning_ledger import _config as ledger_config

    cluster = "lost-" + uuid.uuid4().hex[:8]
    cfg = ledger_config(redfish_emulator, bmc_secrets_file, cluster, spares=["gpu-04"])
    prov = ProvisioningActivities(cfg, pool=ledger_pool)
    bmc = _Bmc(lost=True)
    bmc.install(monkeypatch)
    inp = MachineActionInput(cluster=cluster, node="gpu-03", machine="gpu-03",
                             repair_id=f"r-{uuid.uuid4().hex[:6]}")
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(prov.migrate_node, inp)
    phase = ei.value.details[0]["phase"]
    assert phase == "restart_sent" and not ei.value.non_retryable, phase
    res = await ActivityEnvironment().run(
        prov.migrate_node, inp.model_copy(update={"resume_phase": phase}))
    assert len(bmc.sent) == 1, bmc.sent  # one restart of the spare in the attempt (I16)
    assert res.new_machine == "gpu-04" and "restart already sent" in res.detail, res
