"""Issue 27 item 9: the guard's denominators (concurrency budget, breaker threshold) come
from the configured inventory or the scheduler's node list only, never from the distinct
nodes that alerts or lease requests name.

Without configured ``gpu_nodes`` a collector's 32 made-up nodes used to take the budget
1 → 3 and the breaker threshold 2 → 5. The guard runs on the project harness
(time-skipping Temporal, real ledger); ``load_policy`` is the real ``PolicyActivities``
over the real Kubernetes scheduler client against kmock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from activities.policy_activities import NODE_LIST_TTL_S, PolicyActivities
from activities.scheduler.kube import KubeScheduler
from tests.fixtures.kube import KubeApi
from tests.security.conftest import Harness
from tests.workflows.conftest import make_alert
from tests.workflows.helpers import guard_status
from workflows.config import AutorepairConfig
from workflows.protocol import GUARD_SIGNAL_ACQUIRE, LeaseRequest, workflow_id_guard


async def test_made_up_nodes_do_not_raise_the_rails(harness: Harness) -> None:
    h = harness
    h.gpu_nodes = 0  # nothing configured, no scheduler list
    c = h.cluster.cluster
    for i in range(32):  # a collector's made-up nodes, each with a GPU-naming alert
        await h.ledger.record_alert(make_alert(
            c, f"fake-{i:02d}", f"f{i}", observed_at=datetime(2025, 1, 1, tzinfo=UTC)))
    guard = await h.client.start_workflow(
        "ClusterGuardWorkflow", {"cluster": c}, id=workflow_id_guard(c),
        task_queue=h.task_queue)
    for i in range(32):  # and lease requests carrying GPU evidence from them
        await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
            repair_id=f"fake{i}", workflow_id=f"nowhere/{i}", cluster=c,
            node=f"fake-{i:02d}", automatic=False, gpu_evidence=True))
    await asyncio.sleep(2)
    g = await guard_status(h)
    assert (g.gpu_nodes, g.budget, g.breaker_threshold) == (0, 1, 2)


async def test_load_policy_counts_the_schedulers_node_list(kube_api: KubeApi) -> None:
    for i in range(40):
        kube_api.add_node(f"gpu-{i:02d}")
    cfg = AutorepairConfig.model_validate({"clusters": [
        {"name": "k1", "scheduler": "kubernetes"},
        {"name": "k2", "scheduler": "kubernetes", "gpu_nodes": 8}]})
    sched = KubeScheduler(cfg.clusters[0], api_client=kube_api.api_client)
    calls: list[str] = []
    t = [0.0]

    async def names(cluster: str) -> list[str]:
        calls.append(cluster)
        return await sched.node_names()

    acts = PolicyActivities(cfg, node_names=names, clock=lambda: t[0])
    snap = await acts.load_policy("k1")
    assert snap.gpu_nodes == 40
    assert (await acts.load_policy("k2")).gpu_nodes == 8  # configured wins, not read
    assert calls == ["k1"]
    kube_api.add_node("gpu-40")
    assert (await acts.load_policy("k1")).gpu_nodes == 40  # cached
    t[0] += NODE_LIST_TTL_S + 1
    assert (await acts.load_policy("k1")).gpu_nodes == 41
    assert (await acts.load_policy("unknown")).gpu_nodes == 0
