"""End to end: an approved ``reboot`` repair on Kubernetes (kmock), real activities.

RepairWorkflow on the Temporal dev server; the Kubernetes scheduler activities through
``kubernetes_asyncio`` against the kmock API server (``kube_api``); the reboot through
the sushy-tools Redfish emulator; ledger in embedded PostgreSQL. A GPU training pod runs
on the node, so the repair cordons (unschedulable + taint + annotations), waits for the
pod to finish, evicts the rest (a PodDisruptionBudget answers 429 until the disruption
controller allows one), reboots the machine through Redfish, waits for a new
``status.nodeInfo.bootID`` and uncordons. :class:`workers.devpeers.MachineBridge`
plays the kubelet: on the machine's power-on edge it reports a new boot id.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from activities.ledger import Ledger
from activities.scheduler.kube import ANN_REPAIR_ID, TAINT_KEY, KubeScheduler
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
from tests.fixtures.kube import PODS, KubeApi
from workers.devpeers import MachineBridge, RedfishEmulator
from workflows.models import ApproveSignal, RepairStatus, Stage

pytestmark = [pytest.mark.devserver, pytest.mark.timeout(300)]

NODE = "gpu-02"


async def test_reboot_repair_end_to_end_on_kubernetes(
    temporal_dev_env: Any, ledger_pool: Any, kube_api: KubeApi,
    redfish_emulator: RedfishEmulator, bmc_secrets_file: Path,
) -> None:
    config = e2e_config("kube", redfish_emulator, bmc_secrets_file, [NODE, "gpu-01"])
    cluster = config.clusters[0]
    kube_api.add_node(NODE, boot_id="boot-before")
    kube_api.add_node("gpu-01", boot_id="boot-other")
    kube_api.add_pod("ml", "train-0", NODE, gpus=8)
    kube_api.add_pod("web", "web-1", NODE, labels={"app": "web"})
    kube_api.add_pdb("web", "web-pdb", {"app": "web"}, disruptions_allowed=0)
    kube_api.add_pod("kube-system", "dcgm-exporter", NODE, daemonset=True)
    sched = KubeScheduler(cluster, api_client=kube_api.api_client)

    loop = asyncio.get_running_loop()
    boots: list[str] = []

    def machine_came_back(node: str, event: str) -> None:  # the kubelet after a boot
        boot = f"boot-{uuid.uuid4().hex[:8]}"
        boots.append(boot)
        loop.call_soon_threadsafe(kube_api.set_boot_id, node, boot)

    rid = "e2e-" + uuid.uuid4().hex[:8]
    notes = Notifications()
    client = temporal_dev_env.client
    bridge = MachineBridge(redfish_emulator, machine_came_back,
                           systems={NODE: redfish_emulator.systems[NODE]})
    with bridge:
        async with running_workers(client, config, ledger_pool,
                                   SchedulerActivities(config, {cluster.name: sched}), notes):
            handle = await start_reboot(client, config, NODE, rid)
            await wait_stage(handle, Stage.awaiting_approval)
            assert not kube_api.node(NODE)["spec"].get("unschedulable")  # nothing before consent
            await handle.signal("approve", ApproveSignal(by="alice"))

            # cordoned with our taint and annotations while the GPU pod still runs
            await wait_stage(handle, Stage.waiting_for_idle)
            node = kube_api.node(NODE)
            assert node["spec"]["unschedulable"] is True
            assert {"key": TAINT_KEY, "value": rid, "effect": "NoSchedule"} in [
                {k: t.get(k) for k in ("key", "value", "effect")} for t in node["spec"]["taints"]]
            assert node["metadata"]["annotations"][ANN_REPAIR_ID] == rid
            assert (await sched.check_idle(NODE)).running == ["ml/train-0"]
            await asyncio.sleep(2)  # a couple of idle checks see the job still running
            assert (await handle.query("status", result_type=RepairStatus)).stage == (
                Stage.waiting_for_idle)
            kube_api.server.objects[PODS, "ml", "train-0"].patch({"status": {"phase": "Succeeded"}})

            # the drain meets the PDB (429) until the disruption controller allows one
            await wait_stage(handle, Stage.draining)
            for _ in range(100):
                if ("web", "web-1", 429) in kube_api.server.evictions:
                    break
                await asyncio.sleep(0.1)
            kube_api.set_pdb_allowed("web", "web-pdb", 1)

            final: RepairStatus = await asyncio.wait_for(handle.result(), 240)

    assert final.stage == Stage.succeeded, final.detail
    assert final.approved_by == "alice"
    assert distinct_stages([t.stage for t in final.history]) == [s.value for s in REBOOT_STAGES]

    # evictions: the PDB-protected pod after a 429, never the DaemonSet pod
    ev = kube_api.server.evictions
    assert ("web", "web-1", 429) in ev and ("web", "web-1", 201) in ev
    assert not any(name == "dcgm-exporter" for _, name, _ in ev)
    assert kube_api.pod_exists("kube-system", "dcgm-exporter")
    assert not kube_api.pod_exists("web", "web-1")

    # rebooted through Redfish (a power-on edge), node back with the new boot id, uncordoned
    assert [e[0] for e in bridge.edges] == [NODE] and boots
    node = kube_api.node(NODE)
    assert node["status"]["nodeInfo"]["bootID"] == boots[-1]
    assert not node["spec"].get("unschedulable")
    assert not any(t.get("key") == TAINT_KEY for t in node["spec"].get("taints") or [])
    assert not any(k.startswith("autorepair.io/") for k in node["metadata"]["annotations"])
    health = await sched.node_health(NODE)
    assert health.ready and health.boot_id == boots[-1]
    # the other node was never touched
    other = kube_api.node("gpu-01")
    assert not other["spec"].get("unschedulable")
    assert other["status"]["nodeInfo"]["bootID"] == "boot-other"

    # ledger: every transition in order, one successful reboot attempt
    rec = await ledger_record(ledger_pool, rid)
    assert rec["stage"] == "succeeded" and rec["action"] == "reboot"
    assert rec["approved_by"] == "alice" and rec["cluster"] == cluster.name
    assert distinct_stages([t["stage"] for t in rec["transitions"]]) == [
        s.value for s in REBOOT_STAGES]
    assert [(a["action"], a["outcome"]) for a in rec["attempts"]] == [("reboot", "succeeded")]
    assert notes.sent == []
    # downtime recorded by the ledger activities when the repair ended: cordon → running,
    # with the seconds the GPU job kept the node busy counted as waiting for idle
    down = await Ledger(ledger_pool).get_repair(rid)
    assert down is not None and down["downtime"] is not None
    d = down["downtime"]
    at = {t.stage.value: t.at for t in final.history}
    assert d["outcome"] == "succeeded" and d["action"] == "reboot" and d["gpus"] == 8
    assert d["cordoned_at"] == at["cordoning"] and d["rejoined_at"] == at["running"]
    assert d["duration_s"] == (at["running"] - at["cordoning"]).total_seconds()
    assert d["idle_wait_s"] >= 2 and d["idle_wait_s"] < d["duration_s"]
    assert d["gpu_hours"] == 8 * d["duration_s"] / 3600 and d["cost"] is None
