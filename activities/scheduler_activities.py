"""Scheduler activities on the main task queue: ``cordon_node``, ``check_idle``,
``drain_node``, ``rejoin_node``, ``node_health``.

Each resolves the cluster's scheduler (Slurm or Kubernetes, ``ClusterConfig.scheduler``)
once per cluster and delegates to :class:`activities.scheduler.base.Scheduler`.
``drain_node`` heartbeats its progress (callers set a heartbeat timeout of ~30 s).
Unknown cluster → non-retryable ``ERR_UNKNOWN_NODE``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from temporalio import activity

from activities.power import BindingReader, redfish_probe
from activities.scheduler import Scheduler, scheduler_for
from workflows.activity_api import (
    ACT,
    ERR_UNKNOWN_NODE,
    CordonInput,
    CordonResult,
    DrainInput,
    DrainResult,
    IdleStatus,
    NodeHealth,
    NodeRef,
    RejoinInput,
    RejoinResult,
    permanent,
)
from workflows.config import AutorepairConfig


def _heartbeat(*details: Any) -> None:
    if activity.in_activity():
        activity.heartbeat(*details)


class SchedulerActivities:
    """Scheduler-side activities; ``schedulers`` pre-seeds clients (tests, kube api_client)."""

    def __init__(
        self, config: AutorepairConfig, schedulers: dict[str, Scheduler] | None = None,
        bindings: BindingReader | None = None,
    ) -> None:
        self.config = config
        self._schedulers: dict[str, Scheduler] = dict(schedulers or {})
        #: node → machine a migrate bound it to (the BMC probe follows it); set by
        #: :func:`activities.registry.build_activities` before the first scheduler is built
        self.bindings = bindings

    def scheduler(self, cluster: str) -> Scheduler:
        """The scheduler of ``cluster`` (built on first use)."""
        if cluster not in self._schedulers:
            try:
                c = self.config.cluster(cluster)
            except KeyError:
                raise permanent(
                    ERR_UNKNOWN_NODE,
                    f"clusters: no cluster named {cluster!r}",
                ) from None
            kwargs: dict[str, Any] = {}
            if c.scheduler == "kubernetes":
                # the BMC's word lets a powered-off node's pods go (non-graceful shutdown)
                kwargs["bmc_probe"] = redfish_probe(self.config, self.bindings)
            self._schedulers[cluster] = scheduler_for(c, **kwargs)
        return self._schedulers[cluster]

    async def health(self, cluster: str, node: str) -> NodeHealth:
        """Scheduler view of a node (the boot-identity reader of the BMC activities)."""
        return await self.scheduler(cluster).node_health(node)

    @activity.defn(name=ACT.cordon_node)
    async def cordon_node(self, inp: CordonInput) -> CordonResult:
        """Cordon/drain-flag the node for ``inp.repair_id`` (no-op when already ours)."""
        return await self.scheduler(inp.cluster).cordon(inp.node, inp.repair_id, inp.reason)

    @activity.defn(name=ACT.check_idle)
    async def check_idle(self, inp: NodeRef) -> IdleStatus:
        """Whether the node runs no GPU work."""
        return await self.scheduler(inp.cluster).check_idle(inp.node)

    @activity.defn(name=ACT.drain_node)
    async def drain_node(self, inp: DrainInput) -> DrainResult:
        """Move remaining work off the node before the drain's absolute deadline
        (``inp.deadline_at``; heartbeats): the scheduler gets the time left, seconds, so a
        retry never restarts the deadline; once it passed, the scheduler looks once and
        lists what still runs. "Now" is the later of this try's scheduled time (the
        Temporal server's clock, the clock the deadline was set on) and this worker's
        clock: a worker clock behind the server's never lengthens the drain."""
        now = datetime.now(UTC)
        if activity.in_activity():
            now = max(now, activity.info().current_attempt_scheduled_time)
        return await self.scheduler(inp.cluster).drain(
            inp.node, inp.repair_id, inp.remaining_s(now), heartbeat=_heartbeat
        )

    @activity.defn(name=ACT.rejoin_node)
    async def rejoin_node(self, inp: RejoinInput) -> RejoinResult:
        """Undo only this repair's cordon."""
        return await self.scheduler(inp.cluster).rejoin(inp.node, inp.repair_id)

    @activity.defn(name=ACT.node_health)
    async def node_health(self, inp: NodeRef) -> NodeHealth:
        """Readiness and boot identity of the node."""
        return await self.health(inp.cluster, inp.node)

    def all(self) -> list[Callable[..., Any]]:
        """The activity methods of this class."""
        return [self.cordon_node, self.check_idle, self.drain_node, self.rejoin_node,
                self.node_health]
