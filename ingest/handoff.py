"""Hand-off of alerts from ingest to the NodeWorkflow entities on Temporal.

:class:`AlertSink` is what the ingest pipeline calls; :class:`TemporalAlertSink` delivers
each alert with update-with-start on ``NodeWorkflow`` (id ``node/{cluster}/{node}``,
start input :class:`~workflows.models.NodeInput`, update ``deliver_alert``, id-conflict
policy USE_EXISTING), so the first alert of a node starts its entity and later ones go
to the running one.

Never blocking the receivers on Temporal, never losing an accepted alert while Temporal
is down: :meth:`TemporalAlertSink.submit` stores (with an outbox, below) and enqueues
(bounded, ``queue_size`` in all, counting alerts waiting for a retry); delivery runs in
``shards`` background tasks, alerts of one node always on the same shard and in order (a
raise is never overtaken by its clear). An update-with-start holds its shard until the
node's workflow has recorded the alert and started the repair, so there are many shards
(:data:`DEFAULT_SHARDS`): a storm's alerts do not queue behind one another. One bad
record never blocks the others:

- every alert is capped first (:func:`ingest.limits.cap_alert`: evidence values and the
  whole alert's size, ``ingest.max_evidence_value_chars`` / ``ingest.max_alert_bytes``);
- an alert whose delivery fails is *parked* with its node's later alerts behind it and
  retried with exponential backoff with jitter, while the shard goes on delivering other
  nodes' alerts;
- while Temporal itself is unreachable (``UNAVAILABLE``: a frontend restart or upgrade)
  the alert is retried without end (back-off capped at ``max_backoff_s``): an outage is
  waited out, never turned into dead letters;
- after ``max_attempts`` failed attempts (``ingest.handoff_max_attempts``), or at once
  when the workflow refused the update (``rejected``) or the alert is still over the size
  limit (``too_large``), the alert goes to the dead-letter store (the ledger's
  ``dead_letters`` table, :class:`DeadLetterStore`) with a log line
  ``event=alert_dead_lettered`` and ``on_dead_letter(reason)`` (the
  ``autorepair_alerts_dead_lettered_total{reason}`` counter, docs/design.md §4.5); the node's
  next alert is delivered after it.

When the queue is full ``submit`` raises :class:`HandoffQueueFull`; the receiver answers
503 + ``Retry-After`` so the agent re-sends (alert ids are stable, the NodeWorkflow
de-duplicates).

Durable hand-off (the outbox, ``outbox``: the ledger's ``alerts`` table, docs/design.md §2): an
answered push must never lose an alert, even when the ingest process is killed before the
node's workflow has it (agents do not re-send a kernel log line). With an outbox,
:meth:`TemporalAlertSink.submit_many` records the alerts of one push in PostgreSQL in one
round trip (:meth:`AlertOutbox.accept_alerts`) *before* it queues them, so the receiver
answers success only for stored alerts; when PostgreSQL cannot take them within
``outbox_timeout_s`` it raises :class:`OutboxUnavailable` (nothing queued) and the
receiver answers 503 + ``Retry-After`` / gRPC UNAVAILABLE. Only ids new to the ledger are
queued (a re-sent push is stored and delivered once). Once the workflow's update completed
(or the alert was dead-lettered: handled too) the alert is marked handed off, in batches
every ``mark_every_s``. On start, and before the first push is taken, every alert still
unmarked is re-queued in the order it was accepted (per node, a raise stays ahead of its
clear); every ``resubmit_every_s`` unmarked alerts older than ``resubmit_after_s`` that
this process does not hold are re-queued too (left by another ingest replica that died,
or stored by a push whose answer was cut short). A re-delivery of an alert the workflow
already took is de-duplicated by the workflow (stable ``alert_id``).

Counted: ``delivered``, ``retried``, ``rejected`` (the workflow refused the update),
``dead_lettered``, ``queue_full``, ``outbox_unavailable`` (a push refused because
PostgreSQL could not store it), ``resubmitted`` (an unmarked alert re-queued from the
ledger).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from temporalio.client import Client, WithStartWorkflowOperation, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from ingest.limits import alert_bytes, cap_alert
from ingest.maintenance_marks import MaintenanceMarks
from ingest.quota import SENDER, SENDER_IS_COLLECTOR
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


class HandoffRefused(Exception):
    """The hand-off cannot take the alerts now; the caller should ask the sender to retry
    (HTTP 503 + ``Retry-After``, gRPC UNAVAILABLE). Nothing of the refused call was kept."""


class HandoffQueueFull(HandoffRefused):
    """The bounded hand-off queue is full; the caller should ask the sender to retry."""


class IdentityShareFull(HandoffQueueFull):
    """The sender identity's share of the hand-off queue is full (``ingest.limits
    .queued_alerts_per_identity`` / ``_per_collector``): that identity alone is asked to
    retry, every other sender's alerts are still taken."""


class OutboxUnavailable(HandoffRefused):
    """PostgreSQL (the outbox) could not store the alerts; the sender should retry."""


@runtime_checkable
class AlertSink(Protocol):
    """Where the ingest pipeline puts alerts. ``submit`` must not wait on Temporal (it may
    wait on one outbox write). A sink may also offer ``submit_many(alerts)``: the alerts
    of one push, all or none (the pipeline uses it when present).

    Raises :class:`HandoffRefused` (:class:`HandoffQueueFull`, :class:`OutboxUnavailable`)
    when it cannot take the alert now.
    """

    async def submit(self, alert: Alert) -> None: ...


@runtime_checkable
class DeadLetterStore(Protocol):
    """Where an alert that cannot be delivered is kept (the ledger's ``dead_letters``).

    ``reason``: ``rejected`` | ``too_large`` | ``retries_exhausted``; ``error``: the last
    error's text; ``attempts``: delivery attempts made. May raise; the sink then logs the
    alert (the log line is the record of last resort)."""

    async def record(self, alert: Alert, reason: str, error: str, attempts: int) -> None: ...


@runtime_checkable
class AlertOutbox(Protocol):
    """Where accepted alerts are stored until their workflow has them (the ledger's
    ``alerts`` table, :class:`activities.ledger.Ledger` / ``workers.lazy_ledger``).

    ``accept_alerts``: store them in one round trip, not yet handed off; returns the ids
    that were new; raises on any failure (then nothing was stored). ``mark_handed_off``:
    the alerts were delivered or dead-lettered. ``pending_handoff``: stored alerts not
    marked, recorded at least ``older_than_s`` seconds ago, at most ``limit``, in the
    order they were accepted."""

    async def accept_alerts(self, alerts: Sequence[Alert]) -> set[str]: ...

    async def mark_handed_off(self, alert_ids: Sequence[str]) -> int: ...

    async def pending_handoff(self, older_than_s: float = 0.0, limit: int = 1000
                              ) -> list[Alert]: ...


#: Reasons an alert is dead-lettered (label values of
#: ``autorepair_alerts_dead_lettered_total``).
DEAD_LETTER_REASONS = ("rejected", "too_large", "retries_exhausted")
#: Prefix of a failed attempt's error when Temporal's frontend did not answer at all
#: (``RPCError`` ``UNAVAILABLE``): retried without end, never dead-lettered for it.
UNREACHABLE = "temporal unreachable"


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
    | "rejected" | "dead_lettered" | "queue_full" | "outbox_unavailable" |
    "resubmitted"``; ``on_dead_letter``: with the reason.
    ``outbox``: where accepted alerts are stored before they are queued (``None``: queued
    in memory only, lost if the process dies). ``outbox_timeout_s``: bound on storing one
    push's alerts (config ``ingest.outbox_timeout_s``); ``resubmit_every_s`` /
    ``resubmit_after_s``: period of the re-delivery sweep and the age an unmarked alert
    must reach before it (config ``ingest.outbox_resubmit_every_s`` /
    ``ingest.outbox_resubmit_after_s``); ``mark_every_s``: how often delivered alerts are
    marked, seconds. ``maintenance``: marks the alerts of nodes inside a planned
    maintenance window as observations before delivery (:mod:`ingest.maintenance_marks`).
    ``queued_per_identity`` / ``queued_per_collector``: the most alerts one sender
    identity (a node's, a collector's; :data:`ingest.quota.SENDER` of the push) may have
    queued and not yet handled (config ``ingest.limits.queued_alerts_per_identity`` /
    ``_per_collector``; ``None``: no share); beyond it that identity's push is refused
    with :class:`IdentityShareFull`, so one token holder cannot fill the queue others need.
    Raises ``ValueError`` naming the field for ``queue_size < shards``,
    ``max_attempts < 1`` or a timing that is not positive.
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
        outbox: AlertOutbox | None = None,
        outbox_timeout_s: float = 5.0,
        resubmit_every_s: float = 30.0,
        resubmit_after_s: float = 60.0,
        mark_every_s: float = 0.5,
        maintenance: MaintenanceMarks | None = None,
        queued_per_identity: int | None = None,
        queued_per_collector: int | None = None,
    ) -> None:
        if shards is None:
            shards = max(1, min(DEFAULT_SHARDS, queue_size))
        if queue_size < shards:
            raise ValueError(f"queue_size: {queue_size} must be at least shards ({shards})")
        if max_attempts < 1:
            raise ValueError(f"max_attempts: must be >= 1, got {max_attempts}")
        for name, v in (("outbox_timeout_s", outbox_timeout_s),
                        ("resubmit_every_s", resubmit_every_s),
                        ("resubmit_after_s", resubmit_after_s), ("mark_every_s", mark_every_s)):
            if not v > 0:
                raise ValueError(f"{name}: must be > 0, got {v!r}")
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
                                       "dead_lettered": 0, "queue_full": 0,
                                       "outbox_unavailable": 0, "resubmitted": 0}
        self.last_results: dict[str, AlertDelivery] = {}
        self.outbox = outbox
        self.outbox_timeout_s = outbox_timeout_s
        self.resubmit_every_s = resubmit_every_s
        self.resubmit_after_s = resubmit_after_s
        self.mark_every_s = mark_every_s
        #: marks alerts of nodes inside a maintenance window (issue 29) before delivery
        self.maintenance = maintenance
        #: ids of stored alerts this process holds: queued, parked, in flight, or handled
        #: and waiting to be marked (the sweep leaves them alone)
        self._held: set[str] = set()
        self._to_mark: list[str] = []
        #: True once the alerts left unmarked by an earlier process are all queued again
        self._recovered = outbox is None
        self._recover_lock = asyncio.Lock()
        self._outbox_task: asyncio.Task[None] | None = None
        #: per-identity share of the queue (ingest.limits; None: no share): alerts queued
        #: and not yet handled per sender identity, and the identity of each
        self.queued_per_identity = queued_per_identity
        self.queued_per_collector = queued_per_collector
        self._owner_pending: dict[str, int] = {}
        self._owner_of: dict[str, str] = {}

    def _count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    def depth(self) -> int:
        """Alerts accepted and not yet delivered or dead-lettered (queued or parked)."""
        return sum(self._pending)

    def _shard(self, alert: Alert) -> int:
        return zlib.crc32(f"{alert.cluster}/{alert.node}".encode()) % len(self._queues)

    async def submit(self, alert: Alert) -> None:
        """Cap ``alert``, store it (with an outbox) and queue it on its node's shard.
        Raises :class:`HandoffQueueFull` / :class:`OutboxUnavailable`."""
        await self.submit_many([alert])

    async def submit_many(self, alerts: Sequence[Alert]) -> None:
        """Take the alerts of one push, all or none: cap each, store them in the outbox in
        one round trip, then queue the ones new to it on their nodes' shards, in order.

        Raises :class:`HandoffQueueFull` when a shard cannot take its share (nothing is
        stored or queued) and :class:`OutboxUnavailable` when the outbox failed or took
        longer than ``outbox_timeout_s`` (nothing is queued)."""
        if not alerts:
            return
        if not self._recovered:
            await self._recover()
        owner = SENDER.get()
        cap = self.queued_per_collector if SENDER_IS_COLLECTOR.get() else \
            self.queued_per_identity
        if owner is not None and cap is not None and \
                self._owner_pending.get(owner, 0) + len(alerts) > cap:
            self._count("queue_full")
            raise IdentityShareFull(
                f"alert hand-off queue: this sender's share ({cap} alerts, "
                "ingest.limits.queued_alerts_per_identity) is full; retry later")
        if cap is None:
            owner = None
        shards = [self._shard(a) for a in alerts]
        need: dict[int, int] = {}
        for sh in shards:
            need[sh] = need.get(sh, 0) + 1
        for sh, n in need.items():
            if self._pending[sh] + n > self._per_shard:
                self._count("queue_full")
                raise HandoffQueueFull(
                    f"alert hand-off queue full ({self._per_shard} on this shard); "
                    "retry later")
        capped: list[Alert] = []
        for a in alerts:
            a2, cut = cap_alert(a, max_value_chars=self.max_value_chars,
                                max_bytes=self.max_alert_bytes)
            if cut:
                # the cut keys are sender-chosen evidence keys: %r, never a forged line
                log.warning("event=alert_capped cluster=%s node=%s alert_id=%s cut=%r",
                            a2.cluster, a2.node, a2.alert_id, ",".join(cut))
            capped.append(a2)
        if self.outbox is None:
            for a, sh in zip(capped, shards, strict=True):
                self._enqueue(a, sh, owner)
            return
        for sh, n in need.items():  # reserved while the outbox call is out
            self._pending[sh] += n
        self._drained.clear()
        try:
            new = await asyncio.wait_for(self.outbox.accept_alerts(capped),
                                         self.outbox_timeout_s)
        except asyncio.CancelledError:
            self._release(need)
            raise
        except Exception as e:
            self._release(need)
            self._count("outbox_unavailable")
            log.warning("event=outbox_store_failed alerts=%d error=%s", len(capped),
                        f"{type(e).__name__}: {e}"[:300])
            raise OutboxUnavailable(
                f"alerts cannot be stored now ({type(e).__name__}); retry later") from e
        self._release(need)
        for a, sh in zip(capped, shards, strict=True):
            if a.alert_id in new and a.alert_id not in self._held:
                self._enqueue(a, sh, owner)

    def _release(self, need: dict[int, int]) -> None:
        for sh, n in need.items():
            self._pending[sh] -= n
        if not self.depth():
            self._drained.set()

    def _enqueue(self, alert: Alert, shard: int, owner: str | None = None) -> None:
        self._pending[shard] += 1
        if owner is not None and alert.alert_id not in self._owner_of:
            self._owner_of[alert.alert_id] = owner
            self._owner_pending[owner] = self._owner_pending.get(owner, 0) + 1
        self._drained.clear()
        if self.outbox is not None:
            self._held.add(alert.alert_id)
        self._queues[shard].put_nowait(alert)

    async def _recover(self) -> bool:
        """Queue again every alert the outbox holds unmarked (left by an earlier process),
        in the order accepted; returns True once all are. Raises
        :class:`OutboxUnavailable` when PostgreSQL failed and :class:`HandoffQueueFull`
        when some are left for the next pass (a node whose shard is full keeps the rest of
        its alerts back, so its order holds)."""
        async with self._recover_lock:
            if self._recovered:
                return True
            assert self.outbox is not None
            limit = sum(self._free()) + len(self._held)
            try:
                rows = await asyncio.wait_for(self.outbox.pending_handoff(0.0, limit=limit),
                                              self.outbox_timeout_s)
            except Exception as e:
                self._count("outbox_unavailable")
                log.warning("event=outbox_recover_failed error=%s",
                            f"{type(e).__name__}: {e}"[:300])
                raise OutboxUnavailable(
                    f"alerts stored before a restart cannot be read now "
                    f"({type(e).__name__}); retry later") from e
            queued, blocked = self._requeue(rows)
            complete = not blocked and len(rows) < limit
            self._recovered = complete
            log.info("event=outbox_recovered resubmitted=%d complete=%s", queued, complete)
            if not complete:
                raise HandoffQueueFull("re-delivering alerts stored before a restart; "
                                       "retry later")
            return True

    def _free(self) -> list[int]:
        return [max(0, self._per_shard - p) for p in self._pending]

    def _requeue(self, rows: list[Alert]) -> tuple[int, bool]:
        """Queue the outbox rows this process does not hold, in order; a node whose shard
        is full is skipped from there on. Returns (queued, whether a node was skipped)."""
        blocked: set[str] = set()
        queued = 0
        for a in rows:
            key = f"{a.cluster}/{a.node}"
            if a.alert_id in self._held or key in blocked:
                continue
            sh = self._shard(a)
            if self._pending[sh] >= self._per_shard:
                blocked.add(key)
                continue
            self._enqueue(a, sh)
            queued += 1
            self._count("resubmitted")
        return queued, bool(blocked)

    def _handled(self, alert: Alert) -> None:
        """The alert was delivered or dead-lettered: mark it in the outbox (batched)."""
        if self.outbox is not None and alert.alert_id in self._held:
            self._to_mark.append(alert.alert_id)

    async def flush_marks(self) -> bool:
        """Mark the handled alerts in the outbox now (one statement); False (they stay for
        the next flush) when PostgreSQL failed."""
        if self.outbox is None or not self._to_mark:
            return True
        ids = self._to_mark[:5000]
        try:
            await asyncio.wait_for(self.outbox.mark_handed_off(ids), self.outbox_timeout_s)
        except Exception as e:
            log.warning("event=outbox_mark_failed alerts=%d error=%s", len(ids),
                        f"{type(e).__name__}: {e}"[:300])
            return False
        del self._to_mark[:len(ids)]
        self._held.difference_update(ids)
        return True

    async def sweep(self) -> int:
        """One re-delivery pass: the outbox's unmarked alerts older than
        ``resubmit_after_s`` that this process does not hold are queued again (the whole
        backlog when the start-up recovery has not completed). Returns how many; raises
        :class:`OutboxUnavailable` when PostgreSQL failed."""
        if self.outbox is None:
            return 0
        if not self._recovered:
            before = self.counts["resubmitted"]
            with contextlib.suppress(HandoffQueueFull):
                await self._recover()
            return self.counts["resubmitted"] - before
        try:
            rows = await asyncio.wait_for(
                self.outbox.pending_handoff(self.resubmit_after_s,
                                            limit=sum(self._free()) + len(self._held)),
                self.outbox_timeout_s)
        except Exception as e:
            self._count("outbox_unavailable")
            raise OutboxUnavailable(f"{type(e).__name__}: {e}") from e
        queued, _ = self._requeue(rows)
        if queued:
            log.warning("event=outbox_resubmitted alerts=%d", queued)
        return queued

    async def _outbox_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = loop.time()  # the first pass recovers what an earlier process left
        while True:
            try:
                await self.flush_marks()
                if loop.time() >= next_sweep:
                    try:
                        await self.sweep()
                        next_sweep = loop.time() + (self.resubmit_every_s
                                                    if self._recovered else 1.0)
                    except OutboxUnavailable as e:
                        log.warning("event=outbox_sweep_failed error=%s", str(e)[:300])
                        next_sweep = loop.time() + min(self.resubmit_every_s, 5.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("event=outbox_loop_error")
            await asyncio.sleep(self.mark_every_s)

    async def start(self) -> None:
        """Start the delivery tasks, and with an outbox re-queue what an earlier process
        left unmarked (PostgreSQL down: retried by the sweep and before the first push is
        taken). Idempotent."""
        if not self._tasks:
            self._stopping = False
            self._tasks = [asyncio.create_task(self._run(i)) for i in range(len(self._queues))]
            if self.outbox is not None:
                with contextlib.suppress(HandoffRefused):
                    await self._recover()
                self._outbox_task = asyncio.create_task(self._outbox_loop())

    async def stop(self, drain_timeout_s: float = 5.0) -> None:
        """Give queued alerts ``drain_timeout_s`` to go out, then stop the tasks and mark
        what was handled (alerts still queued stay in the outbox for the next start)."""
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
        if self._outbox_task is not None:
            self._outbox_task.cancel()
            await asyncio.gather(self._outbox_task, return_exceptions=True)
            self._outbox_task = None
        await self.flush_marks()

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
        if self.maintenance is not None:
            alert = await self.maintenance.mark(alert)
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
                  "reason=%s attempts=%d error=%r", alert.cluster, alert.node,
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
            log.error("event=handoff_rejected cluster=%s node=%s alert_id=%s error=%r",
                      alert.cluster, alert.node, alert.alert_id, str(e.cause))
            await self._dead_letter(alert, "rejected", str(e.cause or e), attempts + 1)
            return True, ""
        except asyncio.CancelledError:
            raise
        except RPCError as e:
            if e.status == RPCStatusCode.UNAVAILABLE:
                # Temporal itself is unreachable (a frontend restart, an upgrade): waited
                # out, never counted toward max_attempts (nothing accepted is lost)
                return False, f"{UNREACHABLE}: {e}"
            return False, f"{type(e).__name__}: {e}"
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
            if attempts >= self.max_attempts and not error.startswith(UNREACHABLE):
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
        self._handled(alert)
        self._pending[shard] -= 1
        owner = self._owner_of.pop(alert.alert_id, None)
        if owner is not None:
            left = self._owner_pending.get(owner, 0) - 1
            if left > 0:
                self._owner_pending[owner] = left
            else:
                self._owner_pending.pop(owner, None)
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
