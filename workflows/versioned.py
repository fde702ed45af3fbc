"""The workflows as a versioned worker registers them (Temporal Worker Versioning).

Same names and code as :data:`workflows.registry.WORKFLOWS`, each declaring its
versioning behaviour: ``RepairWorkflow`` and ``ValidationWorkflow`` ``PINNED`` (an
in-flight repair finishes on the build that started it), ``NodeWorkflow`` and
``ClusterGuardWorkflow`` ``PINNED`` too: a long-lived entity moves to the current build on
continue-as-new, its machine's state carried explicitly (:mod:`workflows.upgrades`), so
no run ever replays an older build's history on newer code.

Separate classes because a server with Worker Deployments refuses a workflow task
completion that names a behaviour from an unversioned worker ("versioning behavior
cannot be specified without deployment options being set with versioned mode", Temporal
server 1.32): the unversioned registry (tests, ``temporal.worker_versioning: false``)
keeps the plain classes. Used by ``workers.worker.build_workers`` when versioning is on.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

from workflows.guard import ClusterGuardWorkflow
from workflows.models import (
    NodeInput,
    RepairRequest,
    RepairStatus,
    ValidationRequest,
    ValidationResult,
)
from workflows.node import NodeWorkflow
from workflows.protocol import (
    GUARD_WORKFLOW,
    NODE_WORKFLOW,
    REPAIR_WORKFLOW,
    VALIDATION_WORKFLOW,
    GuardInput,
)
from workflows.repair import RepairWorkflow
from workflows.validation import ValidationWorkflow


@workflow.defn(name=NODE_WORKFLOW, versioning_behavior=VersioningBehavior.PINNED)
class VersionedNodeWorkflow(NodeWorkflow):
    """``NodeWorkflow``, pinned; it moves to a new build on continue-as-new
    (:mod:`workflows.upgrades`)."""

    @workflow.run
    async def run(self, inp: NodeInput) -> None:
        await super().run(inp)


@workflow.defn(name=GUARD_WORKFLOW, versioning_behavior=VersioningBehavior.PINNED)
class VersionedClusterGuardWorkflow(ClusterGuardWorkflow):
    """``ClusterGuardWorkflow``, pinned; it moves to a new build on continue-as-new
    (:mod:`workflows.upgrades`; its policy-refresh timer wakes it every few minutes)."""

    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        await super().run(inp)


@workflow.defn(name=REPAIR_WORKFLOW, versioning_behavior=VersioningBehavior.PINNED)
class VersionedRepairWorkflow(RepairWorkflow):
    """``RepairWorkflow``, pinned to the build that started it."""

    @workflow.run
    async def run(self, req: RepairRequest) -> RepairStatus:
        return await super().run(req)


@workflow.defn(name=VALIDATION_WORKFLOW, versioning_behavior=VersioningBehavior.PINNED)
class VersionedValidationWorkflow(ValidationWorkflow):
    """``ValidationWorkflow``, pinned to the build that started it."""

    @workflow.run
    async def run(self, req: ValidationRequest) -> ValidationResult:
        return await super().run(req)


#: The versioned registry (same order as :data:`workflows.registry.WORKFLOWS`).
VERSIONED_WORKFLOWS: list[type] = [
    VersionedNodeWorkflow,
    VersionedRepairWorkflow,
    VersionedClusterGuardWorkflow,
    VersionedValidationWorkflow,
]
