"""Failure-domain holds on the real workflows (issue 29 item 2; time-skipping server, real
ledger): three automatic repairs of one domain open one hold and one ``failure_domain``
alert, the fourth waits naming the hold, an operator's request still goes, and the
operator's ``release_domain`` lets the waiting repairs through."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from tests.workflows.conftest import Harness, make_alert
from tests.workflows.helpers import (
    eventually,
    guard_status,
    repair_status,
    start_repair,
    terminate_between_tasks,
)
from workers import domains_cli
from workers.repairs.auth import ApiTokens
from workers.repairs.intake import RepairIntake
from workers.repairs.router import build_repairs_router
from workflows.activity_api import GuardStateQuery
from workflows.config import AutorepairConfig
from workflows.models import Action, Alert, AlertOutcome, Requester, RequesterKind
from workflows.protocol import (
    GUARD_SIGNAL_RELEASE_DOMAIN,
    ReleaseDomainSignal,
    workflow_id_guard,
)

OP = {"Authorization": "Bearer op-tok"}
VIEW = {"Authorization": "Bearer view-tok"}


@pytest.fixture
async def api(harness: Harness, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The real repair API router over the harness's Temporal client and ledger."""
    toks = tmp_path / "api.tokens"
    toks.write_text("op-tok operator alice\nview-tok viewer grafana\n")
    intake = RepairIntake(AutorepairConfig(), harness.ledger, harness.client)

    async def get() -> RepairIntake:
        return intake

    app = FastAPI()
    app.include_router(build_repairs_router(get, ApiTokens.load(toks)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://api") as c:
        yield c

RACK = [f"gpu-0{i}" for i in range(1, 6)]


async def test_a_domain_hold_waits_and_a_release_resumes(
        harness: Harness, api: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]) -> None:
    h = harness
    c = h.cluster.cluster
    r = await api.get("/api/v1/domains", headers=VIEW, params={"cluster": c})
    assert r.status_code == 200 and r.json()["holds"] == []
    h.gpu_nodes = 100  # budget 5, breaker threshold 10: neither binds here
    h.domains = {n: ["rack-a"] for n in RACK}
    h.policy.wait_for_idle.do_not_interrupt = True
    h.policy.wait_for_idle.poll_s = 60
    h.policy.wait_for_idle.poll_max_s = 60
    for n in RACK:
        h.cluster.busy_polls[n] = 10_000  # a granted repair holds its lease, waiting
    for i, n in enumerate(RACK[:3], 1):
        await start_repair(h, n, Action.reboot, f"d{i}")

        async def asked(k: int = i) -> bool:
            g = await guard_status(h)
            return len(g.leases) + len(g.pending) == k

        await eventually(asked, f"d{i} answered by the guard")

    async def held() -> bool:
        g = await guard_status(h)
        return [d.domain for d in g.domain_holds] == ["rack-a"]

    await eventually(held, "the rack held")
    g = await guard_status(h)
    assert sorted(x.repair_id for x in g.leases) == ["d1", "d2"]
    assert [p.repair_id for p in g.pending] == ["d3"]
    assert g.domain_holds[0].nodes == RACK[:3] and g.domain_holds[0].kinds == ["xid"]

    async def alerted() -> bool:
        alerts = await h.ledger.list_alerts(cluster=h.cluster.cluster, node="*")
        return [(a.kind, a.active) for a in alerts] == [("failure_domain", True)]

    await eventually(alerted, "one failure_domain alert in the ledger")
    # a fourth automatic repair of the rack waits, and says why
    await start_repair(h, RACK[3], Action.reboot, "d4")

    async def waits() -> bool:
        st = await repair_status(h, RACK[3], "d4")
        return "failure domain rack-a held" in st.detail

    await eventually(waits, "d4 waiting with the hold's reason")
    assert h.cluster.count("cordon", RACK[2]) == h.cluster.count("cordon", RACK[3]) == 0
    # an operator's own request is a person's decision: granted
    await start_repair(h, RACK[4], Action.reboot, "d5",
                       requester=Requester(kind=RequesterKind.user, name="ops"), alerts=[])

    async def person_goes() -> bool:
        return "d5" in {x.repair_id for x in (await guard_status(h)).leases}

    await eventually(person_goes, "the operator's repair granted in the held rack")
    # the operator's surface: the API (and the CLI's table of its answer)
    r = await api.get("/api/v1/domains", headers=VIEW, params={"cluster": c})
    doc = r.json()
    assert [(x["domain"], x["nodes"]) for x in doc["holds"]] == [("rack-a", RACK[:3])]
    assert doc["guard_running"] and doc["threshold"] == 3
    domains_cli.print_view(doc)
    out = capsys.readouterr().out
    assert "rack-a" in out and "gpu-01, gpu-02, gpu-03" in out
    path = f"/api/v1/domains/{c}/rack-a/release"
    assert (await api.post(path, headers=VIEW, json={"reason": "x"})).status_code == 403
    r = await api.post(f"/api/v1/domains/{c}/rack-b/release", headers=OP, json={})
    assert r.status_code == 409 and "rack-b" in r.text and "rack-a" in r.text
    r = await api.post(path, headers=OP, json={"reason": "PSU fixed"})
    assert r.status_code == 200, r.text
    assert r.json()["holds"] == []

    async def resumed() -> bool:
        g = await guard_status(h)
        return (g.domain_holds == [] and {"d3", "d4"} <= {x.repair_id for x in g.leases})

    await eventually(resumed, "the waiting repairs granted after the release")
    g = await guard_status(h)
    assert [(r.domain, r.by) for r in g.domain_releases] == [("rack-a", "alice")]

    async def cleared() -> bool:
        alerts = await h.ledger.list_alerts(cluster=h.cluster.cluster, node="*")
        return sorted((a.kind, a.active) for a in alerts) == [
            ("failure_domain", False), ("failure_domain", True)]

    await eventually(cleared, "the release recorded as the hold's clear")


async def test_a_domain_hold_survives_a_guard_restart(harness: Harness) -> None:
    """A terminated guard's fresh successor rebuilds the hold from the ledger's newest
    ``failure_domain`` rows (``ledger_guard_state``) and keeps the domain held; after a
    release the next fresh guard holds nothing."""
    h = harness
    h.gpu_nodes = 100
    h.domains = {n: ["rack-a"] for n in RACK}
    h.policy.wait_for_idle.do_not_interrupt = True
    for n in RACK:
        h.cluster.busy_polls[n] = 10_000
    for i, n in enumerate(RACK[:3], 1):
        await start_repair(h, n, Action.reboot, f"s{i}")

    async def recorded() -> bool:
        alerts = await h.ledger.list_alerts(cluster=h.cluster.cluster, node="*")
        return any(a.kind == "failure_domain" and a.active for a in alerts)

    await eventually(recorded, "the hold recorded in the ledger")
    await terminate_between_tasks(h, workflow_id_guard(h.cluster.cluster))
    await h.client.start_workflow("ClusterGuardWorkflow", {"cluster": h.cluster.cluster},
                                  id=workflow_id_guard(h.cluster.cluster),
                                  task_queue=h.task_queue)

    async def rebuilt() -> bool:
        g = await guard_status(h)
        return g.rebuilt_at is not None and [d.domain for d in g.domain_holds] == ["rack-a"]

    await eventually(rebuilt, "a fresh guard with the hold rebuilt")
    g = await guard_status(h)
    assert g.domain_holds[0].nodes == RACK[:3]
    guard = h.client.get_workflow_handle(workflow_id_guard(h.cluster.cluster))
    await guard.signal(GUARD_SIGNAL_RELEASE_DOMAIN,
                       ReleaseDomainSignal(domain="rack-a", by="alice", reason="ok"))

    async def cleared() -> bool:
        alerts = await h.ledger.list_alerts(cluster=h.cluster.cluster, node="*")
        return any(a.kind == "failure_domain" and not a.active for a in alerts)

    await eventually(cleared, "the release recorded in the ledger")
    state = await h.ledger.guard_state(GuardStateQuery(cluster=h.cluster.cluster,
                                                       since=g.rebuilt_at))
    assert state.domain_holds == []


async def test_a_rack_whose_faults_wait_out_a_grace_is_held_before_any_repair_asks(
        harness: Harness) -> None:
    """The false NVLink-down after a planned rack reboot (issue 29 Done-when; NVSentinel PR
    #1715): the faults arrive in the grace period after the rack's window, so no repair
    asks for a lease before it ends; each node reports its fault to the guard
    (``fault_seen``, the guard started by the first report) and the third opens the hold.
    When the faults recur after the grace, every repair waits on the hold: nothing is
    cordoned, though nothing but the hold stops them (budget 5, breaker 10)."""
    from activities.maintenance_store import MaintenanceStore
    from tests.workflows.test_maintenance_grace import GRACE_S, _deliver
    from workflows.leases import DomainFault

    h = harness
    c = h.cluster.cluster
    rack = RACK[:4]
    h.gpu_nodes = 100
    h.domains = {n: ["rack-g"] for n in rack}
    h.policy.consent.mode = "automatic"
    h.policy.wait_for_idle.do_not_interrupt = True
    for n in rack:
        h.cluster.busy_polls[n] = 10_000
    store = MaintenanceStore(h.ledger.pool)
    now = await h.env.get_current_time()
    await store.start(cluster=c, scope="nodes", nodes=rack, duration_s=3600,
                      reason="planned rack reboot", created_by="ops",
                      now=now - timedelta(seconds=3630))  # ended 30 s ago

    def nvlink(node: str, n: str) -> Alert:
        return make_alert(c, node, n, code=74, action="reset_gpu",
                          summary="Xid 74: NVLink error")

    for i, n in enumerate(rack):
        d = await _deliver(h, store, nvlink(n, f"x74-{i}"))
        assert d.outcome == AlertOutcome.new and d.reason.startswith("held:"), d
        await h.env.sleep(timedelta(seconds=10))

    async def held() -> bool:
        g = await guard_status(h)
        return [x.domain for x in g.domain_holds] == ["rack-g"]

    await eventually(held, "the rack held on its nodes' fault reports")
    g = await guard_status(h)
    assert g.domain_holds[0].nodes == rack[:3] and not g.leases and not g.pending
    assert all(isinstance(f, DomainFault) and f.repair_id.startswith("fault/")
               for f in g.domain_faults)
    assert await h.ledger.list_repairs(cluster=c) == []  # held before any repair asked
    alerts = await h.ledger.list_alerts(cluster=c, node="*")
    assert [(a.kind, a.active) for a in alerts] == [("failure_domain", True)]
    for _ in range(int(GRACE_S // 60) + 1):  # past the grace end, a minute at a time
        await h.env.sleep(timedelta(seconds=60))
    for i, n in enumerate(rack):  # the false fault persists
        await _deliver(h, store, nvlink(n, f"x74-again-{i}"))

    async def all_wait() -> bool:
        g = await guard_status(h)
        return len(g.pending) == len(rack)

    await eventually(all_wait, "every repair of the rack waiting on the hold")
    for p in (await guard_status(h)).pending:
        async def says(node: str = p.node, rid: str = p.repair_id) -> bool:
            return "failure domain rack-g held" in (await repair_status(h, node, rid)).detail

        await eventually(says, f"{p.repair_id} waiting with the hold's reason")
    assert not (await guard_status(h)).leases and h.cluster.count("cordon") == 0
