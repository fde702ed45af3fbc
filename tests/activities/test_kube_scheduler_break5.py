"""Break-test round 5: KubeScheduler against kmock (``kube_api``) — the drain deadline,
evictions the API server refuses, and a node deleted and re-created mid-repair."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp.web
import pytest
from temporalio.exceptions import ApplicationError

from activities.power import boot_changed
from activities.scheduler.kube import TAINT_KEY, KubeScheduler
from tests.fixtures.kube import NODES, PODS, KubeApi, KubeEmulator, _status
from workflows.activity_api import ERR_DRAIN_DEADLINE, NodeHealth
from workflows.config import ClusterConfig, NodeConfig


@pytest.fixture()
def sched(kube_api: KubeApi) -> KubeScheduler:
    cluster = ClusterConfig(
        name="k8s", scheduler="kubernetes", nodes=[NodeConfig(name="gpu-node-1")]
    )
    return KubeScheduler(cluster, api_client=kube_api.api_client)


async def test_drain_deadline_holds_for_evicted_pods_stuck_terminating(
    kube_api: KubeApi, sched: KubeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training pod accepts its eviction but never goes (a finalizer, a long
    terminationGracePeriodSeconds, a kubelet that stopped answering while the BMC still
    says On): it stays Terminating. The drain then looped past its deadline for as long as
    the activity's start-to-close limit allowed (deadline + 300 s) and timed out instead
    of reporting it: the pod was counted as 'evicted', so the deadline check found nothing
    remaining. The rail (kube.py docstring, docs/design.md §5): after ``deadline_s`` the
    pods still on the node are listed in a non-retryable ERR_DRAIN_DEADLINE."""

    async def evict_but_stay(self: KubeEmulator, request: Any) -> aiohttp.web.StreamResponse:
        key = (PODS, request.namespace, request.name)
        self.objects[key].patch({"metadata": {"deletionTimestamp": "2026-12-07T10:00:00Z"}})
        self.evictions.append((str(request.namespace), str(request.name), 201))
        return aiohttp.web.json_response({"kind": "Status", "status": "Success",
                                          "code": 201}, status=201)

    monkeypatch.setattr(KubeEmulator, "_evict", evict_but_stay)
    kube_api.add_node("n1")
    kube_api.add_pod("ml", "train-0", "n1", gpus=8)
    await sched.cordon("n1", "r-k1", "Xid 79")
    with pytest.raises(ApplicationError) as ei:
        await asyncio.wait_for(sched.drain("n1", "r-k1", deadline_s=1.5), timeout=15)
    assert ei.value.type == ERR_DRAIN_DEADLINE and ei.value.non_retryable
    assert "ml/train-0" in str(ei.value)


async def test_drain_deadline_holds_when_the_api_server_refuses_an_eviction(
    kube_api: KubeApi, sched: KubeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod covered by two PodDisruptionBudgets: the API server answers every eviction
    with 500 "This pod has more than one PodDisruptionBudget, which the eviction
    subresource does not support." The drain raised the 500 at once; Temporal retried
    the activity in batches forever, each try with a fresh deadline, so the repair sat in
    ``draining`` without ever reporting which pod blocks it. Expected: the refused pod is
    reported as blocked (heartbeat) and retried within the drain, and after ``deadline_s``
    the drain fails with ERR_DRAIN_DEADLINE naming the pod and the API server's answer."""

    async def refuse(self: KubeEmulator, request: Any) -> aiohttp.web.StreamResponse:
        self.evictions.append((str(request.namespace), str(request.name), 500))
        return _status(500, "InternalError", "This pod has more than one "
                       "PodDisruptionBudget, which the eviction subresource does not support.")

    monkeypatch.setattr(KubeEmulator, "_evict", refuse)
    kube_api.add_node("n1")
    kube_api.add_pod("ml", "train-0", "n1", gpus=8)
    await sched.cordon("n1", "r-k2", "Xid 79")
    beats: list[Any] = []
    with pytest.raises(ApplicationError) as ei:
        await asyncio.wait_for(
            sched.drain("n1", "r-k2", deadline_s=1.5, heartbeat=beats.append), timeout=15)
    assert ei.value.type == ERR_DRAIN_DEADLINE and ei.value.non_retryable
    assert "ml/train-0" in str(ei.value) and "PodDisruptionBudget" in str(ei.value)
    assert any("ml/train-0" in b.get("blocked", {}) for b in beats if isinstance(b, dict))


async def test_drain_recordons_a_node_recreated_mid_repair(
    kube_api: KubeApi, sched: KubeScheduler
) -> None:
    """The Node object is deleted and re-registered by its kubelet while the repair waits
    (a cloud node-lifecycle controller, ``kubectl delete node`` by a colleague): the new
    object carries neither ``unschedulable`` nor our taint. The drain evicted the pods
    from a schedulable node, so the scheduler placed GPU jobs right back on it, and the
    reboot that followed killed them. ``kubectl drain`` cordons before evicting, and the
    Slurm drain re-drains an undrained node first; the Kubernetes drain must likewise
    leave the node cordoned with this repair's taint before it evicts."""
    kube_api.add_node("n1", boot_id="b-1")
    await sched.cordon("n1", "r-k3", "Xid 79")
    kube_api.server.objects[NODES, None, "n1"].delete()
    kube_api.add_node("n1", boot_id="b-1")  # re-registered: no cordon, no taint
    kube_api.add_pod("ml", "train-0", "n1", gpus=8)
    res = await sched.drain("n1", "r-k3", deadline_s=10)
    assert res.drained
    node = kube_api.node("n1")
    assert node["spec"].get("unschedulable") is True
    assert any(t["key"] == TAINT_KEY and t.get("value") == "r-k3"
               for t in node["spec"].get("taints") or [])
    # and the rejoin afterwards undoes exactly that cordon
    rj = await sched.rejoin("n1", "r-k3")
    assert rj.uncordoned and not kube_api.node("n1")["spec"].get("unschedulable")


async def test_drain_of_a_notready_node_does_not_poll_its_bmc_twice_a_second(
    kube_api: KubeApi
) -> None:
    """A NotReady node (kubelet wedged by the GPU fault) whose BMC reports power On: its
    pods cannot be force-released, and one of them waits on a PodDisruptionBudget. The
    drain asked the BMC for the host's power state on every 0.5 s poll, for as long as the
    drain deadline (hours by default): thousands of Redfish sessions against a
    controller the design otherwise rate-limits (``temporal.bmc_rate_per_s``), on the
    machine that is already sick. Expected: the BMC is asked once when the drain starts
    and then at a bounded, slow rate, not on every poll."""
    probes: list[str] = []

    async def probe(cluster: str, node: str) -> dict[str, str | None]:
        probes.append(node)
        return {"power_state": "On", "state": "Enabled", "health": "Critical"}

    cluster = ClusterConfig(name="k8s", scheduler="kubernetes",
                            nodes=[NodeConfig(name="n1")])
    sched = KubeScheduler(cluster, api_client=kube_api.api_client, bmc_probe=probe)
    kube_api.add_node("n1", ready=False)
    kube_api.add_pod("ml", "train-0", "n1", gpus=8, labels={"app": "train"})
    kube_api.add_pdb("ml", "train-pdb", {"app": "train"}, disruptions_allowed=0)
    with pytest.raises(ApplicationError) as ei:
        await sched.drain("n1", "r-k4", deadline_s=3)
    assert ei.value.type == ERR_DRAIN_DEADLINE
    assert 1 <= len(probes) <= 2, f"BMC asked {len(probes)} times in a 3 s drain"


async def test_a_node_object_without_a_reported_boot_id_is_not_a_reboot(
    kube_api: KubeApi, sched: KubeScheduler
) -> None:
    """The Node object was deleted and created again (by a cloud controller or from a
    manifest) and its kubelet has not posted status yet: ``status.nodeInfo.bootID`` is
    the empty string. node_health reported boot id ``""``, which differs from the boot id
    read before the power cycle, so the boot-identity guard said "host already came back:
    boot id changed boot-1 -> " and the power cycle was skipped on a host that never
    lost power. An empty boot id is no boot identity: unknown, never a reboot."""
    kube_api.add_node("n1", boot_id="boot-1")
    before = await sched.node_health("n1")
    kube_api.server.objects[NODES, None, "n1"].delete()
    kube_api.add_node("n1", boot_id="")  # re-created, no status from its kubelet yet
    now = await sched.node_health("n1")
    assert now.boot_id is None
    assert now.rebooted_since(before.boot_id, before.boot_time) is not True

    async def health(_cluster: str, node: str) -> NodeHealth:
        return await sched.node_health(node)

    assert await boot_changed(health, "k8s", "n1", before.boot_id, None) is None


async def test_pods_on_mig_slices_or_shared_gpus_are_gpu_work(
    kube_api: KubeApi, sched: KubeScheduler
) -> None:
    """An inference fleet runs its A100/H100 nodes in MIG mode (the NVIDIA device plugin's
    ``mixed`` strategy advertises ``nvidia.com/mig-1g.10gb`` …) or with time-slicing
    renamed to ``nvidia.com/gpu.shared``. Their pods request no ``nvidia.com/gpu``, so the
    idle check called the node idle while seven inference replicas ran on its GPUs: the
    wait for idle ended at once and the drain evicted them. Work on a MIG slice or a
    shared GPU is GPU work (DESIGN §5 wait-for-idle)."""
    kube_api.add_node("n1")
    for name, resource in (("infer-mig", "nvidia.com/mig-1g.10gb"),
                           ("infer-shared", "nvidia.com/gpu.shared")):
        kube_api.add_pod("ml", name, "n1")
        kube_api.server.objects[PODS, "ml", name].patch({"spec": {"containers": [
            {"name": "main", "image": "triton",
             "resources": {"requests": {"cpu": "1", resource: "1"},
                           "limits": {resource: "1"}}}]}})
    st = await sched.check_idle("n1")
    assert not st.idle and st.running == ["ml/infer-mig", "ml/infer-shared"], st
