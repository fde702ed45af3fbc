"""Break-test round 5: the non-graceful node shutdown must ask the BMC of the machine the
node runs on now (kmock Kubernetes API, Redfish emulator, real ledger bindings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from activities.registry import build_activities
from activities.scheduler.kube import OUT_OF_SERVICE_KEY
from activities.scheduler_activities import SchedulerActivities
from tests.activities.test_kube_powered_off import NODE, cfg, not_ready, power  # noqa: F401
from tests.fixtures.kube import KubeApi
from workflows.config import AutorepairConfig


async def test_a_migrated_node_is_not_shut_down_on_its_old_machines_power(
    kube_api: KubeApi, cfg: AutorepairConfig, ledger_pool: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """gpu-02 was migrated to the spare ``spare-9`` (ledger binding); its old machine
    ``m-gpu-02`` went to re-validation and was powered off there. The node then went
    NotReady for a moment (kubelet restart, network blip) while a repair checked idle.
    The worker's BMC probe asked the BMC of the configured machine — the old one — which
    said Off, so the scheduler tainted the node out-of-service and force-deleted its GPU
    pods although their host (spare-9) was running them: force deletion of pods that
    still run (two copies of a StatefulSet member, a training rank lost). The probe must
    follow the node's binding like the power actions do; a machine without a BMC
    confirms nothing."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: k, cluster: {{server: '{kube_api.url}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\ncurrent-context: c\n")
    conf = cfg.model_copy(update={"clusters": [cfg.clusters[0].model_copy(
        update={"kubeconfig": str(kubeconfig)})]})
    await ledger_pool.execute(
        "INSERT INTO node_bindings (cluster, node, machine, repair_id) "
        "VALUES ('k8s', $1, 'spare-9', 'r-mig')", NODE)
    sched_acts = SchedulerActivities(conf)
    build_activities(conf, ledger_pool, scheduler=sched_acts)  # the worker's wiring
    sched = sched_acts.scheduler("k8s")
    kube_api.add_node(NODE)
    kube_api.add_pod("ml", "train-0", NODE, gpus=8)
    await sched.cordon(NODE, "rep-9", "Xid 79")
    not_ready(kube_api)
    await power(conf, on=False)  # the OLD machine, under re-validation
    try:
        idle = await sched.check_idle(NODE)
    finally:
        await power(conf, on=True)
        await sched.close()
    assert not idle.idle and idle.detail == "", idle
    assert kube_api.pod_exists("ml", "train-0")
    assert not any(t["key"] == OUT_OF_SERVICE_KEY
                   for t in kube_api.node(NODE)["spec"].get("taints") or [])
