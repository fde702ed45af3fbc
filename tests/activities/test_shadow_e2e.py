"""Shadow mode end to end (issue 29 item 3), real activities: a ``reboot`` repair of a
pool in shadow mode on the loopback Slurm cluster and on Kubernetes (kmock), the BMC
behind the sushy-tools Redfish emulator, the ledger in embedded PostgreSQL, the
workflows on the Temporal dev server. A person approves it (consent ``approve``), it
ends ``shadowed`` saying it would reboot the machine, and the scheduler and the BMC saw
nothing: the Slurm node is not drained, the Kubernetes node not cordoned nor tainted,
no Redfish power edge, the boot identity unchanged."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from activities.scheduler.kube import TAINT_KEY, KubeScheduler
from activities.scheduler.slurm import SlurmScheduler
from activities.scheduler_activities import SchedulerActivities
from tests.activities.e2e_support import (
    Notifications,
    e2e_config,
    ledger_record,
    running_workers,
    start_reboot,
    wait_stage,
)
from tests.fixtures.kube import KubeApi
from workers.devpeers import MachineBridge, RedfishEmulator, SlurmCluster
from workflows.config import AutorepairConfig, PoolConfig
from workflows.models import ApproveSignal, RepairStatus, Stage

pytestmark = [pytest.mark.devserver, pytest.mark.timeout(300)]


def _shadow_pool(config: AutorepairConfig, node: str) -> None:
    """Put ``node``'s pool in shadow mode (``clusters[].pools[].mode``); the cluster and
    the policy stay ``enforce``."""
    c = config.clusters[0]
    c.pools = [PoolConfig(name=f"pool-{node}", mode="shadow")]


async def _approve_to_shadowed(client: Any, config: AutorepairConfig, pool: Any,
                               node: str) -> RepairStatus:
    rid = "sh-e2e-" + uuid.uuid4().hex[:8]
    handle = await start_reboot(client, config, node, rid)
    st = await wait_stage(handle, Stage.awaiting_approval)
    assert "shadow mode" in st.history[-1].reason, st.history[-1]
    await handle.signal("approve", ApproveSignal(by="alice"))
    final: RepairStatus = await asyncio.wait_for(handle.result(), 120)
    assert final.stage == Stage.shadowed and final.mode == "shadow", final
    assert final.approved_by == "alice"
    assert f"then reboot {node}" in final.history[-1].reason, final.history[-1]
    rec = await ledger_record(pool, rid)
    assert rec["stage"] == "shadowed" and rec["approved_by"] == "alice"
    assert [(a["action"], a["outcome"]) for a in rec["attempts"]] == [("reboot", "shadowed")]
    return final


@pytest.mark.slurm
async def test_shadow_repair_on_slurm_drains_and_reboots_nothing(
    temporal_dev_env: Any, ledger_pool: Any, slurm_cluster: SlurmCluster,
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
) -> None:
    node = "gpu-04"
    slurm_cluster.reset_nodes()
    config = e2e_config("slurm", redfish_emulator, bmc_secrets_file, list(slurm_cluster.nodes),
                        slurm_conf=str(slurm_cluster.conf_path))
    _shadow_pool(config, node)
    cluster = config.clusters[0]
    sched = SlurmScheduler(cluster)
    before = await sched.node_health(node)
    bridge = MachineBridge(redfish_emulator, lambda n, e: None,
                           systems={node: redfish_emulator.systems[node]})
    with bridge:
        async with running_workers(temporal_dev_env.client, config, ledger_pool,
                                   SchedulerActivities(config, {cluster.name: sched}),
                                   Notifications()):
            await _approve_to_shadowed(temporal_dev_env.client, config, ledger_pool, node)
    n = await sched.read_node(node)
    assert not n.drain and n.reason == "", n  # never drained, no repair reason
    after = await sched.node_health(node)
    assert after.boot_id == before.boot_id and "DRAIN" not in after.state, after
    assert bridge.edges == []  # no Redfish power action


async def test_shadow_repair_on_kubernetes_cordons_and_reboots_nothing(
    temporal_dev_env: Any, ledger_pool: Any, kube_api: KubeApi,
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
) -> None:
    node = "gpu-02"
    config = e2e_config("kube", redfish_emulator, bmc_secrets_file, [node, "gpu-01"])
    _shadow_pool(config, node)
    cluster = config.clusters[0]
    kube_api.add_node(node, boot_id="boot-before")
    kube_api.add_node("gpu-01", boot_id="boot-other")
    kube_api.add_pod("ml", "train-0", node, gpus=8)
    sched = KubeScheduler(cluster, api_client=kube_api.api_client)
    bridge = MachineBridge(redfish_emulator, lambda n, e: None,
                           systems={node: redfish_emulator.systems[node]})
    with bridge:
        async with running_workers(temporal_dev_env.client, config, ledger_pool,
                                   SchedulerActivities(config, {cluster.name: sched}),
                                   Notifications()):
            await _approve_to_shadowed(temporal_dev_env.client, config, ledger_pool, node)
    k = kube_api.node(node)
    assert not k["spec"].get("unschedulable"), k["spec"]
    assert not any(t.get("key") == TAINT_KEY for t in k["spec"].get("taints") or [])
    assert not any(a.startswith("autorepair.io/") for a in
                   (k["metadata"].get("annotations") or {}))
    assert k["status"]["nodeInfo"]["bootID"] == "boot-before"
    assert kube_api.pod_exists("ml", "train-0") and kube_api.server.evictions == []
    assert bridge.edges == []
