"""``autorepair repairs ...`` against the repair API served by uvicorn on a free port."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
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


async def cli(*args: str, token: str | None = "op-token", data_dir: str | None = None) -> Any:
    # None removes the variable for the call, so the runner's own environment cannot leak in.
    env: dict[str, str | None] = {"COLUMNS": "200", "AUTOREPAIR_TOKEN": token,
                                  "AUTOREPAIR_DATA_DIR": data_dir}
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)


def flat(text: str) -> str:
    """``text`` with rich's line wrapping undone (one space between words)."""
    return " ".join(text.split())


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
    # remove always waits for a person (the state too: the row's stage moves with the
    # transition write, approval_pending with the row write right after it)
    for _ in range(100):
        r = await cli("repairs", "show", rid, "--api", api_url, "--json")
        if (json.loads(r.output)["stage"], json.loads(r.output)["state"]) == (
                "awaiting_approval", "awaiting_approval"):
            break
        await asyncio.sleep(0.1)
    assert json.loads(r.output)["state"] == "awaiting_approval", r.output
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


async def test_repairs_cli_finds_the_stack_token_through_data_dir(
    stack: Stack, api_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`autorepair up --data-dir X` then `autorepair repairs list --data-dir X` (or with
    AUTOREPAIR_DATA_DIR=X) finds X/operator.token; without one, the 401 says where the CLI
    looked and how to pass a token."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # no .autorepair here
    data = tmp_path / "stack-data"
    data.mkdir()
    (data / "operator.token").write_text("op-token\n")

    r = await cli("repairs", "list", "--api", api_url, "--json", token=None)
    out = flat(r.output)
    assert r.exit_code == 1 and "401" in out
    assert str(work / ".autorepair" / "operator.token") in out
    assert "--token" in out and "AUTOREPAIR_TOKEN" in out and "--data-dir" in out

    r = await cli("repairs", "list", "--api", api_url, "--json", "--data-dir", str(data),
                  token=None)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == []
    r = await cli("repairs", "list", "--api", api_url, "--json", token=None, data_dir=str(data))
    assert r.exit_code == 0, r.output
    # --token wins over the data directory's file
    r = await cli("repairs", "list", "--api", api_url, "--json", "--token", "view-token",
                  "--data-dir", str(tmp_path / "nowhere"), token=None)
    assert r.exit_code == 0, r.output

    (data / "operator.token").write_text("stale-token")
    r = await cli("repairs", "list", "--api", api_url, "--data-dir", str(data), token=None)
    out = flat(r.output)
    assert r.exit_code == 1 and "401" in out
    assert f"the token in {data / 'operator.token'} was refused" in out
