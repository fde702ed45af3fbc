"""Reliability figures (issue 31 item 4) from a known ledger, built with the ledger
activities the RepairWorkflow uses, with hand-computed expectations: through
``GET /api/v1/report``, ``autorepair report --json`` and the table, and the MCP
``fleet_summary``; the pure arithmetic (:mod:`activities.reliability`) on its own."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from temporalio.testing import ActivityEnvironment

from activities.ledger_activities import LedgerActivities
from activities.reliability import NO_FLEET, decision_of, fleet_gpus, reliability_figures
from tests.detectors.conftest import Stack
from tests.detectors.test_cli import api_url, cli  # noqa: F401  (fixture)
from tests.detectors.test_report import cells
from workers.fleet_models import FleetSummaryInput
from workers.fleet_query import FleetQuery
from workflows.activity_api import AttemptRecord, RepairRecord, TransitionRecord
from workflows.models import AUTO_APPROVED, Action, Requester, RequesterKind, Stage

VIEW = {"Authorization": "Bearer view-token"}
SYS = Requester(kind=RequesterKind.system, name="autorepair")
ALICE = Requester(kind=RequesterKind.user, name="alice")
SCANNER = Requester(kind=RequesterKind.detector, name="scanner")
LADDER_UP = "ladder:reboot x2 in 604800s -> reprovision"

# repair, node, requester, approved_by, rule, [(stage, minute)], [(action, outcome, minute)]
PLAN = [
    ("r1", "gpu-01", SYS, AUTO_APPROVED, None,
     [(Stage.recommended, 0), (Stage.succeeded, 60)], [(Action.reboot, "succeeded", 30)]),
    ("r2", "gpu-01", SYS, "alice", None,
     [(Stage.recommended, 120), (Stage.succeeded, 240)],
     [(Action.reboot, "failed", 150), (Action.reprovision, "succeeded", 200)]),
    ("r3", "gpu-01", ALICE, "alice", None,
     [(Stage.recommended, 480), (Stage.succeeded, 510)], [(Action.power_cycle, "succeeded", 490)]),
    ("r4", "gpu-02", SCANNER, AUTO_APPROVED, LADDER_UP,
     [(Stage.recommended, 60), (Stage.succeeded, 100)], [(Action.reprovision, "succeeded", 80)]),
    ("r5", "gpu-02", SYS, AUTO_APPROVED, None,
     [(Stage.recommended, 300), (Stage.failed, 330)],
     [(Action.reboot, "cancelled", 305), (Action.power_cycle, "failed", 310)]),
    ("r6", "gpu-03", SYS, None, None, [(Stage.recommended, 100), (Stage.rejected, 130)], []),
    ("r7", "gpu-04", SYS, None, None, [(Stage.recommended, 200), (Stage.auto_resolved, 205)], []),
    ("r8", "gpu-03", SYS, None, None, [(Stage.recommended, 600)], []),
]

# Hand-computed from PLAN (window: the last day; 4 nodes x 8 GPUs = 32 GPUs = 32 GPU-days):
EXPECTED_MTTR = {"automatic": 3600.0, "approved": 7200.0, "operator": 1800.0,
                 "detector": 2400.0}                   # r1 60 min, r2 120, r3 30, r4 40
# r1..r7 ended; r1 and r4 succeeded without a person
EXPECTED_AUTO = {"auto_remediated": 2, "repairs": 7, "rate": 2 / 7}
# reboot r1, reboot+reprovision r2, power_cycle r3, reprovision r4, power_cycle r5
# (r5's cancelled reboot does not count): 6 / 32 GPU-days x 1000
EXPECTED_PER_1K = 6 / 32 * 1000
# incidents: m-gpu-01 at 0, 120, 480 (gaps 120, 360 min); m-gpu-02 at 60, 300 (240 min);
# m-gpu-03 at 100, 600 (500 min); m-gpu-04 once. Pooled gaps 120, 240, 360, 500 min.
EXPECTED_TBI_MEDIAN = (240 + 360) / 2 * 60
EXPECTED_WORST = [("m-gpu-01", 3, 240 * 60, 120 * 60), ("m-gpu-02", 2, 240 * 60, 240 * 60),
                  ("m-gpu-03", 2, 500 * 60, 500 * 60)]
# acted: r1..r5; second rung: r2 (reboot then reprovision), r4 (started a rung up)
EXPECTED_SECOND = {"repairs_with_actions": 5, "second_rung": 2, "share": 0.4}


async def seed(stack: Stack, now: datetime) -> None:
    acts = LedgerActivities(stack.ledger.pool)
    env = ActivityEnvironment()
    t0 = now - timedelta(hours=20)
    for rid, node, who, approved, rule, steps, attempts in PLAN:
        rec = RepairRecord(repair_id=rid, cluster=stack.cluster, node=node,
                           machine_id=f"m-{node}", action=Action.reboot, stage=steps[0][0],
                           requester=who, approved_by=approved, decided_by_rule=rule,
                           updated_at=t0 + timedelta(minutes=steps[0][1]))
        await env.run(acts.upsert_repair, rec)
        for action, outcome, minute in attempts:
            await env.run(acts.record_attempt, AttemptRecord(
                repair_id=rid, cluster=stack.cluster, node=node, machine_id=f"m-{node}",
                action=action, alert_kind="xid", code=79, outcome=outcome,
                at=t0 + timedelta(minutes=minute)))
        for stage, minute in steps:
            await env.run(acts.record_transition, TransitionRecord(
                repair_id=rid, stage=stage, at=t0 + timedelta(minutes=minute)))
        await env.run(acts.upsert_repair, rec.model_copy(update={
            "stage": steps[-1][0], "updated_at": t0 + timedelta(minutes=steps[-1][1])}))


def check(rel: dict) -> None:
    assert {k: v["mttr_s"] for k, v in rel["mttr_by_decision"].items()} == EXPECTED_MTTR
    assert all(v["repairs"] == 1 for v in rel["mttr_by_decision"].values())
    assert rel["auto_remediation"] == EXPECTED_AUTO
    assert rel["disruptive_actions"] == 6 and rel["fleet_gpus"] == 32
    assert rel["gpu_days"] == 32.0
    assert rel["disruptive_per_1k_gpu_days"] == EXPECTED_PER_1K
    tbi = rel["time_between_incidents"]
    assert tbi["median_s"] == EXPECTED_TBI_MEDIAN and tbi["gaps"] == 4 and tbi["machines"] == 3
    assert [(w["machine"], w["incidents"], w["median_gap_s"], w["min_gap_s"])
            for w in tbi["worst"]] == EXPECTED_WORST
    assert rel["second_rung"] == EXPECTED_SECOND
    assert rel["notes"] == []


async def test_reliability_figures_through_api_cli_and_mcp(stack: Stack, api_url: str) -> None:  # noqa: F811
    now = datetime.now(UTC).replace(microsecond=0)
    await seed(stack, now)
    params = {"since": "1d", "until": now.isoformat()}
    r = await stack.http.get("/api/v1/report", params=params, headers=VIEW)
    assert r.status_code == 200, r.text
    check(r.json()["reliability"])

    res = await cli("report", "--api", api_url, "--json", "--since", "1d", token="view-token")
    assert res.exit_code == 0, res.output
    rel = json.loads(res.output)["reliability"]
    # the CLI's window ends at its own now: the same repairs and attempts, other GPU-days
    assert rel["auto_remediation"] == EXPECTED_AUTO
    assert rel["second_rung"] == EXPECTED_SECOND
    assert rel["time_between_incidents"]["median_s"] == EXPECTED_TBI_MEDIAN
    res = await cli("report", "--api", api_url, "--since", "1d", token="view-token")
    out = cells(res.output)
    assert res.exit_code == 0, res.output
    assert "auto-remediation rate 28.6 % (2 of 7)" in out
    assert "needed a second rung 40.0 % (2 of 5)" in out
    assert "time between incidents (median) 5.00 h" in out
    assert "MTTR by decision" in out and "approved 1 2.00 h 2.00 h" in out
    assert "m-gpu-01 3 4.00 h 2.00 h" in out

    fq = FleetQuery(stack.config, stack.ledger.pool, clock=lambda: now)
    summary = await fq.fleet_summary(FleetSummaryInput(since="1d"))
    check(summary.reliability)


def test_decision_and_unknown_fleet() -> None:
    """How a repair was decided, and a fleet of unknown size: the per-GPU-day rate is
    ``None`` with a note (never a division by zero or a made-up denominator)."""
    assert decision_of("system", AUTO_APPROVED) == "automatic"
    assert decision_of("system", None) == "automatic"
    assert decision_of("system", "alice") == "approved"
    assert decision_of("user", "alice") == "operator"
    assert decision_of("detector", AUTO_APPROVED) == "detector"
    now = datetime(2026, 12, 1, tzinfo=UTC)
    rel = reliability_figures([], [], [], now - timedelta(days=7), now, None)
    assert rel["disruptive_per_1k_gpu_days"] is None and rel["notes"] == [NO_FLEET]
    assert rel["auto_remediation"]["rate"] is None and rel["second_rung"]["share"] is None
    from workflows.config import AutorepairConfig

    cfg = AutorepairConfig.model_validate({
        "providers": {"default_gpus_per_node": 4,
                      "rules": [{"match": {"node": "big-*"}, "gpus_per_node": 16}]},
        "clusters": [{"name": "a", "gpu_nodes": 10, "nodes": [{"name": "big-1"},
                                                              {"name": "n-2"}]},
                     {"name": "b", "gpu_nodes": 3}]})
    assert fleet_gpus(cfg) == 16 + 4 + 8 * 4 + 3 * 4
    assert fleet_gpus(cfg, "b") == 12 and fleet_gpus(cfg, "zzz") is None
