"""``GET /api/v1/report`` and ``autorepair report`` (table, ``--json``, ``--plot`` PNG), the
downtime of a finished repair in ``repairs show`` and ``status``, over a seeded ledger."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.ledger_activities import LedgerActivities
from tests.detectors.conftest import Stack
from tests.detectors.test_cli import api_url, cli, flat  # noqa: F401  (fixture)
from workflows.activity_api import RepairRecord, TransitionRecord
from workflows.config import ProvidersConfig
from workflows.models import Action, Alert, Requester, RequesterKind, Severity, Stage


def cells(text: str) -> str:
    """Table text with the column rules removed and whitespace collapsed."""
    return flat(text.replace("│", " ").replace("┃", " "))

VIEW = {"Authorization": "Bearer view-token"}
PROVIDERS = ProvidersConfig.model_validate({"currency": "EUR", "rules": [
    {"match": {"node": "gpu-0*"}, "provider": "onprem", "gpus_per_node": 8,
     "hourly_rate": 2.5}]})


async def seed(stack: Stack) -> datetime:
    """Two finished repairs (one succeeded after 30 min idle wait, one failed) and one open
    one, as the RepairWorkflow's ledger activities would record them."""
    acts = LedgerActivities(stack.ledger.pool, providers=PROVIDERS)
    env = ActivityEnvironment()
    c = stack.cluster
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=5)
    await acts.record_alert(Alert(
        alert_id="a-79", cluster=c, node="gpu-01", machine_id="m-gpu-01", kind="xid", code=79,
        severity=Severity.critical, actionable=True, action=Action.power_cycle,
        summary="Xid 79 on gpu-01", observed_at=t0))
    plan = [
        ("rep-a", "gpu-01", Action.power_cycle, ["a-79"],
         [(Stage.recommended, 0), (Stage.cordoning, 10), (Stage.waiting_for_idle, 11),
          (Stage.draining, 41), (Stage.repairing, 42), (Stage.running, 70),
          (Stage.succeeded, 70)]),
        ("rep-b", "gpu-02", Action.reboot, [],
         [(Stage.recommended, 100), (Stage.cordoning, 100), (Stage.failed, 160)]),
        ("rep-c", "gpu-03", Action.reboot, [], [(Stage.recommended, 200)]),
    ]
    for rid, node, action, alerts, steps in plan:
        rec = RepairRecord(repair_id=rid, cluster=c, node=node, machine_id=f"m-{node}",
                           action=action, stage=steps[0][0], alert_ids=alerts,
                           requester=Requester(kind=RequesterKind.system, name="autorepair"),
                           updated_at=t0)
        await env.run(acts.upsert_repair, rec)
        for stage, minute in steps:
            at = t0 + timedelta(minutes=minute)
            await env.run(acts.record_transition, TransitionRecord(
                repair_id=rid, stage=stage, at=at, reason=stage.value))
        last = steps[-1][0]
        await env.run(acts.upsert_repair, rec.model_copy(update={
            "stage": last, "updated_at": t0 + timedelta(minutes=steps[-1][1])}))
    return t0


async def test_report_endpoint_and_cli(stack: Stack, api_url: str, tmp_path: Path) -> None:  # noqa: F811
    await seed(stack)
    r = await stack.http.get("/api/v1/report", params={"since": "1d"}, headers=VIEW)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["repairs"] == 2 and doc["open"] == 1
    assert doc["outcomes"] == {"failed": 1, "succeeded": 1}
    assert doc["mttr_s"] == 70 * 60
    assert doc["gpu_hours"] == 8 * 1.0 + 8 * 1.0          # 60 min each, 8 GPUs
    assert doc["idle_wait_gpu_hours"] == 4.0             # 30 min of waiting for idle
    assert doc["cost"] == 16 * 2.5 and doc["currency"] == "EUR"
    assert doc["top_fault_kinds"][0]["fault_kind"] in {"xid", "manual"}
    assert {m["machine"] for m in doc["top_machines"]} == {"m-gpu-01", "m-gpu-02"}
    assert (await stack.http.get("/api/v1/report")).status_code == 401
    bad = await stack.http.get("/api/v1/report", params={"since": "yesterday"}, headers=VIEW)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "since"]
    old = await stack.http.get("/api/v1/report", params={"since": "3h"}, headers=VIEW)
    assert old.json()["repairs"] == 1                    # only rep-b ended in the last 3 h

    res = await cli("report", "--api", api_url, "--json", "--since", "1d", token="view-token")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["cost"] == 40.0
    png = tmp_path / "week.png"
    res = await cli("report", "--api", api_url, "--plot", str(png), token="view-token")
    out = cells(res.output)
    assert res.exit_code == 0, res.output
    assert "MTTR" in out and "GPU-hours lost 16.00" in out and "cost (EUR) 40.00" in out
    assert "top machines" in out and "m-gpu-01" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    res = await cli("report", "--api", api_url, "--plot", str(tmp_path / "no" / "x.png"),
                    token="view-token")
    assert res.exit_code == 2 and "--plot" in res.output
    res = await cli("report", "--api", api_url, token=None)
    assert res.exit_code == 1 and "401" in res.output


async def test_downtime_in_repairs_show_list_and_status(stack: Stack, api_url: str) -> None:  # noqa: F811
    await seed(stack)
    r = await stack.http.get("/api/v1/repairs/rep-a", headers=VIEW)
    d = r.json()["downtime"]
    assert d["gpu_hours"] == 8.0 and d["idle_wait_gpu_hours"] == 4.0 and d["cost"] == 20.0
    assert d["provider"] == "onprem" and d["currency"] == "EUR"
    listed = {x["repair_id"]: x for x in
              (await stack.http.get("/api/v1/repairs", headers=VIEW)).json()["repairs"]}
    assert listed["rep-b"]["downtime"]["cost"] == 20.0 and listed["rep-c"]["downtime"] is None
    res = await cli("repairs", "show", "rep-a", "--api", api_url)
    out = cells(res.output)
    assert res.exit_code == 0 and "downtime" in out
    assert "GPU-hours lost 8.00" in out and "cost 20.00 EUR" in out
    assert "waiting for idle 30.0 min" in out


def test_status_shows_downtime_breakdown() -> None:
    from rich.console import Console

    from workers.ops import status_tables

    doc = {"state": {}, "alerts": [], "repairs": [], "downtime": {
        "currency": "EUR", "gpu_hours": 16.0, "cost": 40.0, "breakdown": [
            {"cluster": "c1", "action": "power_cycle", "fault_kind": "xid", "repairs": 1,
             "failed": 0, "gpu_hours": 8.0, "cost": 20.0}]}}
    console = Console(record=True, width=200)
    console.print(status_tables(doc, width=200))
    text = cells(console.export_text())
    assert "downtime and cost, last 7d (16.00 GPU-h, 40.00 EUR)" in text
    assert "c1 power_cycle xid 1 0 8.00 20.00 EUR" in text


async def test_report_json_exits_zero_with_no_repairs(stack: Stack, api_url: str) -> None:  # noqa: F811
    res = await cli("report", "--api", api_url, "--json", token="view-token")
    assert res.exit_code == 0 and json.loads(res.output)["repairs"] == 0
    await asyncio.sleep(0)


def test_report_without_an_hourly_rate_says_so() -> None:
    """No providers rule sets hourly_rate: the report said `0.00 USD` and drew an empty
    cost panel on a −0.04…0.04 axis."""
    from rich.console import Console

    from workers.report import NO_RATE, report_tables, unpriced

    doc = {"since": "2026-11-24T00:00", "until": "2026-12-01T00:00", "cluster": None,
           "currency": "USD", "repairs": 2, "open": 0, "mttr_s": 600.0, "mttr_p50_s": 600.0,
           "gpu_hours": 3.0, "idle_wait_gpu_hours": 1.0, "out_of_service_gpu_hours": 2.0,
           "cost": 0.0, "unpriced_repairs": 2, "outcomes": {"succeeded": 2},
           "by_cluster": [], "by_action": [], "top_fault_kinds": [], "top_machines": [],
           "daily": []}
    assert unpriced(doc)
    console = Console(record=True, width=200)
    console.print(report_tables(doc))
    text = cells(console.export_text())
    assert f"cost (USD) {NO_RATE}" in text and "0.00 USD" not in text
    assert not unpriced({**doc, "unpriced_repairs": 1})
