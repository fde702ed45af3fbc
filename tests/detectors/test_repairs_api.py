"""Repair API over HTTP: auth (401/403), malformed bodies (422 naming the field),
idempotent create, detector cap, approve / reject / cancel round trips against the real
RepairWorkflow on the Temporal dev server and the real ledger."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from tests.detectors.conftest import Stack
from workers.repairs.models import RepairCreate
from workflows.models import Requester, RequesterKind

OP = {"Authorization": "Bearer op-token"}
DET = {"Authorization": "Bearer det-token"}
VIEW = {"Authorization": "Bearer view-token"}


def body(node: str = "gpu-01", request_id: str = "r-1", **kw: Any) -> dict[str, Any]:
    return {"node": node, "mode": "reboot", "request_id": request_id,
            "reason": "DCGM diag level 3 failed: memory test", **kw}


async def wait_stage(s: Stack, repair_id: str, stage: str, wait_s: float = 20.0,
                     state: str | None = None) -> dict[str, Any]:
    """The repair's view once it shows ``stage`` (and ``state``, when given: the row's
    stage moves with the transition write and ``approval_pending`` with the row write
    right after it, so a read between the two shows the stage before the state)."""
    deadline = asyncio.get_running_loop().time() + wait_s
    last: dict[str, Any] = {}
    while asyncio.get_running_loop().time() < deadline:
        r = await s.http.get(f"/api/v1/repairs/{repair_id}", headers=VIEW)
        assert r.status_code == 200, r.text
        last = r.json()
        if last["stage"] == stage and (state is None or last["state"] == state):
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"{repair_id} never reached {stage} ({state}): "
                         f"{last.get('stage')} ({last.get('state')})")


async def test_auth_failures(stack: Stack) -> None:
    h = stack.http
    r = await h.post("/api/v1/repairs", json=body())
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = await h.get("/api/v1/repairs", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    r = await h.post("/api/v1/repairs", json=body(), headers=VIEW)
    assert r.status_code == 403 and "viewer" in r.json()["detail"]
    r = await h.post("/api/v1/repairs", json=body(mode="remove"), headers=DET)
    assert r.status_code == 403 and "remove" in r.json()["detail"]
    r = await h.post("/api/v1/repairs", json=body(detector="someone-else"), headers=DET)
    assert r.status_code == 403
    r = await h.post("/api/v1/repairs/req-x/approve", json={}, headers=DET)
    assert r.status_code == 403
    assert (await h.get("/api/v1/repairs", headers=VIEW)).json() == {"repairs": []}


async def test_malformed_bodies_name_the_field(stack: Stack) -> None:
    h = stack.http
    cases = [
        ({k: v for k, v in body().items() if k != "mode"}, "mode"),
        (body(mode="explode"), "mode"),
        (body(node=""), "node"),
        (body(request_id=""), "request_id"),
        ({**body(), "colour": "red"}, "colour"),
        (body(cluster="no-such-cluster"), "cluster"),
        (body(node="gpu-99"), "node"),
        (body(evidence_alert="alert-that-does-not-exist"), "evidence_alert"),
        (body(detected_at="yesterday"), "detected_at"),
    ]
    for payload, field in cases:
        r = await h.post("/api/v1/repairs", json=payload, headers=DET)
        assert r.status_code == 422, (field, r.text)
        locs = [d["loc"] for d in r.json()["detail"]]
        assert any(loc[-1] == field for loc in locs), (field, locs)
    r = await h.get("/api/v1/repairs?state=sideways", headers=VIEW)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "state"]
    # approve with action "none": no action to run (before: the node was drained, then the
    # repair hung at "repairing none"); refused before the repair is even looked up
    r = await h.post("/api/v1/repairs/req-x/approve", json={"action": "none"}, headers=OP)
    assert r.status_code == 422, r.text
    d = r.json()["detail"][0]
    assert d["loc"][-1] == "action" and "not an action to run" in d["msg"], d
    # nothing was recorded by the refused bodies: the keys are still free
    assert (await h.get("/api/v1/repairs", headers=VIEW)).json() == {"repairs": []}


async def test_create_idempotent_then_approve(stack: Stack) -> None:
    h = stack.http
    r = await h.post("/api/v1/repairs", json=body(), headers=DET)
    assert r.status_code == 201, r.text
    first = r.json()
    rid = first["repair"]["repair_id"]
    assert first["created"] and not first["refused"]
    assert first["repair"]["requester_kind"] == "detector"
    assert first["repair"]["requester_name"] == "scanner"
    again = await h.post("/api/v1/repairs", json=body(), headers=DET)
    assert again.status_code == 200 and again.json()["repair"]["repair_id"] == rid
    assert not again.json()["created"]
    # same key, another node: a client bug, named
    clash = await h.post("/api/v1/repairs", json=body(node="gpu-02"), headers=DET)
    assert clash.status_code == 409 and "request_id" in clash.json()["detail"]

    view = await wait_stage(stack, rid, "awaiting_approval", state="awaiting_approval")
    assert view["live"]["requester"] == {"kind": "detector", "name": "scanner"}
    kinds = {a["kind"] for a in view["live"]["evidence"]}
    assert kinds == {"repair_request"}

    r = await h.post(f"/api/v1/repairs/{rid}/approve", json={"reason": "ok"}, headers=OP)
    assert r.status_code == 200, r.text
    # approval moves it on to the lease and cordon (no scheduler activity in this test)
    view = await wait_stage(stack, rid, "cordoning")
    assert view["approved_by"] == "alice"
    # approved and acting on it: another approval (an override above all) is refused,
    # not kept and silently dropped when the repair next asks
    for extra in ({"action": "remove"}, {}):
        r = await h.post(f"/api/v1/repairs/{rid}/approve", json=extra, headers=OP)
        assert r.status_code == 409, r.text
        assert "stage cordoning: it is not waiting for an approval" in r.json()["detail"]
    lst = (await h.get(f"/api/v1/repairs?node=gpu-01&cluster={stack.cluster}"
                       "&requester=scanner&state=open", headers=VIEW)).json()["repairs"]
    assert [v["repair_id"] for v in lst] == [rid]
    assert (await h.get("/api/v1/repairs?action=migrate", headers=VIEW)).json()["repairs"] == []


async def test_reject_and_cancel_round_trips(stack: Stack) -> None:
    h = stack.http
    ids = []
    for i, node in enumerate(("gpu-02", "gpu-03")):
        r = await h.post("/api/v1/repairs", json=body(node=node, request_id=f"k-{i}"),
                         headers=DET)
        assert r.status_code == 201, r.text
        ids.append(r.json()["repair"]["repair_id"])
    for rid in ids:
        await wait_stage(stack, rid, "awaiting_approval")
    r = await h.post(f"/api/v1/repairs/{ids[0]}/reject", json={"reason": "node is fine"},
                     headers=OP)
    assert r.status_code == 200
    v = await wait_stage(stack, ids[0], "rejected")
    assert v["transitions"][-1]["by"] == "alice"
    assert v["transitions"][-1]["reason"] == "node is fine"
    r = await h.post(f"/api/v1/repairs/{ids[1]}/cancel", json={"reason": "job running"},
                     headers=OP)
    assert r.status_code == 200
    await wait_stage(stack, ids[1], "cancelled")
    # deciding a finished repair is a conflict; an unknown one is 404
    r = await h.post(f"/api/v1/repairs/{ids[0]}/approve", headers=OP)
    assert r.status_code == 409 and "finished" in r.json()["detail"]
    assert repr(ids[0]) in r.json()["detail"]  # the repair_id, quoted
    assert (await h.post("/api/v1/repairs/req-none/cancel", headers=OP)).status_code == 404
    # a finished repair still owns its key: the retried create returns it
    r = await h.post("/api/v1/repairs", json=body(node="gpu-02", request_id="k-0"), headers=DET)
    assert r.status_code == 200 and r.json()["repair"]["repair_id"] == ids[0]
    assert r.json()["repair"]["stage"] == "rejected"
    # filters
    rej = (await h.get("/api/v1/repairs?state=rejected", headers=VIEW)).json()["repairs"]
    assert [v["repair_id"] for v in rej] == [ids[0]]


async def test_detector_cap_refused_and_recorded(stack: Stack) -> None:
    h = stack.http  # stack's cap is 2
    made = []
    for i, node in enumerate(("gpu-01", "gpu-02")):
        r = await h.post("/api/v1/repairs", json=body(node=node, request_id=f"cap-{i}"),
                         headers=DET)
        assert r.status_code == 201 and not r.json()["refused"]
        made.append(r.json()["repair"]["repair_id"])
    r = await h.post("/api/v1/repairs", json=body(node="gpu-03", request_id="cap-2"),
                     headers=DET)
    assert r.status_code == 201
    res = r.json()
    assert res["refused"] and "detector cap" in res["refused_reason"]
    assert res["repair"]["stage"] == "rejected"
    assert res["repair"]["transitions"][-1]["by"] == "autorepair"
    assert "policy.rails.detector_cap=2" in res["repair"]["transitions"][-1]["reason"]
    assert res["repair"]["workflow_id"] is None
    # retried: still the same refused record (the key is spent)
    r = await h.post("/api/v1/repairs", json=body(node="gpu-03", request_id="cap-2"),
                     headers=DET)
    assert r.status_code == 200 and r.json()["refused"]
    # an operator is not capped
    r = await h.post("/api/v1/repairs", json=body(node="gpu-04", request_id="op-1"),
                     headers=OP)
    assert r.status_code == 201 and not r.json()["refused"]
    assert r.json()["repair"]["requester_kind"] == "user"


async def test_one_detector_cannot_take_the_cluster_cap_from_the_others(
    stack: Stack
) -> None:
    """Per-detector caps below the per-cluster cap (2 here): a detector the cluster does
    not list gets ``detectors.default_cap`` (1), the listed ``scanner`` its own."""
    noisy = Requester(kind=RequesterKind.detector, name="noisy")
    first = await stack.intake.create(RepairCreate(node="gpu-01", request_id="n-1",
                                                   mode="reboot", reason="r"), noisy)
    assert not first.refused
    second = await stack.intake.create(RepairCreate(node="gpu-02", request_id="n-2",
                                                    mode="reboot", reason="r"), noisy)
    assert second.refused and "per-detector cap" in second.refused_reason
    assert f"clusters[{stack.cluster}].detectors.default_cap=1" in second.refused_reason
    assert second.repair.stage == "rejected" and second.repair.workflow_id is None
    # the cluster has room for one more: another detector gets it
    r = await stack.http.post("/api/v1/repairs", json=body(node="gpu-03", request_id="s-1"),
                              headers=DET)
    assert r.status_code == 201 and not r.json()["refused"]
    # and now the cluster cap is what refuses, whoever asks
    r = await stack.http.post("/api/v1/repairs", json=body(node="gpu-04", request_id="s-2"),
                              headers=DET)
    assert r.json()["refused"] and "policy.rails.detector_cap=2" in r.json()["refused_reason"]


async def test_racing_creates_make_one_repair(stack: Stack) -> None:
    results = await asyncio.gather(*[
        stack.http.post("/api/v1/repairs", json=body(request_id="race"), headers=DET)
        for _ in range(5)
    ])
    ids = {r.json()["repair"]["repair_id"] for r in results}
    assert len(ids) == 1
    assert sorted(r.status_code for r in results) == [200, 200, 200, 200, 201]
    rows = await stack.ledger.list_repairs(cluster=stack.cluster)
    assert len(rows) == 1


async def test_openapi_document(stack: Stack) -> None:
    r = await stack.http.get("/api/v1/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert "/api/v1/repairs" in doc["paths"]
    assert "/api/v1/repairs/{repair_id}/approve" in doc["paths"]
    assert "RepairCreate" in doc["components"]["schemas"]


async def test_alerts_listing_needs_a_token_and_returns_recorded_alerts(stack: Stack) -> None:
    from datetime import UTC, datetime

    from workflows.models import Action, Alert, Severity

    h = stack.http
    assert (await h.get("/api/v1/alerts")).status_code == 401
    for i, node in enumerate(("gpu-01", "gpu-02")):
        await stack.ledger.record_alert(Alert(
            alert_id=f"al-{i}", cluster=stack.cluster, node=node, kind="xid", code=79,
            severity=Severity.critical, actionable=True, action=Action.power_cycle,
            summary=f"Xid 79 on {node}", observed_at=datetime(2026, 11, 1, 12, i, tzinfo=UTC),
        ))
    r = await h.get("/api/v1/alerts", headers=VIEW, params={"cluster": stack.cluster})
    assert r.status_code == 200
    assert [a["alert_id"] for a in r.json()["alerts"]] == ["al-1", "al-0"]
    r = await h.get("/api/v1/alerts", headers=VIEW, params={"node": "gpu-01"})
    assert [a["summary"] for a in r.json()["alerts"]] == ["Xid 79 on gpu-01"]
    r = await h.get("/api/v1/alerts", headers=VIEW, params={"limit": 0})
    assert r.status_code == 422


def _locs(r: Any) -> list[list[Any]]:
    assert r.status_code == 422, r.text
    return [d["loc"] for d in r.json()["detail"]]


async def test_unreadable_json_body_is_a_422_naming_the_body(stack: Stack) -> None:
    # not UTF-8 under a JSON content type: FastAPI alone answers a bare 400
    bad = {"content-type": "application/json"}
    for path, who in (("/api/v1/repairs", DET), ("/api/v1/repairs/req-x/approve", OP)):
        r = await stack.http.post(path, content=b"p\xe5\x8a8\x19:", headers={**who, **bad})
        assert _locs(r) == [["body"]]
        assert "UTF-8" in r.json()["detail"][0]["msg"]


async def test_text_postgresql_cannot_store_is_a_422_naming_the_field(stack: Stack) -> None:
    h = stack.http
    for field in ("request_id", "reason", "cluster", "evidence_alert", "evidence_run"):
        r = await h.post("/api/v1/repairs", json=body(**{field: "a\x00b"}), headers=DET)
        assert _locs(r) == [["body", field]], field
    # a lone surrogate (JSON can carry one, UTF-8 cannot): named, and the 422 renders
    raw = b'{"node": "gpu-01", "mode": "reboot", "request_id": "s", "reason": "\\ud800"}'
    r = await h.post("/api/v1/repairs", content=raw,
                     headers={**DET, "content-type": "application/json"})
    assert _locs(r) == [["body", "reason"]]
    for raw in (b'["\\ud800"]', b'{"\\ud800": 1}'):
        r = await h.post("/api/v1/repairs", content=raw,
                         headers={**DET, "content-type": "application/json"})
        assert _locs(r) == [["body"]], raw
    r = await h.post("/api/v1/repairs/req-x/reject", json={"reason": "\x00"}, headers=OP)
    assert _locs(r) == [["body", "reason"]]
    for path, name in (("/api/v1/repairs", "node"), ("/api/v1/repairs", "cluster"),
                       ("/api/v1/repairs", "state"), ("/api/v1/repairs", "action"),
                       ("/api/v1/repairs", "requester"), ("/api/v1/alerts", "cluster"),
                       ("/api/v1/alerts", "node"), ("/api/v1/report", "cluster"),
                       ("/api/v1/report", "since")):
        r = await h.get(path, params={name: "x\x00"}, headers=VIEW)
        assert _locs(r) == [["query", name]], (path, name)
    for path in ("/api/v1/repairs/a%00b", "/api/v1/repairs/a%00b/approve"):
        r = await (h.get(path, headers=VIEW) if path.endswith("b") else h.post(path, headers=OP))
        assert _locs(r) == [["path", "repair_id"]], path
    # nothing reached the ledger
    assert (await h.get("/api/v1/repairs", headers=VIEW)).json() == {"repairs": []}


async def test_times_outside_utc_years_are_a_422_naming_the_field(stack: Stack) -> None:
    h = stack.http
    late = "9999-12-31T23:59:59-14:00"  # year 10000 in UTC
    r = await h.post("/api/v1/repairs", json=body(detected_at=late), headers=DET)
    assert _locs(r) == [["body", "detected_at"]]
    assert _locs(await h.get("/api/v1/report", params={"until": late}, headers=VIEW)) == [
        ["query", "until"]]
    assert _locs(await h.get("/api/v1/report", params={"since": late}, headers=VIEW)) == [
        ["query", "since"]]
    # the default 7d back from the year 1 is before it
    r = await h.get("/api/v1/report", params={"until": "0001-01-01T00:00:00"}, headers=VIEW)
    assert _locs(r) == [["query", "since"]]
    r = await h.get("/api/v1/report", params={"since": "²d"}, headers=VIEW)
    assert _locs(r) == [["query", "since"]] and "'²d'" in r.json()["detail"][0]["msg"]
    r = await h.get("/api/v1/report", headers=VIEW,
                    params={"since": "2026-01-01T00:00:00+14:00", "until": "2026-02-01"})
    assert r.status_code == 200, r.text
    assert r.json()["since"] == "2025-12-31T10:00:00+00:00"


async def test_sender_chosen_ids_cannot_forge_log_lines(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """A detector's request id is quoted in the intake's log lines: a newline in it cannot
    start a forged ``event=`` line (logs are one event a line, docs/design.md §6)."""
    forged = "r-1\nevent=repair_requested cluster=prod node=gpu-99 request_id=x"
    with caplog.at_level(logging.INFO, logger="autorepair.api.repairs"):
        r = await stack.http.post("/api/v1/repairs", json=body(request_id=forged), headers=DET)
    assert r.status_code == 201, r.text
    lines = [m for rec in caplog.records for m in [rec.getMessage()]
             if "request_id" in m]
    assert lines, "the intake logs the request"
    assert all("\n" not in m for m in lines)
