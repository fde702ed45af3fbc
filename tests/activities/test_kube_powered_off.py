"""A powered-off Kubernetes node can be repaired: Kubernetes' non-graceful node shutdown
(kmock Kubernetes API, the Redfish emulator as the BMC).

GPU pods left ``Running`` / ``Terminating`` on a NotReady node never leave by themselves
(the kubelet that would stop them is dead). Once the BMC confirms power Off, the idle
check and the drain taint the node ``node.kubernetes.io/out-of-service=nodeshutdown:
NoExecute`` and force-delete the pods, recording it; rejoin removes the taint. Without the
BMC's confirmation (host powered on, or the node Ready) nothing is forced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sushy

from activities.power import RedfishMachine, redfish_probe
from activities.scheduler.kube import (
    ANN_OUT_OF_SERVICE,
    OUT_OF_SERVICE_KEY,
    KubeScheduler,
)
from tests.fixtures.kube import NODES, PODS, KubeApi
from workers.devpeers import RedfishEmulator
from workflows.config import AutorepairConfig

NODE = "gpu-02"


@pytest.fixture()
def cfg(redfish_emulator: RedfishEmulator, bmc_secrets_file: Path) -> AutorepairConfig:
    return AutorepairConfig.model_validate({
        "secrets": {"bmc_credentials_file": str(bmc_secrets_file)},
        "clusters": [{"name": "k8s", "scheduler": "kubernetes", "nodes": [
            {"name": NODE, "machine": f"m-{NODE}",
             "bmc": {"address": redfish_emulator.url,
                     "system_id": redfish_emulator.systems[NODE], "verify_tls": False}}]}],
    })


async def power(cfg: AutorepairConfig, on: bool) -> None:
    m = RedfishMachine(cfg, "k8s", NODE, f"m-{NODE}")
    await m.reset(sushy.RESET_ON if on else sushy.RESET_FORCE_OFF)
    await m.wait_power("On" if on else "Off", "test", 30)


def taints(kube: KubeApi) -> list[dict[str, Any]]:
    return list(kube.node(NODE)["spec"].get("taints") or [])


def not_ready(kube: KubeApi) -> None:
    kube.server.objects[NODES, None, NODE].patch({"status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}})


async def test_powered_off_node_pods_released_by_non_graceful_shutdown(
    kube_api: KubeApi, cfg: AutorepairConfig
) -> None:
    kube = kube_api
    sched = KubeScheduler(cfg.clusters[0], api_client=kube.api_client,
                          bmc_probe=redfish_probe(cfg))
    kube.add_node(NODE)
    kube.add_pod("ml", "train-0", NODE, gpus=8)
    kube.add_pod("ml", "train-1", NODE, gpus=8)

    kube.server.objects[PODS, "ml", "train-1"].patch(
        {"metadata": {"deletionTimestamp": "2026-01-05T10:00:00Z"}})  # stuck Terminating
    kube.add_pod("kube-system", "static-proxy", NODE, mirror=True)
    await sched.cordon(NODE, "rep-1", "power_cycle: NotReady and BMC power Off")

    # Ready node, BMC on: an ordinary busy node — nothing forced
    idle = await sched.check_idle(NODE)
    assert not idle.idle and idle.detail == "" and len(idle.running) == 2
    # NotReady but the BMC says the host is on: still nothing forced
    not_ready(kube)
    idle = await sched.check_idle(NODE)
    assert not idle.idle and idle.detail == ""
    assert not any(t["key"] == OUT_OF_SERVICE_KEY for t in taints(kube))

    await power(cfg, on=False)
    try:
        idle = await sched.check_idle(NODE)
        assert idle.idle and idle.running == []
        assert "non-graceful node shutdown" in idle.detail and "ml/train-0" in idle.detail
        oos = [t for t in taints(kube) if t["key"] == OUT_OF_SERVICE_KEY]
        assert oos == [{"key": OUT_OF_SERVICE_KEY, "value": "nodeshutdown",
                        "effect": "NoExecute"}]
        record = json.loads(kube.node(NODE)["metadata"]["annotations"][ANN_OUT_OF_SERVICE])
        assert record["repair_id"] == "rep-1" and record["bmc"]["power_state"] == "Off"
        assert record["pods"] == ["ml/train-0", "ml/train-1"]
        assert not kube.pod_exists("ml", "train-0") and not kube.pod_exists("ml", "train-1")
        assert kube.pod_exists("kube-system", "static-proxy")  # the kubelet's own
        again = await sched.check_idle(NODE)  # idempotent
        assert again.idle and [t["key"] for t in taints(kube)].count(OUT_OF_SERVICE_KEY) == 1
        drained = await sched.drain(NODE, "rep-1", deadline_s=5)
        assert drained.drained
    finally:
        await power(cfg, on=True)
    # the host is back (power cycled); rejoin removes the taint this repair set
    kube.server.objects[NODES, None, NODE].patch({"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
    await sched.rejoin(NODE, "rep-1")
    assert not any(t["key"] == OUT_OF_SERVICE_KEY for t in taints(kube))
    assert ANN_OUT_OF_SERVICE not in (kube.node(NODE)["metadata"].get("annotations") or {})


async def test_drain_of_powered_off_node_does_not_wait_for_dead_pods(
    kube_api: KubeApi, cfg: AutorepairConfig
) -> None:
    kube = kube_api
    sched = KubeScheduler(cfg.clusters[0], api_client=kube.api_client,
                          bmc_probe=redfish_probe(cfg))
    kube.add_node(NODE, ready=False)
    kube.add_pod("ml", "infer-0", NODE, gpus=1)
    kube.add_pod("ml", "sidecar", NODE)
    await sched.cordon(NODE, "rep-2", "power_cycle")
    await power(cfg, on=False)
    try:
        res = await sched.drain(NODE, "rep-2", deadline_s=10)
    finally:
        await power(cfg, on=True)
    assert res.drained and "non-graceful node shutdown" in res.detail
    assert not kube.pod_exists("ml", "infer-0") and not kube.pod_exists("ml", "sidecar")
    # without a BMC probe the same node would have waited out the drain deadline
    kube.add_pod("ml", "infer-1", NODE, gpus=1)
    blind = KubeScheduler(cfg.clusters[0], api_client=kube.api_client)
    idle = await blind.check_idle(NODE)
    assert not idle.idle and idle.detail == ""
