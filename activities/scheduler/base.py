"""The scheduler interface behind ``cordon_node``/``check_idle``/``drain_node``/``rejoin_node``.

Two implementations, chosen by ``ClusterConfig.scheduler``
(:func:`activities.scheduler.scheduler_for`):
:class:`activities.scheduler.slurm.SlurmScheduler` and
:class:`activities.scheduler.kube.KubeScheduler`.

Contract of every method (docs/design.md §6): check the current state first and act only when
needed (a call on a node already in the wanted state is a no-op), write the repair id on
the target (Slurm reason, Kubernetes annotation) so a retry after a crash recognises its
own work, never undo someone else's cordon. Permanent failures raise non-retryable
``ApplicationError`` with ``ERR_UNKNOWN_NODE``/``ERR_UNSUPPORTED``/``ERR_AUTH``/
``ERR_DRAIN_DEADLINE``; transient ones raise anything else (Temporal retries them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from workflows.activity_api import CordonResult, DrainResult, IdleStatus, NodeHealth, RejoinResult

#: Called with progress details during long operations (drain); activities pass
#: ``temporalio.activity.heartbeat``, tests pass a recorder.
Heartbeat = Callable[..., Any]


def no_heartbeat(*details: Any) -> None:
    """A heartbeat that records nothing (used outside activities)."""
    return None


class Scheduler(Protocol):
    """One cluster's scheduler (Slurm or Kubernetes)."""

    async def cordon(self, node: str, repair_id: str, reason: str) -> CordonResult:
        """Stop new work landing on ``node``, tagged with ``repair_id``."""
        ...

    async def check_idle(self, node: str) -> IdleStatus:
        """Whether ``node`` runs no GPU work now; ``running`` names what still runs."""
        ...

    async def drain(
        self, node: str, repair_id: str, deadline_s: float, heartbeat: Heartbeat = no_heartbeat
    ) -> DrainResult:
        """Move the remaining work off ``node`` within ``deadline_s`` seconds."""
        ...

    async def rejoin(self, node: str, repair_id: str) -> RejoinResult:
        """Undo this repair's cordon (only ours) so ``node`` takes work again."""
        ...

    async def node_health(self, node: str) -> NodeHealth:
        """Readiness, state flags and boot identity of ``node``."""
        ...

    async def close(self) -> None:
        """Release clients (idempotent)."""
        ...
