"""A lease requester that keeps every ``lease`` reply it gets (the guard reply tests,
``tests/workflows/test_guard_replies.py``): a module of its own, so the workflow sandbox
imports only what a workflow may."""

from __future__ import annotations

from temporalio import workflow

from workflows.protocol import REPAIR_SIGNAL_LEASE, LeaseReply

RECORDER = "TestLeaseRecorder"


@workflow.defn(name=RECORDER)
class LeaseRecorder:
    """Keeps every ``lease`` reply it gets, in order (query ``replies``); runs until
    terminated."""

    def __init__(self) -> None:
        self.got: list[LeaseReply] = []

    @workflow.signal(name=REPAIR_SIGNAL_LEASE)
    def lease(self, reply: LeaseReply) -> None:
        self.got.append(reply)

    @workflow.query
    def replies(self) -> list[LeaseReply]:
        return list(self.got)

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)
