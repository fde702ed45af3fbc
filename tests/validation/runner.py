"""Run one ``ValidationWorkflow`` on its own worker with the real validation and ledger
activities — optionally one of them replaced (an injected outage) — for the tests that
drive a validation end to end on the loopback Slurm cluster."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.worker import Worker

from workflows.models import ValidationRequest, ValidationResult
from workflows.protocol import workflow_id_validation
from workflows.validation import ValidationWorkflow


def _name(fn: Any) -> str:
    return str(fn.__temporal_activity_definition.name)


async def run_validation(temporal_env: Any, ledger_pool: Any, config: Any, cluster: str,
                         node: str, tag: str, replace: Any = None) -> ValidationResult:
    """The result of validating ``node`` (workflow id ``validate/{node}/{tag}-<hex>``);
    ``replace``: an activity standing in for the real one of its name. Raises what the
    workflow's end raises (``WorkflowFailureError``)."""
    from activities.ledger_activities import LedgerActivities
    from activities.validation_activities import ValidationActivities

    acts = (ValidationActivities(config, ledger_pool).all()
            + LedgerActivities(ledger_pool).all())
    if replace is not None:
        acts = [a for a in acts if _name(a) != _name(replace)] + [replace]
    tq = f"validation-{uuid.uuid4().hex[:8]}"
    async with Worker(temporal_env.client, task_queue=tq, workflows=[ValidationWorkflow],
                      activities=acts):
        result: ValidationResult = await temporal_env.client.execute_workflow(
            ValidationWorkflow.run, ValidationRequest(cluster=cluster, machine=node),
            id=workflow_id_validation(node, f"{tag}-{uuid.uuid4().hex[:6]}"),
            task_queue=tq, result_type=ValidationResult,
        )
    return result
