"""The test harness's virtual sleep survives a skip that takes longer than 30 s of real
time (tests/conftest.py ``patient_sleep``).

The SDK's client gives every call 30 s by default, and a CI run failed so: on a loaded
machine ``env.sleep(3 min)`` in test_node_rails ran past it (``RPCError: Timeout
expired``) although the clock still advanced. Here an activity holds the clock for
``HOLD_S`` of real time (the test server does not skip while one runs), which a 30 s
deadline cannot wait out.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

#: Real seconds the activity holds the virtual clock: past the client's 30 s default.
HOLD_S = 33.0


@activity.defn(name="hold_the_clock")
async def hold_the_clock() -> None:
    await asyncio.sleep(HOLD_S)


@workflow.defn(name="HoldsTheClock")
class HoldsTheClock:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(
            hold_the_clock, start_to_close_timeout=timedelta(minutes=5))


async def test_a_skip_slower_than_the_client_default_still_finishes(
    ts_env: WorkflowEnvironment,
) -> None:
    queue = f"patience-{uuid.uuid4().hex[:8]}"
    async with Worker(ts_env.client, task_queue=queue, workflows=[HoldsTheClock],
                      activities=[hold_the_clock],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await ts_env.client.start_workflow(
            HoldsTheClock.run, id=f"patience-{uuid.uuid4()}", task_queue=queue)
        before = await ts_env.get_current_time()
        started = time.monotonic()
        await ts_env.sleep(timedelta(minutes=1))
        waited = time.monotonic() - started
        assert await ts_env.get_current_time() - before >= timedelta(minutes=1)
        assert waited > 30, f"the skip took {waited:.1f} s: the test no longer shows it"
        await handle.result()
