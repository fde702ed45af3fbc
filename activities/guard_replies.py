"""The cluster guard's ``lease`` replies, one activity per batch (issue 30 item 1).

``guard_send_leases(LeaseDeliveries) -> LeaseOutcomes`` signals each requester's
``lease`` handler (:data:`~workflows.protocol.REPAIR_SIGNAL_LEASE`) with the same
:class:`~workflows.protocol.LeaseReply` payload the guard used to send as an external
signal, through the worker's Temporal client and its data converter (the wire format is
unchanged). A guard step that answers 200 requests then costs the guard one activity
(three history events and one workflow task when it completes) instead of 200 external
signals, each of which woke the guard for a workflow task of its own
(docs/scaling.md, "Cluster guard: decisions per second").

Idempotent by key: every signal carries the request id
``{guard_id}/{run_id}/{activity_id}/{index}``, the same on every attempt of the
activity, and the Temporal server drops a signal whose request id the target run has
already seen. Where a server keeps no such record the requester sees the same reply
twice, in order, before any later one (the guard runs one ``guard_send_leases`` at a
time), and every requester acts on the last reply it got (``RepairWorkflow.lease``).

Per delivery: ``delivered``; ``gone`` when the server answers NOT_FOUND (the requester
is not running: the guard drops its lease or queue entry); ``failed`` after
:data:`TRIES` tries of another error (the guard notes it; the requester re-sends its
request every ``LEASE_RESEND_S``). The activity itself raises only when it is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import SignalWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from workflows.activity_api import ACT, LeaseDeliveries, LeaseDelivery, LeaseOutcome, LeaseOutcomes
from workflows.protocol import REPAIR_SIGNAL_LEASE

#: Signals in flight at once per activity. 32 keeps a 2-core dev server busy without
#: queueing (tests/bench/guard_throughput.py: 16, 32 and 64 gave the same rate) and is
#: far below the server's per-namespace RPS limits (frontend.namespaceRPS, 2,400 default).
CONCURRENCY = 32
#: Tries per delivery for errors other than NOT_FOUND (the client itself already retries
#: UNAVAILABLE and RESOURCE_EXHAUSTED: ``retry=True``); pauses between tries, seconds.
TRIES = 3
BACKOFF_S = (0.2, 1.0)
#: Timeout of one signal RPC (the client's default is 10 s; a guard waits for the whole
#: batch, so one slow call must not hold it long).
RPC_TIMEOUT = timedelta(seconds=5)


class GuardReplyActivities:
    """``guard_send_leases`` on ``client`` (the worker's: same namespace and converter)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def all(self) -> list[Callable[..., Any]]:
        """The activities to register (the guard's task queue: the main one)."""
        return [self.guard_send_leases]

    @activity.defn(name=ACT.guard_send_leases)
    async def guard_send_leases(self, inp: LeaseDeliveries) -> LeaseOutcomes:
        """Signal every delivery of ``inp`` (concurrently, :data:`CONCURRENCY`); one
        outcome per delivery, in order. Never raises for a delivery's failure."""
        info = activity.info()
        prefix = f"{inp.guard_id}/{info.workflow_run_id}/{info.activity_id}"
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(i: int, d: LeaseDelivery) -> LeaseOutcome:
            async with sem:
                return await self._deliver(d, f"{prefix}/{i}")

        outcomes = await asyncio.gather(*(one(i, d) for i, d in enumerate(inp.commands)))
        return LeaseOutcomes(outcomes=list(outcomes))

    async def _deliver(self, d: LeaseDelivery, request_id: str) -> LeaseOutcome:
        req = SignalWorkflowExecutionRequest(
            namespace=self.client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=d.workflow_id),
            signal_name=REPAIR_SIGNAL_LEASE,
            identity=self.client.identity,
            request_id=request_id,
        )
        req.input.payloads.extend(await self.client.data_converter.encode([d.reply]))
        message = ""
        for attempt in range(TRIES):
            try:
                await self._signal(req)
                return LeaseOutcome(repair_id=d.repair_id, purpose=d.purpose,
                                    status="delivered")
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return LeaseOutcome(repair_id=d.repair_id, purpose=d.purpose,
                                        status="gone", message=err.message)
                message = f"{err.status.name if err.status else 'error'}: {err.message}"
            if attempt < TRIES - 1:
                await asyncio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
        return LeaseOutcome(repair_id=d.repair_id, purpose=d.purpose, status="failed",
                            message=f"lease signal to {d.workflow_id}: {message} "
                                    f"({TRIES} tries)")

    async def _signal(self, req: SignalWorkflowExecutionRequest) -> None:
        """One ``SignalWorkflowExecution`` call (raises ``RPCError``)."""
        await self.client.workflow_service.signal_workflow_execution(
            req, retry=True, timeout=RPC_TIMEOUT)
