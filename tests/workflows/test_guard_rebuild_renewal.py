"""A holder renews while a fresh guard cannot read the ledger (real guard workflow,
time-skipping server, real ledger; the guard's ``ledger_guard_state`` fails).

The rebuilding guard told the renewal "guard rebuilding its state from the ledger",
``granted`` false: to its holder a refused renewal (workflows/repair.py ``lease``), so
it took its lease for lapsed and stopped before its next disruptive step for as long as
the ledger stayed down. The renewal is now kept without an answer; once the ledger
answers the holder is re-registered ("rebuilt") and the renewal granted.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.workflows.conftest import Harness
from tests.workflows.helpers import (
    eventually,
    guard_status,
    guard_worker_in_ledger_outage,
    lease_recorders,
    lease_replies,
)
from workflows.activity_api import (
    RepairRecord,
    TransitionRecord,
)
from workflows.lifecycle.guard import LEDGER_RETRY_S
from workflows.models import Action, Requester, RequesterKind, Stage
from workflows.protocol import (
    GUARD_SIGNAL_ACQUIRE,
    GUARD_WORKFLOW,
    GuardInput,
    LeaseRequest,
    workflow_id_guard,
)

USER = Requester(kind=RequesterKind.user, name="ops")


async def test_a_renewal_while_the_guard_rebuilds_is_not_refused(
    harness: Harness, ledger_pool: Any
) -> None:
    h = harness
    c = h.cluster.cluster
    async with (
        guard_worker_in_ledger_outage(h, ledger_pool) as (guard_queue, down),
        lease_recorders(h, 1) as (rec,),
    ):
        # r1 holds gpu-01 (cordoned, lease held) as the ledger records it
        t0 = datetime(2026, 1, 1, tzinfo=UTC)
        await h.ledger.upsert_repair(RepairRecord(
            repair_id="r1", cluster=c, node="gpu-01", action=Action.reboot,
            stage=Stage.recommended, requester=USER, workflow_id=rec.id,
            updated_at=t0, lease_held=True))
        await h.ledger.record_transition(TransitionRecord(
            repair_id="r1", stage=Stage.cordoning, at=t0 + timedelta(minutes=1)))
        gid = workflow_id_guard(c)
        guard = h.client.get_workflow_handle(gid)
        await h.client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=c), id=gid,
                                      task_queue=guard_queue)

        async def ledger_failed() -> bool:
            g = await guard_status(h)
            return any("reading the ledger" in e for e in g.errors)

        await eventually(ledger_failed, "the fresh guard's ledger read failed")
        await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
            repair_id="r1", workflow_id=rec.id, cluster=c, node="gpu-01", renew=True))
        await h.env.sleep(timedelta(seconds=LEDGER_RETRY_S * 2))
        g = await guard_status(h)
        assert g.rebuilt_at is None and down.reads >= 2, (g, down)
        # before: [False], "guard rebuilding its state from the ledger"
        assert [r.granted for r in await lease_replies(rec)] == [], await lease_replies(rec)

        down.on = False
        await h.env.sleep(timedelta(seconds=LEDGER_RETRY_S + 5))  # the next retry

        async def rebuilt_and_renewed() -> bool:
            return len(await lease_replies(rec)) >= 2

        await eventually(rebuilt_and_renewed, "r1 re-registered and its renewal granted",
                         explain=lambda: guard_status(h))
        got = await lease_replies(rec)
        assert all(r.granted for r in got), got
        assert [x.repair_id for x in (await guard_status(h)).leases] == ["r1"]
