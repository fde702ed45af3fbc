"""The RMA hold of a removed machine (issue 26 I18) in the real ledger: a succeeded
``remove`` attempt (or the provider's ``removed_machines`` row) holds the machine until an
operator returns it; a later removal holds it again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.ledger import Ledger
from workflows.activity_api import AttemptRecord
from workflows.models import Action


def _attempt(machine: str, action: Action, outcome: str, at: datetime, rid: str) -> AttemptRecord:
    return AttemptRecord(repair_id=rid, cluster="c1", node="gpu-01", machine_id=machine,
                         action=action, alert_kind="xid", code=79, outcome=outcome, at=at)


async def test_removed_machine_is_held_until_returned_and_again_after_a_new_removal(
    ledger_pool: Any,
) -> None:
    led = Ledger(ledger_pool)
    t0 = datetime.now(UTC) - timedelta(hours=2)
    assert await led.machine_hold("c1", "m-1") is None
    assert await led.machine_hold("c1", None) is None
    await led.record_attempt(_attempt("m-1", Action.power_cycle, "succeeded", t0, "r0"))
    await led.record_attempt(_attempt("m-1", Action.remove, "failed", t0, "r1"))
    assert await led.machine_hold("c1", "m-1") is None  # neither holds the machine
    await led.record_attempt(_attempt("m-1", Action.remove, "succeeded", t0, "r2"))
    hold = await led.machine_hold("c1", "m-1")
    assert hold is not None and hold["repair_id"] == "r2" and hold["since"] == t0
    assert await led.machine_hold("c2", "m-1") is None  # another cluster's machine
    with pytest.raises(ValueError, match="by"):
        await led.return_machine("c1", "m-1", "", "fixed")
    lifted = await led.return_machine("c1", "m-1", "alice", "board replaced")
    assert lifted is not None and lifted["repair_id"] == "r2"
    assert await led.machine_hold("c1", "m-1") is None
    assert await led.return_machine("c1", "m-1", "alice", "again") is None  # idempotent
    # removed again later (a new succeeded remove, newer than the return): held again
    later = datetime.now(UTC) + timedelta(minutes=1)
    await led.record_attempt(_attempt("m-1", Action.remove, "succeeded", later, "r3"))
    hold = await led.machine_hold("c1", "m-1")
    assert hold is not None and hold["repair_id"] == "r3"


async def test_provider_removal_row_holds_and_return_clears_it(ledger_pool: Any) -> None:
    led = Ledger(ledger_pool)
    await ledger_pool.execute(
        "INSERT INTO removed_machines (cluster, machine, repair_id, ticket_id, reason)"
        " VALUES ('c1', 'm-2', 'r9', 'HW-1', 'failed validation')")
    hold = await led.machine_hold("c1", "m-2")
    assert hold is not None and hold["reason"] == "failed validation"
    assert await led.return_machine("c1", "m-2", "bob", "RMA done") is not None
    assert await ledger_pool.fetchval(
        "SELECT count(*) FROM removed_machines WHERE machine = 'm-2'") == 0
    assert await led.machine_hold("c1", "m-2") is None


async def test_held_machines_lists_every_hold_of_a_cluster_or_all(ledger_pool: Any) -> None:
    led = Ledger(ledger_pool)
    t0 = datetime.now(UTC) - timedelta(hours=1)
    await led.record_attempt(_attempt("m-h1", Action.remove, "succeeded", t0, "rh1"))
    await led.record_attempt(_attempt("m-h1", Action.remove, "succeeded",
                                      t0 + timedelta(minutes=5), "rh2"))
    await led.record_attempt(_attempt("m-h2", Action.remove, "succeeded", t0, "rh3"))
    await led.record_attempt(_attempt("m-h3", Action.remove, "failed", t0, "rh4"))
    await ledger_pool.execute(
        "INSERT INTO removed_machines (cluster, machine, repair_id, ticket_id, reason)"
        " VALUES ('c9', 'm-h9', 'rh9', 'HW-9', 'failed validation')")
    held = {(h["cluster"], h["machine"]): h for h in await led.held_machines()}
    assert {("c1", "m-h1"), ("c1", "m-h2"), ("c9", "m-h9")} <= set(held)
    assert ("c1", "m-h3") not in held  # a failed remove holds nothing
    assert held[("c1", "m-h1")]["repair_id"] == "rh2"  # the newest removal, once
    assert held[("c9", "m-h9")]["reason"] == "failed validation"
    c9 = await led.held_machines("c9")
    assert [h["machine"] for h in c9] == ["m-h9"]
    # each listed hold is exactly what machine_hold says for that machine
    for (cl, m), h in held.items():
        one = await led.machine_hold(cl, m)
        assert one is not None and one["repair_id"] == h["repair_id"]
    await led.return_machine("c1", "m-h2", "alice", "fixed")
    assert ("c1", "m-h2") not in {(h["cluster"], h["machine"])
                                  for h in await led.held_machines("c1")}


async def test_a_return_lifts_a_removal_recorded_on_a_clock_ahead_of_the_ledgers(
    ledger_pool: Any,
) -> None:
    """The removal's time is the control plane's (the repair's workflow clock), the
    return's the ledger's: a return lifts what it saw whatever the two clocks say (found
    when the time-skipping server's clock was years ahead in a full test run)."""
    led = Ledger(ledger_pool)
    ahead = datetime.now(UTC) + timedelta(days=3650)
    await led.record_attempt(_attempt("m-9", Action.remove, "succeeded", ahead, "r9"))
    assert await led.machine_hold("c1", "m-9") is not None
    assert await led.return_machine("c1", "m-9", "tech", "fixed") is not None
    assert await led.machine_hold("c1", "m-9") is None
    await led.record_attempt(_attempt("m-9", Action.remove, "succeeded",
                                      ahead + timedelta(minutes=5), "r10"))
    hold = await led.machine_hold("c1", "m-9")
    assert hold is not None and hold["repair_id"] == "r10"  # a later removal holds again
