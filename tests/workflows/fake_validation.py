"""Same-named stand-in for the real ``ValidationWorkflow`` (kept in its own module so the
workflow sandbox re-imports nothing but this file and the models)."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from workflows.models import ValidationRequest


@workflow.defn(name="ValidationWorkflow")
class FakeValidationWorkflow:
    """Records that a re-validation ran for ``req.machine``."""

    @workflow.run
    async def run(self, req: ValidationRequest) -> str:
        return f"validated {req.machine}"


@workflow.defn(name="ValidationWorkflow", versioning_behavior=VersioningBehavior.PINNED)
class PinnedFakeValidationWorkflow:
    """The stand-in as a versioned worker registers it: pinned, like the real one
    (``workflows.versioned``)."""

    @workflow.run
    async def run(self, req: ValidationRequest) -> str:
        return f"validated {req.machine}"
