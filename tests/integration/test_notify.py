"""The notify activity against a real loopback webhook (aiohttp server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.notify import NotifyActivities, idempotency_key
from workflows.activity_api import Notification
from workflows.config import NotificationsConfig


class Hook:
    def __init__(self) -> None:
        self.received: list[tuple[str | None, dict[str, Any]]] = []
        self.status = 200


@pytest.fixture
async def hook() -> AsyncIterator[tuple[Hook, str]]:
    state = Hook()

    async def handle(request: web.Request) -> web.Response:
        state.received.append((request.headers.get("Idempotency-Key"), await request.json()))
        return web.Response(status=state.status, text="ok")

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield state, f"http://127.0.0.1:{port}/hook"
    finally:
        await runner.cleanup()


NOTE = Notification(cluster="c1", node="gpu-03", repair_id="r-9", subject="repair r-9 failed",
                    body="power cycle failed twice", severity="critical")


async def test_logged_only_without_webhook() -> None:
    acts = NotifyActivities(NotificationsConfig())
    assert await ActivityEnvironment().run(acts.notify, NOTE) is False


async def test_delivered_with_stable_idempotency_key(hook: tuple[Hook, str]) -> None:
    state, url = hook
    acts = NotifyActivities(NotificationsConfig(webhook_url=url))
    env = ActivityEnvironment()
    assert await env.run(acts.notify, NOTE) is True
    assert await env.run(acts.notify, NOTE) is True
    keys = {k for k, _ in state.received}
    assert keys == {idempotency_key(NOTE)}
    assert state.received[0][1]["subject"] == "repair r-9 failed"
    assert state.received[0][1]["body"] == "power cycle failed twice"


async def test_client_error_is_permanent_server_error_retried(hook: tuple[Hook, str]) -> None:
    state, url = hook
    acts = NotifyActivities(NotificationsConfig(webhook_url=url))
    state.status = 404
    with pytest.raises(ApplicationError) as e:
        await ActivityEnvironment().run(acts.notify, NOTE)
    assert e.value.non_retryable and "404" in str(e.value)
    # scheme and host only: a webhook's path is its credential
    assert url.rsplit("/", 1)[0] in str(e.value) and "/hook" not in str(e.value)
    state.status = 503
    with pytest.raises(RuntimeError, match="503"):
        await ActivityEnvironment().run(acts.notify, NOTE)
