"""The ``load_policy`` activity: hands workflows the current policy and cluster facts.

Workflows read policy through this activity (recorded in their history) so a config
change applies to new decisions without restarting running workflows.
"""

from __future__ import annotations

import asyncpg
from temporalio import activity

from activities.spares import MachineBindings
from workflows.activity_api import ACT, ERR_UNKNOWN_NODE, PolicySnapshot, permanent
from workflows.config import AutorepairConfig


class PolicyActivities:
    """Holds the loaded configuration; ``load_policy`` snapshots it per cluster.

    With the ledger ``pool``, node → machine bindings recorded by migrations override the
    configured machines, so the next repair and the search attributes name the machine
    the node runs on now."""

    def __init__(self, config: AutorepairConfig, pool: asyncpg.Pool | None = None) -> None:
        self.config = config
        self.pool = pool

    @activity.defn(name=ACT.load_policy)
    async def load_policy(self, cluster: str) -> PolicySnapshot:
        """Policy + GPU node count, scheduler, pools and machines of ``cluster``; the
        cluster's ``reset_gpu.policy`` replaces ``policy.reset_gpu`` when set.

        An unconfigured cluster gets the global policy with ``gpu_nodes=0`` (rails then
        size budgets from the nodes they have seen). Raises non-retryable
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
        policy = self.config.policy
        if c.reset_gpu.policy is not None:
            policy = policy.model_copy(update={"reset_gpu": c.reset_gpu.policy})
        machines = {n.name: (n.machine or n.name) for n in c.nodes}
        if self.pool is not None:
            machines.update(await MachineBindings(self.pool).bindings(cluster))
        return PolicySnapshot(
            cluster=cluster,
            policy=policy,
            gpu_nodes=c.gpu_node_count,
            scheduler=c.scheduler,
            pools={n.name: n.pool for n in c.nodes},
            machines=machines,
            bmc_task_queue=self.config.temporal.bmc_task_queue,
        )
