"""Dev peers: the machine bridge over the Redfish emulator, Slurm job output placement."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.power import PowerActivities
from activities.provisioning import ProvisioningActivities
from workers.devpeers import (
    EVENT_POWER_ON,
    EVENT_REPROVISION,
    MachineBridge,
    RedfishEmulator,
    SlurmCluster,
)
from workflows.activity_api import MachineActionInput
from workflows.config import AutorepairConfig, BmcConfig, ClusterConfig, NodeConfig, SecretsConfig


def _config(emu: RedfishEmulator, secrets: Path) -> AutorepairConfig:
    nodes = [NodeConfig(name=n, machine=n, bmc=BmcConfig(address=emu.url, system_id=sid))
             for n, sid in emu.systems.items()]
    return AutorepairConfig(
        clusters=[ClusterConfig(name="bridge", nodes=nodes, provision_image=emu.image_url)],
        secrets=SecretsConfig(bmc_credentials_file=str(secrets)),
    )


async def _wait_events(events: list[tuple[str, str]], n: int, limit_s: float = 20) -> None:
    deadline = time.monotonic() + limit_s
    while len(events) < n:
        assert time.monotonic() < deadline, f"only {events}"
        await asyncio.sleep(0.1)


async def test_bridge_reports_power_on_and_reprovision_edges_per_node(
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
) -> None:
    cfg = _config(redfish_emulator, bmc_secrets_file)
    events: list[tuple[str, str]] = []
    threads: set[str] = set()

    def cb(node: str, event: str) -> None:
        threads.add(threading.current_thread().name)
        events.append((node, event))
        if len(events) == 1:
            raise RuntimeError("a broken callback must not stop the bridge")

    systems = redfish_emulator.systems
    with MachineBridge(redfish_emulator, cb, systems={"node-a": systems["gpu-04"]}) as bridge:
        res = await ActivityEnvironment().run(
            ProvisioningActivities(cfg).reprovision_machine,
            MachineActionInput(cluster="bridge", node="gpu-04", machine="gpu-04", repair_id="b1"))
        assert res.done
        await _wait_events(events, 1)
        assert events == [("node-a", EVENT_REPROVISION)]

        # node-a moves to another machine (a migrate): its edges follow the new system
        bridge.bind("node-a", systems["gpu-01"])
        assert bridge.systems == {"node-a": systems["gpu-01"]}
        await ActivityEnvironment().run(
            PowerActivities(cfg).reboot_machine,
            MachineActionInput(cluster="bridge", node="gpu-01", machine="gpu-01", repair_id="b2"))
        await _wait_events(events, 2)
    assert events == [("node-a", EVENT_REPROVISION), ("node-a", EVENT_POWER_ON)]
    assert [(n, e) for n, e, _ in bridge.edges] == events
    assert threads == {"machine-bridge-node-a_0"}  # one callback thread per node, in order


def test_bridge_rejects_bad_poll_interval(redfish_emulator: RedfishEmulator) -> None:
    with pytest.raises(ValueError, match="poll_s"):
        MachineBridge(redfish_emulator, lambda n, e: None, poll_s=0)


@pytest.mark.slurm
def test_sbatch_without_output_writes_into_the_cluster_workdir(
    slurm_cluster: SlurmCluster,
) -> None:
    """Job output of an ``sbatch`` without ``--output`` never lands in the caller's cwd."""
    slurm_cluster.reset_nodes()
    job = slurm_cluster.run("sbatch", "--parsable", "--wrap", "echo hello-from-job").strip()
    job = job.split(";")[0]
    out = slurm_cluster.jobs_dir / f"slurm-{job}.out"
    deadline = time.monotonic() + 30
    while not (out.exists() and "hello-from-job" in out.read_text()):
        assert time.monotonic() < deadline, f"no {out}"
        time.sleep(0.2)
    assert not (Path(os.getcwd()) / f"slurm-{job}.out").exists()
