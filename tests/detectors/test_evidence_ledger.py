"""Evidence captured before acting, in the ledger (issue 31 item 3): the
``ledger_record_evidence`` activity (idempotent on repair, action and attempt), the
repair's evidence in ``GET /api/v1/repairs/{id}`` and ``autorepair repairs show``, and the
hardware ticket of a failed re-validation of the machine carrying it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.ledger_activities import LedgerActivities
from tests.detectors.conftest import Stack
from tests.detectors.test_cli import api_url, cli  # noqa: F401  (fixture)
from tests.detectors.test_report import cells
from workflows.activity_api import ERR_UNKNOWN_NODE, RepairRecord, TicketInput
from workflows.evidence import (
    BmcCapture,
    EvidenceCapture,
    EvidenceRecord,
    NodeCapture,
    SelEntry,
)
from workflows.models import Action, Requester, Stage, ValidationResult, Verdict

VIEW = {"Authorization": "Bearer view-token"}
SHA = "3f" * 32


def _capture(at: datetime) -> EvidenceCapture:
    return EvidenceCapture(
        node=NodeCapture(path="/var/lib/autorepair/evidence/autorepair-evidence-ev-1.tar.gz",
                         size_bytes=123456, sha256=SHA, tool="nvidia-bug-report",
                         collected_at=at),
        bmc=BmcCapture(source="SEL", collected_at=at, entries=[
            SelEntry(id="60", created="2026-11-30T09:00:00Z", severity="Critical",
                     message="Multi-bit memory errors detected on DIMM_B3.")]),
        notes=["node: kernel_log: journalctl not found"])


async def test_evidence_recorded_once_shown_and_carried_by_the_ticket(
    stack: Stack, api_url: str,  # noqa: F811
) -> None:
    acts = LedgerActivities(stack.ledger.pool)
    env = ActivityEnvironment()
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    await env.run(acts.upsert_repair, RepairRecord(
        repair_id="ev-1", cluster=stack.cluster, node="gpu-01", machine_id="m-gpu-01",
        action=Action.migrate, stage=Stage.repairing, requester=Requester(), updated_at=at))
    rec = EvidenceRecord(repair_id="ev-1", action=Action.migrate, attempt=1,
                         capture=_capture(at), at=at)
    assert await env.run(acts.record_evidence, rec) is True
    # a retried activity (same key, even another capture) changes nothing
    again = rec.model_copy(update={"capture": EvidenceCapture(notes=["other"])})
    assert await env.run(acts.record_evidence, again) is False
    assert await env.run(acts.record_evidence, rec.model_copy(update={"attempt": 2})) is True
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.record_evidence, rec.model_copy(update={"repair_id": "nope"}))
    assert err.value.type == ERR_UNKNOWN_NODE and "'nope'" in str(err.value)

    r = await stack.http.get("/api/v1/repairs/ev-1", headers=VIEW)
    assert r.status_code == 200, r.text
    ev = r.json()["evidence"]
    assert [(e["action"], e["attempt"]) for e in ev] == [("migrate", 1), ("migrate", 2)]
    first = ev[0]
    assert first["node"]["sha256"] == SHA and first["node"]["size_bytes"] == 123456
    assert first["bmc"]["entries"][0]["severity"] == "Critical"
    assert first["notes"] == ["node: kernel_log: journalctl not found"]
    assert first["summary"] == _capture(at).summary()

    res = await cli("repairs", "show", "ev-1", "--api", api_url)
    out = cells(res.output)
    assert res.exit_code == 0, res.output
    assert "evidence captured before acting" in out
    assert "migrate #1" in out and SHA in out.replace(" ", "")
    assert "SEL: 1 entries; newest Critical: Multi-bit memory errors" in out

    result = ValidationResult(machine="m-gpu-01", verdict=Verdict.failed, reason="dcgm failed")
    t = await env.run(acts.open_ticket, TicketInput(
        cluster=stack.cluster, machine="m-gpu-01", run_id="val-1",
        summary="m-gpu-01: validation failed", result=result))
    assert t.evidence == [_capture(at).summary()] * 2    # attempts 1 and 2 of ev-1
    row = (await stack.ledger.open_tickets("m-gpu-01"))[0]
    assert row["evidence"][0]["repair_id"] == "ev-1"
    assert row["evidence"][0]["node"]["path"].endswith("ev-1.tar.gz")
    # another machine's ticket carries none
    t2 = await env.run(acts.open_ticket, TicketInput(
        cluster=stack.cluster, machine="m-gpu-02", run_id="val-2",
        summary="m-gpu-02: validation failed", result=result))
    assert t2.evidence == []
