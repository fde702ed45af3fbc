"""Guard rails a break-test of 8a5413f found open, each a failing reproduction."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from activities.ledger import Ledger
from workflows.activity_api import GuardStateQuery
from workflows.leases import LeaseRequest, ResetBreakerSignal
from workflows.lifecycle import guard as gm

POLICY = gm.PolicyView(gpu_nodes=30, budget=1, breaker_threshold=2, breaker_window_s=600.0,
                       one_per_pool=False, detector_cap=3, lease_ttl_s=3600.0)


def _req(n: int) -> LeaseRequest:
    return LeaseRequest(repair_id=f"r{n}", workflow_id=f"w{n}", cluster="c", node=f"n{n}")


async def test_a_trip_in_the_same_instant_as_a_reset_survives_a_guard_restart(
        ledger_pool: Any) -> None:
    """Operator: the breaker tripped; I reset it while the storm goes on, and in the same
    workflow task (one batch, one clock reading) three more automatic requests trip it
    again. The guard shows OPEN and notified — but after the next guard restart the
    rebuilt guard reads the ledger's newest breaker row as the reset (same observed_at,
    ``active ASC`` puts the clear first) and serves with the breaker closed: the storm's
    repairs are granted. Rail: a rebuilt guard takes the breaker as the guard left it (a
    trip after a reset stays a trip; breaker reset racing a trip)."""
    ledger = Ledger(ledger_pool)
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=20)
    s = gm.new_state("c", POLICY)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, t0)
    written: list[gm.WriteAlert] = []
    for n in (1, 2, 3):
        s, cmds = gm.step(s, gm.Request(req=_req(n)), t0)
        written += [c for c in cmds if isinstance(c, gm.WriteAlert)]
    assert s.breaker_open
    now = t0 + timedelta(minutes=15)
    s, cmds = gm.step(s, gm.Batch(events=[
        gm.ResetBreaker(sig=ResetBreakerSignal(by="op", reason="storm over?")),
        *(gm.Request(req=_req(n)) for n in (4, 5, 6))]), now)
    written += [c for c in cmds if isinstance(c, gm.WriteAlert)]
    if any(isinstance(c, gm.LoadPolicy) for c in cmds):  # the 5-minute policy refresh
        s, cmds = gm.step(s, gm.PolicyRead(view=POLICY), now)
        written += [c for c in cmds if isinstance(c, gm.WriteAlert)]
    assert s.breaker_open and s.tripped_at == now, "the batch trips the breaker again"
    for w in written:
        await ledger.record_alert(w.alert)
    st = await ledger.guard_state(GuardStateQuery(cluster="c",
                                                  since=now - timedelta(minutes=10)))
    assert st.breaker_open, "a rebuilt guard would serve with the breaker closed"


async def test_a_reset_in_the_same_instant_as_its_trip_still_closes_the_breaker(
        ledger_pool: Any) -> None:
    """The tie-break above keeps the other order right: a trip and the reset of that trip
    decided at one instant leave the breaker closed for a rebuilt guard."""
    ledger = Ledger(ledger_pool)
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    s = gm.new_state("c2", POLICY)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, t0)
    reqs = [LeaseRequest(repair_id=f"q{n}", workflow_id=f"v{n}", cluster="c2", node=f"n{n}")
            for n in (1, 2, 3)]
    s, cmds = gm.step(s, gm.Batch(events=[
        *(gm.Request(req=r) for r in reqs),
        gm.ResetBreaker(sig=ResetBreakerSignal(by="op", reason="known cause"))]), t0)
    assert not s.breaker_open and s.tripped_at == t0
    for w in [c for c in cmds if isinstance(c, gm.WriteAlert)]:
        await ledger.record_alert(w.alert)
    st = await ledger.guard_state(GuardStateQuery(cluster="c2",
                                                  since=t0 - timedelta(minutes=10)))
    assert not st.breaker_open and st.reset_at == t0


async def test_a_repair_parked_in_maintenance_through_a_reset_acts_only_on_later_evidence(
        harness: Any) -> None:
    """Operator: a storm trips the breaker; I reset it. Repairs queued at the guard
    (budget or breaker) auto-resolve on their storm-time Xid evidence — but gpu-09's
    repair, which had its lease and then handed it back to wait out a maintenance window
    before cordoning, asks again after the window and power-cycles gpu-09 on the same
    pre-reset Xid: it re-asked with a fresh ``requested_at``, so the guard took it for a
    request first made after the reset. Rail (I23): every repair that waited through a
    reset without acting acts only on evidence observed after it; ``requested_at`` is
    when the repair *first* asked (workflows/leases.py)."""
    from activities.maintenance_store import MaintenanceStore
    from tests.workflows.helpers import eventually, guard_status, start_repair
    from tests.workflows.test_guard_lifecycle import _trip_with_one_holder_and_two_queued
    from workflows.models import Action, Stage
    from workflows.protocol import GUARD_SIGNAL_RESET_BREAKER, workflow_id_guard
    from workflows.repair import MAINTENANCE_RECHECK_S

    h = harness
    c = h.cluster.cluster
    store = MaintenanceStore(h.ledger.pool)
    w = await store.start(cluster=c, scope="nodes", nodes=["gpu-09"], duration_s=7200,
                          reason="rack 9 firmware", created_by="ops",
                          now=await h.env.get_current_time())
    parked = await start_repair(h, "gpu-09", Action.power_cycle, "mw9")
    await h.env.sleep(120)  # granted, then paused before cordoning: lease handed back
    assert (await guard_status(h)).leases == []
    await _trip_with_one_holder_and_two_queued(h, "s")
    guard = h.client.get_workflow_handle(workflow_id_guard(c))
    await guard.signal(GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="alice"))

    async def reset() -> bool:
        return not (await guard_status(h)).breaker_open

    await eventually(reset, "breaker reset")
    await store.end(w.window_id, "ops", now=await h.env.get_current_time())
    await h.env.sleep(MAINTENANCE_RECHECK_S + 60)
    st = await parked.result()
    assert h.cluster.count("power_cycle", "gpu-09") == 0 and st.stage == Stage.auto_resolved, (
        f"the parked repair ended {st.stage.value} ({st.detail}); power cycles of gpu-09: "
        f"{h.cluster.count('power_cycle', 'gpu-09')}")


def test_a_trip_after_a_reset_pages_as_a_new_incident() -> None:
    """Operator: the breaker trips (PagerDuty pages, incident dedup_key
    ``breaker/{cluster}``); I find the cause and run `autorepair breaker reset` — the
    reset sends no resolve, so the incident stays open unless I close it by hand. An
    hour later the breaker trips again for another storm: the trigger carries the same
    dedup_key, PagerDuty folds it into the open incident and nobody is paged. Rail: a
    trip is an operator's decision point ("paused until an operator runs `autorepair
    breaker reset`"): each trip is its own incident."""
    s = gm.new_state("c3", POLICY)
    t0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=POLICY),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, t0)

    def trip(at: datetime, first: int) -> gm.Notify:
        nonlocal s
        notes: list[gm.Notify] = []
        for n in range(first, first + 3):
            req = LeaseRequest(repair_id=f"p{n}", workflow_id=f"u{n}", cluster="c3",
                               node=f"n{n}")
            s, cmds = gm.step(s, gm.Request(req=req), at)
            if any(isinstance(c, gm.LoadPolicy) for c in cmds):
                s, more = gm.step(s, gm.PolicyRead(view=POLICY), at)
                cmds += more
            notes += [c for c in cmds if isinstance(c, gm.Notify)]
        (note,) = notes
        return note

    first = trip(t0, 1)
    s, _ = gm.step(s, gm.ResetBreaker(sig=ResetBreakerSignal(by="op", reason="fixed")),
                   t0 + timedelta(minutes=10))
    later = t0 + timedelta(hours=1)
    second = trip(later, 10)
    assert s.breaker_open
    assert second.dedup_key != first.dedup_key, (
        f"both trips page under dedup_key {first.dedup_key!r}: the second folds into the "
        "first incident")
