"""The policy activities: hand workflows the current policy and cluster facts.

- ``load_policy(cluster)`` → :class:`PolicySnapshot`: every node's pool, machine and
  failure domains (the cluster guard needs them all);
- ``load_node_policy(NodeRef)`` → :class:`NodePolicy`: the same for one node only (the
  node entity and its repairs, which run it as a local activity on every alert's path:
  its size does not grow with the cluster, issue 30 item 2).

Workflows read policy through these activities (recorded in their history) so a config
change applies to new decisions without restarting running workflows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable

import asyncpg
from temporalio import activity

from activities.spares import MachineBindings
from workflows.activity_api import (
    ACT,
    ERR_UNKNOWN_NODE,
    NodePolicy,
    NodeRef,
    PolicySnapshot,
    permanent,
)
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, PolicyConfig

log = logging.getLogger("autorepair.activities.policy")

NODE_LIST_TTL_S = 300.0
"""How long a scheduler's node count is reused, seconds (ingest re-reads its inventory on
the same order, ``ingest.inventory_refresh_s``): ``load_policy`` runs on every workflow's
policy refresh and must not run ``scontrol show node`` each time."""

#: The scheduler's node names of a cluster (``Scheduler.node_names``).
NodeNames = Callable[[str], Awaitable[Iterable[str]]]
#: node → failure domains of a cluster as its scheduler labels them
#: (``Scheduler.node_domains`` with ``policy.domains``; issue 29 item 2).
NodeDomains = Callable[[str], Awaitable[dict[str, list[str]]]]


class PolicyActivities:
    """Holds the loaded configuration; ``load_policy`` snapshots it per cluster.

    With the ledger ``pool``, node → machine bindings recorded by migrations override the
    configured machines, so the next repair and the search attributes name the machine
    the node runs on now."""

    def __init__(self, config: AutorepairConfig, pool: asyncpg.Pool | None = None, *,
                 node_names: NodeNames | None = None,
                 node_domains: NodeDomains | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.pool = pool
        self.node_names = node_names
        self.node_domains = node_domains
        self.clock = clock
        self._counts: dict[str, tuple[float, int]] = {}
        self._domains: dict[str, tuple[float, dict[str, list[str]]]] = {}
        #: cluster → node name → its configuration (built once: the config is fixed)
        self._index: dict[str, dict[str, NodeConfig]] = {}

    def all(self) -> list[Callable[..., Awaitable[PolicySnapshot]]]:
        """Both policy activities, for ``Worker(activities=...)``."""
        return [self.load_policy, self.load_node_policy]

    def _node_config(self, c: ClusterConfig, node: str) -> NodeConfig | None:
        index = self._index.get(c.name)
        if index is None:
            index = self._index[c.name] = {n.name: n for n in c.nodes}
        return index.get(node)

    @staticmethod
    def _cluster_policy(c: ClusterConfig, policy: PolicyConfig) -> PolicyConfig:
        """``policy`` with the cluster's ``reset_gpu.policy`` and ``mode`` folded in."""
        if c.reset_gpu.policy is not None:
            policy = policy.model_copy(update={"reset_gpu": c.reset_gpu.policy})
        if c.mode is not None:
            policy = policy.model_copy(update={"mode": c.mode})
        return policy

    async def _labelled(self, cluster: str) -> dict[str, list[str]]:
        """node → domains the scheduler labels (``{}`` without ``node_domains``), re-read
        after :data:`NODE_LIST_TTL_S`; a failed read keeps the last answer (logged)."""
        if self.node_domains is None:
            return {}
        now = self.clock()
        got = self._domains.get(cluster)
        if got is not None and now - got[0] < NODE_LIST_TTL_S:
            return got[1]
        try:
            found = dict(await self.node_domains(cluster))
        except Exception as e:
            log.warning("event=node_domains_failed cluster=%s error=%s", cluster,
                        type(e).__name__)
            return got[1] if got is not None else {}
        self._domains[cluster] = (now, found)
        return found

    async def _listed(self, cluster: str) -> int:
        """Nodes the scheduler lists for ``cluster`` (0 without ``node_names``), re-read
        after :data:`NODE_LIST_TTL_S`; a failed read keeps the last count (logged)."""
        if self.node_names is None:
            return 0
        now = self.clock()
        got = self._counts.get(cluster)
        if got is not None and now - got[0] < NODE_LIST_TTL_S:
            return got[1]
        try:
            n = len(set(await self.node_names(cluster)))
        except Exception as e:
            log.warning("event=node_list_failed cluster=%s error=%s", cluster,
                        type(e).__name__)
            return got[1] if got is not None else 0
        self._counts[cluster] = (now, n)
        return n

    @activity.defn(name=ACT.load_policy)
    async def load_policy(self, cluster: str) -> PolicySnapshot:
        """Policy + GPU node count, scheduler, pools and machines of ``cluster``; the
        cluster's ``reset_gpu.policy`` replaces ``policy.reset_gpu`` and its ``mode``
        ``policy.mode`` when set; ``pool_modes`` are its ``pools[].mode`` (issue 29).

        ``gpu_nodes`` (the budget and breaker denominator) is the configured count
        (``clusters[].gpu_nodes``, else the listed ``nodes``), else the number of nodes
        the cluster's scheduler lists (``node_names``), else 0 (the rails' minimums).
        ``domains``: each node's ``failure_domain`` with the domains its scheduler labels
        (``node_domains``: Kubernetes labels ``policy.domains.label_keys``, Slurm features
        ``policy.domains.slurm_feature_prefix``), read like the node count.

        An unconfigured cluster gets the global policy with ``gpu_nodes=0`` (the rails
        then apply their minimums: ``min_concurrent``, ``breaker_min``). Raises non-retryable
        ``UnknownNode`` only for an empty cluster name.
        """
        if not cluster:
            raise permanent(ERR_UNKNOWN_NODE, "load_policy: cluster must not be empty")
        try:
            c = self.config.cluster(cluster)
        except KeyError:
            return PolicySnapshot(
                cluster=cluster,
                policy=self.config.policy,
                gpu_nodes=0,
                scheduler="slurm",
                bmc_task_queue=self.config.temporal.bmc_task_queue,
            )
        policy = self._cluster_policy(c, self.config.policy)
        machines = {n.name: (n.machine or n.name) for n in c.nodes}
        domains = {n: sorted(set(ds)) for n, ds in (await self._labelled(cluster)).items()}
        for n in c.nodes:
            if n.failure_domain:
                domains[n.name] = sorted({*domains.get(n.name, []), n.failure_domain})
        if self.pool is not None:
            machines.update(await MachineBindings(self.pool).bindings(cluster))
        return PolicySnapshot(
            cluster=cluster,
            policy=policy,
            # the rails' denominator: configured inventory, else the scheduler's node
            # list, never the nodes that alerts name (issue 27 item 9)
            gpu_nodes=c.gpu_node_count or await self._listed(cluster),
            scheduler=c.scheduler,
            pools={n.name: n.pool for n in c.nodes},
            machines=machines,
            domains=domains,
            bmc_task_queue=self.config.temporal.bmc_task_queue,
            pool_modes={p.name: p.mode for p in c.pools if p.mode is not None},
        )

    @activity.defn(name=ACT.load_node_policy)
    async def load_node_policy(self, ref: NodeRef) -> NodePolicy:
        """``load_policy(ref.cluster)`` for ``ref.node`` alone: the same policy, node
        count, scheduler, BMC queue and pool modes, and in ``pools`` / ``machines`` /
        ``domains`` only ``ref.node``'s entry (none where ``load_policy`` has none). The
        machine is the ledger's binding (one indexed row read), else the configured one.
        Cost and size are independent of the cluster's node count (the node index and
        the scheduler's domain labels are cached; the node count is cached as in
        ``load_policy``).

        An unconfigured cluster gets the global policy with ``gpu_nodes=0``. Raises
        non-retryable ``UnknownNode`` for an empty cluster or node name."""
        if not ref.cluster or not ref.node:
            field = "cluster" if not ref.cluster else "node"
            raise permanent(ERR_UNKNOWN_NODE,
                            f"load_node_policy: {field} must not be empty (got {ref!r})")
        node = ref.node
        try:
            c = self.config.cluster(ref.cluster)
        except KeyError:
            return NodePolicy(cluster=ref.cluster, node=node, policy=self.config.policy,
                              gpu_nodes=0, scheduler="slurm",
                              bmc_task_queue=self.config.temporal.bmc_task_queue)
        n = self._node_config(c, node)
        machine = (n.machine or n.name) if n is not None else None
        if self.pool is not None:
            machine = await MachineBindings(self.pool).machine_of(ref.cluster, node) or machine
        domains = set((await self._labelled(ref.cluster)).get(node, []))
        if n is not None and n.failure_domain:
            domains.add(n.failure_domain)
        return NodePolicy(
            cluster=ref.cluster,
            node=node,
            policy=self._cluster_policy(c, self.config.policy),
            gpu_nodes=c.gpu_node_count or await self._listed(ref.cluster),
            scheduler=c.scheduler,
            pools={node: n.pool} if n is not None else {},
            machines={node: machine} if machine is not None else {},
            domains={node: sorted(domains)} if domains else {},
            bmc_task_queue=self.config.temporal.bmc_task_queue,
            pool_modes={p.name: p.mode for p in c.pools if p.mode is not None},
        )
