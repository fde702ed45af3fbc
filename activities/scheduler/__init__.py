"""Scheduler side of the repair: one interface (:class:`Scheduler`), Slurm and Kubernetes.

* :mod:`activities.scheduler.base`: the :class:`Scheduler` protocol and its contract.
* :mod:`activities.scheduler.slurm`: ``scontrol``/``squeue`` against the site's slurmctld.
* :mod:`activities.scheduler.kube`: cordon, taint and eviction through ``kubernetes_asyncio``.

The activities over them are :class:`activities.scheduler_activities.SchedulerActivities`.
"""

from __future__ import annotations

from typing import Any

from activities.scheduler.base import Heartbeat, Scheduler
from workflows.config import ClusterConfig

__all__ = ["Heartbeat", "Scheduler", "scheduler_for"]


def scheduler_for(cluster: ClusterConfig, **kwargs: Any) -> Scheduler:
    """The scheduler implementation ``cluster.scheduler`` names.

    ``kwargs`` go to the implementation (e.g. ``api_client=`` for Kubernetes tests).
    Raises ``ValueError`` naming the field and value for an unknown scheduler.
    """
    if cluster.scheduler == "slurm":
        from activities.scheduler.slurm import SlurmScheduler

        return SlurmScheduler(cluster, **kwargs)
    if cluster.scheduler == "kubernetes":
        from activities.scheduler.kube import KubeScheduler

        return KubeScheduler(cluster, **kwargs)
    raise ValueError(f"clusters[{cluster.name}].scheduler: unknown scheduler {cluster.scheduler!r}")
