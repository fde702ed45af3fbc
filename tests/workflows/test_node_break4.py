"""Node rails a break-test of 8a5413f found open, each a failing reproduction on the pure
node machine (workflows/lifecycle/node.py), stepped as NodeWorkflow steps it: the ledger
write, the policy read, the attach and the child start answered at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.unit.test_node_machine import run
from workflows.config import CatalogueConfig, RailsConfig
from workflows.lifecycle import node as nm
from workflows.models import Alert, AlertOutcome

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CAT = CatalogueConfig()


def policy(machine: str, rails: RailsConfig | None = None) -> nm.PolicyLoaded:
    return nm.PolicyLoaded(catalogue=CAT, rails=rails or RailsConfig(), machine_id=machine)


def known(pol: nm.PolicyLoaded) -> nm.NodeState:
    s, _ = nm.step(nm.new_state("c", "n", "seed"), nm.Begin(), T0)
    s, _ = run(s, nm.LedgerRead(), T0, pol)
    return s


def lost(aid: str, at: datetime, machine: str, *, active: bool = True,
         boot: str = "b0") -> Alert:
    return Alert(alert_id=aid, cluster="c", node="n", kind="gpu_lost",
                 summary="NVML sees 7 of 8 GPUs", level=True, active=active,
                 evidence={"boot_id": boot}, machine_id=machine,
                 observed_at=at, received_at=at)


def starts(cmds: list[nm.Command]) -> list[nm.StartRepair]:
    return [c for c in cmds if isinstance(c, nm.StartRepair)]


def replies(cmds: list[nm.Command]) -> list[nm.Reply]:
    return [c for c in cmds if isinstance(c, nm.Reply)]


def _rebound(rails: RailsConfig | None = None
             ) -> tuple[nm.NodeState, nm.PolicyLoaded, datetime]:
    """Node ``n`` ran on machine m1 (its last report, a clear, read the policy at T0);
    the operator re-binds ``n`` to machine m2 (a replacement) and, two minutes later,
    m2's agent reports a GPU missing. Ingest files the alert under m2 (the configured
    binding); the node's policy read is not 5 minutes old, so the fault is decided now."""
    p1, p2 = policy("m1", rails), policy("m2", rails)
    s = known(p1)
    s, _ = run(s, nm.AlertDelivered(alert=lost("old-clear", T0, "m1", active=False)), T0, p1)
    assert s.machine_id == "m1"
    t = T0 + timedelta(minutes=2)
    s, cmds = run(s, nm.AlertDelivered(alert=lost("m2-lost", t, "m2", boot="m2boot")), t, p2)
    assert [r.outcome for r in replies(cmds)] == [AlertOutcome.new]
    return s, p2, t


def test_a_replacement_machines_fault_survives_the_policy_read_that_sees_the_rebind() -> None:
    """Operator: node n is re-registered to a replacement machine m2, m2's agent reports
    a GPU missing (answered `new`, waiting out a 10-minute persistence), and then nothing
    happens: at the policy read that sees the new binding the node drops "the old
    machine's faults" — m2's own fault among them — and the agent never re-sends a level
    fault, so the missing GPU is never repaired. Rail: a node re-registered to another
    machine drops the old machine's faults and history, not the new machine's (rule
    zero: an actionable fault that outlived its persistence is acted on)."""
    rails = RailsConfig(persistence_by_kind={"gpu_lost": 600.0})
    s, p2, t = _rebound(rails)
    due = t + timedelta(seconds=601)
    s, cmds = run(s, nm.TimerFired(), due, p2)
    assert "gpu_lost::" in s.active, "m2's fault was dropped with m1's history"
    (start,) = starts(cmds)
    assert start.machine_id == "m2"


def test_a_repair_for_a_replacement_machines_fault_is_filed_under_that_machine() -> None:
    """Operator: node n is re-registered to m2; m2 reports a GPU missing; a power cycle
    starts 60 s later — started with m1, the machine that left, in its request and its
    search attributes (the Temporal UI lists it under m1 until the repair's own policy
    read corrects its machine), because the node decided on a policy read from before the
    re-binding. Rail: alerts and repairs are filed under the configured machine,
    whatever was cached; an alert ingest filed under another machine than the node's
    last read is decided after the binding is read again."""
    s, p2, t = _rebound()
    s, cmds = run(s, nm.TimerFired(), t + timedelta(seconds=61), p2)
    (start,) = starts(cmds)
    assert start.machine_id == "m2", f"repair filed under {start.machine_id}"


def test_a_fault_the_operator_made_non_actionable_is_not_repaired_after_the_policy_read(
) -> None:
    """Operator: gpu_lost reports turn out false fleet-wide (a driver bug), so I set the
    catalogue override `kinds.gpu_lost.actionable: false` at 12:03. A node that reported
    gpu_lost at 12:00 (waiting out its 10-minute persistence) is power-cycled at 12:10
    anyway: the node read the new catalogue right before the start, then started the
    repair on the decision it took under the old one. Rule zero: no repair without an
    actionable fault — judged by the policy in force when the repair starts (the node
    reads it again before a start for exactly that)."""
    from workflows.config import CatalogueOverride

    rails = RailsConfig(persistence_by_kind={"gpu_lost": 600.0})
    p1 = policy("m1", rails)
    p2 = nm.PolicyLoaded(catalogue=CatalogueConfig(
        kinds={"gpu_lost": CatalogueOverride(actionable=False)}), rails=rails,
        machine_id="m1")
    s = known(p1)
    s, cmds = run(s, nm.AlertDelivered(alert=lost("lost-1", T0, "m1")), T0, p1)
    assert [r.outcome for r in replies(cmds)] == [AlertOutcome.new]
    s, cmds = run(s, nm.TimerFired(), T0 + timedelta(seconds=601), p2)
    assert any(isinstance(c, nm.LoadPolicy) for c in cmds), "the policy is read first"
    assert not starts(cmds), "repair started on a fault the catalogue no longer acts on"


async def test_a_fresh_node_entity_keeps_the_cooldown_and_retirement_of_the_ended_repair(
        harness: Any) -> None:
    """Operator: gpu-07's Xid 79 was fixed by a power cycle. Its node workflow is then
    terminated (from the Temporal UI, or after a stuck task) and the next alert starts it
    afresh. Ingest re-delivers the Xid 79 (its outbox mark was not written before a
    restart: the same alert id) and the fresh entity power-cycles the healthy node a
    second time at once — it read only the node's *open* repair from the ledger, not the
    one that just ended, so it knew neither the cooldown nor that the fault was retired.
    Rail (I21, I20, cooldown): a fresh node entity decides on what the ledger knows, and
    never starts a second repair for one episode."""
    from tests.workflows.conftest import make_alert
    from tests.workflows.helpers import terminate_between_tasks
    from tests.workflows.test_node import repair_result
    from workflows.models import Stage
    from workflows.protocol import workflow_id_node

    h = harness
    c = h.cluster.cluster
    node = "gpu-07"
    now = await h.env.get_current_time()
    x = make_alert(c, node, "x79", observed_at=now, received_at=now)  # stamped by ingest
    d = await h.deliver(x)
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    assert (await repair_result(h, node, d.repair_id)).stage == Stage.succeeded
    assert h.cluster.power_cycles == 1
    await terminate_between_tasks(h, workflow_id_node(c, node))
    d2 = await h.deliver(x)  # the same alert, re-delivered to a fresh entity
    await h.env.sleep(timedelta(minutes=5))
    assert d2.outcome != AlertOutcome.recommended and h.cluster.power_cycles == 1, (
        f"the fresh entity answered {d2.outcome.value} ({d2.reason}, repair "
        f"{d2.repair_id}); power cycles {h.cluster.power_cycles}")


def test_a_fault_whose_action_the_operator_changed_is_repaired_with_the_new_action() -> None:
    """The same policy change the other way: the override maps gpu_lost to a reboot; the
    repair that starts after the read runs the reboot, not the power cycle decided under
    the old catalogue."""
    from workflows.config import CatalogueOverride
    from workflows.models import Action

    rails = RailsConfig(persistence_by_kind={"gpu_lost": 600.0})
    p1 = policy("m1", rails)
    p2 = nm.PolicyLoaded(catalogue=CatalogueConfig(
        kinds={"gpu_lost": CatalogueOverride(action=Action.reboot)}), rails=rails,
        machine_id="m1")
    s = known(p1)
    s, _ = run(s, nm.AlertDelivered(alert=lost("lost-1", T0, "m1")), T0, p1)
    s, cmds = run(s, nm.TimerFired(), T0 + timedelta(seconds=601), p2)
    (start,) = starts(cmds)
    assert start.action == Action.reboot
