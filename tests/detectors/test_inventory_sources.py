"""The schedulers' node lists that ``autorepair ingest`` reads into its inventory
(``workers.inventory.scheduler_inventory``): the real Slurm client against a running
slurmctld, the real Kubernetes client (from a kubeconfig) against kmock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fixtures.slurm import SlurmCluster
from workers.inventory import scheduler_inventory
from workflows.config import AutorepairConfig, ClusterConfig


def kubeconfig(tmp_path: Path, url: str) -> str:
    p = tmp_path / "kubeconfig"
    p.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: k, cluster: {{server: "{url}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: c, context: {{cluster: k, user: u}}}}]
current-context: c
""")
    return str(p)


async def test_kubernetes_node_list_and_unreadable_cluster_left_out(
    kube_api: Any, tmp_path: Path
) -> None:
    for n in ("gpu-01", "gpu-02", "cpu-01"):
        kube_api.add_node(n)
    cfg = AutorepairConfig(clusters=[
        ClusterConfig(name="k8s", scheduler="kubernetes",
                      kubeconfig=kubeconfig(tmp_path, kube_api.url)),
        ClusterConfig(name="gone", scheduler="slurm", slurm_bin_dir=str(tmp_path / "none")),
    ])
    source = scheduler_inventory(cfg)
    assert source is not None
    lists = await source()
    assert {k: sorted(v) for k, v in lists.items()} == {"k8s": ["cpu-01", "gpu-01", "gpu-02"]}
    assert scheduler_inventory(AutorepairConfig()) is None


async def test_slurm_node_list(slurm_cluster: SlurmCluster) -> None:
    cfg = AutorepairConfig(clusters=[ClusterConfig(
        name="s", scheduler="slurm", slurm_conf=str(slurm_cluster.conf_path))])
    source = scheduler_inventory(cfg)
    assert source is not None
    assert sorted((await source())["s"]) == sorted(slurm_cluster.nodes)
