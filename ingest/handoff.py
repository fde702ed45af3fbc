"""Hand-off of alerts from ingest to the NodeWorkflow entities on Temporal.

:class:`AlertSink` is what the ingest pipeline calls; :class:`TemporalAlertSink` delivers
each alert with update-with-start on ``NodeWorkflow`` (id ``node/{cluster}/{node}``,
start input :class:`~workflows.models.NodeInput`, update ``deliver_alert``, id-conflict
policy USE_EXISTING), so the first alert of a node starts its entity and later ones go
to the running one.

Never blocking the receivers, never losing an accepted alert while Temporal is briefly
down: :meth:`TemporalAlertSink.submit` only enqueues (bounded, ``queue_size`` in all);
delivery runs in ``shards`` background tasks, alerts of one node always on the same
shard and in order (a raise is never overtaken by its clear), retried with exponential
backoff with jitter (tenacity) until delivered or the sink stops. When the queue is full
``submit`` raises :class:`HandoffQueueFull`; the receiver answers 503 + ``Retry-After``
so the agent re-sends (alert ids are stable, the NodeWorkflow de-duplicates).
Counted: ``delivered``, ``retried``, ``rejected`` (the workflow refused the update; not
retried), ``queue_full``.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

import tenacity
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy

from workflows.models import Alert, AlertDelivery, AlertOutcome, NodeInput
from workflows.protocol import (
    GUARD_SIGNAL_CLUSTER_ALERT,
    GUARD_WORKFLOW,
    NODE_UPDATE_DELIVER_ALERT,
    NODE_WORKFLOW,
    TASK_QUEUE,
    GuardInput,
    workflow_id_guard,
    workflow_id_node,
)

log = logging.getLogger("autorepair.ingest.handoff")

#: ``Alert.node`` of a cluster-level alert (as the guard's breaker alert uses).
CLUSTER_NODE = "*"


class HandoffQueueFull(Exception):
    """The bounded hand-off queue is full; the caller should ask the sender to retry."""


@runtime_checkable
class AlertSink(Protocol):
    """Where the ingest pipeline puts alerts. ``submit`` must not block on the network.

    Raises :class:`HandoffQueueFull` when it cannot take the alert now.
    """

    async def submit(self, alert: Alert) -> None: ...


@runtime_checkable
class ManagedAlertSink(AlertSink, Protocol):
    """An :class:`AlertSink` with background work the service starts and stops."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def depth(self) -> int: ...


class TemporalAlertSink:
    """Delivers alerts to ``NodeWorkflow`` with update-with-start (see module docstring).

    ``client``: a connected Temporal client using the pydantic data converter.
    ``queue_size``: total bound on queued alerts (default 10 000; config
    ``ingest.alert_queue``). ``shards``: parallel delivery tasks (default 4).
    ``max_backoff_s``: cap of the exponential backoff between attempts (default 30 s).
    ``rpc_timeout_s``: bound on one update-with-start call (default 30 s) — without a
    worker the update would wait for acceptance indefinitely.
    ``on_outcome``: called with ``"delivered" | "retried" | "rejected" | "queue_full"``.
    """

    def __init__(
        self,
        client: Client,
        task_queue: str = TASK_QUEUE,
        *,
        queue_size: int = 10_000,
        shards: int = 4,
        max_backoff_s: float = 30.0,
        rpc_timeout_s: float = 30.0,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        if queue_size < shards:
            raise ValueError(f"queue_size: {queue_size} must be at least shards ({shards})")
        self.client = client
        self.task_queue = task_queue
        self.max_backoff_s = max_backoff_s
        self.rpc_timeout_s = rpc_timeout_s
        self.on_outcome = on_outcome
        per = queue_size // shards
        self._queues: list[asyncio.Queue[Alert]] = [asyncio.Queue(per) for _ in range(shards)]
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.counts: dict[str, int] = {"delivered": 0, "retried": 0, "rejected": 0,
                                       "queue_full": 0}
        self.last_results: dict[str, AlertDelivery] = {}

    def _count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    def depth(self) -> int:
        """Alerts queued and not yet delivered."""
        return sum(q.qsize() for q in self._queues)

    async def submit(self, alert: Alert) -> None:
        """Enqueue ``alert`` on its node's shard. Raises :class:`HandoffQueueFull`."""
        key = f"{alert.cluster}/{alert.node}".encode()
        q = self._queues[zlib.crc32(key) % len(self._queues)]
        try:
            q.put_nowait(alert)
        except asyncio.QueueFull:
            self._count("queue_full")
            raise HandoffQueueFull(
                f"alert hand-off queue full ({q.maxsize} on this shard); retry later"
            ) from None

    async def start(self) -> None:
        """Start the delivery tasks (idempotent)."""
        if not self._tasks:
            self._stopping = False
            self._tasks = [asyncio.create_task(self._run(q)) for q in self._queues]

    async def stop(self, drain_timeout_s: float = 5.0) -> None:
        """Give queued alerts ``drain_timeout_s`` to go out, then stop the tasks."""
        if not self._tasks:
            return
        try:
            await asyncio.wait_for(
                asyncio.gather(*(q.join() for q in self._queues)), drain_timeout_s
            )
        except TimeoutError:
            log.warning("event=handoff_stop undelivered=%d", self.depth())
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def deliver(self, alert: Alert) -> AlertDelivery:
        """One update-with-start call for ``alert``; returns the workflow's answer.

        A cluster-level alert (``node == "*"``, e.g. panic mode) goes to the cluster's
        ``ClusterGuardWorkflow`` instead, by signal-with-start of ``cluster_alert``.
        Raises whatever the client raises (``RPCError`` on transport trouble,
        ``WorkflowUpdateFailedError`` when the workflow rejects the update).
        """
        if alert.node == CLUSTER_NODE:
            await self.client.start_workflow(
                GUARD_WORKFLOW,
                GuardInput(cluster=alert.cluster),
                id=workflow_id_guard(alert.cluster),
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                start_signal=GUARD_SIGNAL_CLUSTER_ALERT,
                start_signal_args=[alert],
                rpc_timeout=timedelta(seconds=self.rpc_timeout_s),
            )
            return AlertDelivery(alert_id=alert.alert_id, outcome=AlertOutcome.new,
                                 reason="cluster-level alert sent to the cluster guard")
        op: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            NODE_WORKFLOW,
            NodeInput(cluster=alert.cluster, node=alert.node, machine_id=alert.machine_id,
                      node_pool=alert.node_pool),
            id=workflow_id_node(alert.cluster, alert.node),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        result: AlertDelivery = await self.client.execute_update_with_start_workflow(
            NODE_UPDATE_DELIVER_ALERT,
            alert,
            start_workflow_operation=op,
            result_type=AlertDelivery,
            rpc_timeout=timedelta(seconds=self.rpc_timeout_s),
        )
        return result

    async def _deliver_with_retry(self, alert: Alert) -> None:
        def before_sleep(rs: tenacity.RetryCallState) -> None:
            self._count("retried")
            exc = rs.outcome.exception() if rs.outcome else None
            log.warning(
                "event=handoff_retry cluster=%s node=%s alert_id=%s attempt=%d error=%s",
                alert.cluster, alert.node, alert.alert_id, rs.attempt_number,
                type(exc).__name__,
            )

        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_exponential_jitter(
                multiplier=0.2, max=self.max_backoff_s, jitter=0.2),
            retry=tenacity.retry_if_exception(
                lambda e: not isinstance(e, WorkflowUpdateFailedError | asyncio.CancelledError)
            ),
            # the client turns a cancelled call into an RPC error: stop retrying on stop()
            stop=lambda _rs: self._stopping,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            result: AlertDelivery = await retrying(self.deliver, alert)
        except WorkflowUpdateFailedError as e:
            self._count("rejected")
            log.error("event=handoff_rejected cluster=%s node=%s alert_id=%s error=%s",
                      alert.cluster, alert.node, alert.alert_id, e.cause)
            return
        self.last_results[alert.alert_id] = result
        if len(self.last_results) > 1000:
            self.last_results.pop(next(iter(self.last_results)))
        self._count("delivered")

    async def _run(self, q: asyncio.Queue[Alert]) -> None:
        while not self._stopping:
            alert = await q.get()
            try:
                await self._deliver_with_retry(alert)
            except Exception:  # never let one alert kill the shard
                if not self._stopping:
                    log.exception("event=handoff_error alert_id=%s", alert.alert_id)
            finally:
                q.task_done()
