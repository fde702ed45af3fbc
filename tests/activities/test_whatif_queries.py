"""The what-if's ledger queries (activities/ledger_queries.py) on a real PostgreSQL with
hand-computed answers: keyset pages in observation order without the guard's own alerts,
median stage durations per action, the approval wait, attempt outcomes, breaker resets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.ledger import Ledger
from activities.ledger_queries import (
    breaker_reset_median,
    domain_release_median,
    whatif_alerts,
    whatif_measures,
)
from workflows.models import Action, Alert, Severity

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _alert(aid: str, t_s: float, kind: str = "xid", active: bool = True,
           cluster: str = "c", evidence: dict[str, Any] | None = None) -> Alert:
    return Alert(alert_id=aid, cluster=cluster, node="n1", kind=kind, evidence=evidence or {},
                 code=79 if kind == "xid" else None, severity=Severity.critical,
                 summary=kind, actionable=kind == "xid", action=Action.power_cycle
                 if kind == "xid" else Action.none, active=active,
                 observed_at=T0 + timedelta(seconds=t_s))


async def test_alerts_come_in_keyset_pages_in_observation_order(ledger_pool: Any) -> None:
    led = Ledger(ledger_pool)
    # two at the same time (ordered by id), one outside the window, one breaker alert
    for a in (_alert("b", 10), _alert("a", 10), _alert("c", 5), _alert("late", 99999),
              _alert("brk", 20, kind="circuit_breaker"), _alert("other", 7, cluster="d"),
              _alert("dom", 30, kind="failure_domain", evidence={"domain": "r1"})):
        await led.record_alert(a)
    pages = [[a.alert_id for a in p] async for p in whatif_alerts(
        ledger_pool, T0, T0 + timedelta(hours=1), batch=2)]
    assert pages == [["c", "other"], ["a", "b"]]
    only_c = [a.alert_id async for p in whatif_alerts(
        ledger_pool, T0, T0 + timedelta(hours=1), cluster="c", batch=2) for a in p]
    assert only_c == ["c", "a", "b"]
    with pytest.raises(ValueError, match="batch"):
        async for _ in whatif_alerts(ledger_pool, T0, T0, batch=0):
            pass


async def test_measures_are_medians_of_the_recorded_stages(ledger_pool: Any) -> None:
    """Two power cycles: draining 60 s / 120 s (median 90), repairing 600 / 800 (700);
    one waited 1 h for approval; one attempt failed, one succeeded."""
    rows = [("r1", [("recommended", 0), ("awaiting_approval", 0), ("cordoning", 3600),
                    ("draining", 3600), ("repairing", 3660), ("joining", 4260),
                    ("succeeded", 4300)]),
            ("r2", [("recommended", 0), ("cordoning", 0), ("draining", 0), ("repairing", 120),
                    ("joining", 920), ("failed", 930)])]
    async with ledger_pool.acquire() as conn:
        for rid, steps in rows:
            await conn.execute(
                """INSERT INTO repairs (repair_id, cluster, node, action, stage, requester_kind,
                     requester_name, created_at, updated_at)
                   VALUES ($1, 'c', 'n1', 'power_cycle', 'succeeded', 'system', 'a', $2, $2)""",
                rid, T0)
            for st, t in steps:
                await conn.execute("INSERT INTO repair_transitions (repair_id, stage, at) "
                                   "VALUES ($1, $2, $3)", rid, st, T0 + timedelta(seconds=t))
        for i, outcome in enumerate(("failed", "succeeded")):
            await conn.execute(
                """INSERT INTO repair_attempts (repair_id, cluster, node, action, alert_kind,
                     outcome, at) VALUES ($1, 'c', 'n1', 'power_cycle', 'xid', $2, $3)""",
                f"r{i + 1}", outcome, T0 + timedelta(seconds=i))
    by_action, approval, outcomes = await whatif_measures(ledger_pool, T0,
                                                          T0 + timedelta(days=1))
    assert by_action["power_cycle"]["draining"] == pytest.approx(90.0)
    assert by_action["power_cycle"]["repairing"] == pytest.approx(700.0)
    assert approval == pytest.approx(3600.0)
    assert outcomes == {("c", "n1", "power_cycle"): ["failed", "succeeded"]}


async def test_breaker_reset_median(ledger_pool: Any) -> None:
    """Trips reset after 600 s and 1800 s (median 1200 s); one never reset."""
    led = Ledger(ledger_pool)
    assert await breaker_reset_median(ledger_pool, T0, T0 + timedelta(days=1)) is None
    for aid, t, active in (("t1", 0, True), ("r1", 600, False), ("t2", 5000, True),
                           ("r2", 6800, False), ("t3", 9000, True)):
        await led.record_alert(_alert(aid, t, kind="circuit_breaker", active=active))
    got = await breaker_reset_median(ledger_pool, T0, T0 + timedelta(days=1))
    assert got == pytest.approx(1200.0)


async def test_domain_release_median_pairs_holds_per_domain(ledger_pool: Any) -> None:
    """rack-1 held at 0 s, released at 600 s; rack-2 held at 100 s (between them),
    released at 3700 s (3600 s); rack-1 held again at 5000 s, never released: the median
    over the released holds is (600 + 3600) / 2 = 2100 s. Pairing by cluster alone would
    pair rack-1's hold with rack-2's (still-active) hold and miss it."""
    led = Ledger(ledger_pool)
    assert await domain_release_median(ledger_pool, T0, T0 + timedelta(days=1)) is None
    for aid, t, active, dom in (("h1", 0, True, "rack-1"), ("h2", 100, True, "rack-2"),
                                ("h1/release", 600, False, "rack-1"),
                                ("h2/release", 3700, False, "rack-2"),
                                ("h3", 5000, True, "rack-1")):
        await led.record_alert(_alert(aid, t, kind="failure_domain", active=active,
                                      evidence={"domain": dom}))
    got = await domain_release_median(ledger_pool, T0, T0 + timedelta(days=1))
    assert got == pytest.approx(2100.0)
    assert await domain_release_median(ledger_pool, T0, T0 + timedelta(days=1),
                                       cluster="other") is None
