"""Break-test round 5: the operator-facing repair API contract (DESIGN §6: bad input gets
a clear error naming the field and the value, 4xx, never 500)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.integration.test_maintenance_windows import OP, VIEW, api  # noqa: F401


async def test_a_maintenance_reason_with_nul_is_refused_naming_the_field(
    api: httpx.AsyncClient,  # noqa: F811
) -> None:
    """An operator (or a script pasting a log line) opens a maintenance window whose reason
    carries a NUL byte. PostgreSQL ``text`` cannot hold U+0000, so the insert fails and the
    API answered 500 Internal Server Error, naming nothing. The contract (DESIGN §6, api.md):
    422 naming ``reason``, and nothing opened."""
    body: dict[str, Any] = {"cluster": "c1", "all": True, "for": "1h",
                            "reason": "rack A\x00firmware"}
    r = await api.post("/api/v1/maintenance", headers=OP, json=body)
    assert r.status_code == 422, r.text
    assert "reason" in r.text
    r = await api.get("/api/v1/maintenance", headers=VIEW)
    assert r.json()["windows"] == []
