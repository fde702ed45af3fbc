"""``autorepair repairs ...`` against the repair API served by uvicorn on a free port."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from tests.detectors.conftest import Stack
from workers.cli import app
from workers.devpeers import free_port


@pytest.fixture
async def api_url(stack: Stack) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(stack.app, host="127.0.0.1", port=port,
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


async def cli(*args: str, token: str | None = "op-token") -> Any:
    env = {"COLUMNS": "200", **({"AUTOREPAIR_TOKEN": token} if token else {})}
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)


async def test_repairs_cli_round_trip(stack: Stack, api_url: str) -> None:
    r = await cli("repairs", "create", "--api", api_url, "--node", "gpu-01", "--mode", "remove",
                  "--request-id", "cli-1", "--reason", "GPU fell off the bus twice", "--json")
    assert r.exit_code == 0, r.output
    created = json.loads(r.output)
    rid = created["repair"]["repair_id"]
    assert created["created"] and created["repair"]["requester_kind"] == "user"
    # retried create: same repair
    r = await cli("repairs", "create", "--api", api_url, "--node", "gpu-01", "--mode", "remove",
                  "--request-id", "cli-1", "--reason", "GPU fell off the bus twice")
    assert r.exit_code == 0 and f"exists: {rid}" in r.output
    # remove always waits for a person
    for _ in range(100):
        r = await cli("repairs", "show", rid, "--api", api_url, "--json")
        if json.loads(r.output)["stage"] == "awaiting_approval":
            break
        await asyncio.sleep(0.1)
    assert json.loads(r.output)["stage"] == "awaiting_approval"
    r = await cli("repairs", "list", "--api", api_url, "--state", "awaiting_approval")
    assert r.exit_code == 0 and rid in r.output and "repairs" in r.output  # a table
    r = await cli("repairs", "list", "--api", api_url, "--json", "--node", "gpu-01")
    assert [x["repair_id"] for x in json.loads(r.output)] == [rid]
    r = await cli("repairs", "show", rid, "--api", api_url)
    assert r.exit_code == 0 and "transitions" in r.output
    r = await cli("repairs", "reject", rid, "--api", api_url, "--reason", "RMA instead")
    assert r.exit_code == 0 and "reject sent" in r.output
    # auth and validation failures exit 1 with the server's message
    r = await cli("repairs", "list", "--api", api_url, token=None)
    assert r.exit_code == 1 and "401" in r.output
    r = await cli("repairs", "approve", rid, "--api", api_url, token="view-token")
    assert r.exit_code == 1 and "403" in r.output
    r = await cli("repairs", "create", "--api", api_url, "--node", "gpu-01", "--mode", "zap",
                  "--reason", "x")
    assert r.exit_code == 1 and "422" in r.output and "mode" in r.output
    r = await cli("repairs", "list", "--api", "http://127.0.0.1:1")
    assert r.exit_code == 2
