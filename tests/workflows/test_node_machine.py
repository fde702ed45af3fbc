"""The node machine's decisions that the shell's rewrite onto it settled (issue 26 review
of ``NodeWorkflow``), driven without Temporal: a delivery is never held for the ledger's
outage, an alert for a repair that is gone is not answered ``attached``, a clear queued
behind its raise is weighed before a repair starts, a re-registered node does not
inherit the old machine's faults, a receipt stamp ahead of the clock is no head start,
continue-as-new waits for what is being decided, and a 0.3.0 carried state converts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.workflows.conftest import make_alert
from workflows.config import CatalogueConfig, RailsConfig
from workflows.lifecycle import node as nm
from workflows.models import Alert, AlertOutcome, NodeInput
from workflows.node import NodeCarried, machine_state

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
POLICY = nm.PolicyLoaded(catalogue=CatalogueConfig(), rails=RailsConfig(), machine_id="m-a")


def _run(s: nm.NodeState, ev: nm.Event, now: datetime = T0, *, attach_ok: bool = True,
         policy: nm.PolicyLoaded = POLICY) -> tuple[nm.NodeState, list[nm.Command]]:
    """Step ``ev`` and answer the ledger write, policy read and attach signal at once."""
    todo: list[nm.Event] = [ev]
    out: list[nm.Command] = []
    while todo:
        known = s.reconcile == nm.Reconcile.done
        s, cmds = nm.step(s, todo.pop(0), now)
        out += cmds
        for c in cmds:
            if isinstance(c, nm.ReadLedger) and known:
                # the read before a repair starts: the ledger has no open repair
                todo.append(nm.LedgerRead())
            elif isinstance(c, nm.RecordAlert):
                todo.append(nm.AlertRecorded(alert_id=c.alert.alert_id))
            elif isinstance(c, nm.LoadPolicy):
                todo.append(policy)
            elif isinstance(c, nm.AttachAlert):
                todo.append(nm.AttachDone(alert_id=c.alert.alert_id, ok=attach_ok))
    return s, out


def _replies(cmds: list[nm.Command]) -> dict[str, nm.Reply]:
    return {c.alert_id: c for c in cmds if isinstance(c, nm.Reply)}


def _known() -> nm.NodeState:
    s, _ = _run(nm.new_state("c", "gpu-01", "seed"), nm.Begin())
    s, _ = _run(s, nm.LedgerRead())
    assert s.reconcile == nm.Reconcile.done
    return s


def _xid(n: str, at: datetime = T0) -> Alert:
    return make_alert("c", "gpu-01", n, observed_at=at, received_at=at)


def _lost(n: str, active: bool = True, at: datetime = T0) -> Alert:
    return make_alert("c", "gpu-01", n, kind="gpu_lost", code=None, gpu=None, level=True,
                      active=active, observed_at=at, received_at=at)


def test_a_delivery_is_answered_when_the_first_ledger_read_fails_not_after_the_outage(
) -> None:
    s, cmds = _run(nm.new_state("c", "gpu-01", "seed"), nm.Begin())
    assert [type(c) for c in cmds] == [nm.ReadLedger]
    s, cmds = _run(s, nm.AlertDelivered(alert=_xid("1")))
    assert "1" not in {c.alert_id for c in cmds if isinstance(c, nm.Reply)}
    s, cmds = _run(s, nm.LedgerUnavailable(message="pg down"))
    r = [c for c in cmds if isinstance(c, nm.Reply)]
    assert len(r) == 1 and r[0].outcome == AlertOutcome.new
    assert "waiting for the ledger" in r[0].reason
    assert not any(isinstance(c, nm.StartRepair) for c in cmds)  # I21
    # the ledger answers: a repair another run started owns the episode; the waiting
    # alert joins it, and no second repair starts
    s, _ = _run(s, nm.TimerFired(), T0 + timedelta(seconds=5))
    s, cmds = _run(s, nm.LedgerRead(repair_id="other", running=True, stage="repairing",
                                    status="running"), T0 + timedelta(seconds=6))
    assert [c.repair_id for c in cmds if isinstance(c, nm.AttachAlert)] == ["other"]
    assert not any(isinstance(c, nm.StartRepair) for c in cmds)
    assert s.repair is not None and s.repair.repair_id == "other"


def test_an_alert_for_a_repair_that_is_gone_is_not_answered_attached() -> None:
    s, cmds = _run(_known(), nm.AlertDelivered(alert=_xid("1")))
    assert _replies(cmds)["c/gpu-01/1"].outcome == AlertOutcome.recommended
    assert s.repair is not None
    rid = s.repair.repair_id
    s, cmds = _run(s, nm.AlertDelivered(alert=_xid("2")), attach_ok=False)
    assert not _replies(cmds)  # held: the probe decides
    assert [c.repair_id for c in cmds if isinstance(c, nm.ProbeRepair)] == [rid]
    s, cmds = _run(s, nm.RepairProbed(repair_id=rid, running=False, status="terminated"))
    reply = _replies(cmds)["c/gpu-01/2"]
    assert reply.outcome == AlertOutcome.new and "cooldown" in reply.reason
    assert any(isinstance(c, nm.CloseLedger) and c.stage == nm.Stage.cancelled for c in cmds)
    assert s.repair is None


def test_a_clear_queued_behind_its_raise_ends_the_fault_before_a_repair_starts() -> None:
    """Found by the model checker: raise and clear of a level fault both wait for the
    ledger; the raise's persistence window ended meanwhile. Deciding them one by one
    started a repair on the raise before the clear behind it was weighed."""
    s, _ = _run(nm.new_state("c", "gpu-01", "seed"), nm.Begin())
    s, _ = _run(s, nm.AlertDelivered(alert=_lost("r")))
    s, _ = _run(s, nm.AlertDelivered(alert=_lost("c", active=False)))
    s, cmds = _run(s, nm.LedgerRead(), T0 + timedelta(minutes=2))
    assert not any(isinstance(c, nm.StartRepair) for c in cmds)
    assert _replies(cmds)["c/gpu-01/c"].outcome == AlertOutcome.cleared
    assert not s.active


def test_a_reregistered_node_does_not_inherit_the_old_machines_faults() -> None:
    s, cmds = _run(_known(), nm.AlertDelivered(alert=_lost("r")))
    assert _replies(cmds)["c/gpu-01/r"].outcome == AlertOutcome.new and s.active
    assert s.machine_id == "m-a"
    swapped = POLICY.model_copy(update={"machine_id": "m-b"})
    s, cmds = _run(s, swapped, T0 + timedelta(seconds=10))
    assert not s.active and not s.occurrences and s.machine_id == "m-b"
    assert any(isinstance(c, nm.Notify) and "m-a → m-b" in c.subject for c in cmds)
    s, cmds = _run(s, nm.TimerFired(), T0 + timedelta(minutes=5))
    assert not any(isinstance(c, nm.StartRepair) for c in cmds)
    # the new machine's own fault is repaired, filed under the configured machine
    later = T0 + timedelta(minutes=6)
    s, cmds = _run(s, nm.AlertDelivered(alert=_xid("x", later)), later, policy=swapped)
    starts = [c for c in cmds if isinstance(c, nm.StartRepair)]
    assert [c.machine_id for c in starts] == ["m-b"]


def test_a_receipt_stamp_ahead_of_the_clock_gives_no_head_start() -> None:
    s, cmds = _run(_known(), nm.AlertDelivered(alert=_lost("r", at=T0 + timedelta(hours=1))))
    assert _replies(cmds)["c/gpu-01/r"].outcome == AlertOutcome.new
    assert s.active["gpu_lost::"].first_seen == T0  # received no later than now


def test_continue_as_new_waits_while_an_alert_is_being_decided() -> None:
    s, _ = nm.step(_known(), nm.AlertDelivered(alert=_xid("1")), T0)  # record, policy out
    s, cmds = nm.step(s, nm.HistoryFull(), T0)
    assert cmds == [] and s.intake
    s, _ = _run(s, nm.AlertRecorded(alert_id="c/gpu-01/1"))
    s, cmds = nm.step(s, nm.HistoryFull(), T0)
    assert cmds == [] and s.intake  # the policy read is still out
    s, _ = _run(s, POLICY)
    assert not s.intake
    _, cmds = nm.step(s, nm.HistoryFull(), T0)
    assert [type(c) for c in cmds] == [nm.ContinueAsNew]


def test_a_0_3_0_carried_state_converts_and_reads_the_ledger_for_its_repair() -> None:
    a = _lost("r")
    old = NodeCarried(
        seen={"c/gpu-01/r": T0}, repair_id="r1", repair_alert_ids=["c/gpu-01/r"],
        active={"gpu_lost::": {"alert": a, "action": "power_cycle", "rule": "x",
                               "first_seen": T0}},
        cooldown_until=T0, history_limit=40)
    s = machine_state(NodeInput(cluster="c", node="gpu-01",
                                carried=old.model_dump(mode="json")), "seed")
    assert s.reconcile == nm.Reconcile.pending and s.history_limit == 40
    assert s.repair is not None and s.repair.acted_on == ["gpu_lost::"]
    assert nm.seen_digest("c/gpu-01/r") in s.seen
    _, cmds = nm.step(s, nm.Begin(), T0)
    assert [c.repair_id for c in cmds if isinstance(c, nm.ReadLedger)] == ["r1"]
    # the machine's own carried form round-trips
    again = machine_state(NodeInput(cluster="c", node="gpu-01",
                                    carried=nm.carry(s).model_dump(mode="json")), "x")
    assert again == nm.carry(s)


def test_a_repair_due_after_continue_as_new_reads_the_policy_first() -> None:
    """The carried state has no policy (read again by the next run): a fault that comes
    due on the timer waits for the read, so the repair is filed under the machine and
    pool configured now (the old shell read the policy before every start)."""
    s, _ = _run(_known(), nm.AlertDelivered(alert=_lost("r")))
    s = nm.carry(s)
    s, cmds = nm.step(s, nm.Begin(), T0 + timedelta(minutes=2))  # the next run, fault due
    assert [type(c) for c in cmds if not isinstance(c, nm.SetTimer)] == [nm.LoadPolicy]
    pool = POLICY.model_copy(update={"node_pool": "p1"})
    s, cmds = nm.step(s, pool, T0 + timedelta(minutes=2))
    # then the node's open repair, read again right before the start (one per node)
    assert [c for c in cmds if isinstance(c, nm.ReadLedger)] == [nm.ReadLedger()]
    s, cmds = nm.step(s, nm.LedgerRead(), T0 + timedelta(minutes=2))
    starts = [c for c in cmds if isinstance(c, nm.StartRepair)]
    assert [(c.machine_id, c.node_pool) for c in starts] == [("m-a", "p1")]
