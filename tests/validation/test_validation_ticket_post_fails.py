"""A machine that failed re-validation stays out even when its ticket cannot be posted.

The run ends ``failed``: the ticket is opened in the ledger, then posted to the cluster's
``validation.ticket_webhook``. A webhook that refuses the post (a 4xx: a wrong URL or
credential, a common misconfiguration) failed the post for good — and the workflow with
it, before the verdict was applied: the node, resumed for the check job and its
reservation already released, was left schedulable. A machine that had just failed its
checks took jobs again. The verdict (keep it out, naming the ticket) must be applied and
recorded whatever the webhook answers; the failed post is said in the result.

Real Slurm on loopback, real Temporal (time-skipping), real PostgreSQL ledger, a local
HTTP endpoint answering 404.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from tests.validation.runner import run_validation
    from tests.validation.test_validation_slurm import CLUSTER, _config
    from workers.devpeers import SlurmCluster
    from workflows.models import Verdict

pytestmark = pytest.mark.slurm


class _NotFound(http.server.BaseHTTPRequestHandler):
    posts: list[str] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _NotFound.posts.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def refusing_webhook() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _NotFound.posts.clear()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/no-such-path"
    finally:
        srv.shutdown()
        srv.server_close()


async def test_failed_machine_stays_out_when_the_ticket_post_is_refused(
        temporal_env: Any, ledger_pool: Any, slurm_cluster: SlurmCluster, tmp_path: Path,
        refusing_webhook: str) -> None:
    from activities.ledger import Ledger

    config = _config(slurm_cluster, tmp_path)
    config.clusters[0].validation.ticket_webhook = refusing_webhook
    node = "gpu-02"
    (tmp_path / "faults" / f"{node}.json").write_text('{"remap_failure": true}')
    try:
        result = await run_validation(temporal_env, ledger_pool, config, CLUSTER, node,
                                      "hook-404")
        line = slurm_cluster.run("scontrol", "-o", "show", "node", node)
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume",
                          check=False)
    assert _NotFound.posts, "the webhook was never asked"
    assert result.verdict == Verdict.failed and result.ticket_id, result
    assert "DRAIN" in line and result.ticket_id in line, line  # kept out, naming the ticket
    assert "404" in result.reason, result.reason  # the failed post is said
    tickets = await Ledger(ledger_pool).open_tickets(node)
    assert [t["ticket_id"] for t in tickets] == [result.ticket_id]
    v = await Ledger(ledger_pool).latest_verdict(node)
    assert v is not None and v["verdict"] == "failed"


@pytest.mark.parametrize("failing", ["release_validation", "ledger_open_ticket"])
async def test_failed_machine_stays_out_when_a_step_before_the_verdict_fails(
        temporal_env: Any, ledger_pool: Any, slurm_cluster: SlurmCluster, tmp_path: Path,
        failing: str) -> None:
    """The release of the placement, or the ledger's ticket, failing for good (the
    activity is replaced by one that fails non-retryably, as after its retries): the run
    still applies the verdict — the failed machine is drained — and says what failed."""
    from temporalio import activity
    from temporalio.exceptions import ApplicationError


    config = _config(slurm_cluster, tmp_path)
    node = "gpu-02"
    (tmp_path / "faults" / f"{node}.json").write_text('{"remap_failure": true}')

    @activity.defn(name=failing)
    async def broken(_arg: Any) -> None:
        raise ApplicationError(f"{failing}: injected outage", non_retryable=True)

    try:
        result = await run_validation(temporal_env, ledger_pool, config, CLUSTER, node,
                                      failing, replace=broken)
        line = slurm_cluster.run("scontrol", "-o", "show", "node", node)
        if failing == "release_validation":  # what the broken release left behind
            for res in slurm_cluster.run("scontrol", "-o", "show", "reservation",
                                         check=False).splitlines():
                if "autorepair-validate" in res:
                    rname = res.split("ReservationName=")[1].split()[0]
                    slurm_cluster.run("scontrol", "delete", f"ReservationName={rname}",
                                      check=False)
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume",
                          check=False)
    assert result.verdict == Verdict.failed, result
    assert "injected outage" in result.reason, result.reason
    assert "DRAIN" in line and "validation failed" in line, line
    if failing == "ledger_open_ticket":
        assert result.ticket_id is None and "no hardware ticket opened" in result.reason
    else:
        assert result.ticket_id and "placement not released" in result.reason


async def test_a_verdict_that_cannot_be_applied_is_recorded_and_fails_the_run(
        temporal_env: Any, ledger_pool: Any, slurm_cluster: SlurmCluster,
        tmp_path: Path) -> None:
    """``return_machine`` failing for good (the scheduler refusing, after its retries): the
    verdict is still recorded in the ledger (a failed machine's ticket open, saying the
    verdict was not applied) and the run fails, so the Temporal UI lists it."""
    from temporalio import activity
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError

    from activities.ledger import Ledger
    from workflows.protocol import VALIDATION_VERDICT_NOT_APPLIED

    config = _config(slurm_cluster, tmp_path)
    node = "gpu-02"
    (tmp_path / "faults" / f"{node}.json").write_text('{"remap_failure": true}')

    @activity.defn(name="return_machine")
    async def broken(_arg: Any) -> None:
        raise ApplicationError("scontrol update: slurmctld refused", non_retryable=True)

    try:
        with pytest.raises(WorkflowFailureError) as ei:
            await run_validation(temporal_env, ledger_pool, config, CLUSTER, node,
                                 "unapplied", replace=broken)
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume",
                          check=False)
    cause = ei.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == VALIDATION_VERDICT_NOT_APPLIED, cause
    assert "verdict failed recorded" in cause.message and "slurmctld refused" in cause.message
    v = await Ledger(ledger_pool).latest_verdict(node)
    assert v is not None and v["verdict"] == "failed"
    tickets = await Ledger(ledger_pool).open_tickets(node)
    assert len(tickets) == 1
