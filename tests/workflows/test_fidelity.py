"""The recording interpreter (issue 26 item 5): the harness's worker checks every call a
machine-interpreting workflow makes against what ``step`` commanded
(``tests/workflows/fidelity.py``). Here: the check runs on real repairs and guards, and it
bites — a shell that makes a call of its own, or skips one, fails its workflow."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger_activities import LedgerActivities
from tests.workflows import fidelity
from tests.workflows.conftest import Harness
from tests.workflows.fidelity import FidelityInterceptor, FidelityViolation
from tests.workflows.helpers import start_repair
from tests.workflows.planted_shells import GuardThatDecidesItself, GuardThatSkipsACommand
from workflows.guard import ClusterGuardWorkflow
from workflows.lifecycle.trace import Call, Trace
from workflows.models import Action
from workflows.protocol import GuardInput


def test_trace_accepts_only_the_commanded_calls_in_order() -> None:
    t = Trace()
    t.commanded([Call("activity", "a", (("key", "k1"),)), Call("signal", "lease")])
    assert t.executed("signal", "lease") is not None  # out of order
    assert t.executed("activity", "a", type("X", (), {"key": "k2"})()) is not None  # argument
    assert t.executed("activity", "a", type("X", (), {"key": "k1"})()) is None
    assert t.leftover() is not None  # the signal was never sent
    assert t.executed("signal", "lease") is None
    assert t.leftover() is None
    assert t.executed("activity", "b") is not None  # nothing commanded
    governed = Trace([("activity", "a")])
    assert governed.executed("activity", "other") is None  # not the machine's call
    assert governed.checked == 0


def test_a_machine_run_is_checked_for_the_sent_at_it_commanded() -> None:
    """The machine action's run carries the state's ``sent_at`` (when the attempt's
    restart request went out): a shell that drops it, moves it, or invents one where the
    machine commanded none fails the check (before, only the resume phase and the
    idempotency key were compared)."""
    from datetime import UTC, datetime, timedelta

    from workflows.activity_api import ACT, MachineActionInput
    from workflows.lifecycle.machine_action import RunActivity
    from workflows.repair import machine_calls

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    key = "r-1/reboot/0"
    base = MachineActionInput(cluster="c", node="n", machine="n", repair_id="r-1",
                              resume_phase="restart_sent", idempotency_key=key)

    def check(sent_at: datetime | None, arg: MachineActionInput) -> str | None:
        t = Trace()
        t.commanded(machine_calls(RunActivity(action=Action.reboot, key=key,
                                              resume_phase="restart_sent",
                                              sent_at=sent_at)))
        return t.executed("activity", ACT.reboot_machine, arg)

    assert check(t0, base.model_copy(update={"sent_at": t0})) is None
    assert check(None, base) is None
    dropped = check(t0, base)
    assert dropped is not None and "sent_at" in dropped, dropped
    assert check(t0, base.model_copy(update={"sent_at": t0 + timedelta(seconds=1)})) \
        is not None
    assert check(None, base.model_copy(update={"sent_at": t0})) is not None


def test_trace_matches_a_batched_call_element_by_element() -> None:
    """The guard's ``guard_send_leases`` stands for one ``SendLease`` per element of its
    ``commands`` (issue 30 item 1): each element must be the commanded reply, in order;
    a changed answer, a reordered, missing or extra element, or an empty batch is a
    violation."""
    from workflows.activity_api import ACT, LeaseDeliveries, LeaseDelivery
    from workflows.guard import calls
    from workflows.lifecycle import guard as gm
    from workflows.protocol import LeaseReply

    def send(rid: str, granted: bool) -> gm.SendLease:
        return gm.SendLease(workflow_id=f"w-{rid}",
                            reply=LeaseReply(repair_id=rid, granted=granted))

    def batch(*cmds: gm.SendLease) -> LeaseDeliveries:
        return LeaseDeliveries(guard_id="g", commands=[
            LeaseDelivery(workflow_id=c.workflow_id, reply=c.reply) for c in cmds])

    a, b = send("a", True), send("b", False)

    def trace() -> Trace:
        t = Trace()
        t.commanded(c for cmd in (a, b) for c in calls(cmd))
        return t

    name = ACT.guard_send_leases
    ok = trace()
    assert ok.executed("activity", name, batch(a, b)) is None and ok.leftover() is None
    split = trace()  # the same replies over two batches: fine
    assert split.executed("activity", name, batch(a)) is None
    assert split.executed("activity", name, batch(b)) is None and split.leftover() is None
    assert trace().executed("activity", name, batch(b, a)) is not None  # reordered
    assert trace().executed("activity", name, batch(send("a", False), b)) is not None
    extra = trace()
    assert extra.executed("activity", name, batch(a, b, send("c", True))) is not None
    missing = trace()
    assert missing.executed("activity", name, batch(a)) is None
    assert missing.leftover() is not None  # b was never sent
    assert trace().executed("activity", name, batch()) is not None  # nothing in it


async def test_real_repair_and_guard_run_only_what_their_machines_commanded(
    harness: Harness,
) -> None:
    """A power cycle through the guard: the guard's lease signals and ledger calls and
    the machine action's activity are each checked, and none is a violation."""
    before = dict(fidelity.CHECKED)
    seen = len(fidelity.VIOLATIONS)
    h = harness
    h.cluster.bmc_read_failures_after_on["gpu-07"] = 1
    status = await (await start_repair(h, "gpu-07", Action.power_cycle, "fid-ok")).result()
    assert status.stage.value == "succeeded"
    assert fidelity.VIOLATIONS[seen:] == []
    # guard: load_policy, ledger_guard_state, the grant's signal; repair: two tries
    assert fidelity.CHECKED["calls"] - before["calls"] >= 5
    assert fidelity.CHECKED["runs"] > before["runs"]


@pytest.mark.parametrize("planted", [GuardThatDecidesItself, GuardThatSkipsACommand])
async def test_the_check_finds_a_shell_that_departs_from_its_machine(
    harness: Harness, planted: type[ClusterGuardWorkflow]
) -> None:
    h = harness
    queue = f"planted-{uuid.uuid4().hex[:8]}"
    seen = len(fidelity.VIOLATIONS)
    async with Worker(
        h.client,
        task_queue=queue,
        workflows=[planted],
        activities=[h.load_policy, *LedgerActivities(h.ledger.pool).all(),
                    *GuardReplyActivities(h.client).all()],
        interceptors=[FidelityInterceptor()],
        workflow_failure_exception_types=[FidelityViolation],
    ):
        handle = await h.client.start_workflow(
            planted.run,  # type: ignore[arg-type]
            GuardInput(cluster=f"{h.cluster.cluster}-planted"),
            id=f"planted/{queue}",
            task_queue=queue,
        )
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    assert len(fidelity.VIOLATIONS) == seen + 1, fidelity.VIOLATIONS[seen:]
