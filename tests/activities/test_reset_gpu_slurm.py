"""``reset_gpu`` on the real loopback Slurm cluster (docs/design.md §3).

The reset job really runs on the virtual node: a maintenance reservation on the drained
node and ``sbatch -w NODE --reservation=...`` executing ``autorepair-agent reset-gpu --pci
{pci} --json`` (the venv's console script) with the simulated NVML backend and planted
faults (``--sim-faults``): the loopback nodes have no GPU, the agent's JSON is the real
one. The command also prints the job's node and reservation, and touches a sentinel, so
the test sees where it ran and whether it ran at all.

Activity level: placement on the drained node only, output parsed, the repair's drain put
back. Workflow level (``RepairWorkflow`` on the Temporal dev server, real activities, the
reboot through the sushy-tools Redfish emulator, :class:`workers.devpeers.MachineBridge`
restarting slurmd on power-on): a clean reset ends the repair without a reboot; a reset
that does not clear the fault escalates to reboot
with the agent's evidence; a GPU held by a process (exit 2) and a platform that forbids a
single-GPU reset move to reboot without a failed attempt — the latter before any job.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.reset import ResetActivities, run_id_for
from activities.scheduler.slurm import SlurmScheduler
from activities.scheduler_activities import SchedulerActivities
from activities.validation.base import run_slug
from tests.activities.e2e_support import (
    Notifications,
    e2e_config,
    ledger_record,
    running_workers,
)
from workers.devpeers import MachineBridge, RedfishEmulator, SlurmCluster
from workflows.activity_api import ERR_ACTION_FAILED, MachineActionInput
from workflows.config import (
    AutorepairConfig,
    ClusterConfig,
    NodeConfig,
    ResetGpuConfig,
    ResetGpuPlatform,
    ResetGpuPolicy,
)
from workflows.models import Alert, RepairRequest, RepairStatus, Stage
from workflows.protocol import workflow_id_repair

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
#: GPU 0 of the agent's simulated backend (``SimulatedBackend.pci_of(0)``).
PCI = "0000:18:00"
NODE = "gpu-02"


def _reset_config(tmp: Path) -> ResetGpuConfig:
    agent = Path(sys.executable).parent / "autorepair-agent"
    run = (f"{agent}" if agent.exists() else f"{sys.executable} -m agent.cli")
    script = (f"touch {tmp}/ran-{{gpu}}; echo node=$SLURM_JOB_NODELIST "
              f"resv=$SLURM_JOB_RESERVATION; exec {run} reset-gpu --pci {{pci}} --json "
              f"--backend simulated --sim-faults {tmp}/faults.json --wait-timeout 5")
    return ResetGpuConfig(command=["/bin/sh", "-c", script], env={"PYTHONPATH": str(ROOT)},
                          output_dir=str(tmp / "out"), timeout_s=120.0)


def _plant(tmp: Path, **faults: Any) -> None:
    (tmp / "faults.json").write_text(json.dumps(faults))


def _job_line(tmp: Path, rid: str) -> str:
    return (tmp / "out" / f"{run_slug(run_id_for(rid))}.out").read_text()


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster, tmp_path: Path) -> ClusterConfig:
    slurm_cluster.reset_nodes()
    return ClusterConfig(name="rst", scheduler="slurm", slurm_conf=str(slurm_cluster.conf_path),
                         slurm_boot_identity="slurmd_start",
                         nodes=[NodeConfig(name=n, machine=n) for n in slurm_cluster.nodes],
                         reset_gpu=_reset_config(tmp_path))


async def _drained(sched: SlurmScheduler, rid: str) -> str:
    await sched.cordon(NODE, rid, "Xid 48 reset_gpu")
    n = await sched.read_node(NODE)
    assert n.drain and n.owned_by(rid), n
    return n.reason


def _inp(rid: str) -> MachineActionInput:
    return MachineActionInput(cluster="rst", node=NODE, machine=NODE, repair_id=rid,
                              gpu="00000000:18:00.0", gpus=["0000:18:00"])


async def test_reset_runs_on_the_drained_node_only_and_puts_the_drain_back(
    cluster: ClusterConfig, slurm_cluster: SlurmCluster, tmp_path: Path,
) -> None:
    _plant(tmp_path, recovery_action=1, reset_outcome="clears")
    sched = SlurmScheduler(cluster)
    rid = "r-" + uuid.uuid4().hex[:6]
    reason = await _drained(sched, rid)
    acts = ResetActivities(AutorepairConfig(clusters=[cluster]))
    res = await ActivityEnvironment().run(acts.reset_gpu, _inp(rid))
    assert res.done and not res.not_run, res
    assert f"GPU {PCI}: done (exit 0): GPU reset and back; read-back clean" in res.detail
    job = re.search(r"\(job (\d+)\)", res.detail)
    assert job, res.detail
    # the job ran on the drained node, inside its own maintenance reservation
    out = _job_line(tmp_path, rid)
    assert f"node={NODE} resv=autorepair-reset-{run_slug(run_id_for(rid))}" in out, out
    show = slurm_cluster.run("scontrol", "-o", "show", "job", job.group(1))
    assert f"ReqNodeList={NODE} " in show and f" NodeList={NODE} " in show, show
    # placement removed, the repair's drain back as it was; the other nodes untouched
    assert "autorepair-reset" not in slurm_cluster.run("scontrol", "show", "reservation",
                                                        check=False)
    n = await sched.read_node(NODE)
    assert n.drain and n.reason == reason, n
    for other in slurm_cluster.nodes:
        if other != NODE:
            assert not (await sched.read_node(other)).drain
    await sched.close()


async def test_reset_that_does_not_clear_fails_with_the_agents_evidence(
    cluster: ClusterConfig, tmp_path: Path,
) -> None:
    _plant(tmp_path, recovery_action=1, reset_outcome="persists")
    sched = SlurmScheduler(cluster)
    rid = "r-" + uuid.uuid4().hex[:6]
    reason = await _drained(sched, rid)
    acts = ResetActivities(AutorepairConfig(clusters=[cluster]))
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(acts.reset_gpu, _inp(rid))
    err = ei.value
    assert err.type == ERR_ACTION_FAILED and err.non_retryable
    assert f"GPU {PCI}: failed (exit 1)" in str(err)
    assert "recovery_action: still gpu_reset (was gpu_reset)" in str(err)
    (evidence,) = err.details[0]
    assert evidence["evidence"]["after"]["recovery_action"] == "gpu_reset"
    assert (await sched.read_node(NODE)).reason == reason
    await sched.close()


async def test_gpu_held_by_a_process_cannot_run(cluster: ClusterConfig, tmp_path: Path) -> None:
    _plant(tmp_path, recovery_action=1, gpu_processes={"0": [4242]})
    sched = SlurmScheduler(cluster)
    rid = "r-" + uuid.uuid4().hex[:6]
    await _drained(sched, rid)
    acts = ResetActivities(AutorepairConfig(clusters=[cluster]))
    res = await ActivityEnvironment().run(acts.reset_gpu, _inp(rid))
    assert not res.done and "cannot_run (exit 2)" in res.not_run, res
    assert "pid 4242" in res.not_run
    # an index cannot fill {pci}: nothing is placed at all
    idx = _inp(rid).model_copy(update={"gpu": "3", "gpus": ["3"]})
    res = await ActivityEnvironment().run(acts.reset_gpu, idx)
    assert res.not_run == "GPU '3' is not a PCI address and the reset command needs {pci}"
    assert not (tmp_path / "ran-3").exists()
    await sched.close()


# ---- the repair around it ------------------------------------------------------------

def _reset_alert(cluster: str, rid: str) -> Alert:
    return Alert.model_validate(dict(
        alert_id=f"{cluster}/{NODE}/{rid}", cluster=cluster, node=NODE, kind="xid", code=48,
        gpu="00000000:18:00.0", severity="critical", actionable=True, action="reset_gpu",
        summary="Xid 48: double bit ECC error",
        evidence_text="NVRM: Xid (PCI:0000:18:00): 48, pid=1234, name=python, DBE",
        observed_at="2025-03-01T12:00:00Z",
    ))


@pytest.mark.devserver
@pytest.mark.parametrize("case", ["clears", "persists", "held", "forbidden"])
async def test_repair_resets_or_moves_to_reboot(
    case: str, temporal_dev_env: Any, ledger_pool: Any, slurm_cluster: SlurmCluster,
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path, tmp_path: Path,
) -> None:
    slurm_cluster.reset_nodes()
    config = e2e_config("slurm", redfish_emulator, bmc_secrets_file, list(slurm_cluster.nodes),
                        slurm_conf=str(slurm_cluster.conf_path))
    config.policy.consent.mode = "automatic"
    cluster = config.clusters[0]
    cluster.reset_gpu = _reset_config(tmp_path)
    if case == "forbidden":  # an Ampere NVSwitch pool without Fabric Manager, say
        cluster.reset_gpu.policy = ResetGpuPolicy(
            pools={f"pool-{NODE}": ResetGpuPlatform(single_gpu=False, nvswitch=True)})
    faults = {"clears": dict(recovery_action=1, reset_outcome="clears"),
              "persists": dict(recovery_action=1, reset_outcome="persists"),
              "held": dict(recovery_action=1, gpu_processes={"0": [4242]}),
              "forbidden": dict(recovery_action=1)}[case]
    _plant(tmp_path, **faults)
    sched = SlurmScheduler(cluster)
    rid = "rst-" + uuid.uuid4().hex[:8]
    notes = Notifications()
    bridge = MachineBridge(redfish_emulator, lambda node, _e: slurm_cluster.restart_slurmd(node),
                           systems={NODE: redfish_emulator.systems[NODE]})
    req = RepairRequest(repair_id=rid, cluster=cluster.name, node=NODE, action="reset_gpu",  # type: ignore[arg-type]
                        reason="Xid 48 on GPU 0000:18:00", alerts=[_reset_alert(cluster.name, rid)])
    client = temporal_dev_env.client
    with bridge:
        async with running_workers(client, config, ledger_pool,
                                   SchedulerActivities(config, {cluster.name: sched}), notes):
            handle = await client.start_workflow(
                "RepairWorkflow", req, id=workflow_id_repair(cluster.name, NODE, rid),
                task_queue=config.temporal.task_queue, result_type=RepairStatus)
            final: RepairStatus = await asyncio.wait_for(handle.result(), 240)

    assert final.stage == Stage.succeeded, final.detail
    assert final.action.value == ("reset_gpu" if case == "clears" else "reboot")
    if case == "clears":
        assert not bridge.edges, bridge.edges  # no reboot at all
    # otherwise the reboot is proven by its attempt below (the activity read the BMC's
    # power back On); the bridge samples power every 0.2 s and can fall behind on a
    # loaded CI machine, so its edge is not required
    rec = await ledger_record(ledger_pool, rid)
    attempts = [(a["action"], a["outcome"]) for a in rec["attempts"]]
    notes_text = " | ".join(t["reason"] for t in rec["transitions"])
    ran = (tmp_path / f"ran-{PCI}").exists()
    if case == "clears":
        # exit 0 + clean read-back: the ladder's attempt succeeded, no reboot
        assert attempts == [("reset_gpu", "succeeded")]
        assert "reset:allowed for GPU 0000:18:00" in rec["decided_by_rule"]
        assert ran
    elif case == "persists":
        # a failed attempt with the agent's evidence, then the next rung
        assert attempts == [("reset_gpu", "failed"), ("reboot", "succeeded")]
        assert "recovery_action: still gpu_reset" in notes_text, notes_text
        assert "reset:reset_gpu failed x1" in (rec["decided_by_rule"] or "")
        assert ran
    elif case == "held":
        # exit 2 at action time: not an attempt; the reason is in the rule
        assert attempts == [("reboot", "succeeded")]
        assert "reset:cannot run on the node (" in rec["decided_by_rule"]
        assert "pid 4242" in rec["decided_by_rule"]
        assert ran
    else:
        # decided before acting: no reset job ever ran
        assert attempts == [("reboot", "succeeded")]
        assert (f"reset:pool pool-{NODE} cannot reset one GPU while its NVLink peers stay up "
                "(reset_gpu.single_gpu=false) -> reboot") in rec["decided_by_rule"]
        assert not ran and not (tmp_path / "out").exists()
        assert "reset_gpu" not in notes_text
    n = await sched.read_node(NODE)
    assert not n.drain, n  # the repair resumed the node
    await sched.close()
