"""``autorepair repairs list --state terminal``: the value the option's help names
("stage, open, in_progress or terminal") is one the API takes.

The API refused it (422 "state 'terminal' is not a stage, 'open' or 'in_progress'"), so
the one filter an operator has for "every finished repair" failed with exit 1. And the
``open`` / ``in_progress`` groups were filtered after the row limit: with 200 newer
finished repairs, ``--state open`` listed nothing while repairs were open.
"""

from __future__ import annotations

import asyncio
import json

from tests.detectors.conftest import Stack
from tests.detectors.test_cli import api_url, cli  # noqa: F401  (fixture)


async def test_repairs_list_state_terminal_lists_finished_repairs(
        stack: Stack, api_url: str) -> None:  # noqa: F811
    r = await cli("repairs", "create", "--api", api_url, "--node", "gpu-01", "--mode",
                  "remove", "--request-id", "t-1", "--reason", "RMA", "--json")
    assert r.exit_code == 0, r.output
    done = json.loads(r.output)["repair"]["repair_id"]
    r = await cli("repairs", "create", "--api", api_url, "--node", "gpu-02", "--mode",
                  "remove", "--request-id", "t-2", "--reason", "RMA", "--json")
    assert r.exit_code == 0, r.output
    still_open = json.loads(r.output)["repair"]["repair_id"]
    for _ in range(100):
        r = await cli("repairs", "show", done, "--api", api_url, "--json")
        if json.loads(r.output)["stage"] == "awaiting_approval":
            break
        await asyncio.sleep(0.1)
    r = await cli("repairs", "reject", done, "--api", api_url, "--reason", "not this one")
    assert r.exit_code == 0, r.output
    for _ in range(100):
        r = await cli("repairs", "show", done, "--api", api_url, "--json")
        if json.loads(r.output)["stage"] == "rejected":
            break
        await asyncio.sleep(0.1)
    r = await cli("repairs", "list", "--api", api_url, "--state", "terminal", "--json")
    assert r.exit_code == 0, r.output
    ids = [x["repair_id"] for x in json.loads(r.output)]
    assert done in ids and still_open not in ids
    r = await cli("repairs", "list", "--api", api_url, "--state", "open", "--json")
    ids = [x["repair_id"] for x in json.loads(r.output)]
    assert still_open in ids and done not in ids
    # the limit counts matching repairs: the newest repair is open, yet the newest
    # finished one is listed (filtered after the limit, the page came back empty)
    r = await stack.http.get("/api/v1/repairs", params={"state": "terminal", "limit": 1},
                             headers={"Authorization": "Bearer view-token"})
    assert r.status_code == 200, r.text
    assert [x["repair_id"] for x in r.json()["repairs"]] == [done]
    r = await cli("repairs", "list", "--api", api_url, "--state", "finished")
    assert r.exit_code == 1 and "terminal" in r.output
