"""A maintenance window's node list holds each node once, in the order given:
``autorepair maintenance start --nodes gpu-01,gpu-01`` (and ``POST /api/v1/maintenance``
with ``"nodes": ["gpu-01", "gpu-01"]``) stored ``gpu-01`` twice, and the window listed
it twice."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.integration.test_maintenance_windows import OP, VIEW, api  # noqa: F401
from workers import maintenance_cli
from workers.cli import app as cli_app


def test_cli_sends_each_node_once_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(maintenance_cli, "start",
                        lambda url, auth, as_json, body: sent.append(body))
    r = CliRunner().invoke(cli_app, [
        "maintenance", "start", "--cluster", "c1", "--for", "1h", "--reason", "x",
        "--nodes", "gpu-02, gpu-01,gpu-02,,gpu-01", "--api", "http://127.0.0.1:9",
        "--token", "t"])
    assert r.exit_code == 0, r.output
    assert sent[0]["nodes"] == ["gpu-02", "gpu-01"]


async def test_api_stores_each_node_once_in_order(api: httpx.AsyncClient) -> None:  # noqa: F811
    r = await api.post("/api/v1/maintenance", headers=OP, json={
        "cluster": "c1", "nodes": ["gpu-02", "gpu-01", "gpu-02", "gpu-01"], "for": "1h",
        "reason": "cabling"})
    assert r.status_code == 201, r.text
    assert r.json()["nodes"] == ["gpu-02", "gpu-01"]
    r = await api.get("/api/v1/maintenance", headers=VIEW)
    assert [w["nodes"] for w in r.json()["windows"]] == [["gpu-02", "gpu-01"]]
