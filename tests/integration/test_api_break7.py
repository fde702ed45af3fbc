"""Break-test round 7: the approve endpoint answered 200 to an approval that changed
nothing — a repair approved before its cordon, waiting at ``awaiting_approval`` for its
lease or a maintenance window (the signal sat unread until the repair next asked)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from activities.ledger import Ledger
from workers.repairs.auth import ApiTokens
from workers.repairs.intake import RepairIntake
from workers.repairs.router import build_repairs_router
from workflows.activity_api import RepairRecord, TransitionRecord
from workflows.config import AutorepairConfig
from workflows.models import Action, Requester, RequesterKind, Stage

OP = {"Authorization": "Bearer op-tok"}
T0 = datetime(2026, 12, 7, 12, tzinfo=UTC)


class _Handle:
    def __init__(self, sent: list[tuple[str, Any]]) -> None:
        self.sent = sent

    async def signal(self, name: str, payload: Any) -> None:
        self.sent.append((name, payload))


class _Client:
    """Records the signals the intake sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def get_workflow_handle(self, wf_id: str) -> _Handle:
        return _Handle(self.sent)


@pytest.fixture
async def api_b7(ledger_pool: Any, tmp_path: Path) -> Any:
    toks = tmp_path / "api.tokens"
    toks.write_text("op-tok operator alice\n")
    cfg = AutorepairConfig.model_validate({"clusters": [
        {"name": "c1", "scheduler": "slurm", "nodes": [{"name": "gpu-01"}]}]})
    client = _Client()
    ledger = Ledger(ledger_pool)
    intake = RepairIntake(cfg, ledger, client)  # type: ignore[arg-type]

    async def get() -> RepairIntake:
        return intake

    app = FastAPI()
    app.include_router(build_repairs_router(get, ApiTokens.load(toks)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://api") as c:
        yield c, ledger, client


async def _repair(ledger: Ledger, rid: str, pending: bool, approved_by: str | None,
                  reason: str) -> None:
    await ledger.upsert_repair(RepairRecord(
        repair_id=rid, cluster="c1", node="gpu-01", action=Action.reboot,
        stage=Stage.awaiting_approval, requester=Requester(kind=RequesterKind.system,
                                                           name="detector"),
        approved_by=approved_by, updated_at=T0, approval_pending=pending,
        workflow_id=f"repair/c1/gpu-01/{rid}"))
    await ledger.record_transition(TransitionRecord(
        repair_id=rid, stage=Stage.awaiting_approval, at=T0, reason=reason))


async def test_an_approve_of_an_approved_repair_waiting_for_its_lease_is_409(
    api_b7: tuple[httpx.AsyncClient, Ledger, _Client],
) -> None:
    """The repair was approved by oncall and is paused by a maintenance window (stage
    ``awaiting_approval``, kept for the documented order). A second approve changes
    nothing: 409 naming the stage, who approved and what it waits for; no signal sent.
    A repair a person is asked about is still approved (200, the signal sent)."""
    api, ledger, client = api_b7
    await _repair(ledger, "b7-q", False, "oncall",
                  "paused before cordoning: gpu-01 is in maintenance window mw-1")
    r = await api.post("/api/v1/repairs/b7-q/approve", headers=OP, json={})
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert "awaiting_approval" in detail and "approved by oncall" in detail, detail
    assert "maintenance window mw-1" in detail, detail
    assert client.sent == []

    await _repair(ledger, "b7-a", True, None, "approval needed: consent policy")
    r = await api.post("/api/v1/repairs/b7-a/approve", headers=OP, json={})
    assert r.status_code == 200, r.text
    assert [name for name, _ in client.sent] == ["approve"]


async def test_the_state_filters_tell_an_approved_waiting_repair_from_one_asking(
    api_b7: tuple[httpx.AsyncClient, Ledger, _Client],
) -> None:
    """``state=awaiting_approval`` lists the repairs a person is asked about now;
    ``state=in_progress`` lists an approved repair that keeps the stage
    ``awaiting_approval`` while it waits (the documented order), and not one asking. The
    filter runs in the query, so ``limit`` counts matching repairs only: newer repairs of
    the other kind never hide the one asked for."""
    api, ledger, _ = api_b7
    await _repair(ledger, "b7-asking", True, None, "approval needed: consent policy")
    for n in range(3):
        await _repair(ledger, f"b7-approved-{n}", False, "oncall",
                      "approved; waiting for the lease")
    await _repair(ledger, "b7-legacy", None, None, "approval needed")  # type: ignore[arg-type]

    async def ids(state: str, limit: int = 200) -> set[str]:
        r = await api.get("/api/v1/repairs", headers=OP,
                          params={"state": state, "limit": limit})
        assert r.status_code == 200, r.text
        return {v["repair_id"] for v in r.json()["repairs"]}

    assert await ids("awaiting_approval") == {"b7-asking", "b7-legacy"}
    assert await ids("in_progress") == {f"b7-approved-{n}" for n in range(3)}
    assert await ids("awaiting_approval", limit=1) <= {"b7-asking", "b7-legacy"}
    assert len(await ids("awaiting_approval", limit=1)) == 1
    assert await ids("open") == {"b7-asking", "b7-legacy"} | {
        f"b7-approved-{n}" for n in range(3)}
