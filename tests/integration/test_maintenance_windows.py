"""Planned maintenance windows (issue 29 item 1), the operator's half: open, list and end
through the real API router on a real ledger (embedded PostgreSQL), with the role checks
and the bounds; the CLI's argument rules; the pure coverage rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from activities.ledger import Ledger
from activities.maintenance_store import MaintenanceStore, WindowError
from workers.cli import app as cli_app
from workers.repairs.auth import ApiTokens
from workers.repairs.intake import RepairIntake
from workers.repairs.router import build_repairs_router
from workflows.config import AutorepairConfig
from workflows.maintenance import MaintenanceWindow, covering

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
OP = {"Authorization": "Bearer op-tok"}
VIEW = {"Authorization": "Bearer view-tok"}


def _cfg() -> AutorepairConfig:
    return AutorepairConfig.model_validate({
        "policy": {"maintenance": {"max_s": 7200}},
        "clusters": [{"name": "c1", "scheduler": "slurm", "nodes": [
            {"name": "gpu-01", "pool": "rack-a"}, {"name": "gpu-02", "pool": "rack-b"}]}],
    })


@pytest.fixture
async def api(ledger_pool: Any, tmp_path: Path) -> Any:
    toks = tmp_path / "api.tokens"
    toks.write_text("op-tok operator alice\nview-tok viewer grafana\n")
    intake = RepairIntake(_cfg(), Ledger(ledger_pool), None)  # type: ignore[arg-type]

    async def get() -> RepairIntake:
        return intake

    app = FastAPI()
    app.include_router(build_repairs_router(get, ApiTokens.load(toks)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://api") as c:
        yield c


async def test_open_list_end_a_window_through_the_api(api: httpx.AsyncClient) -> None:
    r = await api.post("/api/v1/maintenance", headers=OP, json={
        "cluster": "c1", "pool": "rack-a", "for": "90m", "reason": "rack A firmware"})
    assert r.status_code == 201, r.text
    w = r.json()
    assert w["window_id"].startswith("mw-") and w["created_by"] == "alice"
    assert w["scope"] == "pool" and w["pool"] == "rack-a" and w["state"] == "open"
    start = datetime.fromisoformat(w["starts_at"])
    assert datetime.fromisoformat(w["ends_at"]) - start == timedelta(minutes=90)
    r = await api.get("/api/v1/maintenance", headers=VIEW, params={"active": "true"})
    assert [x["window_id"] for x in r.json()["windows"]] == [w["window_id"]]
    # a viewer may read but not open or end
    r = await api.post("/api/v1/maintenance", headers=VIEW, json={
        "cluster": "c1", "all": True, "for": "1h", "reason": "x"})
    assert r.status_code == 403
    r = await api.delete(f"/api/v1/maintenance/{w['window_id']}", headers=VIEW)
    assert r.status_code == 403
    r = await api.delete(f"/api/v1/maintenance/{w['window_id']}", headers=OP)
    assert r.status_code == 200 and r.json()["ended_now"] is True
    assert r.json()["ended_by"] == "alice" and r.json()["state"] == "ended"
    again = await api.delete(f"/api/v1/maintenance/{w['window_id']}", headers=OP)
    assert again.status_code == 200 and again.json()["ended_now"] is False  # idempotent
    r = await api.get("/api/v1/maintenance", headers=VIEW, params={"active": "true"})
    assert r.json()["windows"] == []
    r = await api.delete("/api/v1/maintenance/mw-000000000000", headers=OP)
    assert r.status_code == 404 and "mw-000000000000" in r.text


@pytest.mark.parametrize(("body", "field"), [
    ({"cluster": "c1", "all": True, "for": "3h", "reason": "too long"}, "for"),
    ({"cluster": "c1", "all": True, "for": "-5m", "reason": "negative"}, "for"),
    ({"cluster": "c1", "all": True, "for": "soon", "reason": "not a duration"}, "for"),
    ({"cluster": "c1", "all": True, "pool": "rack-a", "for": "1h", "reason": "two"}, "scope"),
    ({"cluster": "c1", "for": "1h", "reason": "none"}, "scope"),
    ({"cluster": "c9", "all": True, "for": "1h", "reason": "unknown cluster"}, "cluster"),
    ({"cluster": "c1", "all": True, "for": "1h", "reason": ""}, "reason"),
    ({"cluster": "c1", "nodes": ["gpu 01"], "for": "1h", "reason": "bad node"}, "nodes"),
    ({"cluster": "c1", "nodes": ["gpu-01", "gpu-1"], "for": "1h", "reason": "typo"},
     "node 'gpu-1' is not a node of cluster 'c1'"),
    ({"cluster": "c1", "pool": "rack-z", "for": "1h", "reason": "no such pool"},
     "pool 'rack-z' has no node in cluster 'c1'"),
])
async def test_bad_windows_are_refused_naming_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    r = await api.post("/api/v1/maintenance", headers=OP, json=body)
    assert r.status_code == 422, r.text
    assert field in r.text, r.text
    r = await api.get("/api/v1/maintenance", headers=VIEW)
    assert r.json()["windows"] == []  # nothing was opened


async def test_store_bounds_and_scopes(ledger_pool: Any) -> None:
    store = MaintenanceStore(ledger_pool, max_s=3600)
    with pytest.raises(WindowError, match=r"policy\.maintenance\.max_s"):
        await store.start(cluster="c1", scope="all", duration_s=3601, reason="x",
                          created_by="bob", now=T0)
    w = await store.start(cluster="c1", scope="nodes", nodes=["gpu-01", "gpu-02"],
                          duration_s=600, reason="swap cables", created_by="bob", now=T0)
    assert (await store.list("c1", active_at=T0 + timedelta(minutes=5)))[0] == w
    assert await store.list("c1", active_at=T0 + timedelta(minutes=11)) == []
    assert await store.list("c2") == []


async def test_overlapping_windows_for_the_whatif_replay(ledger_pool: Any) -> None:
    """The what-if replay's windows: those in force at some time of [since, until),
    an early end counted, other clusters left out, oldest first."""
    store = MaintenanceStore(ledger_pool, max_s=86400)
    a = await store.start(cluster="o1", scope="all", duration_s=3600, reason="a",
                          created_by="bob", now=T0)
    b = await store.start(cluster="o1", scope="pool", pool="p1", duration_s=7200,
                          reason="b", created_by="bob", now=T0 + timedelta(hours=3))
    await store.start(cluster="o2", scope="all", duration_s=3600, reason="c",
                      created_by="bob", now=T0)
    await store.end(b.window_id, by="bob", now=T0 + timedelta(hours=3, minutes=10))
    got = await store.overlapping(T0 - timedelta(hours=1), T0 + timedelta(days=1), "o1")
    assert [w.window_id for w in got] == [a.window_id, b.window_id]
    # b ended early at 3 h 10 min: a replay window that starts after that misses it
    late = await store.overlapping(T0 + timedelta(hours=3, minutes=20),
                                   T0 + timedelta(days=1), "o1")
    assert late == []
    assert [w.window_id for w in await store.overlapping(
        T0 + timedelta(minutes=30), T0 + timedelta(hours=3, minutes=5), "o1")] == [
        a.window_id, b.window_id]
    every = await store.overlapping(T0, T0 + timedelta(days=1))
    assert sorted(w.cluster for w in every if w.cluster in ("o1", "o2")) == ["o1", "o1", "o2"]


def _w(**kw: Any) -> MaintenanceWindow:
    base: dict[str, Any] = {"window_id": "mw-1", "cluster": "c1", "scope": "all",
                            "reason": "r", "created_by": "a", "starts_at": T0,
                            "ends_at": T0 + timedelta(hours=1)}
    return MaintenanceWindow(**{**base, **kw})


def test_coverage_follows_scope_cluster_and_early_end() -> None:
    pool_w = _w(scope="pool", pool="rack-a")
    nodes_w = _w(window_id="mw-2", scope="nodes", nodes=["gpu-02"],
                 ended_at=T0 + timedelta(minutes=20))
    ws = [pool_w, nodes_w]
    at = T0 + timedelta(minutes=10)
    assert covering(ws, "c1", "gpu-01", "rack-a", at) == [pool_w]
    assert covering(ws, "c1", "gpu-02", "rack-b", at) == [nodes_w]
    assert covering(ws, "c2", "gpu-01", "rack-a", at) == []  # another cluster
    assert covering(ws, "c1", "gpu-02", "rack-b", T0 + timedelta(minutes=25)) == []  # ended
    # a window's shape is checked
    with pytest.raises(ValueError, match="ends_at"):
        _w(ends_at=T0)
    with pytest.raises(ValueError, match="pool"):
        _w(scope="pool")
    with pytest.raises(ValueError, match="nodes"):
        _w(scope="all", nodes=["gpu-01"])


def test_cli_needs_exactly_one_scope() -> None:
    r = CliRunner().invoke(cli_app, ["maintenance", "start", "--cluster", "c1", "--for", "1h",
                                     "--reason", "x"])
    assert r.exit_code == 2 and "exactly one of --pool, --nodes, --all" in r.output
    r = CliRunner().invoke(cli_app, ["maintenance", "start", "--cluster", "c1", "--for", "1h",
                                     "--reason", "x", "--all", "--pool", "p"])
    assert r.exit_code == 2 and "--pool, --all" in r.output


def test_scontrol_reservations_are_read_with_their_maint_flag() -> None:
    from activities.scheduler.slurm import parse_scontrol_show_reservation

    text = (
        "ReservationName=rack-a StartTime=2026-12-01T12:00:00 EndTime=2026-12-01T14:00:00 "
        "Duration=02:00:00 Nodes=gpu-[01-03,05] NodeCnt=4 CoreCnt=4 Features=(null) "
        "PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=4 Users=root State=ACTIVE\n\n"
        "ReservationName=train StartTime=2026-12-01T12:00:00 EndTime=2026-12-02T12:00:00\n"
        "   Duration=1-00:00:00 Nodes=gpu-04 NodeCnt=1 Flags=SPEC_NODES Users=alice\n")
    a, b = parse_scontrol_show_reservation(text)
    assert a.name == "rack-a" and a.maint and a.nodes == ("gpu-01", "gpu-02", "gpu-03",
                                                          "gpu-05")
    assert a.end is not None and a.start is not None and (a.end - a.start).seconds == 7200
    assert b.name == "train" and not b.maint and b.nodes == ("gpu-04",)
    assert parse_scontrol_show_reservation("No reservations in the system\n") == []


async def test_scheduler_sync_writes_reopens_and_ends_its_own_windows(ledger_pool: Any) -> None:
    store = MaintenanceStore(ledger_pool)
    op = await store.start(cluster="c1", scope="all", duration_s=600, reason="operator's",
                           created_by="bob", now=T0)
    sw = MaintenanceWindow(window_id="slurm:c1:rack-a", cluster="c1", scope="nodes",
                           nodes=["gpu-01"], reason="Slurm maintenance reservation rack-a",
                           created_by="slurm", source="slurm", starts_at=T0,
                           ends_at=T0 + timedelta(hours=2))
    assert await store.sync("c1", "slurm", [sw], T0) == (1, 0)
    assert await store.sync("c1", "slurm", [sw], T0) == (1, 0)  # idempotent
    assert await store.sync("c1", "slurm", [], T0 + timedelta(minutes=1)) == (1 - 1, 1)
    gone = await store.get("slurm:c1:rack-a")
    assert gone is not None and gone.ended_at == T0 + timedelta(minutes=1)
    await store.sync("c1", "slurm", [sw], T0 + timedelta(minutes=2))  # it came back
    back = await store.get("slurm:c1:rack-a")
    assert back is not None and back.ended_at is None
    # the operator's window is never touched by a scheduler's sync
    assert (await store.get(op.window_id)) == op
    with pytest.raises(WindowError, match="source"):
        await store.sync("c1", "kubernetes", [sw], T0)
