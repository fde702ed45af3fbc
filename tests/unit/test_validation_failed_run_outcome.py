"""`autorepair validate --wait` on a run that failed: the verdict the run recorded (a
``VerdictNotApplied`` failure carries the result), else ``aborted`` with the failure's
message — never a traceback, and the exit code follows the verdict."""

from __future__ import annotations

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from workers.ops_temporal import failed_run_outcome, validation_exit_code
from workflows.protocol import VALIDATION_VERDICT_NOT_APPLIED


def _failure(cause: BaseException) -> WorkflowFailureError:
    return WorkflowFailureError(cause=cause)


def test_a_recorded_verdict_not_applied_is_reported_as_recorded() -> None:
    cause = ApplicationError(
        "validation of gpu-02: verdict failed recorded, verdict not applied to the machine: "
        "slurmctld refused",
        {"machine": "gpu-02", "verdict": "failed", "reason": "gpu: row-remapping failure"},
        type=VALIDATION_VERDICT_NOT_APPLIED, non_retryable=True)
    verdict, reason = failed_run_outcome(_failure(cause))
    assert verdict == "failed"
    assert reason.startswith("gpu: row-remapping failure") and "slurmctld refused" in reason
    assert validation_exit_code([{"verdict": verdict}]) == 1


def test_any_other_failure_is_an_aborted_run_naming_it() -> None:
    verdict, reason = failed_run_outcome(_failure(ApplicationError("worker lost its config")))
    assert verdict == "aborted" and reason == (
        "validation workflow failed: worker lost its config")
    assert validation_exit_code([{"verdict": verdict}]) == 2
