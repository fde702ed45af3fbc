"""``autorepair domains status|release`` (issue 29 item 2) through the real repair API
(uvicorn on a free port) over a real cluster guard on the Temporal dev server, its policy
from the real ``load_policy`` (``nodes[].failure_domain`` in the config): three automatic
lease requests of one rack hold it; a viewer sees the hold but may not release it; an
operator's release lifts it and is recorded; a domain not held is an error naming it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.detectors.conftest import NODES, Stack, make_config, start_stack
from tests.detectors.test_cli import api_url, cli  # noqa: F401  (fixture)
from workflows.protocol import (
    GUARD_QUERY_STATUS,
    GUARD_SIGNAL_ACQUIRE,
    GUARD_WORKFLOW,
    GuardInput,
    GuardStatus,
    LeaseRequest,
    workflow_id_guard,
)


@pytest.fixture
async def stack(cluster_name: str, ledger_pool: Any, temporal_dev_env: Any,
                tokens_file: Path) -> AsyncIterator[Stack]:
    cfg = make_config(cluster_name)
    for n in cfg.clusters[0].nodes[:3]:
        n.failure_domain = "rack-a"
    async for s in start_stack(cfg, ledger_pool, temporal_dev_env, tokens_file):
        yield s


async def test_domains_cli_shows_and_releases_a_hold(stack: Stack,
                                                     api_url: str) -> None:  # noqa: F811
    c = stack.cluster
    r = await cli("domains", "status", "--api", api_url, "--cluster", c, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["guard_running"] is False and doc["holds"] == [] and doc["threshold"] == 3

    client = stack.env.client
    guard = await client.start_workflow(
        GUARD_WORKFLOW, GuardInput(cluster=c), id=workflow_id_guard(c),
        task_queue=stack.config.temporal.task_queue)
    try:
        for n in NODES[:3]:  # automatic repairs of three rack nodes ask for leases
            await guard.signal(GUARD_SIGNAL_ACQUIRE, LeaseRequest(
                repair_id=f"r-{n}", workflow_id=f"gone-{n}", cluster=c, node=n,
                fault_kinds=["xid"]))
        for _ in range(200):
            st = await guard.query(GUARD_QUERY_STATUS, result_type=GuardStatus)
            if st.domain_holds:
                break
            await asyncio.sleep(0.05)
        r = await cli("domains", "status", "--api", api_url, "--cluster", c,
                      token="view-token")
        assert r.exit_code == 0, r.output
        assert "rack-a" in r.output and "gpu-01, gpu-02, gpu-03" in r.output

        r = await cli("domains", "release", "rack-a", "--cluster", c, "--reason", "x",
                      "--api", api_url, token="view-token")
        assert r.exit_code == 1 and "403" in r.output
        r = await cli("domains", "release", "rack-b", "--cluster", c, "--api", api_url)
        assert r.exit_code == 1 and "409" in r.output and "rack-b" in r.output
        r = await cli("domains", "release", "rack-a", "--cluster", c, "--reason",
                      "PSU replaced", "--api", api_url)
        assert r.exit_code == 0 and "released rack-a" in r.output, r.output

        for _ in range(200):
            st = await guard.query(GUARD_QUERY_STATUS, result_type=GuardStatus)
            if not st.domain_holds:
                break
            await asyncio.sleep(0.05)
        r = await cli("domains", "status", "--api", api_url, "--cluster", c, "--json")
        doc = json.loads(r.output)
        assert doc["holds"] == []
        assert [(x["domain"], x["by"], x["reason"]) for x in doc["releases"]] == [
            ("rack-a", "alice", "PSU replaced")]
        for _ in range(200):  # the hold and its release in the ledger (4 nodes: the
            # breaker trips beside it, at its minimum of 2)
            rows = [(a.active, a.evidence.get("by")) for a in
                    await stack.ledger.list_alerts(cluster=c, node="*")
                    if a.kind == "failure_domain"]
            if len(rows) == 2:
                break
            await asyncio.sleep(0.05)
        assert sorted(rows, key=str) == [(False, "alice"), (True, None)]
    finally:
        await guard.terminate("test finished")
