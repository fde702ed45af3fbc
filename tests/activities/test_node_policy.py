"""``load_node_policy`` (issue 30 item 2): the node's and repair's policy read is the
cluster's snapshot cut to one node — the same answer for that node as ``load_policy``
(pool, machine, failure domains, modes), and a size that does not grow with the
cluster (``load_policy`` at 10,000 nodes is several hundred KB per history)."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.policy_activities import PolicyActivities
from workflows.activity_api import ERR_UNKNOWN_NODE, NodePolicy, NodeRef
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, PoolConfig


def _config(nodes: int) -> AutorepairConfig:
    """One cluster of ``nodes`` nodes (names of one width), 4 pools (one in shadow), a
    failure domain per rack of 32, machines named apart from their nodes."""
    return AutorepairConfig(clusters=[ClusterConfig(
        name="big", mode="enforce",
        pools=[PoolConfig(name="pool-1", mode="shadow")],
        nodes=[NodeConfig(name=f"gpu-{i:05d}", machine=f"m-{i:05d}", pool=f"pool-{i % 4}",
                          failure_domain=f"rack-{i // 32:04d}") for i in range(nodes)])])


def _size(model: Any) -> int:
    return len(model.model_dump_json())


async def test_the_node_policy_read_is_the_same_size_at_10_and_10000_nodes() -> None:
    small, large = PolicyActivities(_config(10)), PolicyActivities(_config(10_000))
    ref = NodeRef(cluster="big", node="gpu-00005")
    a, b = await small.load_node_policy(ref), await large.load_node_policy(ref)
    # the only differences are the node count's digits
    assert abs(_size(a) - _size(b)) <= 8, (_size(a), _size(b))
    assert b.gpu_nodes == 10_000 and a.gpu_nodes == 10
    # what it replaces grows with the cluster: the test compares against a real growth
    full_small, full_large = await small.load_policy("big"), await large.load_policy("big")
    assert _size(full_large) > 100 * _size(b)
    assert _size(full_large) > 500 * (_size(full_small) - _size(a)) > 0


@pytest.mark.parametrize("node", ["gpu-00001", "gpu-00006", "gpu-00040", "not-configured"])
async def test_the_node_policy_is_the_cluster_snapshot_cut_to_the_node(node: str) -> None:
    labelled = {"gpu-00001": ["clique-7"], "gpu-00040": ["rack-0001", "zone-a"],
                "not-configured": ["zone-b"]}

    async def domains(cluster: str) -> dict[str, list[str]]:
        return labelled

    acts = PolicyActivities(_config(64), node_domains=domains)
    got = await acts.load_node_policy(NodeRef(cluster="big", node=node))
    want = NodePolicy.of(await acts.load_policy("big"), node)
    assert got == want
    assert got.machine == want.machines.get(node)
    assert got.pool == want.pools.get(node)
    assert got.node_domains == want.domains.get(node, [])
    if node == "gpu-00001":
        assert (got.pool, got.machine, got.node_domains) == (
            "pool-1", "m-00001", ["clique-7", "rack-0000"])
        assert got.mode_of(got.pool) == "shadow"
    if node == "gpu-00006":
        assert got.mode_of(got.pool) == "enforce"
        assert len(got.pools) == len(got.machines) == len(got.domains) == 1
    if node == "not-configured":
        assert (got.pool, got.machine, got.node_domains) == (None, None, ["zone-b"])


async def test_an_unconfigured_cluster_gets_the_global_policy() -> None:
    cfg = _config(4)
    got = await PolicyActivities(cfg).load_node_policy(NodeRef(cluster="other", node="n1"))
    assert got.policy == cfg.policy and got.gpu_nodes == 0
    assert (got.pool, got.machine, got.node_domains) == (None, None, [])


@pytest.mark.parametrize("ref,field", [(NodeRef(cluster="", node="n1"), "cluster"),
                                       (NodeRef(cluster="big", node=""), "node")])
async def test_an_empty_name_is_refused_naming_the_field(ref: NodeRef, field: str) -> None:
    with pytest.raises(ApplicationError) as err:
        await PolicyActivities(_config(4)).load_node_policy(ref)
    assert err.value.type == ERR_UNKNOWN_NODE and err.value.non_retryable
    assert f"{field} must not be empty" in str(err.value)


async def test_a_migrated_node_reads_its_bound_machine_from_the_ledger(ledger_pool: Any) -> None:
    await ledger_pool.execute(
        "INSERT INTO node_bindings (cluster, node, machine) VALUES ($1, $2, $3)",
        "big", "gpu-00002", "spare-9")
    acts = PolicyActivities(_config(8), ledger_pool)
    got = await acts.load_node_policy(NodeRef(cluster="big", node="gpu-00002"))
    assert got.machine == "spare-9"
    assert got == NodePolicy.of(await acts.load_policy("big"), "gpu-00002")
    other = await acts.load_node_policy(NodeRef(cluster="big", node="gpu-00003"))
    assert other.machine == "m-00003"
