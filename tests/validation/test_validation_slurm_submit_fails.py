"""A check job that cannot be submitted never puts a machine back in service.

Placement resumes the repair's drain so the check job can run (the run's ``Flags=MAINT``
reservation keeps every other job off the node). When ``sbatch`` then fails on every try
(a typo in ``validation.partition``, slurmctld refusing jobs), placement gives up after
its retries and the run ends ``aborted`` — and the release deleted the reservation. The
node was left resumed: a machine a repair had drained, never validated, took jobs again.
An aborted run restores the state the node had before it (module docstring of
``activities.validation.slurm``), so the node must end drained with the reason it had.

Real Slurm on loopback, real Temporal (time-skipping: the retries' back-off is skipped),
real PostgreSQL ledger.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from tests.validation.runner import run_validation
    from tests.validation.test_validation_slurm import CLUSTER, _config
    from workers.devpeers import SlurmCluster
    from workflows.models import Verdict

pytestmark = pytest.mark.slurm


async def test_release_puts_back_a_drain_lifted_for_a_job_never_submitted(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The worker died between lifting the drain and submitting the job (the marker
    names no job, the node is resumed): the release puts the drain back with its reason
    before the reservation goes."""
    from activities.validation.slurm import SlurmValidation, _write_marker
    from workflows.activity_api import CollectInput

    config = _config(slurm_cluster, tmp_path)
    node, run_id = "gpu-04", f"validate/gpu-04/crash-{uuid.uuid4().hex[:6]}"
    reason = "autorepair:repair-ended-2 reprovision"
    backend = SlurmValidation(config.clusters[0])
    marker, _ = backend._paths(run_id)
    marker.parent.mkdir(parents=True, exist_ok=True)
    _write_marker(marker, {"prior_state": {"scheduler": "slurm", "drain": True,
                                           "reason": reason}, "job_id": None})
    try:
        await backend.release(CollectInput(cluster=CLUSTER, machine=node, node=node,
                                           run_id=run_id, job_id=""))
        line = slurm_cluster.run("scontrol", "-o", "show", "node", node)
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume",
                          check=False)
        await backend.close()
    assert "DRAIN" in line and f"Reason={reason}" in line, line


@pytest.mark.parametrize("case", ["no_such_partition", "node_outside_partition",
                                  "reservation_user"])
async def test_submit_refused_leaves_the_repairs_drain_and_says_why_at_once(
        temporal_env: Any, ledger_pool: Any, slurm_cluster: SlurmCluster,
        tmp_path: Path, case: str) -> None:
    """A check job sbatch refuses on every try (real Slurm's messages) leaves the node
    drained with the reason it had (it was never validated), and a refusal no retry
    fixes ends the run at once naming the setting, instead of 30 min of retries that
    lift and put back the drain. The node was drained by a repair that has ended (not
    in the ledger's in-flight set): placement may take that drain over for the check
    run."""
    config = _config(slurm_cluster, tmp_path)
    v = config.clusters[0].validation
    node = "gpu-04"
    if case == "no_such_partition":
        v.partition = "no-such-partition"
        says = "validation.partition 'no-such-partition' is not a partition of the cluster"
    elif case == "node_outside_partition":
        # a partition of the cluster that does not hold the node
        slurm_cluster.run("scontrol", "create", "PartitionName=other", "Nodes=gpu-01",
                          "State=UP")
        v.partition = "other"
        says = "the node is not in validation.partition 'other'"
    else:
        # the reservation is made for a user the worker (root) does not submit as
        v.reservation_user = "nobody"
        says = "validation.reservation_user 'nobody' is not the user the worker runs"
    reason = "autorepair:repair-ended-1 reprovision"
    slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=drain",
                      f"reason={reason}")
    try:
        result = await run_validation(temporal_env, ledger_pool, config, CLUSTER, node,
                                      f"refused-{case}-{uuid.uuid4().hex[:6]}")
        line = slurm_cluster.run("scontrol", "-o", "show", "node", node)
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume",
                          check=False)
        slurm_cluster.run("scontrol", "delete", "PartitionName=other", check=False)
    assert result.verdict == Verdict.aborted
    assert says in result.reason, result.reason
    assert "DRAIN" in line and f"Reason={reason}" in line, line  # never validated
    assert "autorepair-validate" not in slurm_cluster.run(
        "scontrol", "show", "reservation", check=False)
