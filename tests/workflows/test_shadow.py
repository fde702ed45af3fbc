"""Shadow mode on the real workflows (issue 29 item 3; time-skipping server, real ledger):
a shadow-mode repair decides everything an enforcing one does — ladder, consent, the
guard's lease (budget and breaker count it) — then ends ``shadowed`` saying what it would
have done, with no cordon, drain or machine call (FakeCluster counts them). A pool in
shadow inside an enforcing cluster; approval asked and recorded in shadow; the breaker
counts shadowed repairs; the rails of shadow count shadowed attempts as the action."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import eventually, guard_status, start_repair, wait_stage
from tests.workflows.test_repair_rails import ledger_row, record
from workflows.models import Action, ApproveSignal, Stage
from workflows.protocol import GUARD_SIGNAL_ACQUIRE, GUARD_SIGNAL_RELEASE, workflow_id_guard

#: FakeCluster call names that change the node or the machine (cordon, drain, actions).
DISRUPTIVE_CALLS = {"cordon", "drain", "rejoin", "reset_gpu", "reboot", "power_cycle",
                    "reprovision", "migrate", "remove"}


def touched(h: Harness, node: str | None = None) -> list[tuple[str, str]]:
    """The disruptive calls the fake cluster saw (of ``node`` only when given)."""
    return [(n, nd) for n, nd in h.cluster.calls
            if n in DISRUPTIVE_CALLS and (node is None or nd == node)]


async def guard_signals(h: Harness, handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The signals the repair sent to its cluster guard, in order (its history)."""
    out: list[str] = []
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
            a = ev.signal_external_workflow_execution_initiated_event_attributes
            if a.workflow_execution.workflow_id == workflow_id_guard(h.cluster.cluster):
                out.append(a.signal_name)
    return out


async def _released(h: Harness) -> None:
    async def no_lease() -> bool:
        g = await guard_status(h)
        return not g.leases and not g.pending

    await eventually(no_lease, "every lease released")


async def test_shadow_repair_of_each_action_family_ends_shadowed_touching_nothing(
    harness: Harness,
) -> None:
    h = harness
    h.policy.mode = "shadow"
    h.policy.rails.concurrency_fraction = 1.0
    h.policy.rails.breaker_min = 10
    # the time-skipping server jumps between repairs: a window no jump leaves
    h.policy.rails.breaker_window_s = 30 * 86400.0
    h.policy.rails.one_per_pool = False
    wanted = {"gpu-01": Action.reset_gpu, "gpu-02": Action.reboot,
              "gpu-03": Action.power_cycle, "gpu-04": Action.reprovision,
              "gpu-05": Action.migrate}
    # a migrate needs critical evidence firing now (the migrate gate): a raised level fault
    alerts = {"gpu-05": [make_alert(h.cluster.cluster, "gpu-05", "lvl", kind="gpu_lost",
                                    code=None, level=True, action="migrate")]}
    words = {Action.reset_gpu: "reset GPU 0000:3b:00 of m-{n} in place",
             Action.reboot: "reboot m-{n}",
             Action.power_cycle: "power-cycle m-{n} through its BMC",
             Action.reprovision: "reprovision m-{n}",
             Action.migrate: "migrate node {n} off machine m-{n} onto a hot spare"}
    handles = {n: await start_repair(h, n, a, f"sh-{n}", **(
        {"alerts": alerts[n]} if n in alerts else {})) for n, a in wanted.items()}
    for node, handle in handles.items():
        st = await handle.result()
        assert st.stage == Stage.shadowed and st.action == wanted[node], st
        assert st.mode == "shadow"
        end = st.history[-1]
        assert end.stage == Stage.shadowed and end.reason.startswith("shadow mode: would "), end
        assert words[st.action].format(n=node) in end.reason, end
        assert "nothing was done" in end.reason, end
        # every decision ran and was recorded
        stages = [t.stage for t in st.history]
        assert stages[0] == Stage.recommended and Stage.cordoning not in stages, stages
        row = await ledger_row(h, f"sh-{node}")
        assert row["stage"] == "shadowed"
        assert row["transitions"][-1]["reason"] == end.reason
        # the lease was taken (acquired, granted: the repair went on) and released
        sent = await guard_signals(h, handle)
        assert sent[0] == GUARD_SIGNAL_ACQUIRE and sent[-1] == GUARD_SIGNAL_RELEASE, sent
        assert row["approved_by"] == "auto-approved"
    assert touched(h) == [], h.cluster.calls
    assert h.cluster.power_cycles == 0
    await _released(h)
    # the attempts the repairs stood for, recorded as shadowed
    for node in wanted:
        rows = await h.ledger.db.fetch(
            "SELECT action, outcome FROM repair_attempts WHERE repair_id = $1", f"sh-{node}")
        assert [r["outcome"] for r in rows] == ["shadowed"], (node, rows)


async def test_a_pool_in_shadow_inside_an_enforcing_cluster(harness: Harness) -> None:
    h = harness
    h.pools = {"gpu-06": "canary", "gpu-07": "prod"}
    h.pool_modes = {"canary": "shadow"}
    h.policy.rails.one_per_pool = False
    shadow = await (await start_repair(h, "gpu-06", Action.power_cycle, "pool-sh")).result()
    real = await (await start_repair(h, "gpu-07", Action.power_cycle, "pool-en")).result()
    assert shadow.stage == Stage.shadowed and shadow.mode == "shadow", shadow
    assert real.stage == Stage.succeeded and real.mode == "enforce", real
    assert touched(h, "gpu-06") == []
    assert ("cordon", "gpu-07") in touched(h, "gpu-07") and h.cluster.power_cycles == 1


async def test_approval_is_asked_and_recorded_in_shadow(harness: Harness) -> None:
    h = harness
    h.policy.mode = "shadow"
    h.policy.consent.mode = "approve"
    handle = await start_repair(h, "gpu-08", Action.reboot, "sh-approve")
    st = await wait_stage(h, "gpu-08", "sh-approve", Stage.awaiting_approval)
    assert "shadow mode" in st.history[-1].reason, st.history[-1]
    await handle.signal("approve", ApproveSignal(by="alice"))
    st = await handle.result()
    assert st.stage == Stage.shadowed and st.approved_by == "alice", st
    assert st.decided_by_rule and "approved by alice" in st.decided_by_rule
    assert touched(h) == []
    row = await ledger_row(h, "sh-approve")
    assert row["approved_by"] == "alice" and row["stage"] == "shadowed"
    await _released(h)


async def test_remove_in_shadow_needs_a_person_and_removes_nothing(harness: Harness) -> None:
    h = harness
    h.policy.mode = "shadow"
    handle = await start_repair(h, "gpu-09", Action.remove, "sh-remove")
    await wait_stage(h, "gpu-09", "sh-remove", Stage.awaiting_approval)
    await handle.signal("approve", ApproveSignal(by="bob"))
    st = await handle.result()
    assert st.stage == Stage.shadowed and "remove m-gpu-09 for RMA" in st.history[-1].reason
    assert touched(h) == []
    # the machine is not held for RMA: nothing was removed
    assert await h.ledger.machine_hold(h.cluster.cluster, "m-gpu-09") is None


async def test_the_breaker_counts_shadowed_repairs(harness: Harness) -> None:
    """Shadowed repairs ask for the lease as automatic repairs do: three at once, one
    granted at a time (budget 1), and the third automatic request in the window trips the
    breaker as it would in enforce; the repairs it holds back wait, touching nothing."""
    h = harness
    h.policy.mode = "shadow"
    h.policy.rails.breaker_min = 2
    h.policy.rails.breaker_fraction = 0.01
    # the time-skipping server jumps between repairs: a window no jump leaves
    h.policy.rails.breaker_window_s = 30 * 86400.0
    await asyncio.gather(*(start_repair(h, f"gpu-1{i}", Action.reboot, f"br-{i}")
                           for i in (1, 2, 3)))

    async def tripped() -> bool:
        return (await guard_status(h)).breaker_open

    await eventually(tripped, "the breaker to trip on the third shadowed repair")
    rows = [await ledger_row(h, f"br-{i}") for i in (1, 2, 3)]
    assert sum(r["stage"] == "shadowed" for r in rows) < 3, rows
    assert touched(h) == []


async def test_shadow_rails_count_shadowed_attempts_and_enforce_does_not(
    harness: Harness,
) -> None:
    """Two shadowed reboots of the same fault: a shadow repair climbs the ladder to
    reprovision (as enforce would have after two reboots); an enforcing one does not
    count them (nothing touched the machine) and reboots."""
    h = harness
    h.pools = {"gpu-14": "canary", "gpu-15": "prod"}
    h.pool_modes = {"canary": "shadow"}
    h.policy.rails.one_per_pool = False
    kw: dict[str, Any] = {"outcome": "shadowed"}
    await record(h, "gpu-14", "m-gpu-14", Action.reboot, 2, **kw)
    await record(h, "gpu-15", "m-gpu-15", Action.reboot, 2, **kw)
    sh = await (await start_repair(h, "gpu-14", Action.reboot, "lad-sh")).result()
    en = await (await start_repair(h, "gpu-15", Action.reboot, "lad-en")).result()
    assert sh.stage == Stage.shadowed and sh.action == Action.reprovision, sh
    assert sh.decided_by_rule and "ladder" in sh.decided_by_rule
    assert en.stage == Stage.succeeded and en.action == Action.reboot, en
    assert h.cluster.count("reboot", "gpu-15") == 1 and touched(h, "gpu-14") == []


async def test_a_node_in_shadow_makes_one_shadowed_repair_per_fault_and_cools_down(
    harness: Harness,
) -> None:
    """The real path from an alert: the node entity recommends, the repair ends shadowed,
    the node holds its cooldown as after an action and retires the fault the repair stood
    for (one fault episode, one shadowed repair), touching nothing."""
    from tests.workflows.helpers import repair_handle
    from workflows.protocol import NODE_QUERY_STATUS, NodeStatus, workflow_id_node

    h = harness
    h.policy.mode = "shadow"
    c = h.cluster.cluster
    # a level fault: it stays raised, so only retiring it keeps a second shadowed repair
    # from starting when the cooldown ends
    h.policy.rails.persistence_s = 0.0
    got = await h.deliver(make_alert(c, "gpu-16", 1, level=True))
    assert got.repair_id, got
    st = await repair_handle(h, "gpu-16", got.repair_id).result()
    assert st.stage == Stage.shadowed, st
    node = h.client.get_workflow_handle(workflow_id_node(c, "gpu-16"))

    async def ended() -> bool:
        ns = await node.query(NODE_QUERY_STATUS, result_type=NodeStatus)
        return ns.repair_id is None and ns.cooldown_until is not None

    await eventually(ended, "the node to take the shadowed end and cool down")
    ns = await node.query(NODE_QUERY_STATUS, result_type=NodeStatus)
    assert ns.active_alerts == [], ns
    await h.env.sleep(2 * h.policy.rails.cooldown_s)  # past the cooldown: nothing new
    ns = await node.query(NODE_QUERY_STATUS, result_type=NodeStatus)
    assert ns.recommendations == 1 and ns.repair_id is None, ns
    assert len(await h.ledger.list_repairs(cluster=c, node="gpu-16")) == 1
    assert touched(h) == []


async def test_a_shadow_repair_waits_out_a_maintenance_window_like_an_enforcing_one(
    harness: Harness,
) -> None:
    """The maintenance gate runs in shadow too: held before the would-be cordon while the
    window covers the node, shadowed once it ends."""
    from activities.maintenance_store import MaintenanceStore
    from workflows.repair import MAINTENANCE_RECHECK_S

    h = harness
    h.policy.mode = "shadow"
    store = MaintenanceStore(h.ledger.pool)
    w = await store.start(cluster=h.cluster.cluster, scope="nodes", nodes=["gpu-17"],
                          duration_s=7200, reason="rack 17 firmware", created_by="ops",
                          now=await h.env.get_current_time())
    handle = await start_repair(h, "gpu-17", Action.power_cycle, "sh-mw")
    await h.env.sleep(120)
    row = await ledger_row(h, "sh-mw")
    assert row["stage"] != "shadowed", row
    notes = " ".join(t["reason"] for t in row["transitions"])
    assert w.window_id in notes and "paused before cordoning" in notes, notes
    await store.end(w.window_id, "ops", now=await h.env.get_current_time())
    await h.env.sleep(MAINTENANCE_RECHECK_S + 60)
    st = await handle.result()
    assert st.stage == Stage.shadowed and "power-cycle m-gpu-17" in st.history[-1].reason
    assert touched(h) == []


async def test_an_operators_own_repair_in_a_shadow_pool_is_shadowed_too(
    harness: Harness,
) -> None:
    from workflows.models import Requester, RequesterKind

    h = harness
    h.pools = {"gpu-18": "canary"}
    h.pool_modes = {"canary": "shadow"}
    st = await (await start_repair(
        h, "gpu-18", Action.reboot, "sh-op",
        requester=Requester(kind=RequesterKind.user, name="carol"))).result()
    assert st.stage == Stage.shadowed and st.approved_by == "carol", st
    assert touched(h) == []
