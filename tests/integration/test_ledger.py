"""The ledger against a real (embedded) PostgreSQL: idempotent writes and queries."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg

from activities.ledger import Ledger, _migrations, migrate
from workflows.activity_api import (
    AttemptQuery,
    AttemptRecord,
    ClaimInput,
    RepairRecord,
    TicketInput,
    TransitionRecord,
    VerdictRecord,
)
from workflows.models import (
    Action,
    Alert,
    CheckOutcome,
    CheckResult,
    Requester,
    RequesterKind,
    Severity,
    Stage,
    ValidationResult,
    Verdict,
)

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _alert(alert_id: str, *, kind: str = "xid", action: Action = Action.power_cycle,
           severity: Severity = Severity.critical, at: datetime = T0) -> Alert:
    return Alert(
        alert_id=alert_id, cluster="c1", node="gpu-01", machine_id="m-01", kind=kind, code=79,
        severity=severity, mnemonic="GPU_LOST", actionable=action != Action.none, action=action,
        summary="Xid 79 on 0000:c6:00", evidence_text="NVRM: Xid (PCI:0000:c6:00): 79",
        evidence={"xid": 79, "pci": "0000:c6:00"}, observed_at=at,
    )


async def test_migrate_is_idempotent(ledger_pool: asyncpg.Pool) -> None:
    assert await migrate(ledger_pool) == []
    versions = await ledger_pool.fetch("SELECT version FROM schema_migrations")
    assert sorted(r["version"] for r in versions) == [v for v, _, _ in _migrations()]


async def test_alert_recorded_once_and_unmapped_counted(ledger_pool: asyncpg.Pool) -> None:
    ledger = Ledger(ledger_pool)
    assert await ledger.record_alert(_alert("a1")) is True
    assert await ledger.record_alert(_alert("a1")) is False
    unmapped = _alert("a2", kind="oom_kill", action=Action.none, severity=Severity.info)
    assert await ledger.record_alert(unmapped) is True
    assert await ledger.record_alert(unmapped) is False
    assert await ledger.unmapped_counts() == {"oom_kill": 1}
    got = await ledger.get_alert("a1")
    assert got is not None and got.evidence == {"xid": 79, "pci": "0000:c6:00"}
    assert [a.alert_id for a in await ledger.list_alerts(cluster="c1")] in (["a1", "a2"], ["a2", "a1"])


async def test_alert_with_nul_characters_is_recorded(ledger_pool: asyncpg.Pool) -> None:
    """A sender-controlled NUL (kernel line, attribute key or value) would make PostgreSQL
    refuse the row on every retry; the alert is recorded with U+FFFD instead."""
    ledger = Ledger(ledger_pool)
    raw = _alert("a-nul").model_dump(mode="json")
    raw.update(summary="Xid 79\x00", evidence_text="NVRM:\x00 Xid",
               evidence={"k\x00": ["v\x00", {"deep": "x\x00"}]})
    nul = Alert.model_validate(raw)
    assert await ledger.record_alert(nul) is True
    got = await ledger.get_alert("a-nul")
    assert got is not None and got.summary == "Xid 79\ufffd"
    assert got.evidence == {"k\ufffd": ["v\ufffd", {"deep": "x\ufffd"}]}


async def test_stale_write_never_reopens_an_ended_repair(ledger_pool: asyncpg.Pool) -> None:
    """An activity attempt the workflow abandoned (cancelled mid-write, timed out but still
    running) lands after the repair ended: the row stays terminal. A later write (a
    Temporal reset of the workflow) still moves it on."""
    ledger = Ledger(ledger_pool)
    rec = RepairRecord(
        repair_id="rs", cluster="c1", node="gpu-01", action=Action.reboot,
        stage=Stage.awaiting_approval, requester=Requester(), updated_at=T0,
    )
    await ledger.upsert_repair(rec)
    end = T0 + timedelta(minutes=5)
    await ledger.record_transition(
        TransitionRecord(repair_id="rs", stage=Stage.cancelled, at=end, by="temporal"))
    await ledger.upsert_repair(rec.model_copy(update={"stage": Stage.cancelled,
                                                       "updated_at": end}))
    await ledger.upsert_repair(rec)  # the abandoned attempt, written at T0
    await ledger.record_transition(
        TransitionRecord(repair_id="rs", stage=Stage.awaiting_approval, at=T0, by="system"))
    # the same time (a clock that did not move between the two workflow tasks), written
    # in the wrong order: the ending still sorts last
    await ledger.record_transition(
        TransitionRecord(repair_id="rs", stage=Stage.awaiting_approval, at=end, by="system"))
    row = await ledger.get_repair("rs")
    assert row is not None and row["stage"] == "cancelled"
    assert [t["stage"] for t in row["transitions"]][-2:] == ["awaiting_approval", "cancelled"]
    later = end + timedelta(minutes=1)
    await ledger.upsert_repair(rec.model_copy(update={"stage": Stage.cordoning,
                                                       "updated_at": later}))
    row = await ledger.get_repair("rs")
    assert row is not None and row["stage"] == "cordoning"



async def test_transition_to_approval_carries_approval_pending(
        ledger_pool: asyncpg.Pool) -> None:
    """The transition to ``awaiting_approval`` writes ``approval_pending`` with the stage:
    between it and the row write the API derived ``state`` from the new stage and the old
    flag (``in_progress`` for a repair asking a person). A transition without the flag
    keeps it; an older write does not move it back."""
    ledger = Ledger(ledger_pool)
    rec = RepairRecord(
        repair_id="ap", cluster="c1", node="gpu-01", action=Action.reboot,
        stage=Stage.recommended, requester=Requester(), updated_at=T0,
        approval_pending=False,
    )
    await ledger.upsert_repair(rec)
    asked = T0 + timedelta(seconds=1)
    await ledger.record_transition(TransitionRecord(
        repair_id="ap", stage=Stage.awaiting_approval, at=asked, approval_pending=True))
    row = await ledger.get_repair("ap")
    assert row is not None and (row["stage"], row["approval_pending"]) == (
        "awaiting_approval", True)
    assert [r["repair_id"] for r in await ledger.list_repairs(
        cluster="c1", stage="awaiting_approval", asked=True)] == ["ap"]
    # a note without the flag (an older writer) keeps it
    await ledger.record_transition(TransitionRecord(
        repair_id="ap", stage=Stage.awaiting_approval, at=asked + timedelta(seconds=1),
        reason="note"))
    row = await ledger.get_repair("ap")
    assert row is not None and row["approval_pending"] is True
    # a stale write (older than the row) does not move the flag back
    await ledger.record_transition(TransitionRecord(
        repair_id="ap", stage=Stage.awaiting_approval, at=T0, approval_pending=False))
    row = await ledger.get_repair("ap")
    assert row is not None and row["approval_pending"] is True


async def test_repair_transitions_and_attempt_history(ledger_pool: asyncpg.Pool) -> None:
    ledger = Ledger(ledger_pool)
    await ledger.record_alert(_alert("a1"))
    rec = RepairRecord(
        repair_id="r1", cluster="c1", node="gpu-01", machine_id="m-01", action=Action.power_cycle,
        stage=Stage.recommended, requester=Requester(), alert_ids=["a1"], updated_at=T0,
    )
    await ledger.upsert_repair(rec)
    await ledger.upsert_repair(rec.model_copy(update={"approved_by": "alice", "alert_ids": ["a2"]}))
    for i, st in enumerate([Stage.awaiting_approval, Stage.cordoning, Stage.succeeded]):
        t = TransitionRecord(repair_id="r1", stage=st, at=T0 + timedelta(minutes=i), by="alice")
        await ledger.record_transition(t)
        await ledger.record_transition(t)  # retried activity: no duplicate
    row = await ledger.get_repair("r1")
    assert row is not None
    assert row["stage"] == "succeeded" and row["approved_by"] == "alice"
    assert sorted(row["alert_ids"]) == ["a1", "a2"]
    assert [t["stage"] for t in row["transitions"]] == ["awaiting_approval", "cordoning", "succeeded"]

    att = AttemptRecord(repair_id="r1", cluster="c1", node="gpu-01", machine_id="m-01",
                        action=Action.reboot, alert_kind="xid", code=79, outcome="failed",
                        at=T0)
    await ledger.record_attempt(att)
    await ledger.record_attempt(att.model_copy(update={"outcome": "succeeded"}))
    hist = await ledger.attempt_history(
        AttemptQuery(cluster="c1", node="gpu-01", machine_id="m-01", since=T0 - timedelta(days=7))
    )
    assert [(a.action, a.outcome) for a in hist.attempts] == [(Action.reboot, "succeeded")]
    assert [a.alert_id for a in hist.critical_alerts] == ["a1"]
    later = await ledger.attempt_history(
        AttemptQuery(cluster="c1", node="gpu-01", machine_id="m-01", since=T0 + timedelta(days=1))
    )
    assert later.attempts == [] and later.critical_alerts == []
    # the node moved to a spare: attempts on the node and on the machine both come back
    moved = att.model_copy(update={"repair_id": "r2", "machine_id": "spare-1",
                                   "at": T0 + timedelta(hours=1)})
    await ledger.record_attempt(moved)
    await ledger.record_attempt(att.model_copy(update={"repair_id": "r3", "node": "gpu-09",
                                                       "machine_id": "m-09"}))
    both = await ledger.attempt_history(
        AttemptQuery(cluster="c1", node="gpu-01", machine_id="spare-1", since=T0 - timedelta(days=7))
    )
    assert sorted(a.repair_id for a in both.attempts) == ["r1", "r2"]


async def test_write_of_a_rerun_workflow_task_replaces_the_lost_one(
    ledger_pool: asyncpg.Pool,
) -> None:
    """A workflow task cut short by a worker crash after its local activity wrote is run
    again with a later workflow clock (the crash test found an attempt counted twice so):
    the writes carry the same ``write_key`` and replace the lost run's rows, for attempts
    and transitions; the kept write's time and content stand. Writes of other keys at
    the same instant, and writes without a key, keep their old idempotency."""
    ledger = Ledger(ledger_pool)
    rec = RepairRecord(
        repair_id="rk", cluster="c1", node="gpu-03", machine_id="m-03", action=Action.reboot,
        stage=Stage.recommended, requester=Requester(), alert_ids=[], updated_at=T0,
    )
    await ledger.upsert_repair(rec)
    lost, kept = T0 + timedelta(minutes=5), T0 + timedelta(minutes=5, seconds=12)
    att = AttemptRecord(repair_id="rk", cluster="c1", node="gpu-03", machine_id="m-03",
                        action=Action.reboot, alert_kind="xid", code=79, outcome="succeeded",
                        at=lost, write_key="run-1/7")
    await ledger.record_attempt(att)
    await ledger.record_attempt(att.model_copy(update={"at": kept}))
    await ledger.record_attempt(att.model_copy(update={"at": kept}))  # retried: once
    tr = TransitionRecord(repair_id="rk", stage=Stage.succeeded, at=lost, reason="lost run",
                          write_key="run-1/8")
    await ledger.record_transition(tr)
    await ledger.record_transition(tr.model_copy(update={"at": kept, "reason": "kept run"}))
    # another write of the same instant and stage (a second note in one task) keeps the
    # old rule: the first one of that instant stands
    await ledger.record_transition(tr.model_copy(update={"at": kept, "reason": "same instant",
                                                         "write_key": "run-1/9"}))
    hist = await ledger.attempt_history(AttemptQuery(
        cluster="c1", node="gpu-03", machine_id="m-03", since=T0 - timedelta(days=1)))
    assert [(a.action, a.outcome, a.at) for a in hist.attempts] == [
        (Action.reboot, "succeeded", kept)]
    row = await ledger.get_repair("rk")
    assert row is not None and row["stage"] == "succeeded"
    assert [(t["stage"], t["reason"]) for t in row["transitions"]] == [
        ("succeeded", "kept run")]
    # a new key is a new attempt, even of the same action; no key: (repair, action, at)
    await ledger.record_attempt(att.model_copy(update={"at": kept + timedelta(hours=1),
                                                       "write_key": "run-2/1"}))
    bare = att.model_copy(update={"at": kept + timedelta(hours=2), "write_key": None})
    await ledger.record_attempt(bare)
    await ledger.record_attempt(bare.model_copy(update={"outcome": "failed"}))
    hist = await ledger.attempt_history(AttemptQuery(
        cluster="c1", node="gpu-03", machine_id="m-03", since=T0 - timedelta(days=1)))
    assert [a.outcome for a in hist.attempts] == ["succeeded", "succeeded", "failed"]


async def test_racing_claims_produce_one_repair(ledger_pool: asyncpg.Pool) -> None:
    ledger = Ledger(ledger_pool)
    claims = [
        ClaimInput(detector="npd", request_id="req-7", repair_id=f"r{i}", cluster="c1",
                   node="gpu-02")
        for i in range(8)
    ]
    results = await asyncio.gather(*(ledger.claim_request(c) for c in claims))
    winners = {r.repair_id for r in results}
    assert len(winners) == 1
    assert sum(r.created for r in results) == 1
    again = await ledger.claim_request(claims[3])
    assert again.repair_id in winners and again.created is False


async def test_failed_verdict_ticket_closed_by_later_pass(ledger_pool: asyncpg.Pool) -> None:
    ledger = Ledger(ledger_pool)
    failed = ValidationResult(
        machine="m-03", verdict=Verdict.failed,
        checks=[CheckResult(name="gpu.remap", outcome=CheckOutcome.failed, detail="remap failure")],
    )
    await ledger.record_verdict(VerdictRecord(run_id="v1", cluster="c1", machine="m-03",
                                              verdict=Verdict.failed, result=failed, at=T0))
    t1 = await ledger.open_ticket(TicketInput(cluster="c1", machine="m-03", run_id="v1",
                                              summary="remap failure", result=failed))
    t2 = await ledger.open_ticket(TicketInput(cluster="c1", machine="m-03", run_id="v1",
                                              summary="remap failure", result=failed))
    assert t1 == t2
    assert [t["ticket_id"] for t in await ledger.open_tickets("m-03")] == [t1.ticket_id]
    passed = ValidationResult(machine="m-03", verdict=Verdict.passed)
    await ledger.record_verdict(VerdictRecord(run_id="v2", cluster="c1", machine="m-03",
                                              verdict=Verdict.passed, result=passed,
                                              at=T0 + timedelta(hours=2)))
    assert await ledger.open_tickets("m-03") == []
    latest = await ledger.latest_verdict("m-03")
    assert latest is not None and latest["verdict"] == "passed"


async def test_detector_repairs_counted_open_only(ledger_pool: asyncpg.Pool) -> None:
    ledger = Ledger(ledger_pool)
    det = Requester(kind=RequesterKind.detector, name="npd")
    for rid, stage in (("d1", Stage.cordoning), ("d2", Stage.succeeded)):
        await ledger.upsert_repair(RepairRecord(
            repair_id=rid, cluster="c1", node="gpu-0" + rid[-1], action=Action.reboot,
            stage=stage, requester=det, updated_at=T0,
        ))
    assert await ledger.count_detector_repairs("c1") == 1
    assert await ledger.count_detector_repairs("c1", open_only=False) == 2


def _repair(repair_id: str) -> RepairRecord:
    return RepairRecord(
        repair_id=repair_id, cluster="c1", node="gpu-01", action=Action.reboot,
        stage=Stage.rejected, requester=Requester(kind=RequesterKind.detector, name="scan"),
        updated_at=T0,
    )


async def test_connection_scoped_ledger_commits_or_rolls_back_as_one(
    ledger_pool: asyncpg.Pool,
) -> None:
    ledger = Ledger(ledger_pool)
    async with ledger.transaction() as tx:
        await tx.upsert_repair(_repair("tx-1"))
        await tx.record_transition(TransitionRecord(
            repair_id="tx-1", stage=Stage.rejected, at=T0, by="autorepair", reason="cap"))
        assert (await tx.get_repair("tx-1")) is not None  # its own writes are visible
    row = await ledger.get_repair("tx-1")
    assert row is not None and [t["reason"] for t in row["transitions"]] == ["cap"]

    class Boom(Exception):
        pass

    try:
        async with ledger.transaction() as tx:
            await tx.upsert_repair(_repair("tx-2"))
            await tx.record_transition(TransitionRecord(
                repair_id="tx-2", stage=Stage.rejected, at=T0, by="autorepair"))
            raise Boom
    except Boom:
        pass
    assert await ledger.get_repair("tx-2") is None
    assert await ledger_pool.fetchval(
        "SELECT count(*) FROM repair_transitions WHERE repair_id = 'tx-2'") == 0


async def test_transactions_with_the_same_lock_run_one_after_the_other(
    ledger_pool: asyncpg.Pool,
) -> None:
    ledger = Ledger(ledger_pool)
    order: list[str] = []
    first_in = asyncio.Event()

    async def first() -> None:
        async with ledger.transaction(lock=(7, "c1")):
            order.append("first in")
            first_in.set()
            await asyncio.sleep(0.3)
            order.append("first out")

    async def second(key: str) -> None:
        await first_in.wait()
        async with ledger.transaction(lock=(7, key)):
            order.append(f"second in ({key})")

    await asyncio.gather(first(), second("c1"))
    assert order == ["first in", "first out", "second in (c1)"]
    order.clear()
    first_in.clear()
    await asyncio.gather(first(), second("other"))  # another key does not wait
    assert order == ["first in", "second in (other)", "first out"]


async def test_critical_history_is_judged_on_receive_time(ledger_pool: asyncpg.Pool) -> None:
    """I17: the migrate gate's critical history is the alerts the control plane received
    in the window, whatever the sender's clock said: one from a host 11 days behind,
    received now, counts; one received 11 days ago from a clock 11 days ahead does not.
    Both ways in (ingest's batch and the node's single record) keep ``received_at``."""
    ledger = Ledger(ledger_pool)
    behind = _alert("slow", at=T0 - timedelta(days=11)).model_copy(update={"received_at": T0})
    ahead = _alert("fast", at=T0).model_copy(
        update={"received_at": T0 - timedelta(days=11), "machine_id": "m-01"})
    assert await ledger.accept_alerts([behind]) == {"slow"}
    assert await ledger.record_alert(ahead) is True
    hist = await ledger.attempt_history(
        AttemptQuery(cluster="c1", node="gpu-01", machine_id="m-01", since=T0 - timedelta(days=10)))
    assert [a.alert_id for a in hist.critical_alerts] == ["slow"]
    assert hist.critical_alerts[0].received_at == T0
    got = await ledger.get_alert("fast")
    assert got is not None and got.received_at == T0 - timedelta(days=11)


async def test_guard_state_reads_each_domains_last_release(ledger_pool: asyncpg.Pool) -> None:
    """``ledger_guard_state`` answers each failure domain's last release (the guard's
    clear of its hold, at the guard's clock) beside the holds in force: a rebuilt guard
    marks a request first asked for before it. A hold raised again after a release keeps
    the release; a clear of another source is not the guard's."""
    from workflows.activity_api import GuardStateQuery
    from workflows.leases import LeaseRequest, ReleaseDomainSignal
    from workflows.lifecycle import guard as gm

    ledger = Ledger(ledger_pool)
    policy = gm.PolicyView(gpu_nodes=100, budget=10, breaker_threshold=50,
                           breaker_window_s=600.0, one_per_pool=False, detector_cap=3,
                           lease_ttl_s=3600.0, domain_threshold=2, domain_window_s=600.0,
                           domains={"n1": ["rack-a"], "n2": ["rack-a"], "n3": ["rack-b"],
                                    "n4": ["rack-b"]})
    s = gm.new_state("c1", policy)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=policy),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, T0)
    writes: list[Alert] = []

    def step(ev: gm.Event, at: datetime) -> None:
        nonlocal s
        s, cmds = gm.step(s, ev, at)
        writes.extend(c.alert for c in cmds if isinstance(c, gm.WriteAlert))

    def hold(nodes: list[str], at: datetime, n: int) -> None:
        for node in nodes:
            step(gm.Request(req=LeaseRequest(
                repair_id=f"r-{node}-{n}", workflow_id=f"w-{node}", cluster="c1", node=node,
                fault_kinds=["xid"])), at)
            step(gm.Release(rel=gm.LeaseRelease(repair_id=f"r-{node}-{n}")), at)

    def release(domain: str, at: datetime) -> None:
        step(gm.ReleaseDomain(sig=ReleaseDomainSignal(domain=domain, by="alice",
                                                      reason="fixed")), at)

    hold(["n1", "n2"], T0, 1)
    release("rack-a", T0 + timedelta(minutes=1))
    hold(["n3", "n4"], T0 + timedelta(minutes=2), 1)
    release("rack-b", T0 + timedelta(minutes=3))
    hold(["n1", "n2"], T0 + timedelta(minutes=4), 2)  # rack-a held again
    assert [(a.active, a.evidence["domain"]) for a in writes] == [
        (True, "rack-a"), (False, "rack-a"), (True, "rack-b"), (False, "rack-b"),
        (True, "rack-a")]
    for a in writes:
        assert await ledger.record_alert(a)
    # a failure_domain clear the guard did not write (an ingest-side row) is not a release
    stray = writes[1].model_copy(update={"alert_id": "stray", "source": "ingest",
                                         "observed_at": T0 + timedelta(minutes=9)})
    assert await ledger.record_alert(stray)

    st = await ledger.guard_state(GuardStateQuery(cluster="c1", since=T0))
    assert [(h.domain, h.opened_at) for h in st.domain_holds] == [
        ("rack-a", T0 + timedelta(minutes=4))]
    assert [(r.domain, r.at, r.by, r.reason, r.opened_at) for r in st.domain_releases] == [
        ("rack-a", T0 + timedelta(minutes=1), "alice", "fixed", T0),
        ("rack-b", T0 + timedelta(minutes=3), "alice", "fixed", T0 + timedelta(minutes=2))]


async def test_guard_state_lists_each_holders_pool(ledger_pool: asyncpg.Pool) -> None:
    """The pool a repair asked the guard with (``RepairRecord.node_pool``, migration 0019)
    is what ``ledger_guard_state`` lists for the holder; a later write without one keeps
    it; a row without one lists none."""
    from workflows.activity_api import GuardStateQuery

    ledger = Ledger(ledger_pool)
    rec = RepairRecord(repair_id="rp", cluster="c1", node="gpu-01", action=Action.reboot,
                       stage=Stage.cordoning, requester=Requester(), updated_at=T0,
                       node_pool="pool-a", lease_held=True)
    await ledger.upsert_repair(rec)
    await ledger.upsert_repair(rec.model_copy(update={
        "node_pool": None, "updated_at": T0 + timedelta(seconds=1)}))
    await ledger.upsert_repair(RepairRecord(
        repair_id="rq", cluster="c1", node="gpu-02", action=Action.reboot,
        stage=Stage.cordoning, requester=Requester(), updated_at=T0))
    st = await ledger.guard_state(GuardStateQuery(cluster="c1", since=T0))
    assert [(h.repair_id, h.node_pool) for h in st.holders] == [("rp", "pool-a"),
                                                                ("rq", None)]


async def test_guard_state_keeps_the_last_reset_when_the_breaker_tripped_again(
        ledger_pool: asyncpg.Pool) -> None:
    """``reset_at`` is the guard's last breaker reset also while the breaker is open again
    (a trip after it): a guard rebuilt then still marks a request first asked for before
    the reset (I23). Before, it was answered only while the reset's clear was the newest
    breaker row."""
    from workflows.activity_api import GuardStateQuery
    from workflows.leases import LeaseRequest, ResetBreakerSignal
    from workflows.lifecycle import guard as gm

    ledger = Ledger(ledger_pool)
    policy = gm.PolicyView(gpu_nodes=100, budget=10, breaker_threshold=1,
                           breaker_window_s=600.0, one_per_pool=False, detector_cap=3,
                           lease_ttl_s=3600.0)
    s = gm.new_state("c1", policy)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=policy),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, T0)
    writes: list[Alert] = []

    def step(ev: gm.Event, at: datetime) -> None:
        nonlocal s
        s, cmds = gm.step(s, ev, at)
        writes.extend(c.alert for c in cmds if isinstance(c, gm.WriteAlert))

    def ask(rid: str, at: datetime) -> None:
        step(gm.Request(req=LeaseRequest(repair_id=rid, workflow_id=f"w-{rid}", cluster="c1",
                                         node=f"n-{rid}")), at)

    ask("r1", T0)
    ask("r2", T0)  # trips
    reset = T0 + timedelta(minutes=1)
    step(gm.ResetBreaker(sig=ResetBreakerSignal(by="alice")), reset)
    ask("r3", T0 + timedelta(minutes=2))
    ask("r4", T0 + timedelta(minutes=2))  # trips again
    assert [(a.kind, a.active) for a in writes] == [
        ("circuit_breaker", True), ("circuit_breaker", False), ("circuit_breaker", True)]
    for a in writes:
        assert await ledger.record_alert(a)
    st = await ledger.guard_state(GuardStateQuery(cluster="c1", since=T0))
    assert st.breaker_open and st.tripped_at == T0 + timedelta(minutes=2)
    assert st.reset_at == reset


async def test_guard_state_keeps_a_hold_raised_again_at_the_instant_of_a_release(
        ledger_pool: asyncpg.Pool) -> None:
    """A release and the faults that hold the domain again decided in one guard step (one
    batch: one instant) write the release's clear and the new raise at the same
    ``observed_at``; the hold is in force and a guard rebuilt from the ledger must keep
    it. The newest row per domain was chosen by ``active`` at one instant, the clear
    first: the rebuilt guard held nothing and granted the domain's automatic repairs. At
    one instant a release now follows only the raise of its own hold (its id: the raise's
    + ``/release``), as a breaker reset follows its trip."""
    from workflows.activity_api import GuardStateQuery
    from workflows.leases import FaultReport, ReleaseDomainSignal
    from workflows.lifecycle import guard as gm

    ledger = Ledger(ledger_pool)
    policy = gm.PolicyView(gpu_nodes=100, budget=10, breaker_threshold=50,
                           breaker_window_s=600.0, one_per_pool=False, detector_cap=3,
                           lease_ttl_s=3600.0, domain_threshold=2, domain_window_s=600.0,
                           domains={"n1": ["rack-a"], "n2": ["rack-a"]})
    s = gm.new_state("c1", policy)
    for ev in (gm.Started(fresh=True), gm.PolicyRead(view=policy),
               gm.LedgerRead(view=gm.LedgerView())):
        s, _ = gm.step(s, ev, T0)

    def fault(node: str, n: int) -> gm.FaultSeen:
        return gm.FaultSeen(report=FaultReport(cluster="c1", node=node, alert_id=f"x{n}",
                                               kind="xid", domains=["rack-a"]))

    writes: list[Alert] = []
    s, cmds = gm.step(s, gm.Batch(events=[fault("n1", 1), fault("n2", 2)]), T0)
    writes += [c.alert for c in cmds if isinstance(c, gm.WriteAlert)]
    at = T0 + timedelta(minutes=1)
    s, cmds = gm.step(s, gm.Batch(events=[
        gm.ReleaseDomain(sig=ReleaseDomainSignal(domain="rack-a", by="alice")),
        fault("n1", 3), fault("n2", 4)]), at)  # the rack flaps on: held again
    writes += [c.alert for c in cmds if isinstance(c, gm.WriteAlert)]
    assert [h.domain for h in s.holds] == ["rack-a"]
    assert [(a.active, a.observed_at) for a in writes] == [(True, T0), (False, at),
                                                           (True, at)]
    for a in writes:
        assert await ledger.record_alert(a)
    st = await ledger.guard_state(GuardStateQuery(cluster="c1", since=T0))
    assert [(h.domain, h.opened_at, h.alert_id) for h in st.domain_holds] == [
        ("rack-a", at, writes[2].alert_id)]
    assert [(r.domain, r.at) for r in st.domain_releases] == [("rack-a", at)]
    # a hold opened and released at one instant is released
    s, cmds = gm.step(s, gm.Batch(events=[
        gm.ReleaseDomain(sig=ReleaseDomainSignal(domain="rack-a", by="alice"))]), at)
    (clear,) = [c.alert for c in cmds if isinstance(c, gm.WriteAlert)]
    assert await ledger.record_alert(clear)
    st = await ledger.guard_state(GuardStateQuery(cluster="c1", since=T0))
    assert st.domain_holds == []
