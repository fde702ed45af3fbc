"""A lease requester's receiving end for the guard benchmark (``tests/bench/guard_throughput.py``).

``BenchLeaseSink`` waits for the cluster guard's ``lease`` signal (:data:`REPAIR_SIGNAL_LEASE`,
payload :class:`~workflows.protocol.LeaseReply`) and returns the first reply. It is what a
``RepairWorkflow`` waiting for its lease looks like to the guard (a running workflow whose
id is ``LeaseRequest.workflow_id``), without anything else a repair does. Its worker runs
unsandboxed: the benchmark measures the guard, not this workflow.
"""

from __future__ import annotations

from temporalio import workflow

from workflows.protocol import REPAIR_SIGNAL_LEASE, LeaseReply

SINK_WORKFLOW = "BenchLeaseSink"
SINK_QUEUE = "bench-lease-sink"


@workflow.defn(name=SINK_WORKFLOW)
class LeaseSink:
    """Returns the first :class:`LeaseReply` signalled to it."""

    def __init__(self) -> None:
        self.reply: LeaseReply | None = None

    @workflow.signal(name=REPAIR_SIGNAL_LEASE)
    def lease(self, reply: LeaseReply) -> None:
        if self.reply is None:
            self.reply = reply

    @workflow.run
    async def run(self) -> LeaseReply:
        await workflow.wait_condition(lambda: self.reply is not None)
        assert self.reply is not None
        return self.reply
