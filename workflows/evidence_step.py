"""The repair's evidence-capture step (issue 31 item 3): workflow code that runs
``capture_evidence`` right before a disruptive action and records the result. Runs inside
``RepairWorkflow`` (deterministic: no I/O of its own, times from ``workflow.now()``).

Before an action of ``policy.evidence_capture.actions`` (after the drain, before the
machine is touched) :func:`capture_before` runs the activity on the BMC task queue with
one try, bounded by ``timeout_s`` + :data:`~workflows.evidence.ACTIVITY_MARGIN_S` from
when it is scheduled (``schedule_to_close``: a worker that never picks it up bounds it
too), then records it with ``ledger_record_evidence``. A capture that fails, or runs out
of time, becomes an :class:`~workflows.evidence.EvidenceCapture` with the reason in its
notes: recorded and shown like any other, never a repair failure. New in 0.5.0 (every
workflow is pinned to its build, so no patch marker: docs/architecture.md
"Baseline and replay").
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from workflows.activity_api import ACT
    from workflows.config import EvidenceCaptureConfig
    from workflows.evidence import (
        ACTIVITY_MARGIN_S,
        EvidenceCapture,
        EvidenceRecord,
        capture_input,
    )
    from workflows.models import Action

#: One try: a retry would run past the bound (the activity bounds itself by timeout_s).
_ONCE = RetryPolicy(maximum_attempts=1)
#: Bound on the ledger write of the capture, seconds, every try included (a slow or
#: down ledger costs the repair at most this beyond the capture's own bound; the capture
#: is then a note, still in the repair's history and status).
_RECORD_S = 15.0


def _why(err: BaseException) -> str:
    cause = err.__cause__
    text = str(cause) if cause is not None else str(err)
    return text or type(cause or err).__name__


async def capture_before(
    cfg: EvidenceCaptureConfig, *, cluster: str, node: str, machine_id: str | None,
    repair_id: str, action: Action, attempt: int, task_queue: str,
) -> tuple[EvidenceCapture, str | None] | None:
    """Capture and record the evidence before ``action`` (attempt ``attempt``, 1 = the
    first of this action in the repair) under ``cfg``; returns the capture (a failed one:
    no node or BMC part, the reason in its notes) and why the ledger write failed (None:
    recorded), or ``None`` when nothing is
    to be captured (disabled, ``action`` not in ``cfg.actions``, or a history from before
    the step). Raises only ``CancelledError`` (the repair was cancelled meanwhile)."""
    inp = capture_input(cfg, cluster=cluster, node=node, machine_id=machine_id,
                        repair_id=repair_id, action=action, attempt=attempt)
    if inp is None:
        return None
    bound = timedelta(seconds=inp.timeout_s + ACTIVITY_MARGIN_S)
    try:
        cap: EvidenceCapture = await workflow.execute_activity(
            ACT.capture_evidence, inp, result_type=EvidenceCapture, task_queue=task_queue,
            start_to_close_timeout=bound, schedule_to_close_timeout=bound,
            retry_policy=_ONCE)
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        why = (f"evidence capture before {action.value} failed or ran past "
               f"{bound.total_seconds():g} s: {_why(err)}")
        cap = EvidenceCapture(notes=[why])
    rec = EvidenceRecord(repair_id=repair_id, action=action, attempt=attempt, capture=cap,
                         at=workflow.now())
    try:
        await workflow.execute_activity(
            ACT.ledger_record_evidence, rec,
            start_to_close_timeout=timedelta(seconds=_RECORD_S),
            schedule_to_close_timeout=timedelta(seconds=_RECORD_S),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=2)))
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        return cap, (f"evidence before {action.value} not recorded in the ledger: "
                     f"{_why(err)}")
    return cap, None
