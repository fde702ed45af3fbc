"""A failure-domain hold's release across a guard rebuilt from scratch (real workflows,
time-skipping server, real ledger).

A release marks the requests the hold kept queued: their grant carries ``reset_at`` (the
release), so each repair acts only on evidence observed after it (the rule of a breaker
reset, I23). The release was not remembered across a guard rebuilt from the ledger: a
repair the hold kept waiting (then the budget), whose queue entry the lost guard took
with it, re-sent its request to the fresh guard and was granted without ``reset_at``; it
rebooted its node on an Xid from before the hold. The rebuilt guard now reads each
domain's last release from the ledger (the hold's clear, written at the guard's clock;
``ledger_guard_state`` ``domain_releases``) and marks an automatic request of the domain
first asked for at or before it (``LeaseRequest.requested_at``), as it does with the last
breaker reset.
"""

from __future__ import annotations

from datetime import UTC, datetime

from tests.workflows.conftest import Harness
from tests.workflows.helpers import (
    eventually,
    guard_status,
    result_skipping,
    start_repair,
    terminate_between_tasks,
)
from workflows.activity_api import GuardStateQuery
from workflows.models import Action, Stage
from workflows.protocol import (
    GUARD_SIGNAL_RELEASE_DOMAIN,
    ReleaseDomainSignal,
    workflow_id_guard,
)

RACK = [f"gpu-0{i}" for i in range(1, 4)]


async def test_a_repair_the_hold_kept_waiting_acts_on_later_evidence_after_a_rebuild(
    harness: Harness,
) -> None:
    h = harness
    c = h.cluster.cluster
    h.gpu_nodes = 40  # budget 2, breaker threshold 4 (not what holds anything here)
    h.domains = {n: ["rack-a"] for n in RACK}
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    for n in RACK[:2]:
        h.cluster.busy_polls[n] = 20  # d1, d2 hold the budget ~20 min past their cordon
    for i, n in enumerate(RACK, 1):
        await start_repair(h, n, Action.reboot, f"d{i}")

        async def asked(k: int = i) -> bool:
            g = await guard_status(h)
            return len(g.leases) + len(g.pending) == k

        await eventually(asked, f"d{i} answered by the guard")

    async def held() -> bool:
        g = await guard_status(h)
        return [d.domain for d in g.domain_holds] == ["rack-a"]

    await eventually(held, "the rack held (d3 the third node)")
    g = await guard_status(h)
    assert sorted(x.repair_id for x in g.leases) == ["d1", "d2"]
    assert [p.repair_id for p in g.pending] == ["d3"]

    gid = workflow_id_guard(c)
    guard = h.client.get_workflow_handle(gid)
    await guard.signal(GUARD_SIGNAL_RELEASE_DOMAIN,
                       ReleaseDomainSignal(domain="rack-a", by="alice", reason="PSU fixed"))

    async def released() -> bool:
        g = await guard_status(h)
        return g.domain_holds == [] and [r.domain for r in g.domain_releases] == ["rack-a"]

    await eventually(released, "the hold released (d3 still waits for the budget)")
    release_at = (await guard_status(h)).domain_releases[0].at

    async def cleared() -> bool:
        alerts = await h.ledger.list_alerts(cluster=c, node="*")
        return sorted((a.kind, a.active) for a in alerts) == [
            ("failure_domain", False), ("failure_domain", True)]

    await eventually(cleared, "the release recorded in the ledger (the hold's clear)")
    g = await guard_status(h)
    assert [p.repair_id for p in g.pending] == ["d3"], g.pending

    # the guard is lost (terminated from the Temporal UI) and started afresh: its queue
    # is gone; d3 re-sends its request (LEASE_RESEND_S) and waits for the budget again
    await terminate_between_tasks(h, gid)
    await h.client.start_workflow("ClusterGuardWorkflow", {"cluster": c}, id=gid,
                                  task_queue=h.task_queue)

    async def rebuilt() -> bool:
        g = await guard_status(h)
        return (g.rebuilt_at is not None and g.domain_holds == []
                and sorted(x.repair_id for x in g.leases) == ["d1", "d2"])

    await eventually(rebuilt, "the fresh guard rebuilt from the ledger")

    # d1 and d2 finish; d3 is granted by the rebuilt guard. Its Xid predates the release:
    # it must not reboot its node on it
    st = await result_skipping(h, RACK[2], "d3")
    assert st.stage == Stage.auto_resolved, st
    assert release_at.isoformat() in st.detail and "failure-domain hold" in st.detail, st
    assert h.cluster.count("reboot", RACK[2]) == 0
    for n, rid in zip(RACK[:2], ("d1", "d2"), strict=True):
        assert (await result_skipping(h, n, rid)).stage == Stage.succeeded
    # what the rebuilt guard read: the release at the guard's clock, shown to operators
    st_ledger = await h.ledger.guard_state(GuardStateQuery(cluster=c, since=datetime(
        2000, 1, 1, tzinfo=UTC)))
    assert st_ledger.domain_holds == []
    assert [(r.domain, r.at, r.by, r.reason) for r in st_ledger.domain_releases] == [
        ("rack-a", release_at, "alice", "PSU fixed")]
    g = await guard_status(h)
    assert [(r.domain, r.at) for r in g.domain_releases] == [("rack-a", release_at)]
