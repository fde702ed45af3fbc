"""Shells that depart from their machines, for the fidelity check's proof that it bites
(``tests/workflows/test_fidelity.py``). A module of its own with few imports, since the
workflow sandbox re-imports the module a workflow is defined in."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.activity_api import ACT
    from workflows.guard import ClusterGuardWorkflow
    from workflows.lifecycle import guard as gm
    from workflows.protocol import GuardInput


@workflow.defn(name="planted-guard-decides-itself")
class GuardThatDecidesItself(ClusterGuardWorkflow):
    """Planted shell defect: it notifies on its own when it loads the policy."""

    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        await run_once(self)

    async def _execute(self, cmd: gm.Command) -> gm.Event | None:
        if isinstance(cmd, gm.LoadPolicy):
            await workflow.execute_activity(
                ACT.notify, "uncommanded", start_to_close_timeout=timedelta(seconds=5))
        return await super()._execute(cmd)


@workflow.defn(name="planted-guard-skips-a-command")
class GuardThatSkipsACommand(ClusterGuardWorkflow):
    """Planted shell defect: it does not continue as new although commanded."""

    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        await run_once(self)

    async def _execute(self, cmd: gm.Command) -> gm.Event | None:
        if isinstance(cmd, gm.ContinueAsNew):
            return None
        return await super()._execute(cmd)


async def run_once(guard: ClusterGuardWorkflow) -> None:
    """The guard's start, then one history-long step (commands a continue-as-new)."""
    await guard._deliver(gm.Started(fresh=True))
    await guard._deliver(gm.HistoryLong())
