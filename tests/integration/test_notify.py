"""Notification channels against real loopback HTTP servers (aiohttp): the generic JSON
webhook, a Slack-compatible incoming webhook and a PagerDuty Events API v2 receiver —
payload shapes, filters, retries, redaction, and that delivery never blocks or raises."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from temporalio.testing import ActivityEnvironment

from activities.notifications import NotificationEvent, Notifier
from activities.notifications.dispatch import build_channels
from activities.notify import NotifyActivities
from workflows.activity_api import Notification
from workflows.config import NotificationsConfig, NotifyEvent

SLACK_PATH = "/services/T000/B000/s3cr3tT0ken"


class Receiver:
    """Records every request; ``script`` holds the statuses to answer, then 200."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.script: list[int] = []

    def of(self, path: str) -> list[dict[str, Any]]:
        return [body for p, _, body in self.received if p == path]


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    state = Receiver()

    async def handle(request: web.Request) -> web.Response:
        state.received.append((request.path, dict(request.headers), await request.json()))
        status = state.script.pop(0) if state.script else 200
        if request.path == "/pd" and status == 200:
            return web.json_response({"status": "success", "dedup_key": "x"}, status=202)
        return web.Response(status=status, text="ok")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield state, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _config(base: str, **extra: Any) -> NotificationsConfig:
    return NotificationsConfig.model_validate({
        "backoff_s": 0.01, "attempts": 3, "timeout_s": 2,
        "channels": [
            {"type": "webhook", "url": f"{base}/hook"},
            {"type": "slack", "url": f"{base}{SLACK_PATH}"},
            {"type": "pagerduty", "url": f"{base}/pd", "routing_key_env": "PD_KEY"},
        ],
        **extra,
    })


def _notifier(cfg: NotificationsConfig) -> Notifier:
    return Notifier(cfg, channels=build_channels(cfg, {"PD_KEY": "R0UT1NGKEY"}))


def _approval() -> NotificationEvent:
    from activities.notifications.event import repair_event
    from workflows.models import Alert, Severity

    alert = Alert(alert_id="a-1", cluster="c1", node="gpu-03", kind="xid", code=79,
                  severity=Severity.critical, summary="Xid 79 on gpu-03 GPU 0000:c6:00",
                  description="The GPU fell off the bus; it needs a power cycle.",
                  evidence_text="NVRM: Xid (PCI:0000:c6:00): 79, GPU has fallen off the bus.",
                  observed_at="2026-11-02T08:00:00Z")
    row = {"repair_id": "r-42", "cluster": "c1", "node": "gpu-03", "action": "power_cycle",
           "workflow_id": "repair/c1/gpu-03/r-42", "reason": ""}
    return repair_event(NotifyEvent.approval_needed, row, "awaiting_approval",
                        "approval needed: consent policy approve", [alert])


async def test_each_channel_gets_its_payload_shape(receiver: tuple[Receiver, str]) -> None:
    state, base = receiver
    n = _notifier(_config(base))
    ev = _approval()
    assert n.publish(ev) == 3
    assert await n.drain(10)
    hook = state.of("/hook")[0]
    assert hook["event"] == "approval_needed" and hook["repair_id"] == "r-42"
    assert hook["subject"] == "repair r-42 awaiting_approval"
    assert hook["summary"] == "Xid 79 on gpu-03 GPU 0000:c6:00"
    assert hook["detail"] == ("awaiting_approval: approval needed: consent policy approve "
                              "(action power_cycle, node gpu-03)")
    assert hook["evidence"][0]["code"] == 79 and hook["severity"] == "critical"
    headers = next(h for p, h, _ in state.received if p == "/hook")
    assert headers["Idempotency-Key"] == ev.idempotency_key()

    slack = state.of(SLACK_PATH)[0]
    assert "Xid 79 on gpu-03" in slack["text"]
    blocks = slack["blocks"]
    assert blocks[0] == {"type": "header", "text": {
        "type": "plain_text", "emoji": False, "text": "Xid 79 on gpu-03 GPU 0000:c6:00"}}
    fields = " ".join(f["text"] for f in blocks[2]["fields"])
    assert "*Node*\ngpu-03" in fields and "*Action*\npower_cycle" in fields
    assert "fallen off the bus" in blocks[3]["text"]["text"]
    hints = " ".join(e["text"] for e in blocks[-1]["elements"])
    assert "`autorepair repairs approve r-42`" in hints
    assert "`autorepair repairs reject r-42 --reason TEXT`" in hints
    assert all(len(b["text"]["text"]) <= 3000 for b in blocks if b["type"] == "section"
               and "text" in b)

    pd = state.of("/pd")[0]
    assert pd["routing_key"] == "R0UT1NGKEY" and pd["event_action"] == "trigger"
    assert pd["dedup_key"] == "r-42"
    assert pd["payload"]["summary"] == "Xid 79 on gpu-03 GPU 0000:c6:00"
    assert pd["payload"]["severity"] == "critical" and pd["payload"]["source"] == "gpu-03"
    assert pd["payload"]["class"] == "xid"
    assert pd["payload"]["custom_details"]["action"] == "power_cycle"


async def test_pagerduty_acknowledge_and_resolve_use_the_repair_id(
        receiver: tuple[Receiver, str]) -> None:
    state, base = receiver
    n = _notifier(_config(base))
    ev = _approval()
    for event in (NotifyEvent.repair_started, NotifyEvent.repair_finished):
        n.publish(ev.model_copy(update={"event": event}))
    assert await n.drain(10)
    assert [(b["event_action"], b["dedup_key"], "payload" in b) for b in state.of("/pd")] == [
        ("acknowledge", "r-42", False), ("resolve", "r-42", False)]


async def test_filters_by_severity_cluster_and_event(receiver: tuple[Receiver, str]) -> None:
    state, base = receiver
    cfg = NotificationsConfig.model_validate({"channels": [
        {"type": "webhook", "url": f"{base}/crit", "severities": ["critical"]},
        {"type": "webhook", "url": f"{base}/c2", "clusters": ["c2"]},
        {"type": "webhook", "url": f"{base}/breaker", "events": ["breaker_tripped"]},
    ]})
    n = _notifier(cfg)
    ev = _approval()
    assert n.publish(ev) == 1                                   # critical, c1, approval
    assert n.publish(ev.model_copy(update={"severity": "info", "cluster": "c2"})) == 1
    assert n.publish(ev.model_copy(update={"event": NotifyEvent.breaker_tripped,
                                           "severity": "info"})) == 1
    assert await n.drain(10)
    assert [p for p, _, _ in state.received].count("/crit") == 1
    assert [p for p, _, _ in state.received].count("/c2") == 1
    assert [p for p, _, _ in state.received].count("/breaker") == 1


async def test_retries_then_gives_up_and_logs_only_scheme_and_host(
        receiver: tuple[Receiver, str], caplog: pytest.LogCaptureFixture) -> None:
    state, base = receiver
    cfg = NotificationsConfig.model_validate({"backoff_s": 0.01, "attempts": 3, "channels": [
        {"type": "slack", "url": f"{base}{SLACK_PATH}"}]})
    n = _notifier(cfg)
    state.script = [503, 429]
    caplog.set_level(logging.INFO, logger="autorepair.notify")
    n.publish(_approval())
    assert await n.drain(10)
    assert len(state.of(SLACK_PATH)) == 3 and n.counts["delivered"] == 1
    assert n.counts["retried"] == 2
    state.received.clear()
    state.script = [404]
    n.publish(_approval())
    assert await n.drain(10)
    assert len(state.of(SLACK_PATH)) == 1 and n.counts["failed"] == 1  # 4xx: no retry
    assert "s3cr3tT0ken" not in caplog.text
    assert f"url={base}" in caplog.text and "HTTP 404" in caplog.text


async def test_notify_activity_never_blocks_or_raises_on_a_dead_receiver(
        caplog: pytest.LogCaptureFixture) -> None:
    # a port nobody listens on: connection refused on every try
    cfg = NotificationsConfig(webhook_url="http://127.0.0.1:9/hook?token=s3cret",
                              attempts=2, backoff_s=0.01)
    acts = NotifyActivities(cfg)
    note = Notification(cluster="c1", node="gpu-03", repair_id="r-9",
                        subject="repair r-9 failed", body="power cycle failed twice",
                        severity="critical")
    t0 = time.monotonic()
    assert await ActivityEnvironment().run(acts.notify, note) is True
    assert time.monotonic() - t0 < 1.0          # queued, not delivered inline
    assert await acts.notifier.drain(10)
    assert acts.notifier.counts["failed"] == 1
    assert "s3cret" not in caplog.text and "http://127.0.0.1:9" in caplog.text
    await acts.notifier.aclose()


async def test_workflow_notification_events_and_legacy_webhook_shape(
        receiver: tuple[Receiver, str]) -> None:
    state, base = receiver
    acts = NotifyActivities(NotificationsConfig(webhook_url=f"{base}/legacy"))
    breaker = Notification(cluster="c1", subject="Circuit breaker tripped on cluster c1",
                           body="3 automatic repair/cordon requests ...", severity="critical",
                           event="breaker_tripped", dedup_key="breaker/c1")
    failed = Notification(cluster="c1", node="gpu-03", repair_id="r-9",
                          subject="repair r-9 failed", body="power cycle failed twice",
                          severity="critical")
    env = ActivityEnvironment()
    assert await env.run(acts.notify, breaker) is True
    assert await env.run(acts.notify, failed) is True
    assert await acts.notifier.drain(10)
    got = {b["event"]: b for b in state.of("/legacy")}
    assert got["breaker_tripped"]["dedup_key"] == "breaker/c1"
    assert got["repair_failed"]["subject"] == "repair r-9 failed"
    assert got["repair_failed"]["body"] == "power cycle failed twice"
    assert got["repair_failed"]["dedup_key"] == "r-9"
    await acts.notifier.aclose()


def test_bad_secrets_name_the_channel_never_the_value(tmp_path: Any) -> None:
    cfg = NotificationsConfig.model_validate({"channels": [
        {"type": "slack", "name": "ops", "url_env": "NO_SUCH_VAR"}]})
    with pytest.raises(ValueError, match=r"channels\[ops\].url: environment variable NO_SUCH"):
        build_channels(cfg, {})
    f = tmp_path / "url"
    f.write_text("https://hooks.example.com/services/SECRET\n")
    cfg = NotificationsConfig.model_validate({"channels": [
        {"type": "slack", "url_file": str(f)}]})
    (ch,) = build_channels(cfg, {})
    assert ch.url.endswith("SECRET") and ch.where == "https://hooks.example.com"
    with pytest.raises(ValueError, match="routing_key_env or routing_key_file"):
        NotificationsConfig.model_validate({"channels": [{"type": "pagerduty"}]})


async def test_pending_is_bounded(receiver: tuple[Receiver, str]) -> None:
    state, base = receiver
    cfg = NotificationsConfig.model_validate({"max_pending": 2, "channels": [
        {"type": "webhook", "url": f"{base}/hook"}]})
    n = _notifier(cfg)
    started = [n.publish(_approval()) for _ in range(5)]
    assert started == [1, 1, 0, 0, 0] and n.counts["dropped"] == 3
    assert await n.drain(10)
    await asyncio.sleep(0)
    assert len(state.of("/hook")) == 2
