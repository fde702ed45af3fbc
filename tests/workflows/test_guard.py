"""ClusterGuardWorkflow: budget, one repair per pool, detector cap, lease expiry, breaker
reset over the operator interface (query ``status``, signal ``reset_breaker``)."""

from __future__ import annotations

from datetime import timedelta

from tests.workflows.conftest import Harness
from tests.workflows.helpers import (
    eventually,
    guard_status,
    start_repair,
    terminate_between_tasks,
    wait_stage,
)
from workflows.models import Action, Requester, RequesterKind, Stage
from workflows.protocol import (
    GUARD_SIGNAL_RESET_BREAKER,
    GUARD_WORKFLOW,
    GuardInput,
    ResetBreakerSignal,
    workflow_id_guard,
)

USER = Requester(kind=RequesterKind.user, name="ops")


async def test_budget_serialises_repairs(harness: Harness) -> None:
    h = harness  # 20 GPU nodes → budget max(1, ceil(0.05 × 20)) = 1
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.cluster.busy_polls["gpu-01"] = 10
    a = await start_repair(h, "gpu-01", Action.reboot, "b1", requester=USER, alerts=[])
    await wait_stage(h, "gpu-01", "b1", Stage.waiting_for_idle)
    b = await start_repair(h, "gpu-02", Action.reboot, "b2", requester=USER, alerts=[])

    async def queued() -> bool:
        g = await guard_status(h)
        return [p.repair_id for p in g.pending] == ["b2"]

    await eventually(queued, "b2 queued behind the budget")
    g = await guard_status(h)
    assert g.budget == 1 and [x.repair_id for x in g.leases] == ["b1"]
    assert h.cluster.count("cordon", "gpu-02") == 0
    assert (await a.result()).stage == Stage.succeeded
    assert (await b.result()).stage == Stage.succeeded
    assert not (await guard_status(h)).leases


async def test_one_repair_per_pool_and_detector_cap(harness: Harness) -> None:
    h = harness
    h.gpu_nodes = 100  # budget 5
    h.policy.rails.detector_cap = 1
    h.pools = {"gpu-01": "p1", "gpu-02": "p1", "gpu-03": "p2", "gpu-04": "p3"}
    h.policy.wait_for_idle.do_not_interrupt = True
    for n in ("gpu-01", "gpu-03"):
        h.cluster.busy_polls[n] = 10
    det = Requester(kind=RequesterKind.detector, name="straggler-scan")
    await start_repair(h, "gpu-01", Action.reboot, "p1a", requester=USER, alerts=[])
    await start_repair(h, "gpu-03", Action.reboot, "p2a", requester=det, alerts=[])
    await wait_stage(h, "gpu-01", "p1a", Stage.waiting_for_idle)
    await wait_stage(h, "gpu-03", "p2a", Stage.waiting_for_idle)
    await start_repair(h, "gpu-02", Action.reboot, "p1b", requester=USER, alerts=[])
    await start_repair(h, "gpu-04", Action.reboot, "p3a", requester=det, alerts=[])

    async def both_queued() -> bool:
        return {p.repair_id for p in (await guard_status(h)).pending} == {"p1b", "p3a"}

    await eventually(both_queued, "same-pool and over-cap requests queued")
    g = await guard_status(h)
    assert {x.repair_id for x in g.leases} == {"p1a", "p2a"}


async def test_unreleased_lease_expires_when_its_holder_is_gone(harness: Harness) -> None:
    h = harness
    h.policy.rails.lease_ttl_s = 600
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 300
    h.cluster.busy_polls["gpu-05"] = 1000
    a = await start_repair(h, "gpu-05", Action.reboot, "e1", requester=USER, alerts=[])
    await wait_stage(h, "gpu-05", "e1", Stage.waiting_for_idle)
    assert len((await guard_status(h)).leases) == 1
    await terminate_between_tasks(h, a.id)
    await h.env.sleep(timedelta(minutes=11))

    async def expired() -> bool:
        g = await guard_status(h)
        return not g.leases and [x.repair_id for x in g.expired] == ["e1"]

    await eventually(expired, "lease expiry of a gone holder")


async def test_reset_breaker_signal_closes_it(harness: Harness) -> None:
    h = harness
    h.policy.wait_for_idle.do_not_interrupt = True
    for i in (1, 2, 3):
        h.cluster.busy_polls[f"gpu-0{i}"] = 1000
        await start_repair(h, f"gpu-0{i}", Action.reboot, f"t{i}")  # automatic (mode)

    async def tripped() -> bool:
        g = await guard_status(h)
        return g.breaker_open and len(g.pending) == 2

    await eventually(tripped, "breaker trip")
    g = await guard_status(h)
    assert g.breaker_threshold == 2 and "exceeded threshold 2" in g.tripped_reason
    guard = h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster))
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))

    async def reset() -> bool:
        g = await guard_status(h)
        return not g.breaker_open and g.reset_by == "alice"

    await eventually(reset, "breaker reset")


async def test_status_says_when_the_policy_was_not_read(harness: Harness) -> None:
    """A guard that cannot read the policy (a broken configuration) says so:
    ``policy_loaded`` false, the error in ``errors`` (it grants nothing meanwhile and
    retries the read, tests/workflows/test_guard_rebuild_policy_unread.py); once read,
    ``policy_loaded`` is true and budget/threshold are the configured ones."""
    h = harness
    h.policy_error = "policy.rails: broken"
    gid = workflow_id_guard(h.cluster.cluster)
    await h.client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=h.cluster.cluster),
                                  id=gid, task_queue=h.task_queue)

    async def noted() -> bool:
        g = await guard_status(h)
        return any("load_policy failed" in e for e in g.errors)

    await eventually(noted, "the policy error noted")
    g = await guard_status(h)
    assert g.policy_loaded is False and "policy.rails: broken" in " ".join(g.errors)
    await terminate_between_tasks(h, gid)  # restarted with a readable policy
    h.policy_error = None
    await h.client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=h.cluster.cluster),
                                  id=gid, task_queue=h.task_queue)

    async def loaded() -> bool:
        return (await guard_status(h)).policy_loaded

    await eventually(loaded, "the policy read")
    g = await guard_status(h)
    assert g.gpu_nodes == h.gpu_nodes and not g.errors


async def test_a_policy_refresh_that_keeps_failing_does_not_stop_the_guard(
    harness: Harness,
) -> None:
    """A guard serving on a policy it read keeps deciding while a refresh fails
    retryably (the machine bindings' PostgreSQL read down): the read gives up after its
    bounded retries, the failure is noted, and the waiting request is decided on the
    last policy read. Before, the read retried without end inside the activity and the
    guard decided nothing (no grant, no release, no expiry) until the outage ended."""
    h = harness
    h.gpu_nodes = 100  # budget 5: b2 is granted beside b1
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.cluster.busy_polls["gpu-01"] = 10_000
    h.cluster.busy_polls["gpu-02"] = 10_000
    await start_repair(h, "gpu-01", Action.reboot, "r1", requester=USER, alerts=[])
    await wait_stage(h, "gpu-01", "r1", Stage.waiting_for_idle)
    h.guard_policy_outage = "ledger unreachable"
    await h.env.sleep(timedelta(minutes=6))  # the policy read is stale: the next
    # request reads it again first
    await start_repair(h, "gpu-02", Action.reboot, "r2", requester=USER, alerts=[])
    await h.env.sleep(timedelta(minutes=3))

    async def granted() -> bool:
        return "r2" in {x.repair_id for x in (await guard_status(h)).leases}

    await eventually(granted, "r2 granted on the last policy read",
                     explain=lambda: guard_status(h))
    g = await guard_status(h)
    assert g.policy_loaded and g.gpu_nodes == 100
    assert any("load_policy failed" in e and "ledger unreachable" in e for e in g.errors)
