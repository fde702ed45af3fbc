"""Break-test round 5: SlurmScheduler — ``sinfo --json`` of current Slurm releases, and a
node someone else set DOWN (real loopback cluster, ``slurm_cluster``)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from activities.scheduler.slurm import SlurmScheduler
from workers.devpeers import SlurmCluster
from workflows.config import ClusterConfig, NodeConfig

#: ``sinfo --json`` as Slurm 23.02+ (data_parser v0.0.39 and later, e.g. 24.11) prints it:
#: a ``sinfo`` array of partition/state groups, no top-level ``nodes`` array.
SINFO_24_11 = {
    "sinfo": [{
        "port": 6818, "cluster": "gpu", "partition": {"name": "gpu"},
        "node": {"state": ["IDLE", "DRAIN"]},
        "nodes": {"allocated": 0, "idle": 0, "other": 1, "total": 1, "hostnames": [],
                  "addresses": [], "nodes": ["gpu-01"]},
        "reason": {"description": "bad DIMM, ticket 4711", "time": {"set": True,
                   "infinite": False, "number": 1765100000}, "user": "alice"},
    }],
    "meta": {"slurm": {"release": "24.11.1"}}, "errors": [], "warnings": [],
}
SCONTROL_TEXT = (
    "NodeName=gpu-01 Arch=x86_64 CoresPerSocket=1\n"
    "   Gres=gpu:1\n"
    "   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n"
    "   BootTime=2026-12-01T10:00:00 SlurmdStartTime=2026-12-01T10:01:00\n"
    "   Reason=bad DIMM, ticket 4711 [alice@2026-12-07T09:00:00]\n"
)


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)


async def test_read_node_on_slurm_24_sinfo_json(tmp_path: Path) -> None:
    """On Slurm 23.02 and later ``sinfo --json`` answers rc 0 with a ``sinfo`` array of
    partition/state groups and no top-level ``nodes`` array. The scheduler took that for
    "no nodes" and raised the non-retryable ERR_UNKNOWN_NODE for every node: every
    cordon, idle check, drain and rejoin of every repair on a current Slurm failed with
    "Slurm has no node 'gpu-01'". Expected: the node is read (its state, reason and
    boot identity), from that document or from ``scontrol show node``."""
    (tmp_path / "sinfo.json").write_text(json.dumps(SINFO_24_11))
    (tmp_path / "node.txt").write_text(SCONTROL_TEXT)
    _script(tmp_path / "sinfo", f'cat "{tmp_path}/sinfo.json"\n')
    _script(tmp_path / "scontrol",
            f'if [ "$1 $2 $3" = "show node gpu-01" ]; then cat "{tmp_path}/node.txt"; '
            'exit 0; fi\necho "Node $3 not found" >&2; exit 1\n')
    cluster = ClusterConfig(name="s24", scheduler="slurm", nodes=[NodeConfig(name="gpu-01")],
                            slurm_bin_dir=str(tmp_path))
    n = await SlurmScheduler(cluster).read_node("gpu-01")
    assert n.state == ["IDLE", "DRAIN"]
    assert n.reason == "bad DIMM, ticket 4711"
    assert n.boot_time is not None



@pytest.mark.slurm
async def test_a_node_set_down_by_an_admin_keeps_its_reason_and_stays_down(
    slurm_cluster: SlurmCluster, slurm_cluster_config: ClusterConfig
) -> None:
    """An admin took gpu-02 out with ``scontrol update state=down reason="PSU fault, RMA
    88"``; then a fault alert on it led to a repair. The cordon saw no DRAIN flag, wrote
    ``state=drain reason=autorepair:<id> ...`` over the admin's reason (now lost from
    ``sinfo -R``), and the rejoin found its own reason and resumed the node: the node the
    admin sent to RMA was back in the partition taking jobs. The rail (docs/design.md §6,
    scenarios.md 4): a node someone else took out is never put back by the system, and
    their reason is kept."""
    slurm_cluster.reset_nodes()
    sched = SlurmScheduler(slurm_cluster_config)
    try:
        slurm_cluster.run("scontrol", "update", "nodename=gpu-02", "state=down",
                          "reason=PSU fault, RMA 88")
        res = await sched.cordon("gpu-02", "r-900", "Xid 79")
        assert not res.cordoned_by_us and res.by_other
        assert (await sched.node_health("gpu-02")).reason == "PSU fault, RMA 88"
        rj = await sched.rejoin("gpu-02", "r-900")
        assert not rj.uncordoned and "PSU fault, RMA 88" in rj.kept_reason
        h = await sched.node_health("gpu-02")
        assert h.state[0] == "DOWN" and h.reason == "PSU fault, RMA 88"
    finally:
        slurm_cluster.reset_nodes()
