"""Repair-path series on the API port's ``/metrics`` (docs/design.md §4.5), read from Temporal.

Repairs run in the worker, but docs/design.md §4.5 serves every series on the ingest API port.
This poller keeps two of them current from Temporal itself, the system of record:

- ``autorepair_repairs_total{action,outcome}``: every ``RepairWorkflow`` that closed since
  this process started, counted once (visibility query on ``CloseTime``; labels from the
  ``RepairAction`` / ``RepairState`` search attributes). A counter: it starts at zero with
  the process, as Prometheus counters do.
- ``autorepair_repair_downtime_gpu_hours_total{cluster,action,fault_kind}``,
  ``autorepair_repair_idle_wait_gpu_hours_total{…}`` and ``autorepair_repair_cost_total{…}``
  (docs/design.md §4.5): for each of those closed repairs that completed, its result (the final
  ``RepairStatus``: stage history and evidence) gives its downtime through
  :func:`workflows.downtime.compute_downtime` — the same computation the ledger records
  — priced by the ``providers`` rules. ``fault_kind`` is the first alert's kind
  (``manual`` without one). A repair with no rate adds GPU-hours but no cost.
- ``autorepair_breaker_open{cluster_id}``: 1 while ``guard/{cluster}`` reports its breaker
  open (``status`` query), 0 otherwise or when the cluster has no guard yet.

Clusters are the configured ones plus every cluster agents push for. Temporal being
unreachable is logged and retried next round; it never affects the receivers.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from ingest.metrics import IngestMetrics
from workflows.config import ProvidersConfig
from workflows.downtime import compute_downtime
from workflows.models import RepairStatus
from workflows.protocol import (
    GUARD_QUERY_STATUS,
    REPAIR_FAILED,
    REPAIR_TIMED_OUT,
    REPAIR_WORKFLOW,
    SA_ACTION,
    SA_STATE,
    STATE_AWAITING_APPROVAL,
    STATE_IN_PROGRESS,
    GuardStatus,
    workflow_id_guard,
)
from workflows.providers import ProviderResolver, info_for

log = logging.getLogger("autorepair.ingest.repair_metrics")

#: Seconds between polls (Prometheus scrapes every 15-60 s; a fresher answer buys nothing).
POLL_S = 15.0
#: Re-read this much before the newest close time seen: visibility is eventually
#: consistent, a workflow may become visible a little after it closed.
OVERLAP = timedelta(seconds=60)
#: Remembered (workflow id, run id) pairs, to count each close once across overlaps.
SEEN_MAX = 50_000


def _attr(wf: Any, name: str) -> str:
    value = (wf.search_attributes or {}).get(name)
    if isinstance(value, list):
        value = value[0] if value else None
    return str(value) if value else "unknown"


class RepairMetricsPoller:
    """Updates ``repairs_total`` and ``breaker_open`` of ``metrics`` from Temporal.

    ``clusters``: returns the cluster ids to ask the guard of (called each round).
    ``started_at``: repairs closed before it are not counted (default: now).
    ``providers``: prices the downtime (default: no rules, 8 GPUs per node, no cost).
    ``task_queue``: count only repairs of this task queue (``temporal.task_queue``), so
    deployments sharing a Temporal namespace never count each other's repairs; None
    counts every ``RepairWorkflow`` of the namespace.
    """

    def __init__(
        self,
        client: Client,
        metrics: IngestMetrics,
        clusters: Callable[[], Iterable[str]],
        *,
        started_at: datetime | None = None,
        interval_s: float = POLL_S,
        providers: ProviderResolver | None = None,
        task_queue: str | None = None,
    ) -> None:
        if task_queue is not None and not re.fullmatch(r"[\w./:-]{1,200}", task_queue):
            raise ValueError(f"task_queue: not a plain task queue name: {task_queue!r}")
        self.client = client
        self.task_queue = task_queue
        self.metrics = metrics
        self.clusters = clusters
        self.interval_s = interval_s
        self.providers = providers or ProviderResolver(ProvidersConfig())
        self.since = started_at or datetime.now(UTC)
        self._seen: set[tuple[str, str]] = set()
        self._order: deque[tuple[str, str]] = deque()

    async def count_closed(self) -> int:
        """Count repairs closed since the last round; returns how many were new."""
        after = (self.since - OVERLAP).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        query = (
            f"WorkflowType = '{REPAIR_WORKFLOW}' AND ExecutionStatus != 'Running' "
            f"AND CloseTime > '{after}'"
        )
        if self.task_queue is not None:
            query += f" AND TaskQueue = '{self.task_queue}'"
        new = 0
        async for wf in self.client.list_workflows(query):
            key = (wf.id, wf.run_id)
            if key in self._seen:
                continue
            self._seen.add(key)
            self._order.append(key)
            if len(self._order) > SEEN_MAX:
                self._seen.discard(self._order.popleft())
            outcome = _attr(wf, SA_STATE.name)
            if outcome in ("unknown", STATE_IN_PROGRESS, STATE_AWAITING_APPROVAL):
                outcome = str(wf.status.name).lower() if wf.status else "unknown"
            self.metrics.repairs_total.labels(_attr(wf, SA_ACTION.name), outcome).inc()
            if wf.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.FAILED):
                # a repair that ended failed / timed_out fails its workflow with its final
                # status as the failure's first detail (workflows.protocol.REPAIR_FAILED)
                await self._count_downtime(wf.id, wf.run_id)
            if wf.close_time is not None and wf.close_time > self.since:
                self.since = wf.close_time
            new += 1
        return new

    async def _count_downtime(self, workflow_id: str, run_id: str | None) -> None:
        """Add the downtime of one finished repair to the counters: its result, or for a
        repair that ended ``failed`` / ``timed_out`` the final status its workflow failed
        with (:data:`~workflows.protocol.REPAIR_FAILED` / ``REPAIR_TIMED_OUT``, first
        detail). Anything that is not a ``RepairStatus`` or cannot be read is skipped
        (logged)."""
        try:
            handle = self.client.get_workflow_handle(workflow_id, run_id=run_id,
                                                     result_type=RepairStatus)
            try:
                st = await handle.result(rpc_timeout=timedelta(seconds=5))
            except WorkflowFailureError as err:
                cause = err.cause
                if not (isinstance(cause, ApplicationError) and cause.details
                        and cause.type in (REPAIR_FAILED, REPAIR_TIMED_OUT)):
                    return  # failed some other way: no final status to count
                st = RepairStatus.model_validate(cause.details[0])
        except Exception as exc:
            log.debug("event=repair_result_unreadable workflow_id=%s error=%s", workflow_id,
                      type(exc).__name__)
            return
        if not isinstance(st, RepairStatus):
            return
        info = info_for(self.providers, st.cluster, st.node, [a.evidence for a in st.evidence])
        down = compute_downtime([(h.stage, h.at) for h in st.history], info)
        if down is None:
            return
        kind = st.evidence[0].kind if st.evidence else "manual"
        labels = (st.cluster, st.action.value, kind)
        self.metrics.repair_downtime_gpu_hours_total.labels(*labels).inc(down.gpu_hours)
        self.metrics.repair_idle_wait_gpu_hours_total.labels(*labels).inc(
            down.idle_wait_gpu_hours)
        if down.cost is not None:
            self.metrics.repair_cost_total.labels(*labels).inc(down.cost)

    async def breaker_states(self) -> dict[str, bool]:
        """Ask each cluster's guard whether its breaker is open; sets the gauge."""
        out: dict[str, bool] = {}
        for cluster in sorted(set(self.clusters())):
            handle = self.client.get_workflow_handle(workflow_id_guard(cluster))
            try:
                status = await handle.query(
                    GUARD_QUERY_STATUS, result_type=GuardStatus, rpc_timeout=timedelta(seconds=5)
                )
                is_open = status.breaker_open
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                is_open = False  # no guard yet: nothing was ever leased, nothing tripped
            self.metrics.breaker_open.labels(cluster).set(1 if is_open else 0)
            out[cluster] = is_open
        return out

    async def poll_once(self) -> None:
        """One round: closed repairs, then breaker states."""
        await self.count_closed()
        await self.breaker_states()

    async def run(self) -> None:
        """Poll every ``interval_s`` until cancelled; errors are logged and retried."""
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("event=repair_metrics_poll_failed error=%s", type(exc).__name__)
            await asyncio.sleep(self.interval_s)
