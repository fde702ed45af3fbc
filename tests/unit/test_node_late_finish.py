"""A repair's ``repair_finished`` stepped after the node closed the repair without it
(found by a break-test): the periodic probe, the ledger or the child's end saw the
workflow closed first. The node remembers the repairs it closed so (``NodeState.gone``)
and applies a late finish of one as the repair's end: on success the faults it acted on
are retired (I20), not repaired again after the cooldown. Driven on the machine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.workflows.conftest import make_alert
from workflows.config import CatalogueConfig, RailsConfig
from workflows.lifecycle import node as nm
from workflows.models import Action, Stage


def test_a_finish_stepped_after_the_probe_saw_the_repair_closed_still_retires() -> None:
    """(2), the node's own repair: the periodic probe (a local activity) finds the repair's
    workflow closed (``completed``) before the repair's ``repair_finished`` signal is
    stepped — the signal reached the history while the probe's workflow task was out, so
    it comes in the next activation. ``_gone`` closes the repair without retiring
    anything, and the success that follows is ignored (``not ours``): the fault the power
    cycle fixed is repaired again after the cooldown. Driven on the machine."""
    t0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    policy = nm.PolicyLoaded(catalogue=CatalogueConfig(), rails=RailsConfig(),
                             machine_id="m-a")

    def run(s: nm.NodeState, ev: nm.Event, now: datetime) -> tuple[nm.NodeState, list]:
        todo, out = [ev], []
        while todo:
            known = s.reconcile == nm.Reconcile.done
            s, cmds = nm.step(s, todo.pop(0), now)
            out += cmds
            for cmd in cmds:
                if isinstance(cmd, nm.ReadLedger) and known:
                    todo.append(nm.LedgerRead())  # the read before a start: none open
                elif isinstance(cmd, nm.RecordAlert):
                    todo.append(nm.AlertRecorded(alert_id=cmd.alert.alert_id))
                elif isinstance(cmd, nm.LoadPolicy):
                    todo.append(policy)
        return s, out

    s, _ = run(nm.new_state("c", "gpu-01", "seed"), nm.Begin(), t0)
    s, _ = run(s, nm.LedgerRead(), t0)
    x = make_alert("c", "gpu-01", "x79", observed_at=t0, received_at=t0)
    s, out = run(s, nm.AlertDelivered(alert=x), t0)
    rid = next(c.repair_id for c in out if isinstance(c, nm.StartRepair))
    # 15 min later the periodic probe goes out; the repair succeeds and closes meanwhile
    t1 = t0 + timedelta(minutes=15)
    s, out = run(s, nm.TimerFired(), t1)
    assert any(isinstance(c, nm.ProbeRepair) for c in out)
    s, _ = run(s, nm.RepairProbed(repair_id=rid, running=False, status="completed"), t1)
    s, _ = run(s, nm.RepairFinishedEv(repair_id=rid, stage=Stage.succeeded, at=t1,
                                      alert_ids=[x.alert_id],
                                      actions=[Action.power_cycle]), t1)
    t2 = t0 + timedelta(hours=1)
    s, out = run(s, nm.TimerFired(), t2)
    again = [c for c in out if isinstance(c, nm.StartRepair)]
    assert not again and not s.active, (
        f"the power cycle succeeded, yet the node keeps {list(s.active)} and starts "
        f"{[(c.repair_id, c.action.value) for c in again]} after its cooldown")
