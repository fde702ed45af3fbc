"""Repair-path series on the API port's ``/metrics`` (DESIGN §4.5), read from Temporal.

Repairs run in the worker, but DESIGN §4.5 serves every series on the ingest API port.
This poller keeps two of them current from Temporal itself, the system of record:

- ``autorepair_repairs_total{action,outcome}``: every ``RepairWorkflow`` that closed since
  this process started, counted once (visibility query on ``CloseTime``; labels from the
  ``RepairAction`` / ``RepairState`` search attributes). A counter: it starts at zero with
  the process, as Prometheus counters do.
- ``autorepair_breaker_open{cluster_id}``: 1 while ``guard/{cluster}`` reports its breaker
  open (``status`` query), 0 otherwise or when the cluster has no guard yet.

Clusters are the configured ones plus every cluster agents push for. Temporal being
unreachable is logged and retried next round; it never affects the receivers.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from ingest.metrics import IngestMetrics
from workflows.protocol import (
    GUARD_QUERY_STATUS,
    REPAIR_WORKFLOW,
    SA_ACTION,
    SA_STATE,
    STATE_AWAITING_APPROVAL,
    STATE_IN_PROGRESS,
    GuardStatus,
    workflow_id_guard,
)

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
    """

    def __init__(
        self,
        client: Client,
        metrics: IngestMetrics,
        clusters: Callable[[], Iterable[str]],
        *,
        started_at: datetime | None = None,
        interval_s: float = POLL_S,
    ) -> None:
        self.client = client
        self.metrics = metrics
        self.clusters = clusters
        self.interval_s = interval_s
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
            if wf.close_time is not None and wf.close_time > self.since:
                self.since = wf.close_time
            new += 1
        return new

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
