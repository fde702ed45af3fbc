"""``autorepair report --since`` a time after the window's end is bad input, not a report.

``--since 2099-01-01`` (a typo for 2019, or a time zone gone wrong) printed a report of a
window running backwards ("repairs 2099-01-01T00:00 → 2026-…", every figure 0) and exited
0: an operator reads "no repairs" where nothing was counted. docs/design.md §6: bad input
gets a clear error naming the field and value.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.detectors.conftest import Stack
from tests.detectors.test_cli import api_url, cli, flat  # noqa: F401  (fixture)

VIEW = {"Authorization": "Bearer view-token"}


async def test_report_since_after_the_window_end_is_refused(stack: Stack, api_url: str) -> None:  # noqa: F811
    future = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0).isoformat()
    r = await stack.http.get("/api/v1/report", params={"since": future}, headers=VIEW)
    assert r.status_code == 422, r.text
    assert "since" in r.text and future in r.text
    r = await cli("report", "--api", api_url, "--since", future, "--json")
    assert r.exit_code == 1, r.output
    out = flat(r.output)
    assert "since" in out and future in out
    # the window's end may be given: a since before it is a report
    r = await stack.http.get("/api/v1/report", params={
        "since": "2026-01-01T00:00:00+00:00", "until": "2026-01-02T00:00:00+00:00"},
        headers=VIEW)
    assert r.status_code == 200, r.text
    r = await stack.http.get("/api/v1/report", params={
        "since": "2026-01-03T00:00:00+00:00", "until": "2026-01-02T00:00:00+00:00"},
        headers=VIEW)
    assert r.status_code == 422 and "since" in r.text
