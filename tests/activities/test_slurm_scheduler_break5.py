"""Break-test round 5: SlurmScheduler — ``sinfo --json`` of current Slurm releases, and a
node someone else set DOWN (real loopback cluster, ``slurm_cluster``)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from activities.scheduler.slurm import SlurmScheduler
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

