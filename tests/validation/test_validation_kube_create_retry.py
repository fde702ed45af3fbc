"""A Job create that fails once never makes the check run's own cordon the node's
"prior state".

Placement cordons a schedulable node for the check run, then creates the Job. When the
create fails (an API server 500, a timeout) the activity is retried; the retry read the
node again and recorded what it saw — cordoned by this very run — as the state to
restore. An ``aborted`` verdict (the run timed out, the machine was taken) then
"restored" that cordon: a node that was in service before validation was left cordoned
by a run that had ended. The prior state must be the one from before the run touched
the node, whichever try of the placement succeeds.

kmock API server + the real ``kubernetes_asyncio`` client, real Temporal
(time-skipping), real PostgreSQL ledger. No kubelet: the Job never runs, so the run ends
``aborted`` on its (short) timeout.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp.web
import pytest
from temporalio import workflow
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    import kmock

    from tests.validation.test_validation_kube import CLUSTER, JOBS, _config, _live_jobs
    from workflows.models import ValidationRequest, ValidationResult, Verdict
    from workflows.protocol import workflow_id_validation
    from workflows.validation import ValidationWorkflow


async def _validate_with_refused_creates(
        temporal_env: Any, ledger_pool: Any, kube_api: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, refusals: int | None,
        timeout_s: float | None = None) -> tuple[ValidationResult, int]:
    """Validate schedulable gpu-01 while the API server answers the first ``refusals``
    Job creates (every one: ``None``) with a 500; no kubelet, so a created Job never runs
    (``timeout_s``: the run's bound). Returns the result and how many were refused."""
    from activities.ledger_activities import LedgerActivities
    from activities.validation_activities import ValidationActivities

    server = kube_api.server
    server.resources[JOBS] = kmock.ResourceInfo(kind="Job", namespaced=True)
    cfg, _faults = _config(tmp_path)
    if timeout_s is not None:
        cfg.clusters[0].validation.timeout_s = timeout_s
        cfg.clusters[0].validation.poll_s = 1.0
    kube_api.add_node("gpu-01")  # schedulable, in service
    real = type(server)._handle
    refused: list[int] = []

    async def refuse(self: Any, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if (request.resource == JOBS and request.action == kmock.action.CREATE
                and (refusals is None or len(refused) < refusals)):
            refused.append(1)
            return aiohttp.web.json_response(
                {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                 "message": "etcdserver: request timed out", "reason": "InternalError",
                 "code": 500}, status=500)
        return await real(self, request)

    monkeypatch.setattr(type(server), "_handle", refuse)
    tq = f"kval-{uuid.uuid4().hex[:8]}"
    acts = (ValidationActivities(cfg, ledger_pool, kube_api_client=kube_api.api_client).all()
            + LedgerActivities(ledger_pool).all())
    async with Worker(temporal_env.client, task_queue=tq, workflows=[ValidationWorkflow],
                      activities=acts):
        result: ValidationResult = await temporal_env.client.execute_workflow(
            ValidationWorkflow.run, ValidationRequest(cluster=CLUSTER, machine="gpu-01"),
            id=workflow_id_validation("gpu-01", f"k-create-{uuid.uuid4().hex[:6]}"),
            task_queue=tq, result_type=ValidationResult)
    return result, len(refused)


def _in_service_as_before(kube_api: Any) -> None:
    node = kube_api.node("gpu-01")
    assert not node["spec"].get("unschedulable"), node
    assert not any(t["key"] == "autorepair.io/repair" for t in node["spec"].get("taints") or [])
    assert "autorepair.io/validation-prior" not in (node["metadata"].get("annotations") or {})
    assert _live_jobs(kube_api) == []


async def test_job_create_failing_once_keeps_the_prior_state(
        temporal_env: Any, ledger_pool: Any, kube_api: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    result, refused = await _validate_with_refused_creates(
        temporal_env, ledger_pool, kube_api, tmp_path, monkeypatch, refusals=1, timeout_s=2.0)
    assert refused == 1, "the first Job create was not refused: the test did not run its case"
    assert result.verdict == Verdict.aborted and "timed out" in result.reason, result.reason
    _in_service_as_before(kube_api)


async def test_job_create_failing_on_every_try_restores_the_node(
        temporal_env: Any, ledger_pool: Any, kube_api: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Job create refused: placement gives up after its retries (the back-off is
    skipped by the test server), the run ends ``aborted`` — and the node, cordoned for the
    run by the first try, is put back in service as it was."""
    result, refused = await _validate_with_refused_creates(
        temporal_env, ledger_pool, kube_api, tmp_path, monkeypatch, refusals=None)
    assert refused > 1, refused  # retried, then given up
    assert result.verdict == Verdict.aborted and "placement failed" in result.reason, \
        result.reason
    _in_service_as_before(kube_api)
