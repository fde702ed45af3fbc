"""Repairs of a node the node entity did not start (a person's through the API or CLI, a
detector's), found by a break-test: their end is applied by the node whenever it comes
(I20, cooldown), and the node starts no repair of its own beside one that runs (one
repair per node: it reads the node's open repair from the ledger again before every
start, and takes over one it finds)."""

from __future__ import annotations

from datetime import timedelta

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import start_repair
from tests.workflows.test_node import node_status, repair_result
from workflows.models import Action, AlertOutcome, Requester, RequesterKind, Stage


async def test_an_operator_power_cycle_that_fixed_the_nodes_fault_retires_it(
        harness: Harness) -> None:
    """A repair the node did not start (an operator's ``repairs create`` naming the
    node's alert as evidence) tells the node it finished; the node applied that only
    while its ledger read was out and ignored it afterwards ("not ours"), so the fault
    the power cycle fixed stayed and the healthy node was repaired again after the
    cooldown (the ladder made the repeat a reprovision)."""
    h = harness
    c = h.cluster.cluster
    node = "gpu-06"
    # the node's own repair of an Xid 79 succeeds: its 30-minute cooldown starts
    d = await h.deliver(make_alert(c, node, "xid79"))
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    assert (await repair_result(h, node, d.repair_id)).stage == Stage.succeeded
    ns = await node_status(h, node)
    assert ns.repair_id is None and ns.cooldown_until is not None
    # during the cooldown another GPU falls off the bus (an event fault: no clear ever
    # comes for it): the node waits for its cooldown
    now = await h.env.get_current_time()
    lost = make_alert(c, node, "xid79-gpu1", gpu="0000:5e:00.0", observed_at=now,
                      received_at=now)
    d2 = await h.deliver(lost)
    assert d2.outcome == AlertOutcome.new and "cooldown" in d2.reason, d2
    # an operator does not wait: `autorepair repairs create --mode power_cycle
    # --evidence-alert <that alert>`; the power cycle brings the GPU back
    op = await start_repair(h, node, Action.power_cycle, "op-1", alerts=[lost],
                            requester=Requester(kind=RequesterKind.user, name="alice"))
    st = await op.result()
    assert st.stage == Stage.succeeded, st
    cycles = h.cluster.power_cycles
    # the restarted agent reports nothing (the GPU is back): past the cooldown the
    # node must not repair the healthy node again for the fault the power cycle fixed
    await h.env.sleep(timedelta(hours=1))
    ns = await node_status(h, node)
    rows = [(r["repair_id"], r["action"], r["stage"])
            for r in await h.ledger.list_repairs(cluster=c)]
    assert ns.recommendations == 1 and not ns.active_alerts, (
        f"repairs {rows}; cordons {h.cluster.count('cordon', node)}; "
        f"after the operator's successful power cycle for {lost.alert_id} the node still "
        f"holds {[a.alert_id for a in ns.active_alerts]} and made "
        f"{ns.recommendations} recommendations (repair {ns.repair_id}); power cycles "
        f"{cycles} → {h.cluster.power_cycles}")


async def test_the_node_starts_no_second_repair_beside_an_operators_running_repair(
        harness: Harness) -> None:
    """One repair per node at a time: an operator's repair of gpu-09 runs (waiting for
    the node to go idle, holding the node's lease). The node entity, which knew gpu-09
    before, gets an Xid 79. It read the ledger's open repair only when it started fresh,
    so it started a power cycle of its own beside the operator's, which waited for the
    node's lease and power-cycled the node the operator had just fixed. It reads the
    ledger again before the start now, takes the operator's repair over (as a fresh
    entity does) and attaches the alert to it; the operator's success ends it."""
    from tests.workflows.helpers import wait_stage

    h = harness
    c = h.cluster.cluster
    node = "gpu-09"
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    # the node entity exists and has read the ledger (a non-actionable alert)
    noise = make_alert(c, node, "n0", code=45, action="none", actionable=False)
    assert (await h.deliver(noise)).outcome == AlertOutcome.ignored
    h.cluster.busy_polls[node] = 5  # a job runs: the operator's repair waits for idle
    op = await start_repair(h, node, Action.power_cycle, "op-9", alerts=[],
                            requester=Requester(kind=RequesterKind.user, name="alice"))
    await wait_stage(h, node, "op-9", Stage.waiting_for_idle)
    now = await h.env.get_current_time()
    x = make_alert(c, node, "x79", observed_at=now, received_at=now)
    d = await h.deliver(x)
    st = await op.result()
    assert st.stage == Stage.succeeded, st
    await h.env.sleep(timedelta(hours=1))
    rows = [(r["repair_id"], r["action"], r["stage"])
            for r in await h.ledger.list_repairs(cluster=c)]
    assert d.outcome == AlertOutcome.attached and d.repair_id == "op-9", d
    ns = await node_status(h, node)
    assert ns.recommendations == 0 and ns.repair_id is None and not ns.active_alerts, ns
    assert h.cluster.power_cycles == 1, (
        f"while the operator's repair op-9 of {node} ran, the node answered the Xid 79 "
        f"{d.outcome.value} ({d.reason}, repair {d.repair_id}); repairs {rows}; power "
        f"cycles {h.cluster.power_cycles}")
