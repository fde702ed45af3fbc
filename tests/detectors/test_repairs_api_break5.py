"""Break-test round 5: idempotency of ``POST /api/v1/repairs`` (DESIGN §5 "Idempotency",
§6 "nothing already accepted is lost")."""

from __future__ import annotations

from tests.detectors.conftest import Stack
from tests.detectors.test_repairs_api import DET, body


async def test_a_reused_request_id_with_another_mode_is_refused_naming_the_field(
    stack: Stack
) -> None:
    """A detector asked for a reboot of gpu-01 under request id r-esc-1, then (its own
    bug, or two code paths sharing a counter) sent r-esc-1 again asking for a reprovision.
    The API answered 200 with the existing reboot repair, ``created: false``: the detector
    took its reprovision as accepted while nothing would ever reprovision the node. A key
    reused with a different node is already a 409 naming ``request_id``; a different mode
    is the same client bug and must be refused the same way, naming ``mode`` and both
    values, with the first repair left as it was."""
    h = stack.http
    r = await h.post("/api/v1/repairs", json=body(request_id="r-esc-1"), headers=DET)
    assert r.status_code == 201, r.text
    rid = r.json()["repair"]["repair_id"]
    again = await h.post("/api/v1/repairs", headers=DET,
                         json={**body(request_id="r-esc-1"), "mode": "reprovision"})
    assert again.status_code == 409, again.text
    detail = again.json()["detail"]
    assert "mode" in detail and "reprovision" in detail and "reboot" in detail
    same = await h.post("/api/v1/repairs", json=body(request_id="r-esc-1"), headers=DET)
    assert same.status_code == 200 and same.json()["repair"]["repair_id"] == rid
    assert same.json()["repair"]["action"] == "reboot"
