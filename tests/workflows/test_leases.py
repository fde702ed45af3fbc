"""Leases and the cluster guard on unhappy paths (docs/design.md §5 rails), on the real workflows:
one repair per node whatever created it, pool and machine from configuration, a guard
that survives a failing webhook, termination and restarts, lease waits that end, and
leases that live exactly as long as their holder."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from temporalio.client import WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import (
    eventually,
    guard_status,
    repair_status,
    result_skipping,
    start_repair,
    terminate_between_tasks,
    wait_stage,
)
from workflows.models import Action, AlertDelivery, NodeInput, Requester, RequesterKind, Stage
from workflows.protocol import (
    GUARD_SIGNAL_ACQUIRE,
    GUARD_SIGNAL_RELEASE,
    GUARD_SIGNAL_RESET_BREAKER,
    NODE_UPDATE_DELIVER_ALERT,
    LeaseRelease,
    LeaseRequest,
    ResetBreakerSignal,
    workflow_id_guard,
    workflow_id_node,
)

USER = Requester(kind=RequesterKind.user, name="ops")


async def _guard_handle(h: Harness):  # type: ignore[no-untyped-def]
    return h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster))


async def _terminate_guard(h: Harness) -> None:
    await terminate_between_tasks(h, workflow_id_guard(h.cluster.cluster))


async def test_second_repair_on_the_same_node_is_queued(harness: Harness) -> None:
    """Two repairs on one node (say the NodeWorkflow's and an operator's through the API),
    no pools configured, budget to spare: the second waits, visibly, and never cordons."""
    h = harness
    h.gpu_nodes = 100  # budget 5
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60  # no back-off
    h.cluster.busy_polls["gpu-01"] = 5
    a = await start_repair(h, "gpu-01", Action.reboot, "n1", requester=USER, alerts=[])
    await wait_stage(h, "gpu-01", "n1", Stage.waiting_for_idle)
    b = await start_repair(h, "gpu-01", Action.reboot, "n2", requester=USER, alerts=[])

    async def queued() -> bool:
        return "node gpu-01 busy with repair n1" in (await repair_status(h, "gpu-01", "n2")).detail

    async def detail() -> str:
        return (await repair_status(h, "gpu-01", "n2")).detail

    await eventually(queued, "second repair queued behind the first on the same node",
                     explain=detail)
    g = await guard_status(h)
    assert [x.repair_id for x in g.leases] == ["n1"] and [p.repair_id for p in g.pending] == ["n2"]
    assert h.cluster.count("cordon", "gpu-01") == 1
    assert (await a.result()).stage == Stage.succeeded
    assert (await b.result()).stage == Stage.succeeded  # after the first released
    assert h.cluster.count("reboot", "gpu-01") == 2


async def test_pool_comes_from_configuration_not_from_the_request(harness: Harness) -> None:
    """A request naming another pool (what an agent reported) is held to the configured
    pool of its node."""
    h = harness
    h.gpu_nodes = 100
    h.pools = {"gpu-01": "p1", "gpu-02": "p1"}
    h.policy.wait_for_idle.do_not_interrupt = True
    h.cluster.busy_polls["gpu-01"] = 10_000
    await start_repair(h, "gpu-01", Action.reboot, "p1", requester=USER, alerts=[])
    await wait_stage(h, "gpu-01", "p1", Stage.waiting_for_idle)
    await start_repair(
        h, "gpu-02", Action.reboot, "p2", requester=USER, alerts=[], node_pool="reported-pool"
    )

    async def queued() -> bool:
        return "node pool p1 busy with repair p1" in (
            await repair_status(h, "gpu-02", "p2")
        ).detail

    async def detail() -> str:
        return (await repair_status(h, "gpu-02", "p2")).detail

    await eventually(queued, "same configured pool queues the second repair", explain=detail)
    assert h.cluster.count("cordon", "gpu-02") == 0


async def test_agent_reported_machine_id_is_not_acted_on(harness: Harness) -> None:
    """An agent on gpu-01 reporting gpu-07's machine id (and its own pool) does not get
    gpu-07's machine acted on: the repair's machine comes from configuration."""
    h = harness
    c = h.cluster.cluster
    handle = await h.client.start_workflow(
        "NodeWorkflow",
        NodeInput(cluster=c, node="gpu-01", machine_id="m-gpu-07", node_pool="spoofed"),
        id=workflow_id_node(c, "gpu-01"),
        task_queue=h.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    alert = make_alert(c, "gpu-01", 1, machine_id="m-gpu-07", node_pool="spoofed")
    d = await handle.execute_update(NODE_UPDATE_DELIVER_ALERT, alert, result_type=AlertDelivery)
    assert d.repair_id
    st = await result_skipping(h, "gpu-01", d.repair_id)
    assert st.stage == Stage.succeeded and st.machine_id == "m-gpu-01"
    assert st.evidence[0].machine_id == "m-gpu-07"  # kept as reported evidence


async def test_webhook_4xx_does_not_fail_the_guard(harness: Harness) -> None:
    """The breaker trips while the notification webhook answers 404: the guard keeps
    running, notes the failure, and the queued repairs are granted after the reset (each
    on evidence observed after it only)."""
    h = harness
    h.cluster.notify_rejects = True
    h.policy.wait_for_idle.do_not_interrupt = True
    h.cluster.busy_polls["gpu-01"] = 3
    await start_repair(h, "gpu-01", Action.reboot, "w1")
    await wait_stage(h, "gpu-01", "w1", Stage.waiting_for_idle)
    for i in (2, 3):  # the second waits for the budget, the third trips the breaker
        await start_repair(h, f"gpu-0{i}", Action.reboot, f"w{i}")

        async def pending(n: int = i - 1) -> bool:
            return len((await guard_status(h)).pending) == n

        await eventually(pending, f"w{i} queued")

    async def tripped() -> bool:
        g = await guard_status(h)
        return g.breaker_open and any("HTTP 404" in e for e in g.errors)

    await eventually(tripped, "breaker trip with the failed notification noted")
    guard = await _guard_handle(h)
    assert (await guard.describe()).status == WorkflowExecutionStatus.RUNNING

    async def recorded() -> bool:  # the ledger write still runs (the guard's commands of
        # one step run side by side: the failed notification may be noted before it ends)
        alerts = await h.ledger.list_alerts(cluster=h.cluster.cluster, node="*")
        return [a.kind for a in alerts] == ["circuit_breaker"]

    await eventually(recorded, "the breaker's alert in the ledger")
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))
    st = await result_skipping(h, "gpu-01", "w1")
    assert st.stage == Stage.succeeded, st
    # both queued ones were granted after the reset, on evidence from before it: the
    # budget-queued one is treated as the breaker-queued one (issue 26 I23)
    for i in (2, 3):
        st = await result_skipping(h, f"gpu-0{i}", f"w{i}")
        assert st.stage == Stage.auto_resolved and "breaker reset" in st.detail, st
    assert (await guard.describe()).status == WorkflowExecutionStatus.RUNNING


async def test_terminated_guard_is_rebuilt_and_waiters_re_register(harness: Harness) -> None:
    """The guard is terminated while one repair holds the lease (budget 1) and two wait:
    the waiters re-send their requests, a fresh guard rebuilds the holder from the ledger,
    never grants a second lease beside it, and every repair ends."""
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60  # no back-off
    h.cluster.busy_polls["gpu-01"] = 20  # ~20 min in flight
    await start_repair(h, "gpu-01", Action.reboot, "g1", requester=USER, alerts=[])
    await wait_stage(h, "gpu-01", "g1", Stage.waiting_for_idle)
    for i in (2, 3):
        await start_repair(h, f"gpu-0{i}", Action.reboot, f"g{i}", requester=USER, alerts=[])

    async def two_waiting() -> bool:
        return len((await guard_status(h)).pending) == 2

    await eventually(two_waiting, "two repairs queued behind the budget")
    await _terminate_guard(h)
    # A fresh guard, as the first re-send starts it (started here: the time-skipping
    # test server loses time skipping when a workflow starts a child under the id of a
    # terminated one); its queue is empty until the waiters re-send.
    await h.client.start_workflow(
        "ClusterGuardWorkflow",
        {"cluster": h.cluster.cluster},
        id=workflow_id_guard(h.cluster.cluster),
        task_queue=h.task_queue,
    )
    await h.env.sleep(timedelta(minutes=6))  # past LEASE_RESEND_S

    async def rebuilt() -> bool:
        g = await guard_status(h)
        return (
            g.rebuilt_at is not None
            and [x.repair_id for x in g.leases] == ["g1"]
            and {p.repair_id for p in g.pending} == {"g2", "g3"}
        )

    await eventually(rebuilt, "fresh guard with the holder rebuilt and the waiters queued")
    assert h.cluster.count("cordon", "gpu-02") == h.cluster.count("cordon", "gpu-03") == 0
    for i in (1, 2, 3):
        st = await result_skipping(h, f"gpu-0{i}", f"g{i}")
        assert st.stage == Stage.succeeded, st


async def test_breaker_state_survives_guard_termination(harness: Harness) -> None:
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    for i in (1, 2, 3):
        h.cluster.busy_polls[f"gpu-0{i}"] = 10_000
        await start_repair(h, f"gpu-0{i}", Action.reboot, f"b{i}")

    async def tripped() -> bool:
        return (await guard_status(h)).breaker_open

    await eventually(tripped, "breaker trip")

    async def recorded() -> bool:
        alerts = await h.ledger.list_alerts(cluster=h.cluster.cluster, node="*")
        return any(a.kind == "circuit_breaker" and a.active for a in alerts)

    await eventually(recorded, "the trip recorded in the ledger")
    await _terminate_guard(h)
    # a fresh guard (as the next request or `autorepair breaker status` would start it)
    await h.client.start_workflow(
        "ClusterGuardWorkflow",
        {"cluster": h.cluster.cluster},
        id=workflow_id_guard(h.cluster.cluster),
        task_queue=h.task_queue,
    )

    async def reopened() -> bool:
        g = await guard_status(h)
        return g.rebuilt_at is not None and g.breaker_open and "exceeded" in g.tripped_reason

    await eventually(reopened, "fresh guard with the breaker still open")
    guard = await _guard_handle(h)
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))

    async def closed_in_ledger() -> bool:
        alerts = await h.ledger.list_alerts(cluster=h.cluster.cluster, node="*")
        return any(a.kind == "circuit_breaker" and not a.active for a in alerts)

    await eventually(closed_in_ledger, "the reset recorded in the ledger")
    assert not (await guard_status(h)).breaker_open


async def test_lease_wait_ends_timed_out_after_the_bound(harness: Harness) -> None:
    h = harness
    h.policy.rails.lease_wait_max_s = 1800
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 300
    h.policy.wait_for_idle.poll_max_s = 300  # no back-off
    h.cluster.busy_polls["gpu-01"] = 10_000
    await start_repair(h, "gpu-01", Action.reboot, "l1", requester=USER, alerts=[])
    await wait_stage(h, "gpu-01", "l1", Stage.waiting_for_idle)
    await start_repair(h, "gpu-02", Action.reboot, "l2", requester=USER, alerts=[])
    st = await result_skipping(h, "gpu-02", "l2", step_s=120)
    assert st.stage == Stage.timed_out
    last = st.history[-1].reason
    assert "lease_wait_max_s" in last and "concurrency budget 1 in use" in last
    assert h.cluster.count("cordon", "gpu-02") == 0
    assert "l2" not in {p.repair_id for p in (await guard_status(h)).pending}
    row = await h.ledger.get_repair("l2")
    assert row is not None and row["stage"] == "timed_out"


async def test_holder_waiting_past_the_ttl_keeps_its_lease(harness: Harness) -> None:
    """A repair waiting for idle for longer than the lease TTL keeps its lease (it renews;
    the guard asks it at expiry): a second repair in the same pool never cordons."""
    h = harness
    h.gpu_nodes = 100
    h.pools = {"gpu-01": "p1", "gpu-02": "p1"}
    h.policy.rails.lease_ttl_s = 600
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60  # no back-off
    h.cluster.busy_polls["gpu-01"] = 60  # one hour of polls
    a = await start_repair(h, "gpu-01", Action.reboot, "t1", requester=USER, alerts=[])
    await wait_stage(h, "gpu-01", "t1", Stage.waiting_for_idle)
    b = await start_repair(h, "gpu-02", Action.reboot, "t2", requester=USER, alerts=[])
    await h.env.sleep(timedelta(minutes=40))
    g = await guard_status(h)
    assert [x.repair_id for x in g.leases] == ["t1"] and not g.expired
    assert h.cluster.count("cordon", "gpu-02") == 0
    assert (await a.result()).stage == Stage.succeeded
    assert (await b.result()).stage == Stage.succeeded
    assert h.cluster.count("cordon", "gpu-02") == 1


async def test_holder_that_lost_its_lease_reacquires_before_draining(harness: Harness) -> None:
    """The guard forgets a holder (as a reset to an earlier point would) and grants its
    pool to another repair: the holder's next renewal is refused, and it does not drain
    until it holds a lease again."""
    h = harness
    h.gpu_nodes = 100
    h.pools = {"gpu-01": "p1", "gpu-02": "p1"}
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60  # no back-off
    h.cluster.busy_polls["gpu-01"] = 20
    h.cluster.busy_polls["gpu-02"] = 60
    a = await start_repair(h, "gpu-01", Action.reboot, "r1", requester=USER, alerts=[])
    await wait_stage(h, "gpu-01", "r1", Stage.waiting_for_idle)
    guard = await _guard_handle(h)
    await guard.signal(GUARD_SIGNAL_RELEASE, LeaseRelease(repair_id="r1", outcome="forgotten"))
    b = await start_repair(h, "gpu-02", Action.reboot, "r2", requester=USER, alerts=[])
    await wait_stage(h, "gpu-02", "r2", Stage.waiting_for_idle)
    await h.env.sleep(timedelta(minutes=30))  # r1 renews (refused), then goes idle

    async def r1_waits_again() -> bool:
        st = await repair_status(h, "gpu-01", "r1")
        return "lease queued" in st.detail and "node pool p1 busy with repair r2" in st.detail

    await eventually(r1_waits_again, "r1 re-acquiring before its drain")
    assert h.cluster.count("drain", "gpu-01") == 0
    assert (await b.result()).stage == Stage.succeeded
    st = await a.result()
    assert st.stage == Stage.succeeded
    assert any("lease not held before drain" in t.reason for t in st.history)


async def test_breaker_denominator_counts_only_gpu_nodes(harness: Harness) -> None:
    """No GPU node count configured (neither in configuration nor from the scheduler):
    neither nodes that asked for a lease nor nodes with a GPU-naming alert in the ledger
    size the breaker (issue 27 item 9: made-up nodes would raise the rails); the rails'
    minimums apply."""
    h = harness
    h.gpu_nodes = 0
    c = h.cluster.cluster
    for i in range(30):
        await h.ledger.record_alert(
            make_alert(c, f"gpu-{i:02d}", f"g{i}", observed_at=datetime(2025, 1, 1, tzinfo=UTC))
        )
    guard = await h.client.start_workflow(
        "ClusterGuardWorkflow",
        {"cluster": c},
        id=workflow_id_guard(c),
        task_queue=h.task_queue,
    )
    for i in range(60):  # 60 requests from CPU-only nodes (no GPU evidence)
        await guard.signal(
            GUARD_SIGNAL_ACQUIRE,
            LeaseRequest(
                repair_id=f"cpu{i}",
                workflow_id=f"nowhere/{i}",
                cluster=c,
                node=f"cpu-{i:02d}",
                automatic=False,
            ),
        )

    await asyncio.sleep(2)  # let the guard take every request before asking it
    g = await guard_status(h)
    # not sized from the 30 nodes alerts named, nor the 60 that asked: the minimums
    assert (g.gpu_nodes, g.breaker_threshold, g.budget) == (0, 2, 1)
    await _terminate_guard(h)
