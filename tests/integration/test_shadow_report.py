"""The fleet report keeps shadowed repairs apart (issue 29 item 3; real PostgreSQL): a
known ledger of three shadowed repairs and one real one, figures computed by hand."""

from __future__ import annotations

from typing import Any

import asyncpg
from rich.console import Console
from temporalio.testing import ActivityEnvironment

from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from activities.ledger_reports import fleet_report
from activities.notifications import Notifier
from tests.integration.test_repair_costs import (  # noqa: F401 (hook: a fixture)
    PROVIDERS,
    _alert,
    _at,
    _play,
    _rec,
    hook,
)
from workers.report import report_tables
from workflows.activity_api import AttemptRecord, GuardStateQuery, TransitionRecord
from workflows.config import NotificationsConfig
from workflows.models import Action, Stage


async def _attempt(acts: LedgerActivities, rid: str, node: str, action: Action, outcome: str,
                   minute: float) -> None:
    await ActivityEnvironment().run(acts.record_attempt, AttemptRecord(
        repair_id=rid, cluster="c1", node=node, machine_id=f"m-{node}", action=action,
        alert_kind="xid", code=79, outcome=outcome, at=_at(minute)))


async def test_report_counts_shadowed_repairs_apart(ledger_pool: asyncpg.Pool) -> None:
    acts = LedgerActivities(ledger_pool, providers=PROVIDERS)
    # three shadowed repairs on one machine (a repeat offender, had they acted) ...
    for i, action in enumerate((Action.power_cycle, Action.reboot, Action.power_cycle)):
        rid = f"s-{i}"
        await acts.record_alert(_alert(f"a-{rid}", "gpu-11"))
        await _play(acts, rid, "gpu-11", [f"a-{rid}"], [
            ("u", (Stage.recommended, action), 10 * i), ("t", Stage.recommended, 10 * i),
            ("t", Stage.shadowed, 10 * i + 1), ("u", (Stage.shadowed, action), 10 * i + 1)])
        await _attempt(acts, rid, "gpu-11", action, "shadowed", 10 * i + 1)
    # ... and one real repair: recommended at 0, cordoned at 10, back at 40
    await acts.record_alert(_alert("a-e", "gpu-12"))
    await _play(acts, "e-1", "gpu-12", ["a-e"], [
        ("u", (Stage.recommended, Action.reboot), 0), ("t", Stage.recommended, 0),
        ("t", Stage.cordoning, 10), ("t", Stage.running, 40), ("t", Stage.succeeded, 40),
        ("u", (Stage.succeeded, Action.reboot), 40)])
    await _attempt(acts, "e-1", "gpu-12", Action.reboot, "succeeded", 35)
    rep = await fleet_report(Ledger(ledger_pool), _at(-60), _at(600), cluster="c1")
    assert rep["shadowed"] == {"repairs": 3, "by_action": {"power_cycle": 2, "reboot": 1},
                               "by_cluster": {"c1": 3}}
    # every other figure is the real repair's alone
    assert rep["repairs"] == 1 and rep["outcomes"] == {"succeeded": 1}
    assert rep["mttr_s"] == 40 * 60
    assert [r["action"] for r in rep["by_action"]] == ["reboot"]
    assert [r["machine"] for r in rep["top_machines"]] == ["m-gpu-12"]
    rel: dict[str, Any] = rep["reliability"]
    assert rel["auto_remediation"] == {"auto_remediated": 1, "repairs": 1, "rate": 1.0}
    assert rel["disruptive_actions"] == 1
    assert rel["second_rung"]["repairs_with_actions"] == 1
    assert rep["repeat_offenders"] == []  # three shadowed repairs touched nothing
    console = Console(record=True, width=200)
    console.print(report_tables(rep))
    text = " ".join(console.export_text().split())  # titles wrap over narrow tables
    assert "shadow mode: would have run" in text and "power_cycle" in text
    assert "shadowed (shadow mode: nothing done)" in text


async def test_a_shadowed_end_is_notified_as_shadow(
        ledger_pool: asyncpg.Pool,
        hook: tuple[list[dict[str, Any]], str]) -> None:  # noqa: F811 (the fixture)
    got, url = hook
    notifier = Notifier(NotificationsConfig(webhook_url=url))
    acts = LedgerActivities(ledger_pool, providers=PROVIDERS, notifier=notifier)
    await acts.record_alert(_alert("a-n", "gpu-21"))
    why = ("shadow mode: would cordon gpu-21, wait for idle (max 7200 s) and drain it, then "
           "power-cycle m-gpu-21 through its BMC; nothing was done (shadow mode)")
    env = ActivityEnvironment()
    await _play(acts, "n-1", "gpu-21", ["a-n"], [
        ("u", (Stage.recommended, Action.power_cycle), 0), ("t", Stage.recommended, 0)])
    await env.run(acts.record_transition, TransitionRecord(
        repair_id="n-1", stage=Stage.shadowed, at=_at(1), reason=why))
    await env.run(acts.upsert_repair, _rec("n-1", "gpu-21", Stage.shadowed,
                                           Action.power_cycle, ["a-n"], _at(1)))
    assert await notifier.drain(10)
    assert [(b["event"], b["stage"]) for b in got] == [("repair_finished", "shadowed")]
    assert got[0]["subject"] == ("shadow: repair n-1 would power_cycle gpu-21 "
                                 "(nothing was done)")
    assert got[0]["body"] == why
    await notifier.aclose()


async def test_a_rebuilt_guard_counts_automatic_shadowed_repairs(
        ledger_pool: asyncpg.Pool) -> None:
    """A guard rebuilt from the ledger counts an automatic shadowed repair in its breaker
    window as it counts an automatic cordon (the lease it held stood for one)."""
    acts = LedgerActivities(ledger_pool)
    env = ActivityEnvironment()
    for rid, stage in (("g-1", Stage.shadowed), ("g-2", Stage.cordoning),
                       ("g-3", Stage.auto_resolved)):
        rec = _rec(rid, f"gpu-3{rid[-1]}", stage, Action.reboot, [], _at(5))
        rec = rec.model_copy(update={"cluster": "c-guard", "approved_by": "auto-approved"})
        await env.run(acts.upsert_repair, rec)
        await env.run(acts.record_transition, TransitionRecord(
            repair_id=rid, stage=stage, at=_at(5), reason="x"))
    st = await Ledger(ledger_pool).guard_state(GuardStateQuery(cluster="c-guard",
                                                               since=_at(0)))
    assert sorted(a.repair_id for a in st.automatic) == ["g-1", "g-2"]
