"""End to end: an approved ``reboot`` repair on the real Slurm cluster, real activities.

RepairWorkflow on the Temporal dev server; scheduler activities against the loopback
Slurm cluster; the reboot through the sushy-tools Redfish emulator; ledger in embedded
PostgreSQL. A real ``sbatch`` job runs on the node, so the repair cordons (drain with
our reason), waits for the job to finish (DRAINING → DRAINED), reboots the machine
through Redfish, waits for the node to come back with a new boot identity and resumes
it. In the dev cluster a Redfish power action does not restart slurmd, so
:class:`workers.devpeers.MachineBridge` restarts the node's slurmd on the machine's
power-on edge, as the demo does.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from activities.scheduler.slurm import SlurmScheduler
from activities.scheduler_activities import SchedulerActivities
from tests.activities.e2e_support import (
    REBOOT_STAGES,
    Notifications,
    distinct_stages,
    e2e_config,
    ledger_record,
    running_workers,
    start_reboot,
    wait_stage,
)
from workers.devpeers import MachineBridge, RedfishEmulator, SlurmCluster
from workflows.models import ApproveSignal, RepairStatus, Stage

pytestmark = [pytest.mark.slurm, pytest.mark.devserver, pytest.mark.timeout(300)]

NODE = "gpu-03"
JOB_S = 8


def _job_state(cluster: SlurmCluster, job: str) -> dict[str, str]:
    out = cluster.run("scontrol", "show", "job", job, check=False)
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


async def _watch_job(cluster: SlurmCluster, job: str, seen: list[dict[str, str]]) -> None:
    """Append each change of ``job``'s (JobState, Restarts) to ``seen`` until cancelled.

    slurmctld forgets a finished job ``MinJobAge`` (30 s in the dev cluster) after it ends,
    and the repair goes on well past that on a loaded machine (reboot, rejoin), so the
    job's end is recorded while it happens, not read back afterwards.
    """
    while True:
        try:
            js = await asyncio.to_thread(_job_state, cluster, job)
        except Exception:  # a slow scontrol on a loaded machine: ask again
            js = {}
        if js and (not seen or (seen[-1].get("JobState"), seen[-1].get("Restarts"))
                   != (js.get("JobState"), js.get("Restarts"))):
            seen.append(js)
        await asyncio.sleep(0.3)


async def test_reboot_repair_end_to_end_on_slurm(
    temporal_dev_env: Any, ledger_pool: Any, slurm_cluster: SlurmCluster,
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
) -> None:
    slurm_cluster.reset_nodes()
    # a node an earlier test's cancelled job kept busy answers slurmctld's next ping
    assert await asyncio.to_thread(slurm_cluster.wait_responding), "a slurmd stays NOT_RESPONDING"
    config = e2e_config("slurm", redfish_emulator, bmc_secrets_file, list(slurm_cluster.nodes),
                        slurm_conf=str(slurm_cluster.conf_path))
    cluster = config.clusters[0]
    sched = SlurmScheduler(cluster)
    before = await sched.node_health(NODE)
    assert before.ready and "DRAIN" not in before.state and before.boot_id

    job = slurm_cluster.run(
        "sbatch", "--parsable", "-w", NODE, "--gres=gpu:1", "-J", "training-run",
        f"--output={slurm_cluster.jobs_dir / '%j.out'}", "--wrap", f"sleep {JOB_S}",
    ).strip().split(";")[0]
    deadline = time.monotonic() + 30
    while _job_state(slurm_cluster, job).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, f"job {job} never RUNNING"
        await asyncio.sleep(0.2)

    job_seen: list[dict[str, str]] = []
    watcher = asyncio.create_task(_watch_job(slurm_cluster, job, job_seen))
    restarted: list[str] = []

    def machine_came_back(node: str, event: str) -> None:
        slurm_cluster.restart_slurmd(node)
        restarted.append(f"{node}:{event}")

    rid = "e2e-" + uuid.uuid4().hex[:8]
    notes = Notifications()
    client = temporal_dev_env.client
    bridge = MachineBridge(redfish_emulator, machine_came_back,
                           systems={NODE: redfish_emulator.systems[NODE]})
    try:
        with bridge:
            async with running_workers(client, config, ledger_pool,
                                       SchedulerActivities(config, {cluster.name: sched}), notes):
                handle = await start_reboot(client, config, NODE, rid)
                await wait_stage(handle, Stage.awaiting_approval)
                assert "DRAIN" not in (await sched.node_health(NODE)).state  # nothing before consent
                await handle.signal("approve", ApproveSignal(by="alice"))

                # cordoned with our reason while the job still runs: DRAINING, not DRAINED
                await wait_stage(handle, Stage.waiting_for_idle)
                n = await sched.read_node(NODE)
                assert n.drain and n.owned_by(rid) and n.allocated, n
                assert job in (await sched.check_idle(NODE)).running

                final: RepairStatus = await asyncio.wait_for(handle.result(), 240)
    finally:
        watcher.cancel()

    assert final.stage == Stage.succeeded, final.detail
    assert final.approved_by == "alice"
    assert distinct_stages([t.stage for t in final.history]) == [s.value for s in REBOOT_STAGES]

    # the job was waited for, not requeued or killed: it ran to COMPLETED, never restarted
    states = [(js.get("JobState"), js.get("Restarts")) for js in job_seen]
    assert states and states[-1] == ("COMPLETED", "0"), states
    assert all(r == "0" for _s, r in states) and all(
        s in ("RUNNING", "COMPLETING", "COMPLETED") for s, _r in states), states

    # the machine really rebooted through Redfish; the node came back with a new boot
    assert any(e[0] == NODE for e in bridge.edges) and restarted, bridge.edges
    n = await sched.read_node(NODE)
    assert not n.drain and n.reason == "", n  # resumed by the repair
    # slurmctld may flag the fresh slurmd NOT_RESPONDING until its next ping of the node
    # (every SlurmdTimeout / 3 = 20 s here; a node that a previous test's cancelled job
    # kept busy can take a cycle or two more): up to 4 ping cycles
    deadline = time.monotonic() + 90
    while not (after := await sched.node_health(NODE)).ready:  # for a ping or two
        assert time.monotonic() < deadline, after
        await asyncio.sleep(0.5)
    assert after.boot_id != before.boot_id and "DRAIN" not in after.state

    # ledger: every transition recorded in order, one successful reboot attempt
    rec = await ledger_record(ledger_pool, rid)
    assert rec["stage"] == "succeeded" and rec["action"] == "reboot"
    assert rec["approved_by"] == "alice" and rec["cluster"] == cluster.name
    assert distinct_stages([t["stage"] for t in rec["transitions"]]) == [
        s.value for s in REBOOT_STAGES]
    assert [(a["action"], a["outcome"]) for a in rec["attempts"]] == [("reboot", "succeeded")]
    assert notes.sent == []  # no failure notification
