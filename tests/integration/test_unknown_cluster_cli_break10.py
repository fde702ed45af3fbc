"""``autorepair report|maintenance list|status --cluster C`` with a cluster the config
does not list is an error naming it and the configured clusters (exit 1, the API's 422),
as ``domains status`` is: ``report`` and ``maintenance list`` printed empty tables (exit
0) and ``status`` added "no agent has reported yet; start agents ..." for a typo."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from typer.testing import CliRunner

from activities.ledger import Ledger
from tests.integration.test_maintenance_windows import _cfg
from workers.cli import app as cli_app
from workers.devpeers import free_port
from workers.repairs.auth import ApiTokens
from workers.repairs.intake import RepairIntake
from workers.repairs.router import build_repairs_router


@pytest.fixture
async def api_url(ledger_pool: Any, tmp_path: Path) -> AsyncIterator[str]:
    toks = tmp_path / "api.tokens"
    toks.write_text("op-tok operator alice\n")
    intake = RepairIntake(_cfg(), Ledger(ledger_pool), None)  # type: ignore[arg-type]

    async def get() -> RepairIntake:
        return intake

    app = FastAPI()
    app.include_router(build_repairs_router(get, ApiTokens.load(toks)), prefix="")

    @app.get("/api/v1/state")
    async def state(cluster_id: str | None = None) -> dict[str, Any]:
        return {"nodes": [], "clusters": {}}  # the ingest's snapshot: no agent reports

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def cli(*args: str) -> Any:
    return await asyncio.to_thread(CliRunner().invoke, cli_app, list(args),
                                   env={"COLUMNS": "200", "AUTOREPAIR_TOKEN": "op-tok"})


@pytest.mark.parametrize("command", [("report",), ("maintenance", "list"), ("status",)])
async def test_an_unknown_cluster_is_named_with_the_configured_ones(
        api_url: str, command: tuple[str, ...]) -> None:
    r = await cli(*command, "--cluster", "typo", "--api", api_url)
    out = " ".join(r.output.split())
    assert r.exit_code == 1, out
    assert "unknown cluster 'typo'" in out and "c1" in out, out
    assert "no agent has reported yet" not in out, out


@pytest.mark.parametrize("command", [("report",), ("maintenance", "list")])
async def test_the_configured_cluster_still_answers(
        api_url: str, command: tuple[str, ...]) -> None:
    r = await cli(*command, "--cluster", "c1", "--api", api_url, "--json")
    assert r.exit_code == 0, r.output
