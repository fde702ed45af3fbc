"""``ValidationWorkflow`` (id ``validate/{machine}/{n}``, docs/design.md §4.4, §1 step 5).

Input :class:`workflows.models.ValidationRequest` (JSON a person can type, e.g.
``{"cluster": "demo", "machine": "gpu-02"}``); result :class:`ValidationResult`.

Steps: place the check run on the machine (``place_validation``) → wait for it, bounded
by the cluster's ``validation.timeout_s`` (``collect_validation`` long-polls, heartbeating)
→ release the placement → on ``failed`` open a hardware ticket with every check's result
and log (ledger + optional webhook) → return the machine per the verdict
(``return_machine``) → record the verdict (``ledger_record_verdict``; a pass closes the
machine's open tickets, so a repaired machine returns without database edits).

* passed — back to the pool (``return_to="pool"``) or into the cluster's hot-spare pool
  (``return_to="spare"``, also chosen when the request comes from a migrate); with
  ``return_to="hold"`` (after a ``remove``) the machine only gets its pre-run state back
  and its RMA ticket stays open — a remove stays removed;
* failed — ticket; the machine stays out until it passes again;
* aborted — no placement, machine reallocated, timeout, or the checks could not run: the
  prior state is restored and nothing is condemned. Only an explicit failure opens a
  ticket.

The verdict is always applied: a release, a ticket or a ticket post that fails after its
retries (a webhook answering 4xx, the ledger down past ``_SHORT_TOTAL``) is said in the
result's reason and the run goes on to ``return_machine`` (a failed machine stays out,
without a ticket to name if none could be opened). When ``return_machine`` itself fails,
the verdict is recorded all the same and the run fails
(:data:`workflows.protocol.VALIDATION_VERDICT_NOT_APPLIED`, the result as its detail),
so the Temporal UI lists it.

Deterministic: no I/O, ``workflow.now()`` only; imports only ``workflows.*``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows.activity_api import (
        ACT,
        ERR_ACTION_FAILED,
        ERR_CONFIGURATION,
        ERR_PLACEMENT,
        ERR_UNKNOWN_NODE,
        CollectInput,
        CollectResult,
        PlacementResult,
        ReturnMachineInput,
        ReturnMachineResult,
        TicketInput,
        TicketPost,
        TicketResult,
        ValidationPlacement,
        VerdictRecord,
        permanent,
    )
    from workflows.models import ValidationRequest, ValidationResult, Verdict
    from workflows.protocol import (
        VALIDATION_QUERY_STATUS,
        VALIDATION_VERDICT_NOT_APPLIED,
        VALIDATION_WORKFLOW,
    )

#: Non-retryable failure types of the validation activities.
_PERMANENT = [ERR_UNKNOWN_NODE, ERR_PLACEMENT, ERR_CONFIGURATION, ERR_ACTION_FAILED]
_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30), non_retryable_error_types=_PERMANENT)
#: Bound on a short activity (placement, release, return, ledger), incl. Slurm commands.
_SHORT = timedelta(minutes=5)
#: Bound on retries of a short activity before the run gives up on it.
_SHORT_TOTAL = timedelta(minutes=30)
#: Heartbeat timeout of the long-polling collect activity (it beats every ~1 s).
_HEARTBEAT = timedelta(seconds=60)
#: Extra time a collect call gets on top of its ``wait_s`` (reading output, retries).
_COLLECT_SLACK_S = 120.0
#: Longest ticket summary, characters.
_SUMMARY_CHARS = 500


def _cause(e: ActivityError) -> str:
    """The failure's own message (the activity's error), else the error itself."""
    if e.cause is not None and hasattr(e.cause, "message"):
        return str(e.cause.message)
    return str(e)


def _noted(result: ValidationResult, note: str) -> ValidationResult:
    """``result`` with ``note`` appended to its reason (``"; "``-separated)."""
    return result.model_copy(update={"reason": f"{result.reason}; {note}"})


def return_target(req: ValidationRequest) -> str:
    """``hold`` when asked (a machine removed for RMA: whatever the verdict it stays out,
    and a pass closes no ticket), ``spare`` when asked or when the node migrated off this
    machine, else ``pool``."""
    if req.return_to == "hold":
        return "hold"
    if req.return_to == "spare" or "migrat" in req.reason.lower():
        return "spare"
    return "pool"


@workflow.defn(name=VALIDATION_WORKFLOW)
class ValidationWorkflow:
    """Re-validation of one machine; query ``status`` → ``{"stage", "job_id", "result"}``."""

    def __init__(self) -> None:
        self._stage = "placing"
        self._job_id: str | None = None
        self._result: ValidationResult | None = None
        self._detail = ""

    @workflow.query(name=VALIDATION_QUERY_STATUS)
    def status(self) -> dict[str, Any]:
        """Stage (placing, running, releasing, ticketing, returning, recording, done),
        the job id, and the result once known."""
        return {
            "stage": self._stage,
            "job_id": self._job_id,
            "detail": self._detail,
            "result": self._result.model_dump(mode="json") if self._result else None,
        }

    async def _short(self, name: str, arg: Any, result_type: type | None = None) -> Any:
        return await workflow.execute_activity(
            name, arg, result_type=result_type, start_to_close_timeout=_SHORT,
            schedule_to_close_timeout=_SHORT_TOTAL, retry_policy=_RETRY,
        )

    @workflow.run
    async def run(self, req: ValidationRequest) -> ValidationResult:
        run_id = workflow.info().workflow_id
        target = return_target(req)
        node = req.machine if target == "spare" else (req.node or req.machine)
        placement: PlacementResult
        try:
            placement = await self._short(
                ACT.place_validation,
                ValidationPlacement(cluster=req.cluster, machine=req.machine, node=node,
                                    run_id=run_id),
                PlacementResult,
            )
        except ActivityError as e:
            placement = PlacementResult(placed=False, reason=f"placement failed: {_cause(e)}")
        self._job_id = placement.job_id
        result: ValidationResult | None = None
        if not placement.placed or placement.job_id is None:
            result = ValidationResult(machine=req.machine, verdict=Verdict.aborted,
                                      reason=f"no placement: {placement.reason}")
        else:
            self._stage = "running"
            result = await self._wait(req, node, run_id, placement)
        self._stage = "releasing"
        try:
            await self._short(
                ACT.release_validation,
                CollectInput(cluster=req.cluster, machine=req.machine, node=node,
                             run_id=run_id, job_id=placement.job_id or ""),
            )
        except ActivityError as e:
            # the verdict is applied all the same (a failed machine must stay out); what
            # is left of the placement ends with its own bound (the reservation's
            # Duration, the Job's activeDeadlineSeconds)
            result = _noted(result, f"placement not released: {_cause(e)}")
        if result.verdict == Verdict.failed:
            self._stage = "ticketing"
            summary = f"{req.machine}: validation failed — {result.reason}"[:_SUMMARY_CHARS]
            ticket: TicketResult | None = None
            try:
                ticket = await self._short(
                    ACT.ledger_open_ticket,
                    TicketInput(cluster=req.cluster, machine=req.machine, run_id=run_id,
                                summary=summary, result=result),
                    TicketResult,
                )
            except ActivityError as e:
                # kept out all the same, without a ticket to name
                result = _noted(result, f"no hardware ticket opened: {_cause(e)}")
            if ticket is not None:
                result = result.model_copy(update={"ticket_id": ticket.ticket_id})
                try:
                    await self._short(
                        ACT.post_ticket,
                        TicketPost(ticket_id=ticket.ticket_id, cluster=req.cluster,
                                   machine=req.machine, run_id=run_id, summary=summary,
                                   result=result),
                        bool,
                    )
                except ActivityError as e:
                    # the ticket is open in the ledger; a webhook that refuses it (a wrong
                    # URL or credential) or stays down never keeps the verdict from being
                    # applied: the machine failed its checks and stays out
                    result = _noted(result, f"ticket {ticket.ticket_id} open in the ledger, "
                                    f"not posted to the ticket webhook: {_cause(e)}")
        self._stage = "returning"
        # A held machine (removed for RMA) that passes only gets back the state it had
        # before the run: return_machine's "aborted" branch restores exactly that.
        applied = result.verdict
        if target == "hold" and result.verdict == Verdict.passed:
            applied = Verdict.aborted
        unapplied: str | None = None
        if placement.prior_state or applied != Verdict.aborted:
            try:
                back: ReturnMachineResult = await self._short(
                    ACT.return_machine,
                    ReturnMachineInput(cluster=req.cluster, machine=req.machine, node=node,
                                       run_id=run_id, verdict=applied,
                                       prior_state=placement.prior_state, return_to=target,
                                       ticket_id=result.ticket_id),
                    ReturnMachineResult,
                )
                self._detail = back.detail
            except ActivityError as e:
                # the verdict is still recorded (a failed machine's ticket stays open, a
                # person sees it), then the run fails naming what was not done
                unapplied = f"verdict not applied to the machine: {_cause(e)}"
                result = _noted(result, unapplied)
                self._detail = unapplied
        self._stage = "recording"
        await self._short(
            ACT.ledger_record_verdict,
            VerdictRecord(run_id=run_id, cluster=req.cluster, machine=req.machine,
                          verdict=result.verdict, result=result, at=workflow.now(),
                          close_tickets=target != "hold"),
        )
        self._result = result
        if unapplied is not None:
            self._stage = "failed"
            raise permanent(
                VALIDATION_VERDICT_NOT_APPLIED,
                f"validation of {req.machine}: verdict {result.verdict.value} recorded, "
                f"{unapplied}", result)
        self._stage = "done"
        return result

    async def _wait(self, req: ValidationRequest, node: str, run_id: str,
                    placement: PlacementResult) -> ValidationResult:
        """Long-poll the job until it reports or ``placement.timeout_s`` passes."""
        assert placement.job_id is not None
        deadline = workflow.now() + timedelta(seconds=placement.timeout_s)
        while True:
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining <= 0:
                return ValidationResult(
                    machine=req.machine, verdict=Verdict.aborted,
                    reason=f"timed out: no result within {placement.timeout_s:g} s",
                )
            wait = min(placement.poll_s, remaining)
            try:
                col: CollectResult = await workflow.execute_activity(
                    ACT.collect_validation,
                    CollectInput(cluster=req.cluster, machine=req.machine, node=node,
                                 run_id=run_id, job_id=placement.job_id, wait_s=wait),
                    result_type=CollectResult,
                    start_to_close_timeout=timedelta(seconds=wait + _COLLECT_SLACK_S),
                    heartbeat_timeout=_HEARTBEAT,
                    retry_policy=_RETRY,
                    schedule_to_close_timeout=timedelta(seconds=remaining + _COLLECT_SLACK_S),
                )
            except ActivityError as e:
                return ValidationResult(machine=req.machine, verdict=Verdict.aborted,
                                        reason=f"could not collect the result: {e.cause or e}")
            if col.finished and col.result is not None:
                return col.result
