"""Approvals, queues and notifications a break-test of 0ac391a found open (each test failed
there):

- an approved repair queued for its lease or paused by a maintenance window showed
  ``awaiting_approval`` (RepairState, ledger state, status) and the maintenance pause's row
  write sent the approval-needed notification again;
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import asyncpg

from activities.ledger_activities import LedgerActivities
from activities.notifications import NotificationEvent, Notifier
from tests.workflows.conftest import Harness
from tests.workflows.helpers import eventually, repair_status, start_repair, wait_stage
from workflows.activity_api import RepairRecord, TransitionRecord
from workflows.models import Action, ApproveSignal, Requester, RequesterKind, Stage
from workflows.protocol import SA_STATE, STATE_AWAITING_APPROVAL, STATE_IN_PROGRESS


class _Recorded:
    """A notifier that records what it was asked to publish."""

    def __init__(self) -> None:
        self.got: list[NotificationEvent] = []

    def publish(self, ev: NotificationEvent) -> int:
        self.got.append(ev)
        return 1


def _at(s: float) -> datetime:
    return datetime(2026, 12, 7, 12, 0, tzinfo=UTC) + timedelta(seconds=s)


def _row(rid: str, stage: Stage, at: datetime, **kw: Any) -> RepairRecord:
    return RepairRecord(repair_id=rid, cluster="c-b7", node="gpu-01", action=Action.reboot,
                        stage=stage, requester=Requester(kind=RequesterKind.system,
                                                         name="detector"),
                        updated_at=at, **kw)


async def test_an_approved_repair_paused_by_maintenance_says_approved_and_what_it_waits_for(
    harness: Harness,
) -> None:
    """A person approved the power cycle; a maintenance window covers the node, so the
    repair pauses before its cordon. The stage stays ``awaiting_approval`` (docs/design.md
    §4.4 order) but nobody is waited for: RepairState, the ledger's state and the status
    say it is approved and name the window it waits for."""
    from activities.maintenance_store import MaintenanceStore
    from workers.repairs.intake import _view

    h = harness
    h.policy.consent.mode = "approve"
    node, rid = "gpu-09", "b7-mw"
    store = MaintenanceStore(h.ledger.pool)
    await store.start(cluster=h.cluster.cluster, scope="nodes", nodes=[node],
                      duration_s=7200, reason="rack 9 firmware", created_by="ops",
                      now=await h.env.get_current_time())
    handle = await start_repair(h, node, Action.power_cycle, rid)
    await wait_stage(h, node, rid, Stage.awaiting_approval)
    asked = (await handle.describe()).typed_search_attributes.get(SA_STATE)
    assert asked == STATE_AWAITING_APPROVAL
    await handle.signal("approve", ApproveSignal(by="oncall"))

    async def paused() -> bool:
        row = await h.ledger.get_repair(rid)
        return row is not None and any("paused before cordoning" in t["reason"]
                                       for t in row["transitions"])

    await eventually(paused, "the maintenance pause")
    st = await repair_status(h, node, rid)
    row = await h.ledger.get_repair(rid)
    assert row is not None
    state = (await handle.describe()).typed_search_attributes.get(SA_STATE)
    assert st.stage == Stage.awaiting_approval and row["stage"] == "awaiting_approval"
    assert state == STATE_IN_PROGRESS, state
    assert st.state == STATE_IN_PROGRESS, st.state
    assert _view(row).state == STATE_IN_PROGRESS
    assert "approved by oncall" in st.detail and "maintenance window" in st.detail, st.detail
    assert row["approval_pending"] is False


async def test_a_note_of_an_approved_repair_does_not_ask_for_approval_again(
    ledger_pool: asyncpg.Pool,
) -> None:
    """The ledger side of the maintenance pause: the approval was asked for (notified),
    the repair was approved, then paused (a note at ``awaiting_approval``) and its row
    written (the lease handed back). The approvers are not asked again."""
    rec = _Recorded()
    acts = LedgerActivities(ledger_pool, notifier=cast(Notifier, rec))
    rid = "b7-note"
    await acts.upsert_repair(_row(rid, Stage.recommended, _at(0)))
    await acts.record_transition(TransitionRecord(repair_id=rid, stage=Stage.awaiting_approval,
                                                  at=_at(1), reason="approval needed: x"))
    await acts.upsert_repair(_row(rid, Stage.awaiting_approval, _at(1), approval_pending=True))
    assert [e.event.value for e in rec.got] == ["approval_needed"]
    # approved, then paused by a maintenance window: a note at the same stage
    await acts.upsert_repair(_row(rid, Stage.awaiting_approval, _at(2), approved_by="oncall",
                                  approval_pending=False))
    await acts.record_transition(TransitionRecord(
        repair_id=rid, stage=Stage.awaiting_approval, at=_at(3),
        reason="paused before cordoning: gpu-01 is in maintenance window w-1"))
    await acts.upsert_repair(_row(rid, Stage.awaiting_approval, _at(3), approved_by="oncall",
                                  approval_pending=False))
    assert [e.event.value for e in rec.got] == ["approval_needed"], rec.got
