"""How the long-lived entities move to a new build (Temporal Worker Versioning; issue 26
item 6, I24).

``NodeWorkflow`` and ``ClusterGuardWorkflow`` are ``PINNED`` to the build that runs them,
like repairs, so a change of their code never replays an older build's history
(nondeterminism). They move to the deployment's new current build on continue-as-new:
when the server says the target version changed
(``workflow.info().is_target_worker_deployment_version_changed()``), the entity
continues as new at its next quiet moment, carrying its machine's state, with
``initial_versioning_behavior=AUTO_UPGRADE`` so the new run's first task goes to the
current build. An idle entity looks at least every :data:`UPGRADE_CHECK_S` seconds, so
the old build drains.

Workflow-side helpers (deterministic: they read only ``workflow.info()``); outside a
versioned worker they say "no upgrade" and change nothing.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.workflow import ContinueAsNewVersioningBehavior

#: How often an idle pinned entity wakes to look for a newer current build, seconds
#: (1 h: 10,000 idle nodes cost about 3 workflow tasks a second; an upgrade's old
#: workers stay at most this long after the last repair pinned to them ended).
UPGRADE_CHECK_S = 3600.0


def versioned() -> bool:
    """Whether this run belongs to a worker deployment version (a versioned worker)."""
    try:
        return workflow.info().get_current_deployment_version() is not None
    except (AttributeError, RuntimeError):
        return False


def upgrade_due() -> bool:
    """Whether a newer build became the deployment's current (or ramping) version while
    this pinned run kept its own."""
    try:
        return bool(workflow.info().is_target_worker_deployment_version_changed())
    except (AttributeError, RuntimeError):
        return False


def upgrade_behavior(seen: bool = False) -> ContinueAsNewVersioningBehavior | None:
    """``initial_versioning_behavior`` of a continue-as-new: ``AUTO_UPGRADE`` when moving
    to a newer build (:func:`upgrade_due` now, or ``seen``: the run saw it due in an
    earlier activation), else None (the next run stays on this build)."""
    due = seen or upgrade_due()
    return ContinueAsNewVersioningBehavior.AUTO_UPGRADE if due else None
