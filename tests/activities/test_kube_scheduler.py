"""KubeScheduler against the kmock Kubernetes API (``kube_api`` fixture)."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.scheduler.kube import (
    ANN_CORDONED_BY,
    ANN_REPAIR_ID,
    TAINT_KEY,
    KubeScheduler,
)
from tests.fixtures.kube import KubeApi
from workflows.activity_api import ERR_DRAIN_DEADLINE, ERR_UNKNOWN_NODE
from workflows.config import ClusterConfig, NodeConfig


@pytest.fixture()
def sched(kube_api: KubeApi) -> KubeScheduler:
    cluster = ClusterConfig(
        name="k8s", scheduler="kubernetes", nodes=[NodeConfig(name="gpu-node-1")]
    )
    return KubeScheduler(cluster, api_client=kube_api.api_client)


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node["spec"].get("taints") or [])


async def test_cordon_taints_annotates_and_is_idempotent(
    kube_api: KubeApi, sched: KubeScheduler
) -> None:
    kube_api.add_node("n1", taints=[{"key": "team", "value": "ml", "effect": "NoSchedule"}])
    res = await sched.cordon("n1", "r-1", "Xid 79 on GPU 0000:3b:00.0")
    assert res.cordoned_by_us and not res.by_other
    node = kube_api.node("n1")
    assert node["spec"]["unschedulable"] is True
    assert {"key": TAINT_KEY, "value": "r-1", "effect": "NoSchedule"} in _taints(node)
    assert {"key": "team", "value": "ml", "effect": "NoSchedule"} in _taints(node)
    assert node["metadata"]["annotations"][ANN_REPAIR_ID] == "r-1"
    assert node["metadata"]["annotations"][ANN_CORDONED_BY] == "autorepair"
    rv = node["metadata"]["resourceVersion"]

    again = await sched.cordon("n1", "r-1", "Xid 79 on GPU 0000:3b:00.0")
    assert again.cordoned_by_us and "already" in again.detail
    assert kube_api.node("n1")["metadata"]["resourceVersion"] == rv  # no write on retry

    rj = await sched.rejoin("n1", "r-1")
    assert rj.uncordoned and rj.kept_reason == ""
    node = kube_api.node("n1")
    assert not node["spec"].get("unschedulable")
    assert _taints(node) == [{"key": "team", "value": "ml", "effect": "NoSchedule"}]
    assert ANN_REPAIR_ID not in node["metadata"]["annotations"]
    assert (await sched.rejoin("n1", "r-1")).uncordoned  # retried rejoin


async def test_conflicts_are_retried_with_a_fresh_read(
    kube_api: KubeApi, sched: KubeScheduler
) -> None:
    kube_api.add_node("n1")
    kube_api.inject_conflicts(3)
    res = await sched.cordon("n1", "r-2", "ECC DBE")
    assert res.cordoned_by_us
    assert kube_api.node("n1")["spec"]["unschedulable"] is True
    patches = [r for r in kube_api.server._requests if r.method == "PATCH"]
    assert len(patches) == 4  # three 409s, then success


async def test_rejoin_keeps_someone_elses_cordon(kube_api: KubeApi, sched: KubeScheduler) -> None:
    kube_api.add_node("n1", unschedulable=True)  # an operator cordoned it
    res = await sched.cordon("n1", "r-3", "Xid 48")
    assert not res.cordoned_by_us and res.by_other and res.held_by_repair is None
    node = kube_api.node("n1")
    assert ANN_CORDONED_BY not in node["metadata"]["annotations"]
    assert any(t["key"] == TAINT_KEY for t in _taints(node))

    rj = await sched.rejoin("n1", "r-3")
    assert not rj.uncordoned and "someone else" in rj.kept_reason
    node = kube_api.node("n1")
    assert node["spec"]["unschedulable"] is True  # operator's cordon kept
    assert not any(t["key"] == TAINT_KEY for t in _taints(node))  # our taint gone
    assert ANN_REPAIR_ID not in node["metadata"]["annotations"]


async def test_idle_detection_by_gpu_requests(kube_api: KubeApi, sched: KubeScheduler) -> None:
    kube_api.add_node("n1")
    kube_api.add_pod("kube-system", "dcgm-exporter", "n1", daemonset=True)
    kube_api.add_pod("default", "cpu-job", "n1")
    kube_api.add_pod("ml", "done-train", "n1", gpus=8, phase="Succeeded")
    kube_api.add_pod("ml", "other-node", "n2", gpus=8)
    assert (await sched.check_idle("n1")).idle
    kube_api.add_pod("ml", "train-0", "n1", gpus=4)
    st = await sched.check_idle("n1")
    assert not st.idle and st.running == ["ml/train-0"]


async def test_drain_evicts_retries_pdb_429_and_leaves_daemonsets(
    kube_api: KubeApi, sched: KubeScheduler
) -> None:
    kube_api.add_node("n1")
    kube_api.add_pod("kube-system", "dcgm-exporter", "n1", daemonset=True)
    kube_api.add_pod("kube-system", "static-etcd", "n1", mirror=True)
    kube_api.add_pod("ml", "train-0", "n1", gpus=8, labels={"app": "train"})
    kube_api.add_pod("web", "api-0", "n1", labels={"app": "api"})
    kube_api.add_pdb("ml", "train-pdb", {"app": "train"}, disruptions_allowed=0)
    await sched.cordon("n1", "r-4", "Xid 79")

    beats: list[Any] = []

    def heartbeat(detail: dict[str, Any]) -> None:
        beats.append(detail)
        if detail["blocked"]:  # the PDB answered 429: its replacement pod becomes ready
            kube_api.set_pdb_allowed("ml", "train-pdb", 1)

    res = await sched.drain("n1", "r-4", deadline_s=30, heartbeat=heartbeat)
    assert res.drained
    assert not kube_api.pod_exists("ml", "train-0") and not kube_api.pod_exists("web", "api-0")
    assert kube_api.pod_exists("kube-system", "dcgm-exporter")
    assert kube_api.pod_exists("kube-system", "static-etcd")
    codes = [(p, c) for _, p, c in kube_api.server.evictions]
    assert ("train-0", 429) in codes and ("train-0", 201) in codes
    assert any("ml/train-0" in b["blocked"] for b in beats)
    # a retried drain is a no-op
    assert (await sched.drain("n1", "r-4", deadline_s=5)).detail == "no pods to evict"


async def test_drain_deadline_lists_remaining_pods(
    kube_api: KubeApi, sched: KubeScheduler
) -> None:
    kube_api.add_node("n1")
    kube_api.add_pod("ml", "train-0", "n1", gpus=8, labels={"app": "train"})
    kube_api.add_pdb("ml", "train-pdb", {"app": "train"}, disruptions_allowed=0)
    with pytest.raises(ApplicationError) as ei:
        await sched.drain("n1", "r-5", deadline_s=1.5)
    assert ei.value.type == ERR_DRAIN_DEADLINE and ei.value.non_retryable
    assert "ml/train-0" in str(ei.value)
    assert kube_api.pod_exists("ml", "train-0")


async def test_node_health_and_unknown_node(kube_api: KubeApi, sched: KubeScheduler) -> None:
    kube_api.add_node("n1", boot_id="b-1")
    h = await sched.node_health("n1")
    assert h.ready and h.boot_id == "b-1" and h.state == ["Ready"]
    kube_api.set_boot_id("n1", "b-2")
    assert (await sched.node_health("n1")).boot_id == "b-2"
    with pytest.raises(ApplicationError) as ei:
        await sched.cordon("nope", "r-6", "x")
    assert ei.value.type == ERR_UNKNOWN_NODE and ei.value.non_retryable and "nope" in str(ei.value)


async def test_cordon_names_the_other_repair_holding_the_node(
    kube_api: KubeApi, sched: KubeScheduler
) -> None:
    kube_api.add_node("n1")
    assert (await sched.cordon("n1", "r-a", "Xid 79")).cordoned_by_us
    res = await sched.cordon("n1", "r-b", "Xid 48")
    assert not res.cordoned_by_us and res.by_other and res.held_by_repair == "r-a"
