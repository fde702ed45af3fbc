"""Short calls on the alert → repair path as local activities (issue 30 item 2).

The node entity's first task (``ledger_record_alert``, ``load_node_policy``,
``ledger_open_repair``) and the repair's ledger reads and writes and its policy read are
short (milliseconds against PostgreSQL or the worker's own config) and idempotent. As
regular activities each costs a round trip through the Temporal server (scheduled →
started → completed events, a matching dispatch, a new workflow task); as local
activities they run in the worker that runs the workflow, inside the same workflow task,
and leave one marker event. Long or external calls (scheduler, BMC, notifications,
evidence capture, validation) stay regular activities, so Temporal still dispatches,
rate-limits and retries them across workers.

Semantics kept (docs/design.md §6):

- the **retry policy** is the caller's own (the same one the regular activity had);
  local retries run in the worker while their back-off is under the SDK's local retry
  threshold (1 min; every policy here backs off to at most 30 s), a worker that dies
  mid-way has the workflow task retried on another worker, which runs the call again:
  the same at-least-once delivery as a regular activity, so the same idempotency rule
  (every one of these activities is idempotent on its key: alert id, repair id + stage
  + time, detector + request id);
- each attempt is bounded by :data:`LOCAL_START_TO_CLOSE` (10 s: a workflow task's
  default timeout; the SDK heartbeats the workflow task while a local activity runs
  longer) and the local tries together by :data:`LOCAL_ATTEMPTS` (8 for a policy that
  retries without end: its back-off 1, 2, 4, 8, 16, 30, 30 s is about 1.5 min; the
  SDK (temporalio 1.35) does not stop a local activity's retries at its
  schedule-to-close, measured, so the bound is the attempt count) and
  :data:`LOCAL_SCHEDULE_TO_CLOSE`, so a PostgreSQL outage never holds a workflow task
  open without end;
- a call whose policy retries without end (``maximum_attempts`` 0: "until it succeeds")
  and whose local tries ran out on transient failures goes on as the same regular
  activity with the same policy (:func:`execute_short`, the repair): an outage longer
  than that is ridden out as before, only the fast path changed. The node entity
  instead steps the failure as its machine's event (``AlertRecorded(ok=False)``,
  ``PolicyFailed``, ``LedgerUnavailable``), which its machine already decides.

Deterministic: only ``workflow`` APIs; no I/O.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    is_cancelled_exception,
)

#: One attempt of a local activity, at most (a workflow task's default timeout, 10 s).
LOCAL_START_TO_CLOSE = timedelta(seconds=10)
#: Every attempt of one local activity together, at most (3 min: 8 tries backing off as
#: :data:`LOCAL_ATTEMPTS` says, 91 s, plus their attempts).
LOCAL_SCHEDULE_TO_CLOSE = timedelta(seconds=180)
#: Local tries of a call whose policy retries without end (its back-off 1, 2, 4, 8, 16,
#: 30, 30 s between them: about 1.5 min); a bounded policy keeps its own count.
LOCAL_ATTEMPTS = 8


def start_local(name: str, arg: Any, *, retry_policy: RetryPolicy,
                result_type: type | None = None,
                start_to_close: timedelta = LOCAL_START_TO_CLOSE) -> Any:
    """Start activity ``name`` with ``arg`` as a local activity (a handle to await):
    ``start_to_close`` per attempt (at most :data:`LOCAL_START_TO_CLOSE`), every attempt
    within :data:`LOCAL_SCHEDULE_TO_CLOSE`, retried by ``retry_policy`` (at most
    :data:`LOCAL_ATTEMPTS` tries where it sets no ``maximum_attempts``). Returns an
    awaitable of its result that raises ``ActivityError`` (its cause the failure) as a
    regular activity's handle does."""
    policy = retry_policy
    if not policy.maximum_attempts:
        policy = dataclasses.replace(policy, maximum_attempts=LOCAL_ATTEMPTS)
    # started now, in command order (the handle is awaited later)
    handle = workflow.start_local_activity(
        name, arg, result_type=result_type,
        start_to_close_timeout=min(start_to_close, LOCAL_START_TO_CLOSE),
        schedule_to_close_timeout=LOCAL_SCHEDULE_TO_CLOSE,
        retry_policy=policy)
    return _as_activity_error(name, handle)


async def _as_activity_error(name: str, handle: Any) -> Any:
    """``handle``'s result; its failure as an ``ActivityError`` whose cause is the
    failure. A failed local activity raises its failure itself (the ``ApplicationError``,
    ``TimeoutError`` or ``CancelledError``; temporalio 1.35, measured), where a regular
    activity raises ``ActivityError`` with it as the cause: every caller catches
    ``ActivityError`` (and ``is_cancelled_exception`` reads the cause), so the two fail
    alike."""
    try:
        return await handle
    except ActivityError:
        raise
    except FailureError as failure:
        err = ActivityError(f"local activity {name} failed", scheduled_event_id=0,
                            started_event_id=0, identity="", activity_type=name,
                            activity_id="", retry_state=None)
        raise err from failure


def ran_out(err: ActivityError, retry_policy: RetryPolicy) -> bool:
    """Whether a local activity under ``retry_policy`` failed only because its local
    tries ran out: the policy retries without end, the failure is not a cancellation and not
    permanent (a non-retryable ``ApplicationError`` or one of the policy's
    ``non_retryable_error_types``)."""
    if retry_policy.maximum_attempts != 0 or is_cancelled_exception(err):
        return False
    cause = err.cause
    if isinstance(cause, ApplicationError):
        return not cause.non_retryable and cause.type not in (
            retry_policy.non_retryable_error_types or ())
    return True


async def execute_short(name: str, arg: Any, *, retry_policy: RetryPolicy,
                        attempt_timeout: timedelta, result_type: type | None = None) -> Any:
    """Run a short idempotent activity as a local activity (:func:`start_local`); when its
    local tries ran out on transient failures under a policy that retries without end
    (:func:`ran_out`), run it again as a regular activity with ``attempt_timeout`` per attempt
    and the same ``retry_policy``. Returns its result; raises ``ActivityError`` as the
    regular activity would."""
    try:
        return await start_local(name, arg, retry_policy=retry_policy,
                                 result_type=result_type, start_to_close=attempt_timeout)
    except ActivityError as err:
        if not ran_out(err, retry_policy):
            raise
        workflow.logger.warning("local activity %s: local tries ran out; retried as an "
                                "activity: %s", name, err.cause or err)
    return await workflow.execute_activity(
        name, arg, result_type=result_type, start_to_close_timeout=attempt_timeout,
        retry_policy=retry_policy)
