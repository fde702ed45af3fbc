"""NodeWorkflow on unhappy paths (docs/design.md §5 rails): a repair that ends without telling
the node, a node workflow that starts fresh while a repair runs, the policy carried
across continue-as-new, the carried state's size at its caps, and no cooldown after a
repair that did nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.common import WorkflowIDConflictPolicy

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import eventually, guard_status, terminate_between_tasks
from workflows.lifecycle import node as nm
from workflows.models import (
    Alert,
    AlertDelivery,
    AlertOutcome,
    ApproveSignal,
    NodeInput,
    RepairStatus,
    Stage,
)
from workflows.node import (
    DEDUP_BUCKET_S,
    DEDUP_MAX,
    MAX_ACTIVE_FAULTS,
    MAX_CARRIED_TEXT,
    MAX_CLEARED,
    MAX_DIAGNOSED,
    MAX_DIAGNOSTICS,
    MAX_OCCURRENCE_KEYS,
    MAX_OCCURRENCES,
    ActiveFault,
    NodeCarried,
    _dump_seen,
    machine_state,
    seen_digest,
)
from workflows.protocol import (
    NODE_SIGNAL_REPAIR_FINISHED,
    NODE_UPDATE_DELIVER_ALERT,
    NodeStatus,
    RepairFinished,
    workflow_id_node,
    workflow_id_repair,
)

#: Temporal's default payload size limit (2 MiB); the carried state must stay well under.
PAYLOAD_LIMIT = 2 * 1024 * 1024


async def node_status(h: Harness, node: str) -> NodeStatus:
    handle = h.client.get_workflow_handle(workflow_id_node(h.cluster.cluster, node))
    return await handle.query("status", result_type=NodeStatus)


async def _until_continued(h: Harness, node: str) -> None:
    """Deliver non-actionable alerts until the node workflow has continued as new, and
    no more (the next delivery would make the new run read the policy)."""
    handle = h.client.get_workflow_handle(workflow_id_node(h.cluster.cluster, node))
    for i in range(40):
        desc = await handle.describe()
        if desc.run_id != desc.raw_description.workflow_execution_info.first_run_id:
            return
        noise = make_alert(
            h.cluster.cluster, node, f"n{i}", code=45, action="none", actionable=False
        )
        await h.deliver(noise)
    raise AssertionError(f"{node}: no continue-as-new")


def _xfs(h: Harness, node: str, n: str, **kw: Any) -> Alert:
    return make_alert(
        h.cluster.cluster, node, n, kind="xfs_shutdown", code=None, level=True,
        action="reboot", **kw,
    )


async def test_terminated_repair_is_noticed_and_closed(harness: Harness) -> None:
    """The repair is terminated from the Temporal UI mid-wait: the node stops attaching
    alerts to it, the ledger row ends with the cause, the lease is given back."""
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 300
    h.cluster.busy_polls["gpu-01"] = 10_000
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-01", 1))
    rid = d.repair_id
    assert rid

    async def holding() -> bool:
        return [x.repair_id for x in (await guard_status(h)).leases] == [rid]

    await eventually(holding, "repair holds its lease")
    await terminate_between_tasks(h, workflow_id_repair(h.cluster.cluster, "gpu-01", rid))
    await h.env.sleep(timedelta(minutes=16))  # one liveness probe (REPAIR_PROBE_S)

    async def noticed() -> bool:
        return (await node_status(h, "gpu-01")).repair_id is None

    await eventually(noticed, "node notices the terminated repair")
    row = await h.ledger.get_repair(rid)
    assert row is not None and row["stage"] == Stage.cancelled.value
    assert "terminated" in row["transitions"][-1]["reason"]
    assert not (await guard_status(h)).leases
    d2 = await h.deliver(make_alert(h.cluster.cluster, "gpu-01", 2))
    assert d2.outcome != AlertOutcome.attached and d2.repair_id != rid
    assert "cooldown" in d2.reason  # it may have acted: the cooldown applies


async def test_repair_gone_after_continue_as_new_is_found_on_the_next_alert(
    harness: Harness,
) -> None:
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 300
    h.cluster.busy_polls["gpu-02"] = 10_000
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-02", 1), history_limit=40)
    rid = d.repair_id
    assert rid
    await _until_continued(h, "gpu-02")
    await terminate_between_tasks(h, workflow_id_repair(h.cluster.cluster, "gpu-02", rid))
    d2 = await h.deliver(make_alert(h.cluster.cluster, "gpu-02", 2))
    assert d2.outcome != AlertOutcome.attached, d2
    assert (await node_status(h, "gpu-02")).repair_id is None


async def test_fresh_node_workflow_takes_the_running_repair_from_the_ledger(
    harness: Harness,
) -> None:
    """The node workflow is terminated (and started fresh by the next alert) while its
    repair runs: the next alert attaches to that repair instead of starting a second."""
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 300
    h.cluster.busy_polls["gpu-03"] = 10_000
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-03", 1))
    rid = d.repair_id
    assert rid

    async def recorded() -> bool:
        return (await h.ledger.get_repair(rid)) is not None

    await eventually(recorded, "repair row in the ledger")
    await terminate_between_tasks(h, workflow_id_node(h.cluster.cluster, "gpu-03"))
    d2 = await h.deliver(make_alert(h.cluster.cluster, "gpu-03", 2))
    assert d2.outcome == AlertOutcome.attached and d2.repair_id == rid
    assert len(await h.ledger.list_repairs(cluster=h.cluster.cluster, node="gpu-03")) == 1


async def test_repair_that_said_it_finished_before_the_reconcile_is_not_adopted(
    harness: Harness,
) -> None:
    """A fresh node workflow receives its repair's ``repair_finished`` before it has read
    the ledger, whose row still says the repair runs (the repair signals before its
    workflow closes). The repair is not taken as in flight: the cooldown starts from the
    repair's end, and the next alert is not attached to a finished repair."""
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 300
    h.cluster.busy_polls["gpu-05"] = 10_000
    c = h.cluster.cluster
    d = await h.deliver(make_alert(c, "gpu-05", 1))
    rid = d.repair_id
    assert rid

    async def recorded() -> bool:
        return (await h.ledger.get_repair(rid)) is not None

    await eventually(recorded, "repair row in the ledger")
    await terminate_between_tasks(h, workflow_id_node(c, "gpu-05"))
    ended = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
    # the repair (still running here, as the stale ledger row says) tells the new run
    # it finished, in the run's first task
    await h.client.start_workflow(
        "NodeWorkflow",
        NodeInput(cluster=c, node="gpu-05"),
        id=workflow_id_node(c, "gpu-05"),
        task_queue=h.task_queue,
        start_signal=NODE_SIGNAL_REPAIR_FINISHED,
        start_signal_args=[RepairFinished(repair_id=rid, stage=Stage.succeeded, at=ended)],
    )

    async def cooling() -> bool:
        return (await node_status(h, "gpu-05")).cooldown_until is not None

    await eventually(cooling, "cooldown from the repair's end")
    st = await node_status(h, "gpu-05")
    assert st.repair_id is None
    assert st.cooldown_until is not None and st.cooldown_until > ended
    d2 = await h.deliver(make_alert(c, "gpu-05", 2))
    assert d2.outcome != AlertOutcome.attached, d2


async def test_configured_cooldown_survives_continue_as_new(harness: Harness) -> None:
    h = harness
    h.policy.rails.cooldown_s = 600  # not the 1800 s default
    h.policy.consent.mode = "approve"  # the repair waits for us while the node continues
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-04", 1), history_limit=40)
    rid = d.repair_id
    assert rid
    await _until_continued(h, "gpu-04")  # the new run has read no policy yet
    repair = h.client.get_workflow_handle(workflow_id_repair(h.cluster.cluster, "gpu-04", rid))

    async def awaiting() -> bool:
        st = await repair.query("status", result_type=RepairStatus)
        return st.stage == Stage.awaiting_approval

    await eventually(awaiting, "repair awaiting approval")
    await repair.signal("approve", ApproveSignal(by="alice"))
    await repair.result()
    row = await h.ledger.get_repair(rid)
    assert row is not None and row["stage"] == "succeeded"
    ended = row["transitions"][-1]["at"]

    async def cooled() -> bool:
        return (await node_status(h, "gpu-04")).cooldown_until is not None

    await eventually(cooled, "cooldown started")
    st = await node_status(h, "gpu-04")
    assert st.cooldown_until is not None
    assert abs((st.cooldown_until - ended).total_seconds() - 600) < 5  # not 1800


async def test_auto_resolved_repair_does_not_start_the_cooldown(harness: Harness) -> None:
    h = harness
    h.policy.consent.mode = "approve"
    h.policy.rails.persistence_by_kind = {"xfs_shutdown": 0}
    raise1 = _xfs(h, "gpu-05", "r1")
    d = await h.deliver(raise1)
    assert d.outcome == AlertOutcome.recommended and d.repair_id
    t = raise1.observed_at
    await h.deliver(raise1.model_copy(update={"alert_id": "c1", "active": False,
                                              "observed_at": t + timedelta(minutes=1)}))

    async def resolved() -> bool:
        return (await node_status(h, "gpu-05")).repair_id is None

    await eventually(resolved, "repair auto-resolved")
    row = await h.ledger.get_repair(d.repair_id)
    assert row is not None and row["stage"] == "auto_resolved"
    assert (await node_status(h, "gpu-05")).cooldown_until is None
    d2 = await h.deliver(_xfs(h, "gpu-05", "r2", observed_at=t + timedelta(minutes=2)))
    assert d2.outcome == AlertOutcome.recommended and d2.repair_id != d.repair_id


def _carried_at_caps() -> NodeCarried:
    """A NodeCarried with every collection at its cap and long values."""
    now = datetime(2025, 1, 8, tzinfo=UTC)
    seen: dict[str, int] = {}
    for i in range(DEDUP_MAX):  # 64-hex-digit alert ids (ingest's sha256 ids), 8 days
        t = now - timedelta(seconds=(DEDUP_MAX - i) * 30)
        seen[seen_digest(f"{i:064x}")] = int(t.timestamp()) // DEDUP_BUCKET_S * DEDUP_BUCKET_S
    text = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus. " * 200
    alert = make_alert("c" * 40, "n" * 60, 1, evidence_text=text[:MAX_CARRIED_TEXT],
                       description=text[:MAX_CARRIED_TEXT], alert_id="a" * 64)
    return NodeCarried(
        seen_log=_dump_seen(seen),
        active={
            f"xid:{i}:0000:{i:02x}:00.0": ActiveFault(
                alert=alert, action="power_cycle", rule="catalogue", first_seen=now
            )
            for i in range(MAX_ACTIVE_FAULTS)
        },
        occurrences={
            f"xid:{k}:0000:{k:02x}:00.0": [now - timedelta(seconds=j) for j in range(MAX_OCCURRENCES)]
            for k in range(MAX_OCCURRENCE_KEYS)
        },
        repair_id="f" * 16,
        repair_alert_ids=["a" * 64] * MAX_ACTIVE_FAULTS,
        diagnostics=["d" * 64] * MAX_DIAGNOSTICS,
        diagnosed={f"repeat:{i:064x}": now for i in range(MAX_DIAGNOSED)},
        cleared={f"k8s_condition_{'x' * 40}::0000:{i:02x}:00.0": now
                 for i in range(MAX_CLEARED)},
    )


def _state_at_caps() -> nm.NodeState:
    """The machine's carried state with every collection at its cap and long values."""
    old = _carried_at_caps()
    s = machine_state(NodeInput(cluster="c" * 40, node="n" * 60,
                                carried=old.model_dump(mode="json")), "s" * 32)
    now = datetime(2025, 1, 8, tzinfo=UTC)
    alert = next(iter(s.active.values())).alert
    return s.model_copy(update={
        "retired": {f"xid:{i}:0000:{i:02x}:00.0": (now, "b" * 36) for i in range(MAX_CLEARED)},
        "repair": nm.OpenRepair(repair_id="f" * 16, action="power_cycle",
                                acted_on=list(s.active)[:MAX_ACTIVE_FAULTS],
                                alert_ids=["a" * 64] * MAX_ACTIVE_FAULTS,
                                boots={k: "b" * 36 for k in s.active}),
        "finished_early": {f"{i:016x}": nm.Finished(repair_id=f"{i:016x}",
                                                    stage="succeeded", at=now,
                                                    alert_ids=[alert.alert_id] * 8)
                           for i in range(nm.MAX_FINISHED_EARLY)}})


def test_carried_state_at_its_caps_is_well_under_the_payload_limit() -> None:
    carried = nm.carry(_state_at_caps())
    assert len(carried.seen) == DEDUP_MAX and len(carried.active) == MAX_ACTIVE_FAULTS
    size = len(json.dumps(carried.model_dump(mode="json")))
    assert size < PAYLOAD_LIMIT // 2, f"{size} bytes carried at the caps"
    # the carried form reads back as the same state (continue-as-new, an upgrade)
    assert nm.NodeState.model_validate(carried.model_dump(mode="json")) == carried


async def test_node_continues_as_new_at_the_dedup_maximum(harness: Harness) -> None:
    """A node carrying DEDUP_MAX keys (and every other cap) starts, takes an alert,
    continues as new with all of it, and still de-duplicates the oldest kept key."""
    h = harness
    c = h.cluster.cluster
    carried = _carried_at_caps()
    carried.repair_id = None
    carried.repair_alert_ids = []
    carried.active = {}
    carried.history_limit = 5
    # the newest key is recent relative to the server's clock: shift the whole log
    now = int((await h.env.get_current_time()).timestamp())
    shift = now - carried.seen_log[-1][0]
    carried.seen_log = [(b + shift, d) for b, d in carried.seen_log]
    handle = await h.client.start_workflow(
        "NodeWorkflow",
        NodeInput(cluster=c, node="gpu-06", carried=carried.model_dump(mode="json")),
        id=workflow_id_node(c, "gpu-06"),
        task_queue=h.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    noise = make_alert(c, "gpu-06", "x", code=45, action="none", actionable=False)
    await handle.execute_update(NODE_UPDATE_DELIVER_ALERT, noise, result_type=AlertDelivery)

    async def continued() -> bool:
        desc = await handle.describe()
        return desc.run_id != desc.raw_description.workflow_execution_info.first_run_id

    await eventually(continued, "continue-as-new at the caps")
    st = await node_status(h, "gpu-06")
    assert st.seen_alert_ids == DEDUP_MAX  # the oldest was dropped for the new one
    again = make_alert(c, "gpu-06", "again", alert_id=f"{DEDUP_MAX - 1:064x}", code=45,
                       action="none", actionable=False)
    d = await handle.execute_update(NODE_UPDATE_DELIVER_ALERT, again, result_type=AlertDelivery)
    assert d.outcome == AlertOutcome.deduplicated


async def test_fresh_node_workflow_waits_for_the_ledger_before_deciding(
    harness: Harness,
) -> None:
    """Issue 26 reproduction 8 (I21): the node workflow is started fresh while the
    ledger cannot be read (its ``repairs`` table is unreachable) and a repair it does
    not know of runs. It retries until the ledger answers, then attaches the alert to
    that repair: never a second repair for one episode. The delivery is answered once
    the first read failed (``new``, waiting for the ledger): well inside ingest's 30 s
    update timeout, not after the outage (an update held for minutes is timed out and
    re-sent by ingest, and the re-send only learns ``deduplicated``)."""
    import asyncio

    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 300
    h.cluster.busy_polls["gpu-06"] = 10_000
    d = await h.deliver(make_alert(h.cluster.cluster, "gpu-06", 1))
    rid = d.repair_id
    assert rid

    async def recorded() -> bool:
        return (await h.ledger.get_repair(rid)) is not None

    await eventually(recorded, "repair row in the ledger")
    await terminate_between_tasks(h, workflow_id_node(h.cluster.cluster, "gpu-06"))
    await h.ledger.pool.execute("ALTER TABLE repairs RENAME TO repairs_unreachable")
    try:
        pending = asyncio.create_task(h.deliver(make_alert(h.cluster.cluster, "gpu-06", 2)))
        d2 = await asyncio.wait_for(pending, timeout=60)  # answered after the first read
        # (two tries, 1 s apart), well inside ingest's 30 s update timeout
        assert d2.outcome == AlertOutcome.new and "waiting for the ledger" in d2.reason, d2
        await h.env.sleep(timedelta(minutes=3))
        st = await node_status(h, "gpu-06")  # no decision while the ledger does not answer
        assert st.recommendations == 0 and st.repair_id is None
    finally:
        await h.ledger.pool.execute("ALTER TABLE repairs_unreachable RENAME TO repairs")
    await h.env.sleep(timedelta(minutes=2))  # the next retry (at most 60 s apart)

    async def adopted() -> bool:
        return (await node_status(h, "gpu-06")).repair_id == rid

    await eventually(adopted, "the running repair adopted from the ledger")
    repair = h.client.get_workflow_handle(workflow_id_repair(h.cluster.cluster, "gpu-06", rid))

    async def joined() -> bool:
        st = await repair.query("status", result_type=RepairStatus)
        return d2.alert_id in {a.alert_id for a in st.evidence}

    await eventually(joined, "the waiting alert attached to the running repair")
    assert len(await h.ledger.list_repairs(cluster=h.cluster.cluster, node="gpu-06")) == 1


async def test_node_reconciles_after_continue_as_new_and_opens_a_new_repair(
    harness: Harness,
) -> None:
    """Issue 26 reproduction 9 (I24): a node entity that continued as new (as it does on
    a worker upgrade: a pinned node moves to the new build that way) still reconciles. Its
    repair is terminated; the next alert is not attached to it, a warning is sent, and
    once the cooldown is over the alert's fault gets a new repair."""
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 300
    h.cluster.busy_polls["gpu-07"] = 10_000
    c = h.cluster.cluster
    d = await h.deliver(make_alert(c, "gpu-07", 1), history_limit=40)
    rid = d.repair_id
    assert rid
    await _until_continued(h, "gpu-07")
    await terminate_between_tasks(h, workflow_id_repair(c, "gpu-07", rid))
    d2 = await h.deliver(make_alert(c, "gpu-07", 2))
    assert d2.outcome != AlertOutcome.attached and d2.repair_id != rid, d2
    assert any(n.repair_id == rid and n.severity == "warning"
               and "ended without finishing" in n.subject for n in h.cluster.notifications)
    h.cluster.busy_polls["gpu-07"] = 0
    until = (await node_status(h, "gpu-07")).cooldown_until
    assert until is not None  # it may have acted: the cooldown applies
    await h.env.sleep(until - await h.env.get_current_time() + timedelta(minutes=1))
    # the fault d2 brought is acted on by a new repair of its own

    async def second() -> bool:
        return (await node_status(h, "gpu-07")).recommendations == 2

    await eventually(second, "a new repair after the cooldown")
    rows = await h.ledger.list_repairs(cluster=c, node="gpu-07")
    assert len(rows) == 2 and {r["repair_id"] for r in rows} > {rid}


async def test_a_machine_held_for_rma_is_not_repaired_again_every_cooldown(
    harness: Harness,
) -> None:
    """I18 on the node: a level fault of a machine held for RMA (removed, not returned)
    gets one repair, which ends ``cancelled`` naming the hold; the node sets the fault
    aside, so no second repair is opened for it when the cooldown ends (before: a new
    refused repair every cooldown, each in the ledger and a notification). A fault
    reported after that end is a new episode and is judged again."""
    from workflows.activity_api import AttemptRecord
    from workflows.models import Action

    h = harness
    c = h.cluster.cluster
    await h.ledger.record_attempt(AttemptRecord(
        repair_id="r-rma", cluster=c, node="gpu-12", machine_id="m-gpu-12",
        action=Action.remove, alert_kind="xid", code=79, outcome="succeeded",
        at=datetime.now(UTC) - timedelta(hours=1)))
    boot = {"boot_id": "b-1"}  # the machine is not rebooted while it is held
    await h.deliver(_xfs(h, "gpu-12", "1", evidence=boot))
    await h.env.sleep(timedelta(minutes=3))  # past the level fault's persistence

    async def ended() -> bool:
        st = await node_status(h, "gpu-12")
        return st.repair_id is None and st.recommendations == 1

    await eventually(ended, "the repair refused by the RMA hold")
    rows = await h.ledger.list_repairs(cluster=c, node="gpu-12")
    assert [r["stage"] for r in rows] == ["cancelled"], rows
    st = await node_status(h, "gpu-12")
    assert not st.active_alerts, st.active_alerts  # set aside: the machine is out
    row = await h.ledger.get_repair(rows[0]["repair_id"])
    assert row is not None and "held for RMA" in row["transitions"][-1]["reason"], row
    until = st.cooldown_until
    assert until is not None
    await h.env.sleep(until - await h.env.get_current_time() + timedelta(minutes=5))
    st = await node_status(h, "gpu-12")
    assert st.recommendations == 1 and st.repair_id is None, st
    assert len(await h.ledger.list_repairs(cluster=c, node="gpu-12")) == 1
    # a new raise after that end is a new episode (the same boot: nothing rebooted it,
    # so it is not taken for a stale raise), judged (and refused) again
    await h.deliver(_xfs(h, "gpu-12", "2", evidence=boot))
    await h.env.sleep(timedelta(minutes=3))

    async def judged_again() -> bool:
        return (await node_status(h, "gpu-12")).recommendations == 2

    await eventually(judged_again, "a repair for the new raise")
