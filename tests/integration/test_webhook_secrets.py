"""Webhook URLs are credentials: none reaches a workflow history (docs/design.md §4.4).

The real notify and webhook-provisioning activities run under a workflow on the Temporal
dev server (the time-skipping test server does not keep ``last_failure``) against a
loopback endpoint whose URLs carry secrets in the path, the query and the userinfo. The
endpoint fails first (a retried attempt's failure is kept in the history's
``ActivityTaskStarted.last_failure``) and then refuses for good (``ActivityTaskFailed``);
the history must show the scheme and host only. Notifications are delivered in the
background (``activities.notifications``): the notify activity always succeeds, its
retries and refusals happen outside the history and are logged with scheme and host only.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp.web
import pytest
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.notify import NotifyActivities
from activities.provisioning import ProvisioningActivities
from activities.secrets import redact_url, scrub_url
from workflows.activity_api import ACT, MachineActionInput, Notification
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, NotificationsConfig

SECRETS = ("s3cr3t-path-XYZ", "s3cr3t-query-ABC", "s3cr3t-ops-QRS", "pw-s3cr3t-DEF")


class Endpoint:
    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def app(self) -> aiohttp.web.Application:
        app = aiohttp.web.Application()
        app.router.add_post("/hook/{secret}", self.hook)
        app.router.add_post("/ops/{secret}", self.ops)
        return app

    def _count(self, name: str) -> int:
        self.calls[name] = self.calls.get(name, 0) + 1
        return self.calls[name]

    async def hook(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.json()
        n = self._count(body["subject"])
        if body["subject"] == "refused":
            # an answer echoing the request URL, as some receivers do
            return aiohttp.web.Response(status=404, text=f"no route {request.url}")
        return aiohttp.web.Response(status=503 if n == 1 else 200)

    async def ops(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.json()
        n = self._count("ops/" + body["machine"])
        if n == 1:
            return aiohttp.web.json_response({"error": "busy"}, status=503)
        if body["machine"] == "m-bad":
            return aiohttp.web.json_response({"error": f"unknown path {request.path_qs}"},
                                             status=422)
        return aiohttp.web.json_response({"id": "op-1", "status": "succeeded"}, status=202)


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[Endpoint, int]]:
    ep = Endpoint()
    runner = aiohttp.web.AppRunner(ep.app())
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield ep, runner.addresses[0][1]
    finally:
        await runner.cleanup()


RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=50), maximum_attempts=3)


@workflow.defn(name="WebhookSecretProbe")
class WebhookSecretProbe:
    @workflow.run
    async def run(self, cluster: str) -> list[str]:
        calls: list[tuple[str, Any]] = [
            (ACT.notify, Notification(cluster=cluster, subject="flaky", body="b")),
            (ACT.reprovision_machine, MachineActionInput(cluster=cluster, node="gpu-01",
                                                         machine="m-01", repair_id="r-1")),
            (ACT.notify, Notification(cluster=cluster, subject="refused", body="b")),
            (ACT.reprovision_machine, MachineActionInput(cluster=cluster, node="gpu-02",
                                                         machine="m-bad", repair_id="r-2")),
        ]
        out: list[str] = []
        for name, arg in calls:
            try:
                await workflow.execute_activity(
                    name, arg, start_to_close_timeout=timedelta(seconds=30), retry_policy=RETRY)
                out.append("ok")
            except ActivityError as e:
                out.append(str(e.cause))
        return out


@pytest.mark.devserver
async def test_no_webhook_secret_in_any_history(temporal_dev_env: Any,
                                                endpoint: tuple[Endpoint, int],
                                                caplog: pytest.LogCaptureFixture) -> None:
    ep, port = endpoint
    hook = f"http://127.0.0.1:{port}/hook/{SECRETS[0]}?token={SECRETS[1]}"
    ops = f"http://operator:{SECRETS[3]}@127.0.0.1:{port}/ops/{SECRETS[2]}"
    cfg = AutorepairConfig(
        clusters=[ClusterConfig(
            name="wh", scheduler="kubernetes", provisioner="webhook", provision_webhook=ops,
            nodes=[NodeConfig(name="gpu-01", machine="m-01"),
                   NodeConfig(name="gpu-02", machine="m-bad")])],
        notifications=NotificationsConfig(webhook_url=hook, backoff_s=0.05),
    )
    notify = NotifyActivities(cfg.notifications)
    queue = f"secrets-{uuid.uuid4().hex[:8]}"
    client = temporal_dev_env.client
    async with Worker(client, task_queue=queue, workflows=[WebhookSecretProbe],
                      activities=[notify.notify,
                                  ProvisioningActivities(cfg).reprovision_machine],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await client.start_workflow(WebhookSecretProbe.run, "wh",
                                             id=f"probe-{queue}", task_queue=queue)
        result = await handle.result()
        history = (await handle.fetch_history()).to_json()
        assert await notify.notifier.drain(10)
    # notifications never fail the workflow; the provisioning refusal does
    assert result[:3] == ["ok", "ok", "ok"] and "HTTP 422" in result[3]
    assert ep.calls == {"flaky": 2, "refused": 1, "ops/m-01": 2, "ops/m-bad": 2}
    assert notify.notifier.counts == {"delivered": 1, "failed": 1, "retried": 1, "dropped": 0}
    # the failures are in the history, with the endpoint named by scheme and host only
    assert history.count("HTTP 503") >= 1 and f"127.0.0.1:{port}" in history
    for secret in (*SECRETS, "/hook", "/ops/", "operator"):
        assert secret not in history, secret
        assert secret not in caplog.text, secret
    assert f"url=http://127.0.0.1:{port}" in caplog.text and "HTTP 404" in caplog.text


async def test_network_errors_name_scheme_and_host_only(
        caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:9/hook/{SECRETS[0]}?token={SECRETS[1]}"  # discard port: refused
    acts = NotifyActivities(NotificationsConfig(webhook_url=url, timeout_s=2, attempts=1))
    assert await ActivityEnvironment().run(acts.notify, Notification(
        cluster="c", subject="s", body="b")) is True
    assert await acts.notifier.drain(10)
    assert acts.notifier.counts["failed"] == 1
    assert ("channel=webhook_url url=http://127.0.0.1:9 kind=cluster_alert repair=- "
            "error='ConnectError'") in caplog.text
    assert all(secret not in caplog.text for secret in SECRETS)


def test_redact_and_scrub() -> None:
    assert redact_url("https://hooks.slack.com/services/T0/B0/XXXX") == "https://hooks.slack.com"
    assert redact_url("https://u:p@[::1]:8443/x?y=z") == "https://[::1]:8443"
    assert redact_url("not a url") == "<url>" and redact_url("http://[::1") == "<url>"
    url = "https://h.example/p/SECRET?token=T0KEN"
    assert scrub_url(f"404: no route {url}", url) == "404: no route https://h.example"
    assert "SECRET" not in scrub_url("path /p/SECRET unknown", url)
    assert "T0KEN" not in scrub_url("query token=T0KEN", url)
