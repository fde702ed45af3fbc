"""The agent's OTLP/HTTP transport re-sends what the ingest did not keep: 408 included
(the ingest's answer when a body does not arrive within ``ingest.receive_timeout_s``;
nothing of the push was stored). Dropping it lost a fault record under load (the storm
benchmark's phase 2 stopped on one)."""

from __future__ import annotations

import httpx
import pytest

from agent.otlp import HttpTransport
from ingest.otlp import make_fault_request


@pytest.mark.parametrize(("status", "retryable"), [
    (408, True), (429, True), (502, True), (503, True), (504, True),
    (400, False), (401, False), (403, False), (413, False), (415, False),
])
async def test_a_refused_push_is_retried_exactly_when_nothing_was_kept(
    status: int, retryable: bool,
) -> None:
    seen: list[str] = []

    def answer(req: httpx.Request) -> httpx.Response:
        seen.append(req.url.path)
        return httpx.Response(status, text="no")

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        t = HttpTransport("http://ingest:4318", client=client)
        res = await t.export_logs(make_fault_request("c1", "gpu-01", kind="xid", code=79,
                                                       body="NVRM: Xid (PCI:0000:3b:00): 79"))
    assert seen == ["/v1/logs"]
    assert not res.ok and res.status == status
    assert res.retryable is retryable, res
