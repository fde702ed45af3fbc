"""Spare pool in the ledger (concurrent takers, gauge) and the ticket webhook activity."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.spares import SparePool
from activities.validation import parse_result_text, run_slug
from activities.validation_activities import ValidationActivities
from workflows.activity_api import TicketPost
from workflows.config import AutorepairConfig, ClusterConfig, ValidationConfig
from workflows.models import ValidationResult, Verdict


async def test_spare_pool_concurrent_takers_and_gauge(ledger_pool: Any) -> None:
    reg = CollectorRegistry()
    pool = SparePool(ledger_pool, registry=reg)
    assert await pool.seed("c1", ["m1", "m2", "m3"]) == 3
    assert not await pool.add("c1", "m1")  # idempotent
    await pool.add("c2", "x1")
    assert reg.get_sample_value("autorepair_spare_pool_size", {"cluster_id": "c1"}) == 3
    got = await asyncio.gather(*(pool.take("c1") for _ in range(5)))
    taken = [g for g in got if g is not None]
    assert sorted(taken) == ["m1", "m2", "m3"] and got.count(None) == 2
    assert reg.get_sample_value("autorepair_spare_pool_size", {"cluster_id": "c1"}) == 0
    assert await pool.list("c2") == ["x1"]
    assert await pool.take("c2", exclude=["x1"]) is None
    assert await pool.remove("c2", "x1") and await pool.size("c2") == 0


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, dict[str, Any]]] = []
    status = 201

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append((self.headers["Idempotency-Key"], json.loads(body)))
        self.send_response(_Hook.status)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def webhook() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Hook.received.clear()
    _Hook.status = 201
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/tickets"
    finally:
        srv.shutdown()
        srv.server_close()


async def test_ticket_webhook_posts_result(webhook: str) -> None:
    cfg = AutorepairConfig(clusters=[
        ClusterConfig(name="c", validation=ValidationConfig(ticket_webhook=webhook)),
        ClusterConfig(name="quiet"),
    ])
    acts = ValidationActivities(cfg)
    result = ValidationResult(machine="gpu-02", verdict=Verdict.failed, reason="gpu: remap")
    t = TicketPost(ticket_id="HW-1", cluster="c", machine="gpu-02", run_id="validate/gpu-02/1",
                   summary="gpu-02: validation failed", result=result)
    env = ActivityEnvironment()
    assert await env.run(acts.post_ticket, t) is True
    key, body = _Hook.received[0]
    assert key == "HW-1" and body["result"]["verdict"] == "failed"
    assert await env.run(acts.post_ticket, t.model_copy(update={"cluster": "quiet"})) is False
    _Hook.status = 400
    with pytest.raises(ApplicationError, match="answered 400"):
        await env.run(acts.post_ticket, t)


async def test_ticket_webhook_errors_never_quote_the_url_path(webhook: str) -> None:
    """The path and query of a ticket webhook may carry its credential: errors (and so
    workflow histories) show scheme and host only."""
    secret_url = webhook.replace("/tickets", "/hooks/s3cr3t-token?key=k3y")
    cfg = AutorepairConfig(clusters=[
        ClusterConfig(name="c", validation=ValidationConfig(ticket_webhook=secret_url))])
    acts = ValidationActivities(cfg)
    result = ValidationResult(machine="gpu-02", verdict=Verdict.failed, reason="gpu: remap")
    t = TicketPost(ticket_id="HW-2", cluster="c", machine="gpu-02", run_id="validate/gpu-02/2",
                   summary="gpu-02: validation failed", result=result)
    env = ActivityEnvironment()
    for status in (403, 503):
        _Hook.status = status
        with pytest.raises(Exception) as err:
            await env.run(acts.post_ticket, t)
        text = str(err.value)
        assert f"answered {status}" in text
        assert "s3cr3t" not in text and "k3y" not in text and "/hooks" not in text
    dead = "http://127.0.0.1:9/hooks/s3cr3t-token"  # discard port: connection refused
    acts = ValidationActivities(AutorepairConfig(clusters=[
        ClusterConfig(name="c", validation=ValidationConfig(ticket_webhook=dead))]))
    with pytest.raises(RuntimeError) as err2:
        await env.run(acts.post_ticket, t)
    assert "s3cr3t" not in str(err2.value) and err2.value.__cause__ is None


def test_run_slug_and_result_parsing() -> None:
    a, b = run_slug("validate/gpu-02/1"), run_slug("validate/gpu-02/2")
    assert a != b and len(a) <= 40 and a.replace("-", "").isalnum()
    text = "noise\n" + json.dumps({"machine": "x", "verdict": "failed", "checks": [
        {"name": "gpu", "outcome": "failed", "measurements": {"gpu_count": 8.0}}]}) + "\n"
    r = parse_result_text(text, "gpu-02")
    assert r is not None and r.machine == "gpu-02" and r.verdict == Verdict.failed
    assert parse_result_text("Traceback...\n{broken", "m") is None
