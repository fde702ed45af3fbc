"""SlurmScheduler against the real loopback Slurm cluster (``slurm_cluster`` fixture)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.power import boot_changed
from activities.scheduler.slurm import (
    SlurmScheduler,
    parse_scontrol_show_node,
    parse_slurm_state,
)
from workers.devpeers import SlurmCluster
from workflows.activity_api import ERR_DRAIN_DEADLINE, ERR_UNKNOWN_NODE, NodeHealth
from workflows.config import ClusterConfig

pytestmark = pytest.mark.slurm


async def _wait_job_running(cluster: SlurmCluster, job: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        st = cluster.run("squeue", "--noheader", "-j", job, "--format=%T", check=False).strip()
        if st == "RUNNING":
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"job {job} not RUNNING after {limit_s}s")


async def _wait_state(
    sched: SlurmScheduler, node: str, state: list[str], limit_s: float = 30.0
) -> None:
    deadline = time.monotonic() + limit_s
    while (cur := (await sched.node_health(node)).state) != state:
        assert time.monotonic() < deadline, f"{node} state {cur}, wanted {state}"
        await asyncio.sleep(0.3)


def _sbatch(cluster: SlurmCluster, node: str, seconds: float, *extra: str) -> str:
    out = cluster.run(
        "sbatch", "--parsable", "-w", node, "--gres=gpu:1",
        f"--output={cluster.workdir / 'jobs' / '%j.out'}", *extra, "--wrap", f"sleep {seconds}",
    )
    return out.strip().split(";")[0]


@pytest.fixture()
def sched(slurm_cluster: SlurmCluster, slurm_cluster_config: ClusterConfig) -> SlurmScheduler:
    slurm_cluster.reset_nodes()
    return SlurmScheduler(slurm_cluster_config)


async def test_drain_waits_for_running_job_then_resume(
    slurm_cluster: SlurmCluster, sched: SlurmScheduler
) -> None:
    job = _sbatch(slurm_cluster, "gpu-01", 4)
    await _wait_job_running(slurm_cluster, job)

    res = await sched.cordon("gpu-01", "r-100", "Xid 79 GPU fell off the bus")
    assert res.cordoned_by_us and not res.by_other
    health = await sched.node_health("gpu-01")
    assert "DRAIN" in health.state and health.state[0] in ("ALLOCATED", "MIXED")  # DRAINING
    assert health.reason.startswith("autorepair:r-100 Xid 79")
    idle = await sched.check_idle("gpu-01")
    assert not idle.idle and idle.running == [job]

    # the retried cordon is a no-op that recognises its own drain
    again = await sched.cordon("gpu-01", "r-100", "Xid 79 GPU fell off the bus")
    assert again.cordoned_by_us and "already drained" in again.detail

    deadline = time.monotonic() + 30
    while not (await sched.check_idle("gpu-01")).idle:
        assert time.monotonic() < deadline, "job never finished"
        await asyncio.sleep(0.5)
    health = await sched.node_health("gpu-01")
    assert health.state == ["IDLE", "DRAIN"]  # DRAINED

    drained = await sched.drain("gpu-01", "r-100", deadline_s=5)
    assert drained.drained and drained.detail == "no jobs left"

    rj = await sched.rejoin("gpu-01", "r-100")
    assert rj.uncordoned
    # Slurm marks a resumed node NOT_RESPONDING until its next ping answers
    await _wait_state(sched, "gpu-01", ["IDLE"])
    assert (await sched.rejoin("gpu-01", "r-100")).uncordoned  # retried rejoin: no-op


async def test_node_drained_by_someone_else_is_never_resumed(
    slurm_cluster: SlurmCluster, sched: SlurmScheduler
) -> None:
    slurm_cluster.run("scontrol", "update", "nodename=gpu-02", "state=drain",
                      "reason=bad DIMM, ticket 4711")
    res = await sched.cordon("gpu-02", "r-200", "ECC DBE")
    assert not res.cordoned_by_us and res.by_other and "bad DIMM" in res.detail
    assert res.held_by_repair is None
    rj = await sched.rejoin("gpu-02", "r-200")
    assert not rj.uncordoned and "bad DIMM, ticket 4711" in rj.kept_reason
    health = await sched.node_health("gpu-02")
    assert "DRAIN" in health.state and health.reason == "bad DIMM, ticket 4711"


async def test_rejoin_keeps_node_redrained_by_operator(
    slurm_cluster: SlurmCluster, sched: SlurmScheduler
) -> None:
    assert (await sched.cordon("gpu-03", "r-300", "Xid 48")).cordoned_by_us
    slurm_cluster.run("scontrol", "update", "nodename=gpu-03", "state=drain",
                      "reason=operator: keep out")
    rj = await sched.rejoin("gpu-03", "r-300")
    assert not rj.uncordoned and "operator: keep out" in rj.kept_reason


async def test_drain_requeues_jobs_and_deadline_lists_the_rest(
    slurm_cluster: SlurmCluster, sched: SlurmScheduler
) -> None:
    requeueable = _sbatch(slurm_cluster, "gpu-04", 60, "--requeue")
    await _wait_job_running(slurm_cluster, requeueable)
    beats: list[Any] = []
    res = await sched.drain("gpu-04", "r-400", deadline_s=20, heartbeat=beats.append)
    assert res.drained and requeueable in res.detail
    assert (await sched.node_health("gpu-04")).reason.startswith("autorepair:r-400")
    slurm_cluster.run("scancel", requeueable, check=False)
    await sched.rejoin("gpu-04", "r-400")

    stuck = _sbatch(slurm_cluster, "gpu-04", 60, "--no-requeue")
    await _wait_job_running(slurm_cluster, stuck)
    with pytest.raises(ApplicationError) as ei:
        await sched.drain("gpu-04", "r-401", deadline_s=2, heartbeat=beats.append)
    assert ei.value.type == ERR_DRAIN_DEADLINE and ei.value.non_retryable
    assert stuck in str(ei.value)
    assert any(isinstance(b, dict) and stuck in b.get("running", []) for b in beats)
    slurm_cluster.run("scancel", stuck, check=False)


async def test_unknown_node_is_non_retryable(sched: SlurmScheduler) -> None:
    with pytest.raises(ApplicationError) as ei:
        await sched.cordon("gpu-99", "r-1", "x")
    assert ei.value.type == ERR_UNKNOWN_NODE and ei.value.non_retryable
    assert "gpu-99" in str(ei.value)


async def test_scontrol_text_fallback_matches_sinfo_json(
    slurm_cluster: SlurmCluster, sched: SlurmScheduler
) -> None:
    await sched.cordon("gpu-01", "r-500", "fallback check")
    via_json = await sched.read_node("gpu-01")
    text = slurm_cluster.run("scontrol", "show", "node", "gpu-01")
    via_text = parse_scontrol_show_node(text)["gpu-01"]
    assert via_text.state == via_json.state == ["IDLE", "DRAIN"]
    assert via_text.reason == via_json.reason == "autorepair:r-500 fallback check"
    assert via_text.reason_user == via_json.reason_user == "root"
    assert via_text.slurmd_start_time == via_json.slurmd_start_time
    slurm_cluster.run("scontrol", "update", "nodename=gpu-01", "state=resume")


def test_reboot_detection_from_slurmd_start_time(slurm_cluster: SlurmCluster) -> None:
    before = parse_scontrol_show_node(slurm_cluster.run("scontrol", "show", "node", "gpu-02"))
    time.sleep(1.1)  # SlurmdStartTime has one-second resolution
    slurm_cluster.restart_slurmd("gpu-02")
    deadline = time.monotonic() + 30
    while True:
        after = parse_scontrol_show_node(slurm_cluster.run("scontrol", "show", "node", "gpu-02"))
        if after["gpu-02"].boot_id != before["gpu-02"].boot_id:
            break
        assert time.monotonic() < deadline, "SlurmdStartTime never changed"
        time.sleep(0.3)


async def test_slurmd_restart_is_a_reboot_only_under_slurmd_start_identity(
    slurm_cluster: SlurmCluster, slurm_cluster_config: ClusterConfig,
) -> None:
    """A production Slurm node whose slurmd restarts between the repair's boot read and its
    reboot/power cycle is not "already rebooted" (the action would be skipped and the
    repair end succeeded without it): its boot is judged on ``BootTime`` alone. The dev
    cluster (``slurmd_start``) counts the restart, which is how it simulates a reboot."""
    prod = SlurmScheduler(slurm_cluster_config.model_copy(
        update={"slurm_boot_identity": "boot_time"}))
    dev = SlurmScheduler(slurm_cluster_config)
    prod_before, dev_before = await prod.node_health("gpu-03"), await dev.node_health("gpu-03")
    assert prod_before.boot_id is None and prod_before.boot_time is not None
    assert dev_before.boot_id is not None
    slurm_cluster.restart_slurmd("gpu-03")  # returns once slurmctld shows the new start
    prod_after, dev_after = await prod.node_health("gpu-03"), await dev.node_health("gpu-03")
    assert dev_after.rebooted_since(dev_before.boot_id, dev_before.boot_time) is True
    assert prod_after.rebooted_since(prod_before.boot_id, prod_before.boot_time) is False

    async def health(_cluster: str, _node: str) -> NodeHealth:
        return await prod.node_health("gpu-03")

    assert await boot_changed(health, "slurmtest", "gpu-03", prod_before.boot_id,
                              prod_before.boot_time) is None


@pytest.mark.parametrize(
    ("text", "base", "flags"),
    [
        ("IDLE+DRAIN", "IDLE", ["DRAIN"]),
        ("DOWN+DRAIN", "DOWN", ["DRAIN"]),
        ("MIXED+DRAIN", "MIXED", ["DRAIN"]),
        ("DRAINING", "ALLOCATED", ["DRAIN"]),
        ("drng", "ALLOCATED", ["DRAIN"]),
        ("drained*", "IDLE", ["NOT_RESPONDING", "DRAIN"]),
        ("IDLE*+DRAIN", "IDLE", ["NOT_RESPONDING", "DRAIN"]),
        ("DOWN+NOT_RESPONDING", "DOWN", ["NOT_RESPONDING"]),
        ("DOWN*+DRAIN", "DOWN", ["NOT_RESPONDING", "DRAIN"]),
        ("idle~", "IDLE", ["POWERED_DOWN"]),
        ("ALLOCATED+COMPLETING", "ALLOCATED", ["COMPLETING"]),
        ("UNKNOWN+DRAIN+INVALID_REG", "UNKNOWN", ["DRAIN", "INVALID_REG"]),
    ],
)
def test_state_combinations(text: str, base: str, flags: list[str]) -> None:
    assert parse_slurm_state(text) == (base, flags)


def test_corpus_records_parse() -> None:
    text = (
        "NodeName=node-c Arch=x86_64 CoresPerSocket=1\n   Gres=gpu:nvidia-rtx-3090:1\n"
        "   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n"
        "   CfgTRES=cpu=8,mem=1M,billing=8,gres/gpu=1\n"
        "   Reason=gres/gpu count reported lower than configured (0 < 1) "
        "[slurm@2024-12-19T11:03:34]"
    )
    n = parse_scontrol_show_node(text)["node-c"]
    assert n.state == ["IDLE", "DRAIN"] and n.drained and not n.owned_by("x")
    assert n.reason == "gres/gpu count reported lower than configured (0 < 1)"
    assert n.reason_user == "slurm"
    with pytest.raises(ValueError, match="state"):
        parse_slurm_state("  ")


async def test_cordon_names_the_other_repair_draining_the_node(
    slurm_cluster: SlurmCluster, sched: SlurmScheduler
) -> None:
    assert (await sched.cordon("gpu-03", "r-300", "Xid 79")).cordoned_by_us
    res = await sched.cordon("gpu-03", "r-301", "Xid 48")
    assert not res.cordoned_by_us and res.by_other and res.held_by_repair == "r-300"
    assert (await sched.rejoin("gpu-03", "r-300")).uncordoned
