"""``autorepair machines held|return`` (issue 26 I18) through the real repair API (served
by uvicorn on a free port) over the real ledger: an operator lists the machines held for
RMA and returns one; a viewer may list but not return; returning a machine that is not
held is an error naming it; the return is recorded with the operator and logged."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest

from tests.detectors.conftest import Stack
from tests.detectors.test_cli import api_url, cli, flat  # noqa: F401  (fixture)
from workflows.activity_api import AttemptRecord
from workflows.models import Action


async def _removed(s: Stack, machine: str, rid: str) -> datetime:
    at = datetime.now(UTC) - timedelta(minutes=30)
    await s.ledger.record_attempt(AttemptRecord(
        repair_id=rid, cluster=s.cluster, node="gpu-02", machine_id=machine,
        action=Action.remove, alert_kind="xid", code=79, outcome="succeeded", at=at))
    return at


async def test_machines_cli_lists_and_returns_held_machines(
    stack: Stack, api_url: str, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    c = stack.cluster
    r = await cli("machines", "held", "--api", api_url, "--cluster", c, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == []
    r = await cli("machines", "held", "--api", api_url, "--cluster", c)
    assert r.exit_code == 0 and "no machine is held" in r.output

    since = await _removed(stack, "m-gpu-02", "rep-rma-1")
    r = await cli("machines", "held", "--api", api_url, "--cluster", c, "--json",
                  token="view-token")
    assert r.exit_code == 0, r.output
    [row] = json.loads(r.output)
    assert row["cluster"] == c and row["machine"] == "m-gpu-02"
    assert row["repair_id"] == "rep-rma-1" and row["reason"] == "removed for RMA"
    assert datetime.fromisoformat(row["since"]) == since
    r = await cli("machines", "held", "--api", api_url)
    assert r.exit_code == 0 and "m-gpu-02" in r.output and "rep-rma-1" in r.output

    # a viewer may read, not return: 403 and the hold stays
    r = await cli("machines", "return", c, "m-gpu-02", "--reason", "fixed", "--api", api_url,
                  token="view-token")
    assert r.exit_code == 1 and "403" in r.output
    assert await stack.ledger.machine_hold(c, "m-gpu-02") is not None
    r = await cli("machines", "return", c, "m-gpu-02", "--reason", "", "--api", api_url)
    assert r.exit_code == 1 and "422" in r.output and "reason" in r.output

    with caplog.at_level(logging.INFO, logger="autorepair.api.machines"):
        r = await cli("machines", "return", c, "m-gpu-02", "--reason", "board replaced",
                      "--api", api_url)
    assert r.exit_code == 0, r.output
    out = flat(r.output)
    assert f"returned: {c}/m-gpu-02" in out and "rep-rma-1" in out and "alice" in out
    assert any("event=machine_returned" in m and "'alice'" in m and "m-gpu-02" in m
               for m in caplog.messages)
    assert await stack.ledger.machine_hold(c, "m-gpu-02") is None
    row2 = await stack.ledger.pool.fetchrow(
        "SELECT returned_by, reason FROM machine_returns WHERE cluster = $1 AND machine = $2",
        c, "m-gpu-02")
    assert dict(row2) == {"returned_by": "alice", "reason": "board replaced"}
    r = await cli("machines", "held", "--api", api_url, "--cluster", c, "--json")
    assert json.loads(r.output) == []

    # again: not held any more, an error naming the machine; the ledger is unchanged
    r = await cli("machines", "return", c, "m-gpu-02", "--reason", "again", "--api", api_url)
    out = flat(r.output)
    assert r.exit_code == 1 and "409" in out and "'m-gpu-02'" in out and "not held" in out
    assert await stack.ledger.pool.fetchval(
        "SELECT count(*) FROM machine_returns WHERE cluster = $1 AND machine = $2",
        c, "m-gpu-02") == 1


async def test_machines_api_validates_names_and_roles(stack: Stack) -> None:
    from tests.detectors.test_repairs_api import OP, VIEW

    r = await stack.http.post("/api/v1/machines/c1/m-1/return", json={"reason": "x"})
    assert r.status_code == 401
    r = await stack.http.post("/api/v1/machines/c1/m-1/return", headers=VIEW,
                              json={"reason": "x"})
    assert r.status_code == 403 and "return machines" in r.json()["detail"]
    r = await stack.http.post("/api/v1/machines/*/m-1/return", headers=OP,
                              json={"reason": "x"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "cluster"]
    r = await stack.http.post("/api/v1/machines/c1/m%0A1/return", headers=OP,
                              json={"reason": "x"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "machine"]
    r = await stack.http.get("/api/v1/machines/held", params={"cluster": "a b"}, headers=VIEW)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "cluster"]
    r = await stack.http.post(f"/api/v1/machines/{stack.cluster}/m-nope/return", headers=OP,
                              json={"reason": "x"})
    assert r.status_code == 409 and "'m-nope'" in r.json()["detail"]
