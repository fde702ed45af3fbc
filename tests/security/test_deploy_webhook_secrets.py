"""Item 14 of issue 27: the provisioning and ticket webhook URLs (which carry their
endpoint's credential) can be given by environment variable or file, like the other
secrets, so they stay out of the ConfigMap. The real activities post to a loopback
endpoint through each form; misconfiguration is a non-retryable error naming the key and
the variable or file, never the URL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp.web
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.provisioning as provisioning
from activities.provisioning import ProvisioningActivities
from activities.validation_activities import ValidationActivities
from workflows.activity_api import MachineActionInput, TicketPost
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig, ValidationConfig
from workflows.models import ValidationResult, Verdict

TOKEN = "s3cr3t-hook-token"


@pytest.fixture
async def endpoint(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, Any]]:
    monkeypatch.setattr(provisioning, "POWER_POLL_S", 0.05)
    seen: dict[str, Any] = {"tickets": [], "ops": []}

    async def ticket(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen["tickets"].append((request.match_info["token"], await request.json()))
        return aiohttp.web.json_response({}, status=201)

    async def create(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen["ops"].append((request.match_info["token"], await request.json()))
        return aiohttp.web.json_response({"id": "op-1", "status": "succeeded"}, status=202)

    app = aiohttp.web.Application()
    app.router.add_post("/tickets/{token}", ticket)
    app.router.add_post("/ops/{token}", create)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    seen["base"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield seen
    finally:
        await runner.cleanup()


def _ticket(cluster: str) -> TicketPost:
    return TicketPost(ticket_id="HW-9", cluster=cluster, machine="m-01",
                      run_id="validate/m-01/1", summary="m-01: validation failed",
                      result=ValidationResult(machine="m-01", verdict=Verdict.failed,
                                              reason="gpu"))


async def test_deploy_ticket_webhook_from_env_and_file(
        endpoint: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"{endpoint['base']}/tickets/{TOKEN}"
    monkeypatch.setenv("AUTOREPAIR_TICKET_WEBHOOK", url)
    f = tmp_path / "ticket-webhook"
    f.write_text(url + "\n")
    cfg = AutorepairConfig(clusters=[
        ClusterConfig(name="by-env", validation=ValidationConfig(
            ticket_webhook_env="AUTOREPAIR_TICKET_WEBHOOK")),
        ClusterConfig(name="by-file", validation=ValidationConfig(
            ticket_webhook_file=str(f))),
        ClusterConfig(name="unset", validation=ValidationConfig(
            ticket_webhook_env="AUTOREPAIR_NO_SUCH_VAR")),
    ])
    assert TOKEN not in cfg.model_dump_json()  # nothing secret in the configuration
    acts, env = ValidationActivities(cfg), ActivityEnvironment()
    assert await env.run(acts.post_ticket, _ticket("by-env")) is True
    assert await env.run(acts.post_ticket, _ticket("by-file")) is True
    assert [t for t, _ in endpoint["tickets"]] == [TOKEN, TOKEN]
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.post_ticket, _ticket("unset"))
    assert err.value.non_retryable
    assert "ticket_webhook_env: environment variable AUTOREPAIR_NO_SUCH_VAR" in str(err.value)


async def test_deploy_provision_webhook_from_env_and_file(
        endpoint: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"{endpoint['base']}/ops/{TOKEN}"
    monkeypatch.setenv("AUTOREPAIR_PROVISION_WEBHOOK", url)
    f = tmp_path / "provision-webhook"
    f.write_text(url)

    def cluster(name: str, **hook: str) -> ClusterConfig:
        return ClusterConfig(name=name, scheduler="kubernetes", provisioner="webhook",
                             nodes=[NodeConfig(name="gpu-01", machine="m-01")], **hook)

    cfg = AutorepairConfig(clusters=[
        cluster("by-env", provision_webhook_env="AUTOREPAIR_PROVISION_WEBHOOK"),
        cluster("by-file", provision_webhook_file=str(f)),
        cluster("missing", provision_webhook_file=str(tmp_path / "nope"))])
    acts, env = ProvisioningActivities(cfg), ActivityEnvironment()
    for name in ("by-env", "by-file"):
        res = await env.run(acts.reprovision_machine, MachineActionInput(
            cluster=name, node="gpu-01", machine="m-01", repair_id=f"r-{name}"))
        assert res.done
    assert [t for t, _ in endpoint["ops"]] == [TOKEN, TOKEN]
    with pytest.raises(ApplicationError) as err:
        await env.run(acts.reprovision_machine, MachineActionInput(
            cluster="missing", node="gpu-01", machine="m-01", repair_id="r-x"))
    assert err.value.non_retryable and "provision_webhook_file: cannot read" in str(err.value)


def test_deploy_webhook_forms_are_exclusive() -> None:
    with pytest.raises(ValueError, match="give one of provision_webhook, provision_webhook_env"):
        ClusterConfig(name="c", provision_webhook="https://x/y", provision_webhook_env="V")
    with pytest.raises(ValueError, match="give one of ticket_webhook, ticket_webhook_file"):
        ValidationConfig(ticket_webhook="https://x/y", ticket_webhook_file="/f")
