"""Break-test round 5: the ``webhook`` provisioning provider against an endpoint that
follows the IETF Idempotency-Key header draft (draft-ietf-httpapi-idempotency-key-header)."""

from __future__ import annotations

import aiohttp.web
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.provisioning as provisioning
from tests.activities.test_webhook_provisioner import _acts, _inp


async def test_a_409_for_a_key_still_being_processed_is_retried(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker died while its reprovision POST was in flight; the endpoint had accepted
    it and was still processing it when the retried activity re-sent the same
    ``Idempotency-Key``. The Idempotency-Key draft (§2.6) answers such a concurrent retry
    with 409 Conflict. The activity took any 4xx as a permanent refusal: the repair
    recorded a failed reprovision attempt (the ladder moved a rung up) while the
    operation ran. A 409 says "try again later", not "no": it must be retried, and the
    retry that finds the operation gets its result."""
    monkeypatch.setattr(provisioning, "POWER_POLL_S", 0.05)
    posts: list[str] = []

    async def create(request: aiohttp.web.Request) -> aiohttp.web.Response:
        posts.append(request.headers.get("Idempotency-Key", ""))
        if len(posts) == 1:
            return aiohttp.web.json_response(
                {"type": "https://developer.example.com/idempotency/concurrent",
                 "title": "A request with the same Idempotency-Key is being processed"},
                status=409)
        return aiohttp.web.json_response({"id": "op-1", "status": "succeeded"}, status=202)

    app = aiohttp.web.Application()
    app.router.add_post("/ops", create)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/ops"
        acts = _acts(None, url=url)  # type: ignore[arg-type]
        with pytest.raises(ApplicationError) as ei:
            await ActivityEnvironment().run(acts.reprovision_machine,
                                            _inp("gpu-01", "m-01", "r-409"))
        assert not ei.value.non_retryable, ei.value
        assert "409" in str(ei.value)
        res = await ActivityEnvironment().run(acts.reprovision_machine,
                                              _inp("gpu-01", "m-01", "r-409"))
        assert res.done and "op-1" in res.detail
        assert posts == ["reprovision/r-409"] * 2
    finally:
        await runner.cleanup()
