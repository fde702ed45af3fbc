"""The BMC side of the evidence capture (issue 31 item 3): the System Event Log through
Redfish. The sushy-tools emulator serves no ``LogServices``, so the log comes from the
tested fake of ``tests/fixtures/redfish_sel.py``, a proxy in front of the emulator (the
system lookup, the auth pair and everything else are the emulator's)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.evidence import EvidenceActivities
from activities.evidence.bmc import SelReader, SelUnavailable
from tests.fixtures.redfish_sel import PAGE, SelBmc, make_entries
from workers.devpeers import RedfishEmulator
from workflows.config import AutorepairConfig, BmcConfig, ClusterConfig, NodeConfig, SecretsConfig
from workflows.evidence import EvidenceCaptureInput
from workflows.models import Action


@pytest.fixture
async def sel(redfish_emulator: RedfishEmulator) -> AsyncIterator[SelBmc]:
    async with SelBmc(redfish_emulator.url, redfish_emulator.username,
                      redfish_emulator.password) as bmc:
        yield bmc


def _config(emu: RedfishEmulator, bmc: SelBmc, secrets_file: Path, *,
            system_ids: bool = True) -> AutorepairConfig:
    nodes = [NodeConfig(name=n, machine=f"m-{n}", bmc=BmcConfig(
        address=bmc.url, system_id=sid if system_ids else None))
        for n, sid in emu.systems.items()]
    return AutorepairConfig(
        clusters=[ClusterConfig(name="ev", scheduler="slurm", nodes=nodes)],
        secrets=SecretsConfig(bmc_credentials_file=str(secrets_file)))


def _reader(cfg: AutorepairConfig, node: str, timeout_s: float = 10.0) -> SelReader:
    n = next(x for x in cfg.cluster("ev").nodes if x.name == node)
    assert n.bmc is not None
    return SelReader(cfg, n.bmc, timeout_s)


async def test_newest_entries_of_the_system_sel_across_pages(
    redfish_emulator: RedfishEmulator, sel: SelBmc, bmc_secrets_file: Path,
) -> None:
    sid = redfish_emulator.systems["gpu-01"]
    sel.logs[sid] = "SEL"
    sel.entries[sid] = make_entries(60)                   # three pages of PAGE entries
    cap = await _reader(_config(redfish_emulator, sel, bmc_secrets_file), "gpu-01").read(50)
    assert cap.source == "SEL"
    assert [e.id for e in cap.entries] == [str(i) for i in range(60, 10, -1)]
    newest = cap.entries[0]
    assert newest.severity == "Critical" and "DIMM_B3" in newest.message
    assert newest.sensor_type == "Memory" and newest.created == "2026-11-30T09:00:00Z"
    pages = [p.rsplit("/", 1)[-1] for p in sel.requests if "/Entries" in p]
    assert PAGE == 25 and pages == ["Entries", "Entries?$skip=25", "Entries?$skip=50"]


async def test_log1_and_the_managers_log_as_fallback(
    redfish_emulator: RedfishEmulator, sel: SelBmc, bmc_secrets_file: Path,
) -> None:
    cfg = _config(redfish_emulator, sel, bmc_secrets_file)
    s2, s3 = redfish_emulator.systems["gpu-02"], redfish_emulator.systems["gpu-03"]
    sel.logs[s2], sel.entries[s2] = "Log1", make_entries(3)
    sel.logs[s3], sel.entries[s3] = "manager", make_entries(5)
    cap = await _reader(cfg, "gpu-02").read(50)
    assert cap.source == "Log1" and [e.id for e in cap.entries] == ["3", "2", "1"]
    cap = await _reader(cfg, "gpu-03").read(2)
    assert cap.source == "Managers/BMC/SEL" and [e.id for e in cap.entries] == ["5", "4"]


async def test_no_log_wrong_password_and_a_hanging_bmc_are_notes(
    redfish_emulator: RedfishEmulator, sel: SelBmc, bmc_secrets_file: Path, tmp_path: Path,
) -> None:
    cfg = _config(redfish_emulator, sel, bmc_secrets_file)
    with pytest.raises(SelUnavailable, match="no System Event Log"):
        await _reader(cfg, "gpu-04").read(50)
    sid = redfish_emulator.systems["gpu-01"]
    sel.logs[sid], sel.entries[sid] = "SEL", make_entries(4)
    wrong = tmp_path / "bmc.yaml"
    wrong.write_text("default: {username: admin, password: not-the-password}\n")
    wrong.chmod(0o600)
    bad = _config(redfish_emulator, sel, wrong)
    with pytest.raises(SelUnavailable) as err:
        await _reader(bad, "gpu-01").read(50)
    assert "rejected user 'admin' (HTTP 401)" in str(err.value)
    assert "not-the-password" not in str(err.value)

    # through the activity: the BMC part is a note, bounded; the node part (no Slurm for
    # cluster "ev" here: slurm_conf points nowhere) is a note too — the call returns
    acts = EvidenceActivities(cfg.model_copy(update={"clusters": [cfg.cluster("ev").model_copy(
        update={"slurm_conf": str(tmp_path / "missing.conf"),
                "slurm_bin_dir": str(tmp_path)})]}))
    sel.hang = True
    t0 = time.monotonic()
    cap = await ActivityEnvironment().run(acts.capture_evidence, EvidenceCaptureInput(
        cluster="ev", node="gpu-01", machine_id="m-gpu-01", repair_id="r-9",
        action=Action.power_cycle, timeout_s=4.0, bmc_entries=10, dir=str(tmp_path / "ev")))
    assert time.monotonic() - t0 < 10
    assert cap.node is None and cap.bmc is None
    assert any(n.startswith("node: ") for n in cap.notes), cap.notes
    assert "BMC: System Event Log not read within 2 s" in cap.notes, cap.notes
    assert cap.summary().startswith("evidence: node: ")


async def test_the_activity_reads_the_sel_of_the_machine(
    redfish_emulator: RedfishEmulator, sel: SelBmc, bmc_secrets_file: Path, tmp_path: Path,
) -> None:
    """Without ``bmc.system_id`` the BMC must list one system: the emulator lists four,
    so the note says so and names the field; with it, the entries come back."""
    sid = redfish_emulator.systems["gpu-02"]
    sel.logs[sid], sel.entries[sid] = "SEL", make_entries(12)
    cfg = _config(redfish_emulator, sel, bmc_secrets_file, system_ids=False)
    acts = EvidenceActivities(cfg)
    notes: list[str] = []
    inp = EvidenceCaptureInput(cluster="ev", node="gpu-02", machine_id="m-gpu-02",
                               repair_id="r-8", action=Action.reprovision, bmc_entries=5)
    assert await acts._bmc(inp, notes) is None
    assert "bmc.system_id is not set and /redfish/v1/Systems lists 4 systems" in notes[0]
    acts = EvidenceActivities(_config(redfish_emulator, sel, bmc_secrets_file))
    got = await acts._bmc(inp, notes := [])
    assert got is not None and notes == [] and [e.id for e in got.entries] == [
        "12", "11", "10", "9", "8"]
    assert await acts._bmc(inp.model_copy(update={"bmc_entries": 0}), notes) is None
