"""Approvals, queues and notifications a break-test of 0ac391a found open (each test failed
there):

- an approved repair queued for its lease or paused by a maintenance window showed
  ``awaiting_approval`` (RepairState, ledger state, status) and the maintenance pause's row
  write sent the approval-needed notification again;
- an approve sent while an approved repair's lease was queued (or during the hand-back
  after the decision changed) was dropped silently;
- a repair a failure-domain hold kept waiting acted after the release on evidence from
  before it (a breaker reset's queued repairs already did not);
- a rejected or cancelled shadow-mode repair's notification (written by the ledger side)
  carried no ``shadow:`` marker: the repair row had no mode.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import asyncpg

from activities.ledger_activities import LedgerActivities
from activities.notifications import NotificationEvent, Notifier
from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import eventually, repair_status, start_repair, wait_stage
from workflows.activity_api import RepairRecord, TransitionRecord
from workflows.models import (
    Action,
    ApproveSignal,
    Requester,
    RequesterKind,
    Stage,
)
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


async def test_an_approve_naming_the_new_action_while_the_lease_is_queued_is_applied(
    harness: Harness,
) -> None:
    """Consent ``approve``: the second repair of a node is approved (reboot) while the first
    holds the node; the first reboots meanwhile, so at grant time the ladder moves the
    second to reprovision and hands its lease back to ask again. Bob had already approved
    reprovision (named) while it was queued: that approval was dropped and the person
    asked again. It is applied: reprovision runs, approved by bob. An approve that named
    nothing (of the reboot shown) is answered with a note saying why it was not applied."""
    from tests.workflows.helpers import guard_status
    from tests.workflows.test_repair_approval_covers import record

    h = harness
    h.policy.consent.mode = "approve"
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    node = "gpu-11"
    h.cluster.busy_polls[node] = 5
    await record(h, node, Action.reboot, 1)
    now = await h.env.get_current_time()
    alert = make_alert(h.cluster.cluster, node, "b7-1", observed_at=now)
    first = await start_repair(h, node, Action.reboot, "b7-1", alerts=[alert])
    await wait_stage(h, node, "b7-1", Stage.awaiting_approval)
    await first.signal("approve", ApproveSignal(by="oncall"))
    await wait_stage(h, node, "b7-1", Stage.waiting_for_idle)
    alert2 = make_alert(h.cluster.cluster, node, "b7-2", observed_at=now)
    second = await start_repair(h, node, Action.reboot, "b7-2", alerts=[alert2])
    await wait_stage(h, node, "b7-2", Stage.awaiting_approval)
    await second.signal("approve", ApproveSignal(by="oncall"))

    async def queued() -> bool:
        return "b7-2" in {p.repair_id for p in (await guard_status(h)).pending}

    await eventually(queued, "the approved second repair queued behind the first")
    await second.signal("approve", ApproveSignal(by="bob", action=Action.reprovision))
    assert (await first.result()).stage == Stage.succeeded
    done = await second.result()
    notes = " | ".join(t.reason for t in done.history)
    assert done.stage == Stage.succeeded, notes
    assert h.cluster.count("reprovision", node) == 1, notes
    assert done.approved_by == "bob", notes


async def test_an_approve_of_the_earlier_decision_while_the_lease_is_queued_is_answered(
    harness: Harness,
) -> None:
    """As above, but the approve sent while queued names nothing (it approves the reboot
    shown then). The ladder moved to reprovision: the approval does not cover it, the
    repair asks again, and a note says the approve was not applied and why."""
    from tests.workflows.helpers import guard_status
    from tests.workflows.test_repair_approval_covers import record
    from workflows.models import RejectSignal

    h = harness
    h.policy.consent.mode = "approve"
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    node = "gpu-12"
    h.cluster.busy_polls[node] = 5
    await record(h, node, Action.reboot, 1)
    now = await h.env.get_current_time()
    first = await start_repair(h, node, Action.reboot, "b7-3",
                               alerts=[make_alert(h.cluster.cluster, node, "b7-3",
                                                  observed_at=now)])
    await wait_stage(h, node, "b7-3", Stage.awaiting_approval)
    await first.signal("approve", ApproveSignal(by="oncall"))
    await wait_stage(h, node, "b7-3", Stage.waiting_for_idle)
    second = await start_repair(h, node, Action.reboot, "b7-4",
                                alerts=[make_alert(h.cluster.cluster, node, "b7-4",
                                                   observed_at=now)])
    await wait_stage(h, node, "b7-4", Stage.awaiting_approval)
    await second.signal("approve", ApproveSignal(by="oncall"))

    async def queued() -> bool:
        return "b7-4" in {p.repair_id for p in (await guard_status(h)).pending}

    await eventually(queued, "the approved second repair queued behind the first")
    await second.signal("approve", ApproveSignal(by="bob"))
    assert (await first.result()).stage == Stage.succeeded

    async def asked_again() -> bool:
        st = await repair_status(h, node, "b7-4")
        return (st.stage == Stage.awaiting_approval and st.state == STATE_AWAITING_APPROVAL
                and st.action == Action.reprovision)

    await eventually(asked_again, "the second repair asking again for reprovision")
    st = await repair_status(h, node, "b7-4")
    notes = " | ".join(t.reason for t in st.history)
    assert "approve by bob of reboot not applied" in notes, notes
    await second.signal("reject", RejectSignal(by="bob", reason="test over"))
    assert (await second.result()).stage == Stage.rejected
    assert h.cluster.count("reprovision", node) == 0


async def test_a_repair_held_by_a_failure_domain_acts_only_on_evidence_after_the_release(
    harness: Harness,
) -> None:
    """Three automatic repairs of rack-a open its hold; the third and a fourth wait for it.
    An operator releases the hold much later. The third's fault was an Xid event received
    before the hold: it ends ``auto_resolved`` without a cordon (as after a breaker reset).
    The fourth's fault is a level one still standing: it goes on and cordons."""
    from tests.workflows.helpers import guard_status, repair_status
    from workflows.protocol import (
        GUARD_SIGNAL_RELEASE_DOMAIN,
        ReleaseDomainSignal,
        workflow_id_guard,
    )

    h = harness
    rack = [f"gpu-1{i}" for i in range(4)]
    h.gpu_nodes = 100  # budget 5, breaker threshold 10: neither binds here
    h.domains = {n: ["rack-a"] for n in rack}
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    for n in rack:
        h.cluster.busy_polls[n] = 10_000  # a granted repair holds its lease, waiting
    for i, n in enumerate(rack[:3], 1):
        await start_repair(h, n, Action.reboot, f"dh{i}")

        async def asked(k: int = i) -> bool:
            g = await guard_status(h)
            return len(g.leases) + len(g.pending) == k

        await eventually(asked, f"dh{i} answered by the guard")
    level = make_alert(h.cluster.cluster, rack[3], "dh4", kind="gpu_health", code=None,
                       level=True, summary="GPU health check failing")
    fourth = await start_repair(h, rack[3], Action.reboot, "dh4", alerts=[level])

    async def held() -> bool:
        g = await guard_status(h)
        return (["rack-a"] == [d.domain for d in g.domain_holds]
                and {"dh3", "dh4"} <= {p.repair_id for p in g.pending})

    await eventually(held, "the rack held, dh3 and dh4 waiting")
    await h.env.sleep(timedelta(hours=2).total_seconds())
    await h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster)).signal(
        GUARD_SIGNAL_RELEASE_DOMAIN, ReleaseDomainSignal(domain="rack-a", by="alice",
                                                         reason="PSU fixed"))

    async def third_moved() -> bool:
        st = await repair_status(h, rack[2], "dh3")
        return st.stage != Stage.recommended

    await eventually(third_moved, "dh3 answered after the release")
    done = await repair_status(h, rack[2], "dh3")
    notes = " | ".join(t.reason for t in done.history)
    assert done.stage == Stage.auto_resolved, notes
    assert "release" in notes, notes
    assert h.cluster.count("cordon", rack[2]) == 0

    async def cordoned() -> bool:
        return (await repair_status(h, rack[3], "dh4")).stage == Stage.waiting_for_idle

    await eventually(cordoned, "dh4 (its level fault standing) cordons after the release")
    assert h.cluster.count("cordon", rack[3]) == 1
    del fourth


async def test_a_rejected_or_cancelled_shadow_repair_is_notified_as_shadow(
    ledger_pool: asyncpg.Pool,
) -> None:
    """A shadow-mode repair (it would never act) is rejected, another cancelled: their
    repair_finished notifications, sent by the ledger side from the repair row, start
    ``shadow:`` as a shadowed or timed-out shadow repair's do. An enforcing repair's
    keep the plain subject."""
    rec = _Recorded()
    acts = LedgerActivities(ledger_pool, notifier=cast(Notifier, rec))
    for rid, stage, mode in (("b7-sr", Stage.rejected, "shadow"),
                             ("b7-sc", Stage.cancelled, "shadow"),
                             ("b7-er", Stage.rejected, "enforce")):
        await acts.upsert_repair(_row(rid, Stage.recommended, _at(0), mode=mode))
        await acts.record_transition(TransitionRecord(repair_id=rid, stage=stage, at=_at(1),
                                                      by="alice", reason="not now"))
        # the final row write names no mode (as a writer from before it): the mode stays
        await acts.upsert_repair(_row(rid, stage, _at(1)))
    subjects = {e.repair_id: e.subject for e in rec.got}
    assert subjects["b7-sr"].startswith("shadow: repair b7-sr rejected"), subjects
    assert subjects["b7-sc"].startswith("shadow: repair b7-sc cancelled"), subjects
    assert not subjects["b7-er"].startswith("shadow"), subjects
