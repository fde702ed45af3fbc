"""A GPU reset whose job cannot be submitted leaves the repair's drain in place.

The reset placement lifts the repair's drain for its job (the run's ``Flags=MAINT``
reservation keeps other jobs off). When ``sbatch`` then fails (a typo in
``reset_gpu.partition``, slurmctld refusing jobs) the activity failed with the drain
lifted: nothing puts it back on that path (the release and the drain's return run only
after a job was placed), so once the reservation's ``Duration`` ran out the node — with
the GPU fault the repair was acting on — took jobs while the repair still counted it as
cordoned. A placement that fails after lifting the drain puts it back first; a partition
the cluster does not have is a setting no retry fixes, so the reset says at once that it
cannot run (the repair moves to reboot, no attempt counted).

Real Slurm on loopback.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.reset import ResetActivities
from activities.scheduler.slurm import SlurmScheduler
from tests.activities import test_reset_gpu_slurm as rst
from tests.activities.test_reset_gpu_slurm import NODE, _drained, _inp, _plant
from workers.devpeers import SlurmCluster
from workflows.config import AutorepairConfig, ClusterConfig

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


#: the reset tests' cluster (the loopback Slurm nodes, the reset command)
cluster = rst.cluster


async def test_reset_job_submit_failing_puts_the_repairs_drain_back(
    cluster: ClusterConfig, slurm_cluster: SlurmCluster, tmp_path: Path,
) -> None:
    _plant(tmp_path, recovery_action=1, reset_outcome="clears")
    cluster.reset_gpu.partition = "no-such-partition"
    sched = SlurmScheduler(cluster)
    rid = "r-" + uuid.uuid4().hex[:6]
    reason = await _drained(sched, rid)
    acts = ResetActivities(AutorepairConfig(clusters=[cluster]))
    try:
        res = await ActivityEnvironment().run(acts.reset_gpu, _inp(rid))
        n = await sched.read_node(NODE)
    finally:
        await sched.rejoin(NODE, rid)
        for line in slurm_cluster.run("scontrol", "-o", "show", "reservation",
                                      check=False).splitlines():
            if "autorepair-reset" in line:
                name = line.split("ReservationName=")[1].split()[0]
                slurm_cluster.run("scontrol", "delete", f"ReservationName={name}",
                                  check=False)
        await sched.close()
    # nothing touched: the repair moves on (to reboot) without counting an attempt,
    # naming the setting; the node still out of service for the repair
    assert not res.done and res.not_run and "no-such-partition" in res.not_run, res
    assert n.drain and n.reason == reason, n
    assert not (tmp_path / f"ran-{'0000:18:00'}").exists()
