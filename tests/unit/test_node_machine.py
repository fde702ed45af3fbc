"""The pure NodeMachine (workflows/lifecycle/node.py) on issue 26's node reproductions,
step by step: no Temporal, no I/O. :func:`run` answers the machine's own round trips
(the ledger write of an alert, the policy read, the attach signal, the child start) at
once, as a healthy shell does, so each test reads as the reproduction it is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workflows.config import CatalogueConfig, RailsConfig
from workflows.lifecycle import node as nm
from workflows.models import Action, Alert, AlertOutcome, Stage

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
RAILS = RailsConfig()
CAT = CatalogueConfig()


def lost(n: int, at: datetime, *, active: bool = True, skew_s: float = 0.0,
         boot: str = "b0") -> Alert:
    return Alert(alert_id=f"lost-{n}", cluster="c", node="n", kind="gpu_lost",
                 summary="NVML sees 3 of 4 GPUs", level=True, active=active,
                 evidence={"boot_id": boot},
                 observed_at=at + timedelta(seconds=skew_s), received_at=at)


POLICY = nm.PolicyLoaded(catalogue=CAT, rails=RAILS)


def run(s: nm.NodeState, ev: nm.Event, now: datetime,
        policy: nm.PolicyLoaded = POLICY) -> tuple[nm.NodeState, list[nm.Command]]:
    """Step ``ev``, answering the ledger write, policy read (with ``policy``), attach and
    child start."""
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
                todo.append(nm.AttachDone(alert_id=c.alert.alert_id, ok=True))
            elif isinstance(c, nm.StartRepair):
                todo.append(nm.RepairStarted(repair_id=c.repair_id))
    return s, out


def raised(a: Alert) -> nm.AlertDelivered:
    return nm.AlertDelivered(alert=a)


def known(now: datetime = T0) -> nm.NodeState:
    s, cmds = nm.step(nm.new_state("c", "n", "seed"), nm.Begin(), now)
    assert [c.kind for c in cmds] == ["read_ledger"]
    s, _ = run(s, nm.LedgerRead(), now)
    assert s.reconcile == nm.Reconcile.done
    return s


def replies(cmds: list[nm.Command]) -> list[nm.Reply]:
    return [c for c in cmds if isinstance(c, nm.Reply)]


def starts(cmds: list[nm.Command]) -> list[nm.StartRepair]:
    return [c for c in cmds if isinstance(c, nm.StartRepair)]


def test_success_retires_the_level_fault_it_fixed() -> None:
    """Reproduction 1 (I20): no repair after the cooldown on a healthy node whose
    restarted agent sent no clear; a late raise from before the repair's end is stale."""
    s = known()
    s, _ = run(s, raised(lost(1, T0)), T0)
    s, cmds = run(s, nm.TimerFired(), T0 + timedelta(seconds=61))
    (start,) = starts(cmds)
    assert start.action == Action.power_cycle
    end = T0 + timedelta(minutes=10)
    s, _ = run(s, nm.RepairFinishedEv(repair_id=start.repair_id, stage=Stage.succeeded,
                                          at=end), end)
    assert not s.active and s.repair is None
    s, cmds = run(s, raised(lost(2, end - timedelta(seconds=1))), end)
    assert [r.outcome for r in replies(cmds)] == [AlertOutcome.ignored]
    later = end + timedelta(hours=3)
    s, cmds = run(s, nm.TimerFired(), later)
    assert not starts(cmds) and s.repairs_started == 1
    # a fresh report after the new boot is acted on again
    s, _ = run(s, raised(lost(3, later, boot="b1")), later)
    s, cmds = run(s, nm.TimerFired(), later + timedelta(seconds=61))
    assert len(starts(cmds)) == 1


def test_a_failed_repair_keeps_the_level_fault() -> None:
    s = known()
    s, _ = run(s, raised(lost(1, T0)), T0)
    s, cmds = run(s, nm.TimerFired(), T0 + timedelta(seconds=61))
    rid = starts(cmds)[0].repair_id
    end = T0 + timedelta(minutes=10)
    s, _ = run(s, nm.RepairFinishedEv(repair_id=rid, stage=Stage.failed, at=end), end)
    assert "gpu_lost::" in s.active and s.cooldown_until == end + timedelta(seconds=1800)


def test_no_decision_until_the_ledger_answers() -> None:
    """Reproduction 8 (I21): a fresh entity whose ledger read fails retries with back-off
    and starts no repair meanwhile; the ledger then names a running repair: attached."""
    s, _ = run(nm.new_state("c", "n", "seed"), nm.Begin(), T0)
    s, cmds = run(s, nm.LedgerUnavailable(message="pg down"), T0)
    assert s.reconcile == nm.Reconcile.retry_wait
    assert nm.SetTimer(at=T0 + timedelta(seconds=5)) in cmds
    s, cmds = run(s, raised(lost(1, T0)), T0)
    assert not starts(cmds) and replies(cmds)
    t = T0 + timedelta(minutes=5)
    s, cmds = run(s, nm.TimerFired(), t)
    assert [c.kind for c in cmds if c.kind == "read_ledger"] == ["read_ledger"]
    s, cmds = run(s, nm.LedgerUnavailable(), t)
    assert nm.SetTimer(at=t + timedelta(seconds=10)) in cmds and not starts(cmds)
    s, _ = run(s, nm.TimerFired(), t + timedelta(seconds=10))
    s, cmds = run(s, nm.LedgerRead(repair_id="r0", running=True, stage="draining",
                                       status="running"), t + timedelta(seconds=10))
    assert not starts(cmds) and s.repair is not None and s.repair.repair_id == "r0"
    s, cmds = run(s, raised(lost(2, t + timedelta(seconds=20))), t + timedelta(seconds=20))
    assert "attach_alert" in [c.kind for c in cmds]
    assert [r.outcome for r in replies(cmds)] == [AlertOutcome.attached]


def test_receipt_time_judges_persistence_not_the_sender_clock() -> None:
    """I17: a sender clock 5 min slow does not make a new level fault due at once."""
    s = known()
    s, cmds = run(s, raised(lost(1, T0, skew_s=-300)), T0)
    (reply,) = replies(cmds)
    assert not starts(cmds) and "waiting for persistence" in reply.reason
    _, cmds = run(s, nm.TimerFired(), T0 + timedelta(seconds=61))
    assert len(starts(cmds)) == 1


def test_repair_that_ended_without_telling_is_closed_out() -> None:
    s = known()
    s, _ = run(s, raised(lost(1, T0)), T0)
    s, cmds = run(s, nm.TimerFired(), T0 + timedelta(seconds=61))
    rid = starts(cmds)[0].repair_id
    t = T0 + timedelta(minutes=20)
    s, cmds = run(s, nm.RepairEnded(repair_id=rid, how="terminated"), t)
    kinds = [c.kind for c in cmds]
    assert {"close_ledger", "release_lease", "notify"} <= set(kinds)
    assert s.repair is None and s.cooldown_until == t + timedelta(seconds=1800)


def test_continue_as_new_carries_everything_and_reads_the_ledger_again() -> None:
    s = known()
    s, _ = run(s, raised(lost(1, T0)), T0)
    s, cmds = run(s, nm.TimerFired(), T0 + timedelta(seconds=61))
    _, cmds = run(s, nm.HistoryFull(), T0 + timedelta(seconds=62))
    (cont,) = [c for c in cmds if isinstance(c, nm.ContinueAsNew)]
    nxt = cont.state
    assert nxt.repair == s.repair and nxt.active == s.active
    assert nxt.reconcile == nm.Reconcile.pending
    _, cmds = run(nxt, nm.Begin(), T0 + timedelta(seconds=63))
    assert cmds[0].kind == "read_ledger"


def test_new_state_names_an_empty_field() -> None:
    with pytest.raises(ValueError, match="node: must not be empty"):
        nm.new_state("c", "", "seed")
