"""I20/I21 in the node machine: a repair another run started (an operator's reset_gpu of
GPU 0) tells the node it succeeded while the node waits for the ledger. A level fault the
repair did not name, which no reboot re-reports, stays active, and nothing rebooted (the
success was taken as booting and retired every fault before the fix)."""
from __future__ import annotations

from datetime import timedelta

from tests.workflows.conftest import make_alert
from tests.workflows.test_node_machine import T0, _run
from workflows.lifecycle import node as nm
from workflows.models import Action, Stage


def test_foreign_reset_gpu_success_keeps_unrelated_level_fault() -> None:
    s, _ = _run(nm.new_state("c", "gpu-01", "seed"), nm.Begin())
    # a level fault on GPU 1 (row-remap pending style: level, per GPU)
    lvl = make_alert("c", "gpu-01", "L", kind="gpu_lost", code=None, gpu=None, level=True,
                     action="reboot", observed_at=T0, received_at=T0)
    s, _ = _run(s, nm.AlertDelivered(alert=lvl))
    s, _ = _run(s, nm.LedgerUnavailable(message="pg down"))
    assert s.reconcile == nm.Reconcile.retry_wait
    # an operator's reset_gpu repair for an Xid on GPU 0 ends meanwhile
    s, _ = _run(s, nm.RepairFinishedEv(repair_id="op-1", stage=Stage.succeeded,
                                       at=T0 + timedelta(seconds=3), alert_ids=["x0"],
                                       actions=[Action.reset_gpu]),
                T0 + timedelta(seconds=3))
    s, _ = _run(s, nm.TimerFired(), T0 + timedelta(seconds=5))
    s, _ = _run(s, nm.LedgerRead(), T0 + timedelta(seconds=6))
    assert s.active, "the level fault no repair acted on was retired by a reset_gpu"
    assert s.booted_at is None
