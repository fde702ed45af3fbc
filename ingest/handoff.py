"""Hand-off of alerts from ingest to the NodeWorkflow entities on Temporal.

:class:`AlertSink` is what the ingest pipeline calls; :class:`TemporalAlertSink` delivers
each alert with update-with-start on ``NodeWorkflow`` (id ``node/{cluster}/{node}``,
start input :class:`~workflows.models.NodeInput`, update ``deliver_alert``, id-conflict
policy USE_EXISTING), so the first alert of a node starts its entity and later ones go
to the running one.

Never blocking the receivers, never losing an accepted alert while Temporal is briefly
down: :meth:`TemporalAlertSink.submit` only enqueues (bounded, ``queue_size`` in all,
counting alerts waiting for a retry); delivery runs in ``shards`` background tasks,
alerts of one node always on the same shard and in order (a raise is never overtaken by
its clear). An update-with-start holds its shard until the node's workflow has recorded
the alert and started the repair, so there are many shards (:data:`DEFAULT_SHARDS`): a
storm's alerts do not queue behind one another. One bad record never blocks the others:

- every alert is capped first (:func:`ingest.limits.cap_alert`: evidence values and the
  whole alert's size, ``ingest.max_evidence_value_chars`` / ``ingest.max_alert_bytes``);
- an alert whose delivery fails is *parked* with its node's later alerts behind it and
  retried with exponential backoff with jitter, while the shard goes on delivering other
  nodes' alerts;
- after ``max_attempts`` failed attempts (``ingest.handoff_max_attempts``), or at once
  when the workflow refused the update (``rejected``) or the alert is still over the size
  limit (``too_large``), the alert goes to the dead-letter store (the ledger's
  ``dead_letters`` table, :class:`DeadLetterStore`) with a log line
  ``event=alert_dead_lettered`` and ``on_dead_letter(reason)`` (the
  ``autorepair_alerts_dead_lettered_total{reason}`` counter, DESIGN §4.5); the node's
  next alert is delivered after it.

When the queue is full ``submit`` raises :class:`HandoffQueueFull`; the receiver answers
503 + ``Retry-After`` so the agent re-sends (alert ids are stable, the NodeWorkflow
de-duplicates). Counted: ``delivered``, ``retried``, ``rejected`` (the workflow refused
the update), ``dead_lettered``, ``queue_full``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from temporalio.client import Client, WithStartWorkflowOperation, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy

from ingest.limits import alert_bytes, cap_alert
from workflows.console import guard_details, guard_summary, node_details, node_summary
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
class DeadLetterStore(Protocol):
    """Where an alert that cannot be delivered is kept (the ledger's ``dead_letters``).

    ``reason``: ``rejected`` | ``too_large`` | ``retries_exhausted``; ``error``: the last
    error's text; ``attempts``: delivery attempts made. May raise; the sink then logs the
    alert (the log line is the record of last resort)."""

    async def record(self, alert: Alert, reason: str, error: str, attempts: int) -> None: ...


#: Reasons an alert is dead-lettered (label values of
#: ``autorepair_alerts_dead_lettered_total``).
DEAD_LETTER_REASONS = ("rejected", "too_large", "retries_exhausted")


@dataclass
class _Parked:
    """A node whose head alert failed: it and the node's later alerts wait for ``due``."""

    alerts: deque[Alert]
    attempts: int
    due: float
    error: str = ""


@runtime_checkable
class ManagedAlertSink(AlertSink, Protocol):
    """An :class:`AlertSink` with background work the service starts and stops."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def depth(self) -> int: ...


#: Default delivery tasks (shards). One update-with-start takes 0.3 s on an idle dev stack
#: and 1-5 s on a loaded 2-core one (tests/bench/orchestration.py: the node's workflow
#: records the alert, loads the policy and starts the repair before the update completes),
#: so 4 shards passed at most ~13 alerts/s idle and 1-4/s loaded; a 1,000-node storm
#: within a minute (~17 alerts/s, tests/bench/storm.py) needs tens in flight.
DEFAULT_SHARDS = 64


class TemporalAlertSink:
    """Delivers alerts to ``NodeWorkflow`` with update-with-start (see module docstring).

    ``client``: a connected Temporal client using the pydantic data converter.
    ``queue_size``: total bound on queued and parked alerts (default 10 000; config
    ``ingest.alert_queue``). ``shards``: parallel delivery tasks (default
    :data:`DEFAULT_SHARDS`, or ``queue_size`` when smaller).
    ``max_backoff_s``: cap of the exponential backoff between attempts (default 30 s).
    ``rpc_timeout_s``: bound on one update-with-start call (default 30 s) — without a
    worker the update would wait for acceptance indefinitely.
    ``max_attempts``: attempts before an alert is dead-lettered (default 12, config
    ``ingest.handoff_max_attempts``). ``max_value_chars`` / ``max_alert_bytes``: the caps
    of :func:`ingest.limits.cap_alert` (config ``ingest.max_evidence_value_chars`` /
    ``ingest.max_alert_bytes``). ``dead_letters``: the store of undeliverable alerts
    (``None``: the log line only). ``on_outcome``: called with ``"delivered" | "retried"
    | "rejected" | "dead_lettered" | "queue_full"``; ``on_dead_letter``: with the reason.
    Raises ``ValueError`` naming the field for ``queue_size < shards`` or
    ``max_attempts < 1``.
    """

    def __init__(
        self,
        client: Client,
        task_queue: str = TASK_QUEUE,
        *,
        queue_size: int = 10_000,
        shards: int | None = None,
        max_backoff_s: float = 30.0,
        rpc_timeout_s: float = 30.0,
        max_attempts: int = 12,
        max_value_chars: int = 4096,
        max_alert_bytes: int = 256 * 1024,
        dead_letters: DeadLetterStore | None = None,
        on_outcome: Callable[[str], None] | None = None,
        on_dead_letter: Callable[[str], None] | None = None,
    ) -> None:
        if shards is None:
            shards = max(1, min(DEFAULT_SHARDS, queue_size))
        if queue_size < shards:
            raise ValueError(f"queue_size: {queue_size} must be at least shards ({shards})")
        if max_attempts < 1:
            raise ValueError(f"max_attempts: must be >= 1, got {max_attempts}")
        self.client = client
        self.task_queue = task_queue
        self.max_backoff_s = max_backoff_s
        self.rpc_timeout_s = rpc_timeout_s
        self.max_attempts = max_attempts
        self.max_value_chars = max_value_chars
        self.max_alert_bytes = max_alert_bytes
        self.dead_letters = dead_letters
        self.on_outcome = on_outcome
        self.on_dead_letter = on_dead_letter
        self._per_shard = queue_size // shards
        self._queues: list[asyncio.Queue[Alert]] = [asyncio.Queue() for _ in range(shards)]
        self._parked: list[dict[str, _Parked]] = [{} for _ in range(shards)]
        self._pending = [0] * shards
        self._drained = asyncio.Event()
        self._drained.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.counts: dict[str, int] = {"delivered": 0, "retried": 0, "rejected": 0,
                                       "dead_lettered": 0, "queue_full": 0}
        self.last_results: dict[str, AlertDelivery] = {}

    def _count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    def depth(self) -> int:
        """Alerts accepted and not yet delivered or dead-lettered (queued or parked)."""
        return sum(self._pending)

    async def submit(self, alert: Alert) -> None:
        """Cap ``alert`` and enqueue it on its node's shard. Raises :class:`HandoffQueueFull`."""
        key = f"{alert.cluster}/{alert.node}".encode()
        shard = zlib.crc32(key) % len(self._queues)
        if self._pending[shard] >= self._per_shard:
            self._count("queue_full")
            raise HandoffQueueFull(
                f"alert hand-off queue full ({self._per_shard} on this shard); retry later"
            )
        alert, cut = cap_alert(alert, max_value_chars=self.max_value_chars,
                               max_bytes=self.max_alert_bytes)
        if cut:
            log.warning("event=alert_capped cluster=%s node=%s alert_id=%s cut=%s",
                        alert.cluster, alert.node, alert.alert_id, ",".join(cut))
        self._pending[shard] += 1
        self._drained.clear()
        self._queues[shard].put_nowait(alert)

    async def start(self) -> None:
        """Start the delivery tasks (idempotent)."""
        if not self._tasks:
            self._stopping = False
            self._tasks = [asyncio.create_task(self._run(i)) for i in range(len(self._queues))]

    async def stop(self, drain_timeout_s: float = 5.0) -> None:
        """Give queued alerts ``drain_timeout_s`` to go out, then stop the tasks."""
        if not self._tasks:
            return
        try:
            await asyncio.wait_for(self._drained.wait(), drain_timeout_s)
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
                static_summary=guard_summary(alert.cluster),
                static_details=guard_details(alert.cluster),
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
            static_summary=node_summary(alert.cluster, alert.node, alert),
            static_details=node_details(alert.cluster, alert.node, alert),
        )
        result: AlertDelivery = await self.client.execute_update_with_start_workflow(
            NODE_UPDATE_DELIVER_ALERT,
            alert,
            start_workflow_operation=op,
            result_type=AlertDelivery,
            rpc_timeout=timedelta(seconds=self.rpc_timeout_s),
        )
        return result

    def _backoff(self, attempts: int) -> float:
        """Seconds before attempt ``attempts + 1``: 0.2·2^(n−1), capped, ±20 % jitter."""
        base = min(self.max_backoff_s, 0.2 * 2 ** max(0, attempts - 1))
        return base * random.uniform(0.8, 1.2)

    async def _dead_letter(self, alert: Alert, reason: str, error: str, attempts: int) -> None:
        """Record an undeliverable alert; never raises."""
        self._count("dead_lettered")
        if self.on_dead_letter is not None:
            self.on_dead_letter(reason)
        log.error("event=alert_dead_lettered cluster=%s node=%s alert_id=%s kind=%s "
                  "reason=%s attempts=%d error=%s", alert.cluster, alert.node,
                  alert.alert_id, alert.kind, reason, attempts, error[:500])
        if self.dead_letters is None:
            return
        try:
            await self.dead_letters.record(alert, reason, error[:2000], attempts)
        except Exception as e:  # the log line above is the record of last resort
            log.error("event=dead_letter_write_failed alert_id=%s error=%s summary=%r",
                      alert.alert_id, type(e).__name__, alert.summary)

    async def _attempt(self, alert: Alert, attempts: int) -> tuple[bool, str]:
        """One delivery attempt. Returns ``(finished, error)``: finished when delivered or
        dead-lettered; else the error text (the caller parks the alert)."""
        if alert_bytes(alert) > self.max_alert_bytes:
            await self._dead_letter(alert, "too_large",
                                    f"{alert_bytes(alert)} bytes over ingest.max_alert_bytes "
                                    f"{self.max_alert_bytes}", attempts)
            return True, ""
        try:
            result: AlertDelivery = await self.deliver(alert)
        except WorkflowUpdateFailedError as e:
            self._count("rejected")
            log.error("event=handoff_rejected cluster=%s node=%s alert_id=%s error=%s",
                      alert.cluster, alert.node, alert.alert_id, e.cause)
            await self._dead_letter(alert, "rejected", str(e.cause or e), attempts + 1)
            return True, ""
        except asyncio.CancelledError:
            raise
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"
        self.last_results[alert.alert_id] = result
        if len(self.last_results) > 1000:
            self.last_results.pop(next(iter(self.last_results)))
        self._count("delivered")
        return True, ""

    async def _try(self, shard: int, key: str, alert: Alert, attempts: int,
                   rest: deque[Alert]) -> None:
        """Attempt ``alert``; park it (and ``rest``, the node's later alerts) on failure,
        dead-letter it after ``max_attempts``."""
        finished, error = await self._attempt(alert, attempts)
        parked = self._parked[shard]
        if not finished:
            attempts += 1
            if attempts >= self.max_attempts:
                await self._dead_letter(alert, "retries_exhausted", error, attempts)
                finished = True
            else:
                self._count("retried")
                delay = self._backoff(attempts)
                log.warning("event=handoff_retry cluster=%s node=%s alert_id=%s attempt=%d "
                            "retry_in_s=%.1f error=%s", alert.cluster, alert.node,
                            alert.alert_id, attempts, delay, error[:300])
                rest.appendleft(alert)
                loop = asyncio.get_running_loop()
                parked[key] = _Parked(rest, attempts, loop.time() + delay, error)
                return
        self._pending[shard] -= 1
        if not self.depth():
            self._drained.set()
        if rest:
            # the node's next alert goes now, still ahead of anything queued after it
            parked[key] = _Parked(rest, 0, 0.0)
        else:
            parked.pop(key, None)

    async def _run(self, shard: int) -> None:
        q = self._queues[shard]
        parked = self._parked[shard]
        loop = asyncio.get_running_loop()
        while not self._stopping:
            try:
                now = loop.time()
                due = [k for k, p in parked.items() if p.due <= now]
                if due:
                    key = min(due, key=lambda k: parked[k].due)
                    p = parked[key]
                    head = p.alerts.popleft()
                    await self._try(shard, key, head, p.attempts, p.alerts)
                    continue
                wait = min((p.due for p in parked.values()), default=None)
                try:
                    if wait is None:
                        alert = await q.get()
                    else:
                        alert = await asyncio.wait_for(q.get(), max(0.0, wait - now))
                except TimeoutError:
                    continue
                key = f"{alert.cluster}/{alert.node}"
                if key in parked:
                    parked[key].alerts.append(alert)  # behind the node's parked alerts
                    continue
                await self._try(shard, key, alert, 0, deque())
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one alert kill the shard
                if not self._stopping:
                    log.exception("event=handoff_error shard=%d", shard)
