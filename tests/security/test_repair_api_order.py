"""Issue 27 item 12: the repair API checks the caller's role before it touches the
ledger, and its errors name no internal address (the 503 used to carry the ledger's
``host:port`` from the connection error).

Real router and a real :class:`~workers.repairs.intake.LazyIntake` whose ``ledger.dsn``
points at a closed loopback port (the connection really fails), served by FastAPI and
called over HTTP through ``httpx``'s ASGI transport."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from workers.repairs.auth import ApiTokens
from workers.repairs.intake import LazyIntake
from workers.repairs.router import LEDGER_UNAVAILABLE, build_repairs_router
from workflows.config import AutorepairConfig


class CountingIntake(LazyIntake):
    """The real lazy intake, counting how often the API asked it for the ledger."""

    calls = 0

    async def get(self) -> Any:
        self.calls += 1
        return await super().get()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


async def test_role_before_ledger_and_no_address_in_errors(tmp_path: Path) -> None:
    port = _closed_port()
    dsn = f"postgresql://autorepair:s3cret@127.0.0.1:{port}/ledger"
    cfg = AutorepairConfig.model_validate({"ledger": {"dsn": dsn}})
    toks = tmp_path / "api.tokens"
    toks.write_text("op-tok operator alice\nview-tok viewer grafana  # dashboards\n")
    lazy = CountingIntake(cfg, None)  # type: ignore[arg-type]  # Temporal never reached
    app = FastAPI()
    app.include_router(build_repairs_router(lazy.get, ApiTokens.load(toks)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://api") as c:
        # no token: 401 before the ledger
        r = await c.post("/api/v1/repairs/req-1/approve")
        assert r.status_code == 401
        r = await c.get("/api/v1/repairs")
        assert r.status_code == 401
        assert lazy.calls == 0
        # a viewer may not decide or create: 403 before the ledger
        view = {"Authorization": "Bearer view-tok"}
        for path in ("approve", "reject", "cancel"):
            r = await c.post(f"/api/v1/repairs/req-1/{path}", headers=view)
            assert r.status_code == 403, (path, r.text)
        r = await c.post("/api/v1/repairs", headers=view, json={
            "node": "gpu-01", "mode": "reboot", "request_id": "x-1", "reason": "test"})
        assert r.status_code == 403
        assert lazy.calls == 0
        # an operator reaches the ledger: 503 without the DSN, host or port
        r = await c.get("/api/v1/repairs", headers={"Authorization": "Bearer op-tok"})
        assert r.status_code == 503
        assert lazy.calls == 1
        assert r.json()["detail"] == LEDGER_UNAVAILABLE
        for leak in ("127.0.0.1", str(port), "s3cret", "postgresql", "ledger.dsn"):
            assert leak not in r.text


async def test_machine_return_checks_the_role_before_the_ledger(tmp_path: Path) -> None:
    """Issue 26 I18 on the item-12 rule: ``POST /api/v1/machines/{c}/{m}/return`` refuses a
    missing token (401) and a viewer (403) without touching the ledger; ``GET
    /api/v1/machines/held`` is a viewer's read (it reaches the ledger: 503, no address)."""
    port = _closed_port()
    cfg = AutorepairConfig.model_validate(
        {"ledger": {"dsn": f"postgresql://autorepair:s3cret@127.0.0.1:{port}/ledger"}})
    toks = tmp_path / "api.tokens"
    toks.write_text("op-tok operator alice\nview-tok viewer grafana\n")
    lazy = CountingIntake(cfg, None)  # type: ignore[arg-type]
    app = FastAPI()
    app.include_router(build_repairs_router(lazy.get, ApiTokens.load(toks)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://api") as c:
        path = "/api/v1/machines/c1/m-1/return"
        assert (await c.post(path, json={"reason": "ok"})).status_code == 401
        assert (await c.get("/api/v1/machines/held")).status_code == 401
        r = await c.post(path, json={"reason": "ok"},
                         headers={"Authorization": "Bearer view-tok"})
        assert r.status_code == 403 and "may not return machines" in r.text
        assert lazy.calls == 0
        r = await c.get("/api/v1/machines/held", headers={"Authorization": "Bearer view-tok"})
        assert r.status_code == 503 and lazy.calls == 1
        assert r.json()["detail"] == LEDGER_UNAVAILABLE and str(port) not in r.text
        r = await c.post(path, json={"reason": "ok"},
                         headers={"Authorization": "Bearer op-tok"})
        assert r.status_code == 503 and lazy.calls == 2
