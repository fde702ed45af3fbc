"""Unit tests of the pure repair policy (no Temporal)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workflows.activity_api import AttemptRecord
from workflows.config import (
    CatalogueConfig,
    CatalogueOverride,
    ConsentConfig,
    LadderConfig,
    MigrateGateConfig,
    RailsConfig,
)
from workflows.models import Action, Alert, Requester, RequesterKind, Severity
from workflows.policy import (
    breaker_threshold,
    breaker_trips,
    choose_action,
    concurrency_budget,
    consent_decision,
    count_in_window,
    decide_node_action,
    evidence_current,
    in_cooldown,
    ladder_decision,
    migrate_gate,
    next_rung,
    node_actions_in_window,
    persistence_for,
)

NOW = datetime(2025, 3, 1, tzinfo=UTC)


def alert(**kw: object) -> Alert:
    base: dict[str, object] = dict(
        alert_id="a",
        cluster="c",
        node="n",
        kind="xid",
        code=79,
        severity="critical",
        actionable=True,
        action="power_cycle",
        summary="s",
        observed_at=NOW,
    )
    base.update(kw)
    return Alert.model_validate(base)


def attempt(
    action: Action, outcome: str = "failed", days: float = 1, **kw: object
) -> AttemptRecord:
    base: dict[str, object] = dict(
        repair_id="r",
        cluster="c",
        node="n",
        machine_id="m",
        action=action,
        alert_kind="xid",
        code=79,
        outcome=outcome,
        at=NOW - timedelta(days=days),
    )
    base.update(kw)
    return AttemptRecord.model_validate(base)


# ---- catalogue ---------------------------------------------------------------------
def test_app_xids_never_repair_but_repeats_ask_for_diagnostics() -> None:
    cat = CatalogueConfig()
    for code in (13, 31, 43, 45, 94):
        d = decide_node_action(alert(code=code, action="reboot"), cat)
        assert not d.actionable and d.action == Action.none and not d.diagnostic
    d = decide_node_action(alert(code=13), cat, repeats_same_gpu=2)
    assert d.diagnostic and not d.actionable and d.rule == "xid:13:repeat"


def test_straggler_asks_for_diagnostics_never_a_repair() -> None:
    cat = CatalogueConfig()
    slow = alert(kind="straggler", code=None, severity="warning", actionable=False, action="none",
                 level=True)
    d = decide_node_action(slow, cat)
    assert d.diagnostic and not d.actionable and d.action == Action.none
    assert d.rule == "straggler:diagnose"
    assert not decide_node_action(slow.model_copy(update={"active": False}), cat).diagnostic


def test_override_counts_in_window_scenario_9() -> None:
    cat = CatalogueConfig(xid={43: CatalogueOverride(action=Action.reboot, count=5, window_s=600)})
    assert not decide_node_action(alert(code=43), cat, occurrences_in_window=4).actionable
    d = decide_node_action(alert(code=43), cat, occurrences_in_window=5)
    assert d.actionable and d.action == Action.reboot and d.rule == "xid:43:override"


def test_catalogue_default_and_clear() -> None:
    cat = CatalogueConfig()
    assert decide_node_action(alert(), cat).action == Action.power_cycle
    assert not decide_node_action(alert(active=False), cat).actionable
    # ingest's stamp is an annotation: the NodeWorkflow decides from the catalogue
    stale = decide_node_action(alert(actionable=False, action="none"), cat)
    assert stale.actionable and stale.action == Action.power_cycle
    assert not decide_node_action(alert(code=13, actionable=True, action="reboot"), cat).actionable
    cfg = CatalogueConfig(xid={79: CatalogueOverride(actionable=False)})
    assert not decide_node_action(alert(), cfg).actionable  # the worker's policy decides


def test_unmapped_code_is_observed_not_decided() -> None:
    d = decide_node_action(alert(code=9999, actionable=True, action="reboot"), CatalogueConfig())
    assert not d.actionable and d.rule == "xid:9999:unmapped"


def test_count_in_window() -> None:
    times = [NOW - timedelta(seconds=s) for s in (0, 100, 599, 601, 5000)]
    assert count_in_window(times, NOW, 600) == 3


# ---- consent -----------------------------------------------------------------------
def test_consent_rules() -> None:
    c = ConsentConfig()
    sys_req = Requester()
    assert consent_decision(Action.reboot, [alert()], sys_req, c).rule == "approve_before_repair"
    assert (
        consent_decision(
            Action.remove,
            [],
            Requester(kind=RequesterKind.user, name="u"),
            ConsentConfig(mode="automatic"),
        ).rule
        == "remove_is_human"
    )
    assert consent_decision(
        Action.reboot, [], Requester(kind=RequesterKind.user, name="u"), c
    ).automatic
    c2 = ConsentConfig(automatic_actions=[Action.reboot], automatic_xids=[79])
    assert consent_decision(Action.reboot, [alert(code=48)], sys_req, c2).rule == (
        "automatic_action:reboot"
    )
    d = consent_decision(Action.power_cycle, [alert()], sys_req, c2)
    assert d.automatic and d.rule == "automatic_xid:79"
    assert not consent_decision(Action.power_cycle, [alert(code=48)], sys_req, c2).automatic
    with pytest.raises(ValueError, match="remove"):
        ConsentConfig(automatic_actions=[Action.remove])


# ---- ladder and gate ---------------------------------------------------------------
def test_ladder_two_attempts_move_one_rung() -> None:
    lad = LadderConfig()
    one = ladder_decision(Action.reboot, [attempt(Action.reboot)], "xid", 79, "m", NOW, lad)
    assert one.action == Action.reboot and not one.escalated
    two = ladder_decision(Action.reboot, [attempt(Action.reboot)] * 2, "xid", 79, "m", NOW, lad)
    assert two.action == Action.reprovision and two.escalated


def test_ladder_excludes_cancelled_old_other_machine_other_code() -> None:
    lad = LadderConfig()
    atts = [
        attempt(Action.reboot, "cancelled"),
        attempt(Action.reboot, "auto_resolved"),
        attempt(Action.reboot, days=8),
        attempt(Action.reboot, machine_id="other"),
        attempt(Action.reboot, code=48),
        attempt(Action.reboot, alert_kind="ib_link_down"),
    ]
    assert ladder_decision(Action.reboot, atts, "xid", 79, "m", NOW, lad).action == Action.reboot


def test_ladder_top_rung_needs_human_scenario_8() -> None:
    lad = LadderConfig()
    atts = [
        attempt(a)
        for a in (
            Action.reboot,
            Action.reboot,
            Action.reprovision,
            Action.reprovision,
            Action.migrate,
            Action.migrate,
        )
    ]
    d = ladder_decision(Action.reboot, atts, "xid", 79, "m", NOW, lad)
    assert d.needs_human and d.action == Action.migrate
    assert next_rung(Action.migrate, lad) is None
    assert next_rung(Action.power_cycle, lad) == Action.reprovision
    assert next_rung(Action.reset_gpu, lad) == Action.reboot


def test_migrate_gate() -> None:
    g = MigrateGateConfig()
    warn = alert(severity="warning")
    assert migrate_gate(Action.migrate, [alert()], [], NOW, g).action == Action.migrate
    assert migrate_gate(Action.migrate, [warn], [], NOW, g).action == Action.reprovision
    old = alert(observed_at=NOW - timedelta(days=9))
    assert migrate_gate(Action.migrate, [warn], [old], NOW, g).action == Action.migrate
    older = alert(observed_at=NOW - timedelta(days=11))
    assert migrate_gate(Action.migrate, [warn], [older], NOW, g).action == Action.reprovision
    d = choose_action(
        Action.reprovision,
        [warn],
        [attempt(Action.reprovision, alert_kind="xid")] * 2,
        [],
        "m",
        NOW,
        LadderConfig(),
        g,
    )
    assert d.action == Action.reprovision and "gate:no critical" in d.rule


def test_migrate_gate_looks_at_age_not_at_still_active() -> None:
    g = MigrateGateConfig()
    warn = alert(severity="warning")
    # an Xid event is never cleared: "active" says nothing about whether it is recent
    stale_xid = alert(observed_at=NOW - timedelta(days=11))
    assert migrate_gate(Action.migrate, [stale_xid], [], NOW, g).action == Action.reprovision
    # a critical level fault that cleared 2 days ago still counts (within 10 days)
    cleared = alert(level=True, active=False, observed_at=NOW - timedelta(days=2))
    d = migrate_gate(Action.migrate, [cleared], [], NOW, g)
    assert d.action == Action.migrate and "within" in d.rule
    # a critical level fault still raised is "now", however old its first observation
    raised = alert(level=True, observed_at=NOW - timedelta(days=30))
    assert migrate_gate(Action.migrate, [raised], [], NOW, g).rule == "gate:critical alert now"
    assert migrate_gate(Action.migrate, [warn], [stale_xid], NOW, g).action == Action.reprovision


def test_ladder_counts_the_node_across_machines() -> None:
    lad = LadderConfig()
    moved = [
        attempt(Action.migrate, machine_id="m-old-a"),
        attempt(Action.migrate, machine_id="m-old-b"),
    ]
    # by machine only, the spare "m" has no history; by node, the fault climbed the ladder
    assert not ladder_decision(Action.migrate, moved, "xid", 79, "m", NOW, lad).needs_human
    d = ladder_decision(Action.migrate, moved, "xid", 79, "m", NOW, lad, node="n")
    assert d.needs_human and d.action == Action.migrate
    other_node = [a.model_copy(update={"node": "n2"}) for a in moved]
    assert not ladder_decision(Action.migrate, other_node, "xid", 79, "m", NOW, lad, "n").needs_human


def test_node_actions_in_window_counts_every_executed_action() -> None:
    atts = [
        attempt(Action.reboot, "succeeded"),
        attempt(Action.power_cycle, "failed", alert_kind="ib_link_down", code=None),
        attempt(Action.migrate, "succeeded", machine_id="spare-1"),
        attempt(Action.reboot, "cancelled"),
        attempt(Action.reboot, "auto_resolved"),
        attempt(Action.reboot, "succeeded", days=8),
        attempt(Action.reboot, "succeeded", node="n2"),
    ]
    # a cancelled attempt is recorded only when it touched the machine: it ran (break4)
    assert node_actions_in_window(atts, "n", NOW, 7 * 86400.0) == 4
    assert node_actions_in_window(atts, "n", NOW, 9 * 86400.0) == 5
    assert node_actions_in_window([], "n", NOW, 7 * 86400.0) == 0


# ---- rails -------------------------------------------------------------------------
def test_budget_and_breaker_arithmetic() -> None:
    r = RailsConfig()
    assert concurrency_budget(0, r) == 1
    assert concurrency_budget(100, r) == 5
    assert concurrency_budget(101, r) == 6
    assert concurrency_budget(0, r, seen_nodes=40) == 2
    assert breaker_threshold(8, r) == 2 and breaker_threshold(100, r) == 10
    times = [NOW - timedelta(seconds=s) for s in (1, 2, 3, 700)]
    assert breaker_trips(times, NOW, 20, r)  # 3 within 600 s > threshold 2
    assert not breaker_trips(times[1:], NOW, 20, r)  # 2 within the window, 1 outside


def test_persistence_cooldown_evidence() -> None:
    r = RailsConfig(persistence_by_kind={"ib_link_down": 120})
    assert persistence_for(alert(), r) == 0
    assert persistence_for(alert(kind="xfs_shutdown", level=True), r) == 60
    assert persistence_for(alert(kind="ib_link_down", level=True), r) == 120
    assert in_cooldown(NOW + timedelta(seconds=1), NOW) and not in_cooldown(None, NOW)
    lvl = alert(level=True, active=False)
    assert not evidence_current([lvl]) and evidence_current([])
    assert evidence_current([alert()])
    assert not evidence_current([alert()], not_before=NOW + timedelta(seconds=1))
    assert Severity.critical == alert().severity
