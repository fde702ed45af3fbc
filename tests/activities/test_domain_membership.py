"""Failure-domain membership from the schedulers (issue 29 item 2): Kubernetes node labels
named by ``policy.domains.label_keys`` (kmock and the real kubernetes_asyncio client),
Slurm node features with ``policy.domains.slurm_feature_prefix`` (the loopback cluster),
merged with ``nodes[].failure_domain`` by ``load_policy`` into ``PolicySnapshot.domains``."""

from __future__ import annotations

import pytest

from activities.policy_activities import PolicyActivities
from activities.scheduler.kube import KubeScheduler
from activities.scheduler.slurm import SlurmScheduler
from tests.fixtures.kube import NODES, KubeApi
from workers.devpeers import SlurmCluster
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig

KEYS = ["topology.kubernetes.io/zone", "nvidia.com/gpu.clique"]


def _label(kube_api: KubeApi, name: str, labels: dict[str, str]) -> None:
    kube_api.server.objects[NODES, None, name].patch({"metadata": {"labels": labels}})


async def test_kubernetes_labels_name_the_domains(kube_api: KubeApi) -> None:
    for n in ("n1", "n2", "n3"):
        kube_api.add_node(n)
    _label(kube_api, "n1", {"topology.kubernetes.io/zone": "zone-a",
                            "nvidia.com/gpu.clique": "clique-7.1", "team": "ml"})
    _label(kube_api, "n2", {"nvidia.com/gpu.clique": "clique-7.1"})
    cluster = ClusterConfig(name="k8s", scheduler="kubernetes",
                            nodes=[NodeConfig(name="n3", failure_domain="pdu-2")])
    sched = KubeScheduler(cluster, api_client=kube_api.api_client)
    assert await sched.node_domains(KEYS, "domain=") == {
        "n1": ["clique-7.1", "zone-a"], "n2": ["clique-7.1"]}
    assert await sched.node_domains(["team"], "domain=") == {"n1": ["ml"]}

    cfg = AutorepairConfig(clusters=[cluster])

    async def domains(name: str) -> dict[str, list[str]]:
        assert name == "k8s"
        return await sched.node_domains(cfg.policy.domains.label_keys,
                                        cfg.policy.domains.slurm_feature_prefix)

    snap = await PolicyActivities(cfg, node_domains=domains).load_policy("k8s")
    assert snap.domains == {"n1": ["clique-7.1", "zone-a"], "n2": ["clique-7.1"],
                            "n3": ["pdu-2"]}


async def test_a_failed_label_read_keeps_the_last_answer() -> None:
    calls = {"n": 0}

    async def domains(_: str) -> dict[str, list[str]]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError("API down")
        return {"n1": ["rack-1"]}

    t = {"now": 0.0}
    cfg = AutorepairConfig(clusters=[ClusterConfig(name="c", nodes=[NodeConfig(name="n1")])])
    acts = PolicyActivities(cfg, node_domains=domains, clock=lambda: t["now"])
    assert (await acts.load_policy("c")).domains == {"n1": ["rack-1"]}
    t["now"] = 301.0  # past NODE_LIST_TTL_S: read again, which fails
    assert (await acts.load_policy("c")).domains == {"n1": ["rack-1"]}
    assert calls["n"] == 2


@pytest.mark.slurm
async def test_slurm_features_name_the_domains(
    slurm_cluster: SlurmCluster, slurm_cluster_config: ClusterConfig
) -> None:
    slurm_cluster.reset_nodes()
    try:
        slurm_cluster.run("scontrol", "update", "NodeName=gpu-01",
                          "AvailableFeatures=a100,domain=rack7",
                          "ActiveFeatures=a100,domain=rack7")
        slurm_cluster.run("scontrol", "update", "NodeName=gpu-02",
                          "AvailableFeatures=domain=rack7,domain=pdu2",
                          "ActiveFeatures=domain=rack7,domain=pdu2")
        sched = SlurmScheduler(slurm_cluster_config)
        got = await sched.node_domains(KEYS, "domain=")
        assert got["gpu-01"] == ["rack7"] and got["gpu-02"] == ["pdu2", "rack7"]
        assert all("a100" not in ds for ds in got.values())
    finally:
        for n in ("gpu-01", "gpu-02"):
            slurm_cluster.run("scontrol", "update", f"NodeName={n}", "AvailableFeatures=",
                              "ActiveFeatures=", check=False)
