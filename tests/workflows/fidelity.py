"""The recording interpreter check (issue 26 item 5): every outbound call a workflow that
interprets a lifecycle machine makes must be one ``step`` commanded, in order, with the
commanded arguments (:mod:`workflows.lifecycle.trace`).

:class:`FidelityInterceptor` sits on the test harness's worker. For a workflow instance
with a ``lifecycle_trace`` it checks each activity start (regular or local, told apart),
external signal, child start and continue-as-new against the trace, and at the end of a run (returned, failed on
purpose or continued as new) that nothing commanded was left unmade. A violation raises
:class:`FidelityViolation`, which the harness's worker lists in
``workflow_failure_exception_types``: the workflow fails at once and the test with it
(and :data:`VIOLATIONS` keeps the text for a test that looks).
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ContinueAsNewInput,
    ExecuteWorkflowInput,
    Interceptor,
    SignalExternalWorkflowInput,
    StartActivityInput,
    StartChildWorkflowInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

#: Violations seen in this process (text, with the workflow id).
VIOLATIONS: list[str] = []
#: Calls checked against a trace in this process (a test asserts the check ran).
CHECKED: dict[str, int] = {"calls": 0, "runs": 0}


class FidelityViolation(Exception):
    """A workflow made a call its machine did not command (or skipped one)."""


def _check(kind: Any, name: str, arg: Any = None) -> None:
    trace = getattr(workflow.instance(), "lifecycle_trace", None)
    if trace is None:
        return
    before = trace.checked
    err = trace.executed(kind, name, arg)
    CHECKED["calls"] += trace.checked - before
    if err is not None:
        _violate(err)


def _violate(err: str) -> None:
    text = f"{workflow.info().workflow_type} {workflow.info().workflow_id}: {err}"
    VIOLATIONS.append(text)
    raise FidelityViolation(text)


def _leftover() -> None:
    trace = getattr(workflow.instance(), "lifecycle_trace", None)
    if trace is None:
        return
    CHECKED["runs"] += 1
    err = trace.leftover()
    if err is not None:
        _violate(err)


class _Outbound(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> Any:
        _check("activity", input.activity, input.args[0] if input.args else None)
        return super().start_activity(input)

    def start_local_activity(self, input: StartLocalActivityInput) -> Any:
        # its own kind: a shell that runs a commanded local activity through the server
        # (or the other way round) departs from what its ``calls`` promised
        _check("local_activity", input.activity, input.args[0] if input.args else None)
        return super().start_local_activity(input)

    async def signal_external_workflow(self, input: SignalExternalWorkflowInput) -> None:
        _check("signal", input.signal, input.args[0] if input.args else None)
        await super().signal_external_workflow(input)

    async def start_child_workflow(self, input: StartChildWorkflowInput) -> Any:
        _check("child", input.workflow, input.args[0] if input.args else None)
        return await super().start_child_workflow(input)

    def continue_as_new(self, input: ContinueAsNewInput) -> Any:
        _check("continue_as_new", "")
        _leftover()
        return super().continue_as_new(input)


class _Inbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_Outbound(outbound))

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        try:
            result = await super().execute_workflow(input)
        except ApplicationError:
            _leftover()  # a repair that failed on purpose (REPAIR_FAILED) ended normally
            raise
        _leftover()
        return result


class FidelityInterceptor(Interceptor):
    """Worker interceptor: the recording interpreter check on every workflow."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _Inbound
