"""``capture_evidence`` on the real loopback Slurm cluster (issue 31 item 3, node side) and
the Redfish SEL (the sushy-tools emulator behind the SEL fake of
``tests/fixtures/redfish_sel.py``).

The capture job really runs on the virtual node through the reset job's placement: a
maintenance reservation on the drained node and ``sbatch -w NODE --reservation=...``
running ``autorepair-agent capture`` (the venv's console script) with a fake
``nvidia-bug-report.sh`` first on ``PATH`` (the loopback nodes have no GPU; the archive,
its size and its hash are real). Checked: the archive on "the node" matches what the
activity returns, the job ran on the drained node in its own reservation, the placement is
gone and the repair's drain is back; a capture command that fails is a note while the
BMC's entries still come back.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import tarfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.evidence import EvidenceActivities
from activities.evidence.node import run_id_for
from activities.scheduler.slurm import SlurmScheduler
from activities.validation.base import run_slug
from tests.fixtures.redfish_sel import SelBmc, make_entries
from workers.devpeers import RedfishEmulator, SlurmCluster
from workflows.config import (
    AutorepairConfig,
    BmcConfig,
    ClusterConfig,
    NodeConfig,
    ResetGpuConfig,
    SecretsConfig,
)
from workflows.evidence import EvidenceCaptureInput
from workflows.models import Action

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-03"


def _fake_bug_report(tmp: Path) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-bug-report.sh"
    tool.write_text('#!/bin/sh\necho "nvidia-bug-report on $SLURMD_NODENAME" | gzip > "$2.gz"\n')
    tool.chmod(0o755)
    return bin_dir


def _reset_config(tmp: Path, *, fail: bool = False, hang: bool = False) -> ResetGpuConfig:
    agent = Path(sys.executable).parent / "autorepair-agent"
    run = f"{agent}" if agent.exists() else f"{sys.executable} -m agent.cli"
    bins = _fake_bug_report(tmp)
    script = (f"echo node=$SLURM_JOB_NODELIST resv=$SLURM_JOB_RESERVATION; "
              f"PATH={bins}:/usr/bin:/bin exec {run} capture --dir {{dir}} --repair {{repair}} "
              f"--tool-timeout {{tool_timeout}} --json --backend simulated")
    if fail:
        script = "echo 'capture: disk full' >&2; exit 2"
    if hang:
        script = f"touch {tmp}/started; exec sleep 600"
    return ResetGpuConfig(command=["true"], capture_command=["/bin/sh", "-c", script],
                          env={"PYTHONPATH": str(ROOT)}, output_dir=str(tmp / "out"))


@pytest.fixture
async def sel(redfish_emulator: RedfishEmulator) -> AsyncIterator[SelBmc]:
    async with SelBmc(redfish_emulator.url, redfish_emulator.username,
                      redfish_emulator.password) as bmc:
        sid = redfish_emulator.systems[NODE]
        bmc.logs[sid], bmc.entries[sid] = "SEL", make_entries(8)
        yield bmc


def _config(slurm: SlurmCluster, emu: RedfishEmulator, bmc: SelBmc, secrets: Path,
            tmp: Path, *, fail: bool = False, hang: bool = False) -> AutorepairConfig:
    nodes = [NodeConfig(name=n, machine=n, bmc=BmcConfig(address=bmc.url,
                                                          system_id=emu.systems.get(n)))
             for n in slurm.nodes]
    return AutorepairConfig(
        clusters=[ClusterConfig(name="evs", scheduler="slurm", slurm_conf=str(slurm.conf_path),
                                nodes=nodes, reset_gpu=_reset_config(tmp, fail=fail, hang=hang))],
        secrets=SecretsConfig(bmc_credentials_file=str(secrets)))


def _archive(path: Path) -> tuple[int, str, set[str]]:
    """Size, sha256 and member names of the archive on disk."""
    data = path.read_bytes()
    with tarfile.open(path) as tar:
        return len(data), hashlib.sha256(data).hexdigest(), set(tar.getnames())


def _inp(rid: str, tmp: Path) -> EvidenceCaptureInput:
    return EvidenceCaptureInput(cluster="evs", node=NODE, machine_id=NODE, repair_id=rid,
                                action=Action.power_cycle, timeout_s=120.0, bmc_entries=5,
                                dir=str(tmp / "evidence"))


async def test_capture_runs_on_the_drained_node_and_reads_the_sel(
    slurm_cluster: SlurmCluster, redfish_emulator: RedfishEmulator, sel: SelBmc,
    bmc_secrets_file: Path, tmp_path: Path,
) -> None:
    slurm_cluster.reset_nodes()
    cfg = _config(slurm_cluster, redfish_emulator, sel, bmc_secrets_file, tmp_path)
    sched = SlurmScheduler(cfg.cluster("evs"))
    rid = "r-" + uuid.uuid4().hex[:6]
    await sched.cordon(NODE, rid, "Xid 79 power_cycle")
    reason = (await sched.read_node(NODE)).reason
    cap = await ActivityEnvironment().run(EvidenceActivities(cfg).capture_evidence,
                                          _inp(rid, tmp_path))
    assert cap.notes == [], cap.notes
    assert cap.node is not None and cap.node.tool == "nvidia-bug-report"
    archive = Path(cap.node.path)
    assert archive.parent == tmp_path / "evidence"
    size, digest, names = _archive(archive)
    assert cap.node.size_bytes == size and cap.node.sha256 == digest
    assert names == {"manifest.json", "nvidia-bug-report.log.gz"}
    assert cap.bmc is not None and cap.bmc.source == "SEL"
    assert [e.id for e in cap.bmc.entries] == ["8", "7", "6", "5", "4"]
    # ran on the drained node, inside its own maintenance reservation
    slug = run_slug(run_id_for(rid))
    out = (tmp_path / "out" / f"evidence-{slug}.out").read_text()
    assert f"node={NODE} resv=autorepair-evidence-{slug}" in out, out
    # placement removed, the repair's drain back as it was
    assert "autorepair-evidence" not in slurm_cluster.run("scontrol", "show", "reservation",
                                                           check=False)
    n = await sched.read_node(NODE)
    assert n.drain and n.reason == reason, n
    await sched.close()


async def test_failed_node_capture_is_a_note_and_the_sel_still_comes(
    slurm_cluster: SlurmCluster, redfish_emulator: RedfishEmulator, sel: SelBmc,
    bmc_secrets_file: Path, tmp_path: Path,
) -> None:
    slurm_cluster.reset_nodes()
    cfg = _config(slurm_cluster, redfish_emulator, sel, bmc_secrets_file, tmp_path, fail=True)
    sched = SlurmScheduler(cfg.cluster("evs"))
    rid = "r-" + uuid.uuid4().hex[:6]
    await sched.cordon(NODE, rid, "Xid 79 power_cycle")
    cap = await ActivityEnvironment().run(EvidenceActivities(cfg).capture_evidence,
                                          _inp(rid, tmp_path))
    assert cap.node is None and cap.bmc is not None and len(cap.bmc.entries) == 5
    (note,) = cap.notes
    assert note.startswith("node: capture job ") and "without a result" in note, note
    assert (await sched.read_node(NODE)).drain
    await sched.close()


async def test_a_capture_that_hangs_is_bounded_and_its_job_removed(
    slurm_cluster: SlurmCluster, redfish_emulator: RedfishEmulator, sel: SelBmc,
    bmc_secrets_file: Path, tmp_path: Path,
) -> None:
    """``timeout_s`` bounds the whole call: a capture job that never ends is cancelled
    when its bound (``timeout_s`` − the placement margin) runs out, the reservation and
    job are gone, the drain is back, and the activity returns a note (the repair goes on)."""
    slurm_cluster.reset_nodes()
    cfg = _config(slurm_cluster, redfish_emulator, sel, bmc_secrets_file, tmp_path, hang=True)
    sched = SlurmScheduler(cfg.cluster("evs"))
    rid = "r-" + uuid.uuid4().hex[:6]
    await sched.cordon(NODE, rid, "Xid 79 power_cycle")
    reason = (await sched.read_node(NODE)).reason
    t0 = time.monotonic()
    cap = await ActivityEnvironment().run(
        EvidenceActivities(cfg).capture_evidence,
        _inp(rid, tmp_path).model_copy(update={"timeout_s": 25.0}))
    took = time.monotonic() - t0
    assert took < 25 + 10, took
    assert (tmp_path / "started").exists()                  # the job did run
    assert cap.node is None and cap.bmc is not None
    assert any("did not finish within 10 s" in n for n in cap.notes), cap.notes
    assert "autorepair-evidence" not in slurm_cluster.run("scontrol", "show", "reservation",
                                                           check=False)
    left = "?"
    for _ in range(20):                                     # a cancelled job may be COMPLETING
        left = slurm_cluster.run("squeue", "-h", "-w", NODE, "-o", "%i %T", check=False).strip()
        if not left:
            break
        await asyncio.sleep(0.5)
    assert left == "", left
    n = await sched.read_node(NODE)
    assert n.drain and n.reason == reason, n
    await sched.close()
