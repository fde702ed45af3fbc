"""Downtime, cost and repair notifications recorded by the ledger activities (real
PostgreSQL, real loopback webhook): what a finished repair leaves in ``repair_downtime``,
the fleet report over it, and which stage records notify whom."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from temporalio.testing import ActivityEnvironment

from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from activities.ledger_reports import fleet_report
from activities.notifications import Notifier
from activities.notify import NotifyActivities
from workflows.activity_api import Notification, RepairRecord, TransitionRecord, VerdictRecord
from workflows.config import NotificationsConfig, ProvidersConfig
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

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
PROVIDERS = ProvidersConfig.model_validate({"rules": [
    {"match": {"cidr": "10.8.0.0/16"}, "provider": "coreweave", "hourly_rate": 4.0},
    {"match": {"cluster": "c1"}, "provider": "onprem", "gpus_per_node": 8, "hourly_rate": 2.0},
]})


@pytest.fixture
async def hook() -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
    got: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        got.append(await request.json())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield got, f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    finally:
        await runner.cleanup()


def _at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _alert(alert_id: str, node: str, evidence: dict[str, Any] | None = None) -> Alert:
    return Alert(alert_id=alert_id, cluster="c1", node=node, kind="xid", code=79,
                 severity=Severity.critical, actionable=True, action=Action.power_cycle,
                 summary=f"Xid 79 on {node}", description="GPU fell off the bus",
                 evidence_text="NVRM: Xid (PCI:0000:c6:00): 79", evidence=evidence or {},
                 observed_at=_at(-1))


def _rec(rid: str, node: str, stage: Stage, action: Action, alerts: list[str],
         at: datetime) -> RepairRecord:
    return RepairRecord(repair_id=rid, cluster="c1", node=node, machine_id=f"m-{node}",
                        action=action, stage=stage,
                        requester=Requester(kind=RequesterKind.system, name="autorepair"),
                        alert_ids=alerts, workflow_id=f"repair/c1/{node}/{rid}", updated_at=at)


async def _play(acts: LedgerActivities, rid: str, node: str, alerts: list[str],
                steps: list[tuple[str, Any, float]]) -> None:
    """Replay the calls RepairWorkflow makes: ('t', stage, minute) transitions and
    ('u', (stage, action), minute) repair upserts."""
    env = ActivityEnvironment()
    for kind, what, minute in steps:
        if kind == "t":
            await env.run(acts.record_transition, TransitionRecord(
                repair_id=rid, stage=what, at=_at(minute), reason=f"{what.value} reason"))
        else:
            stage, action = what
            await env.run(acts.upsert_repair, _rec(rid, node, stage, action, alerts,
                                                   _at(minute)))


async def test_finished_repair_records_downtime_cost_and_notifies_once(
        ledger_pool: asyncpg.Pool, hook: tuple[list[dict[str, Any]], str]) -> None:
    got, url = hook
    notifier = Notifier(NotificationsConfig(webhook_url=url))
    acts = LedgerActivities(ledger_pool, providers=PROVIDERS, notifier=notifier)
    # ingest stamped this alert with the node's IP-based facts (coreweave, 4.0/GPU-h)
    stamped = {"autorepair.provider": "coreweave", "autorepair.provider.gpus_per_node": 8,
               "autorepair.provider.hourly_rate": 4.0, "autorepair.provider.currency": "USD"}
    await acts.record_alert(_alert("a-1", "gpu-01", stamped))
    await _play(acts, "r-1", "gpu-01", ["a-1"], [
        ("u", (Stage.recommended, Action.reboot), 0), ("t", Stage.recommended, 0),
        ("t", Stage.awaiting_approval, 1),
        ("u", (Stage.awaiting_approval, Action.power_cycle), 1),   # the ladder's action
        ("u", (Stage.awaiting_approval, Action.power_cycle), 20),  # approved: no second note
        ("t", Stage.cordoning, 20), ("t", Stage.waiting_for_idle, 21),
        ("t", Stage.draining, 51), ("t", Stage.repairing, 52), ("t", Stage.joining, 60),
        ("t", Stage.running, 65), ("t", Stage.succeeded, 65),
        ("u", (Stage.succeeded, Action.power_cycle), 65),
    ])
    # a retried terminal upsert notifies nothing new and rewrites the same figures
    await ActivityEnvironment().run(acts.upsert_repair, _rec(
        "r-1", "gpu-01", Stage.succeeded, Action.power_cycle, ["a-1"], _at(65)))
    assert await notifier.drain(10)
    assert [(b["event"], b["action"]) for b in got] == [
        ("approval_needed", "power_cycle"), ("repair_started", "power_cycle"),
        ("repair_finished", "power_cycle")]
    assert got[0]["hints"][0] == "autorepair repairs approve r-1"
    assert got[0]["summary"] == "Xid 79 on gpu-01"
    row = (await Ledger(ledger_pool).get_repair("r-1"))["downtime"]  # type: ignore[index]
    assert row["outcome"] == "succeeded" and row["fault_kind"] == "xid"
    assert row["action"] == "power_cycle" and row["provider"] == "coreweave"
    assert row["duration_s"] == 45 * 60 and row["idle_wait_s"] == 30 * 60
    assert row["gpu_hours"] == pytest.approx(6.0)                 # 8 GPUs × 45 min
    assert row["idle_wait_gpu_hours"] == pytest.approx(4.0)
    assert row["out_of_service_gpu_hours"] == pytest.approx(2.0)
    assert row["cost"] == pytest.approx(24.0)                     # 6 GPU-h × 4.0
    await notifier.aclose()


async def test_failure_is_notified_by_the_workflow_with_ledger_facts(
        ledger_pool: asyncpg.Pool, hook: tuple[list[dict[str, Any]], str]) -> None:
    got, url = hook
    notifier = Notifier(NotificationsConfig(webhook_url=url))
    acts = LedgerActivities(ledger_pool, providers=PROVIDERS, notifier=notifier)
    await acts.record_alert(_alert("a-2", "gpu-02"))
    stored = await Ledger(ledger_pool).get_alert("a-2")
    assert stored is not None and stored.evidence["autorepair.provider"] == "onprem"
    await _play(acts, "r-2", "gpu-02", ["a-2"], [
        ("u", (Stage.recommended, Action.power_cycle), 0), ("t", Stage.recommended, 0),
        ("u", (Stage.recommended, Action.power_cycle), 0),
        ("t", Stage.cordoning, 2), ("t", Stage.draining, 3), ("t", Stage.repairing, 4),
        ("t", Stage.failed, 34), ("u", (Stage.failed, Action.power_cycle), 34),
    ])
    note = NotifyActivities(NotificationsConfig(), notifier=notifier, ledger=acts.ledger)
    await ActivityEnvironment().run(note.notify, Notification(
        cluster="c1", node="gpu-02", repair_id="r-2", subject="repair r-2 failed",
        body="power_cycle failed: BMC refused", severity="critical"))
    assert await notifier.drain(10)
    assert [b["event"] for b in got] == ["repair_started", "repair_failed"]
    failed = got[1]
    assert failed["action"] == "power_cycle" and failed["stage"] == "failed"
    assert failed["evidence"][0]["alert_id"] == "a-2"
    assert failed["detail"] == ("failed: power_cycle failed: BMC refused "
                                "(action power_cycle, node gpu-02)")
    down = (await Ledger(ledger_pool).get_repair("r-2"))["downtime"]  # type: ignore[index]
    assert down["gpu_hours"] == pytest.approx(8 * 32 / 60)       # cordon → end, no rejoin
    assert down["cost"] == pytest.approx(8 * 32 / 60 * 2.0)      # cluster rule's rate
    await notifier.aclose()


async def test_failed_verdict_notified_once(
        ledger_pool: asyncpg.Pool, hook: tuple[list[dict[str, Any]], str]) -> None:
    got, url = hook
    notifier = Notifier(NotificationsConfig(webhook_url=url))
    acts = LedgerActivities(ledger_pool, notifier=notifier)
    res = ValidationResult(machine="m-7", verdict=Verdict.failed, reason="1 check failed",
                           ticket_id="HW-1", checks=[CheckResult(
                               name="nccl_all_reduce", outcome=CheckOutcome.failed,
                               detail="busbw 80 GB/s < 350")])
    v = VerdictRecord(run_id="run-1", cluster="c1", machine="m-7", verdict=Verdict.failed,
                      result=res, at=T0)
    await acts.record_verdict(v)
    await acts.record_verdict(v)     # retried activity
    assert await notifier.drain(10)
    assert [b["event"] for b in got] == ["validation_failed"]
    assert got[0]["subject"] == "m-7: validation failed — 1 check failed"
    assert "nccl_all_reduce: failed busbw 80 GB/s < 350" in got[0]["description"]
    await notifier.aclose()


async def test_fleet_report_sums_the_window(ledger_pool: asyncpg.Pool) -> None:
    acts = LedgerActivities(ledger_pool, providers=PROVIDERS)
    await acts.record_alert(_alert("a-3", "gpu-03"))
    await _play(acts, "r-3", "gpu-03", ["a-3"], [
        ("u", (Stage.recommended, Action.reboot), 0), ("t", Stage.recommended, 0),
        ("t", Stage.cordoning, 10), ("t", Stage.running, 40), ("t", Stage.succeeded, 40),
        ("u", (Stage.succeeded, Action.reboot), 40)])
    await _play(acts, "r-4", "gpu-03", [], [
        ("u", (Stage.recommended, Action.reprovision), 100), ("t", Stage.recommended, 100),
        ("t", Stage.cordoning, 110), ("t", Stage.timed_out, 170),
        ("u", (Stage.timed_out, Action.reprovision), 170)])
    await _play(acts, "r-5", "gpu-04", [], [
        ("u", (Stage.recommended, Action.reboot), 0), ("t", Stage.recommended, 0)])  # open
    await _play(acts, "r-old", "gpu-05", [], [
        ("u", (Stage.recommended, Action.reboot), -3000), ("t", Stage.rejected, -2990)])
    rep = await fleet_report(Ledger(ledger_pool), _at(-60), _at(600), currency="USD")
    assert rep["repairs"] == 2 and rep["open"] == 1
    assert rep["outcomes"] == {"succeeded": 1, "timed_out": 1}
    assert rep["mttr_s"] == 40 * 60
    assert rep["gpu_hours"] == pytest.approx(8 * 0.5 + 8 * 1.0)
    assert rep["cost"] == pytest.approx(12 * 2.0)
    assert rep["top_fault_kinds"][0]["fault_kind"] in ("xid", "manual")
    assert {k["fault_kind"] for k in rep["by_fault_kind"]} == {"xid", "manual"}
    assert rep["top_machines"] == [{"machine": "m-gpu-03", "repairs": 2,
                                    "gpu_hours": pytest.approx(12.0),
                                    "cost": pytest.approx(24.0), "failed": 1}]
    assert {r["action"] for r in rep["by_action"]} == {"reboot", "reprovision"}
    assert rep["daily"] == [{"day": "2026-11-02", "repairs": 2,
                             "gpu_hours": pytest.approx(12.0), "cost": pytest.approx(24.0)}]
    empty = await fleet_report(Ledger(ledger_pool), _at(1000), _at(2000), cluster="c9")
    assert empty["repairs"] == 0 and empty["mttr_s"] is None and empty["cost"] == 0


async def test_report_lists_repeat_offender_machines_with_their_repairs(ledger_pool: Any) -> None:
    """Issue 31 item 2: the report's ``repeat_offenders`` are the machines the repair's
    own rule calls repeat offenders at the window's end (3 disruptive repairs in 30 days,
    any fault kinds), with their repairs; a machine with two, or with a cancelled third,
    is not one."""
    from workflows.activity_api import AttemptRecord
    from workflows.config import RepeatOffenderConfig

    led = Ledger(ledger_pool)
    until = _at(600)
    plan = [("m-bad", "r1", "power_cycle", "succeeded", 20, "xid"),
            ("m-bad", "r2", "reboot", "failed", 10, "ecc"),
            ("m-bad", "r2", "reprovision", "succeeded", 9.9, "ecc"),
            ("m-bad", "r3", "reset_gpu", "succeeded", 1, "nvlink"),
            ("m-ok", "r4", "reboot", "succeeded", 5, "xid"),
            ("m-ok", "r5", "reboot", "succeeded", 4, "xid"),
            ("m-ok", "r6", "reboot", "cancelled", 3, "xid")]
    for machine, rid, action, outcome, days, kind in plan:
        await led.record_attempt(AttemptRecord(
            repair_id=rid, cluster="c1", node=f"n-{machine}", machine_id=machine,
            action=action, alert_kind=kind, code=None, outcome=outcome,
            at=until - timedelta(days=days)))
    rep = await fleet_report(led, _at(-60), until, currency="USD")
    assert [o["machine"] for o in rep["repeat_offenders"]] == ["m-bad"]
    bad = rep["repeat_offenders"][0]
    assert bad["disruptive_repairs"] == 3 and bad["cluster"] == "c1"
    assert [r["repair_id"] for r in bad["repairs"]] == ["r1", "r2", "r3"]
    assert bad["repairs"][1]["actions"] == ["reboot", "reprovision"]
    # a stricter rule finds none; a shorter window leaves r1 out
    strict = await fleet_report(led, _at(-60), until, repeat=RepeatOffenderConfig(threshold=4))
    assert strict["repeat_offenders"] == []
    short = await fleet_report(led, _at(-60), until,
                               repeat=RepeatOffenderConfig(window_s=15 * 86400))
    assert short["repeat_offenders"] == []
