"""The ``webhook`` provisioning provider against a real HTTP endpoint on loopback.

The endpoint (aiohttp, free port) behaves like an operator's provisioning control plane:
``POST /ops`` with an ``Idempotency-Key`` creates one operation per key and answers
``{"id", "status"}``; ``GET /ops/{id}`` shows ``running`` for a few polls, then
``succeeded`` (with ``new_machine`` / ``ticket_id`` for migrate / remove) or ``failed``
with a ``detail`` (machine names starting with ``bad-``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.provisioning as provisioning
from activities.provisioning import ProvisioningActivities
from workflows.activity_api import ERR_ACTION_FAILED, ERR_AUTH, MachineActionInput
from workflows.config import AutorepairConfig, ClusterConfig, NodeConfig

#: Polls an operation stays ``running`` before it ends.
RUNNING_POLLS = 3


@dataclass
class OpsEndpoint:
    """State of the fake operator endpoint (what the tests assert on)."""

    url: str = ""
    ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_key: dict[str, str] = field(default_factory=dict)
    posts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    polls: dict[str, int] = field(default_factory=dict)
    fail_next_posts: int = 0  # answer 503 to this many POSTs
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def app(self) -> aiohttp.web.Application:
        app = aiohttp.web.Application()
        app.router.add_post("/ops", self._create)
        app.router.add_get("/ops/{id}", self._get)
        return app

    async def _create(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        key = request.headers.get("Idempotency-Key")
        if not key:
            return aiohttp.web.json_response({"error": "Idempotency-Key required"}, status=400)
        body = await request.json()
        self.posts.append((key, body))
        if self.fail_next_posts > 0:
            self.fail_next_posts -= 1
            return aiohttp.web.json_response({"error": "control plane busy"}, status=503)
        if body.get("action") not in ("reprovision", "migrate", "remove"):
            return aiohttp.web.json_response({"error": "unknown action"}, status=422)
        if key not in self.by_key:
            op_id = f"op-{next(self._ids)}"
            self.by_key[key] = op_id
            self.ops[op_id] = {"id": op_id, "status": "running", "request": body}
            self.polls[op_id] = 0
        op = self.ops[self.by_key[key]]
        return aiohttp.web.json_response(
            {"id": op["id"], "status": op["status"]}, status=202)

    async def _get(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        op = self.ops.get(request.match_info["id"])
        if op is None:
            return aiohttp.web.json_response({"error": "no such operation"}, status=404)
        self.polls[op["id"]] += 1
        req = op["request"]
        if op["status"] == "running" and self.polls[op["id"]] >= RUNNING_POLLS:
            if str(req["machine"]).startswith("bad-"):
                op["status"] = "failed"
                op["detail"] = f"BMC of {req['machine']} unreachable from the imaging network"
            else:
                op["status"] = "succeeded"
                if req["action"] == "migrate":
                    op["new_machine"] = f"spare-for-{req['node']}"
                if req["action"] == "remove":
                    op["ticket_id"] = f"RMA-{req['machine']}"
        out = {k: v for k, v in op.items() if k != "request"}
        out["progress"] = min(100, 100 * self.polls[op["id"]] // RUNNING_POLLS)
        return aiohttp.web.json_response(out)


@pytest.fixture()
async def endpoint(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OpsEndpoint]:
    monkeypatch.setattr(provisioning, "POWER_POLL_S", 0.05)  # poll fast in tests
    ep = OpsEndpoint()
    runner = aiohttp.web.AppRunner(ep.app())
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    ep.url = f"http://127.0.0.1:{port}/ops"
    try:
        yield ep
    finally:
        await runner.cleanup()


def _acts(ep: OpsEndpoint, url: str | None = None) -> ProvisioningActivities:
    cfg = AutorepairConfig(clusters=[ClusterConfig(
        name="wh", scheduler="kubernetes", provisioner="webhook",
        provision_webhook=url or ep.url, provision_image="https://images.example/clean.iso",
        nodes=[NodeConfig(name="gpu-01", machine="m-01"), NodeConfig(name="gpu-02",
                                                                   machine="bad-02")],
    )])
    return ProvisioningActivities(cfg)


def _inp(node: str, machine: str, rid: str = "r-1") -> MachineActionInput:
    return MachineActionInput(cluster="wh", node=node, machine=machine, repair_id=rid)


async def test_reprovision_polls_until_done(endpoint: OpsEndpoint) -> None:
    res = await ActivityEnvironment().run(_acts(endpoint).reprovision_machine,
                                          _inp("gpu-01", "m-01"))
    assert res.done and res.detail == "webhook operation op-1 succeeded"
    key, body = endpoint.posts[0]
    assert key == "reprovision/r-1"
    assert body == {"action": "reprovision", "cluster": "wh", "node": "gpu-01",
                    "machine": "m-01", "repair_id": "r-1",
                    "image": "https://images.example/clean.iso"}
    assert endpoint.polls["op-1"] == RUNNING_POLLS  # polled through the progress


async def test_retry_with_same_idempotency_key_is_one_operation(endpoint: OpsEndpoint) -> None:
    acts = _acts(endpoint)
    inp = _inp("gpu-01", "m-01", "r-crash")
    polling = asyncio.Event()
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *d: polling.set()
    first = asyncio.create_task(env.run(acts.reprovision_machine, inp))
    await asyncio.wait_for(polling.wait(), 10)  # the operation is being polled: worker dies
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert endpoint.ops["op-1"]["status"] == "running"

    res = await ActivityEnvironment().run(acts.reprovision_machine, inp)
    assert res.done and "op-1" in res.detail
    assert [k for k, _ in endpoint.posts] == ["reprovision/r-crash"] * 2
    assert list(endpoint.ops) == ["op-1"]  # both POSTs map to one operation


async def test_failed_operation_is_non_retryable_with_detail(endpoint: OpsEndpoint) -> None:
    with pytest.raises(ApplicationError) as ei:
        await ActivityEnvironment().run(_acts(endpoint).reprovision_machine,
                                        _inp("gpu-02", "bad-02"))
    err = ei.value
    assert err.type == ERR_ACTION_FAILED and err.non_retryable
    assert "bad-02 failed" in str(err) and "unreachable from the imaging network" in str(err)


async def test_migrate_and_remove_return_endpoint_results(endpoint: OpsEndpoint) -> None:
    acts = _acts(endpoint)
    mig = await ActivityEnvironment().run(acts.migrate_node, _inp("gpu-01", "m-01", "r-mig"))
    assert (mig.old_machine, mig.new_machine) == ("m-01", "spare-for-gpu-01")
    rem = await ActivityEnvironment().run(acts.remove_machine, _inp("gpu-01", "m-01", "r-rm"))
    assert rem.done and rem.ticket_id == "RMA-m-01"
    assert [k for k, _ in endpoint.posts] == ["migrate/r-mig", "remove/r-rm"]


async def test_server_errors_retry_client_errors_do_not(endpoint: OpsEndpoint) -> None:
    acts = _acts(endpoint)
    endpoint.fail_next_posts = 1
    with pytest.raises(ApplicationError) as re_:  # 503: retried by Temporal
        await ActivityEnvironment().run(acts.reprovision_machine, _inp("gpu-01", "m-01", "r-5"))
    assert "HTTP 503" in str(re_.value) and "/ops" not in str(re_.value)
    # retryable, and nothing was started (the POST was refused): the phase says so
    assert not re_.value.non_retryable and re_.value.details == ({"phase": "not_started"},)
    res = await ActivityEnvironment().run(acts.reprovision_machine,
                                          _inp("gpu-01", "m-01", "r-5"))
    assert res.done and len(endpoint.ops) == 1

    bad_url = _acts(endpoint, url=endpoint.url.replace("/ops", "/nowhere"))
    with pytest.raises(ApplicationError) as ei:  # 404 on POST: permanent
        await ActivityEnvironment().run(bad_url.reprovision_machine, _inp("gpu-01", "m-01"))
    assert ei.value.type == ERR_ACTION_FAILED and ei.value.non_retryable
    assert "/nowhere" not in str(ei.value)  # the endpoint's path never in the message


async def test_auth_refusal_is_non_retryable() -> None:
    async def refuse(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"error": "bad token"}, status=401)

    app = aiohttp.web.Application()
    app.router.add_post("/ops", refuse)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/ops"
        with pytest.raises(ApplicationError) as ei:
            await ActivityEnvironment().run(_acts(OpsEndpoint(), url=url).reprovision_machine,
                                            _inp("gpu-01", "m-01"))
        assert ei.value.type == ERR_AUTH and ei.value.non_retryable and "401" in str(ei.value)
    finally:
        await runner.cleanup()
