"""Validation side of the re-validation flow: one interface (:class:`ValidationBackend`),
Slurm and Kubernetes — the layout of :mod:`activities.scheduler`.

``place`` puts the check job on the machine, ``collect`` waits for its result,
``release`` removes the placement and ``return_machine`` applies the verdict; the
activities over them are :class:`activities.validation_activities.ValidationActivities`.

* :mod:`activities.validation.base`: run names, the result line, the verdict rules.
* :mod:`activities.validation.slurm`: maintenance reservation + pinned ``sbatch`` job.
* :mod:`activities.validation.kube`: ``batch/v1`` Job pinned to the node, tolerating the
  repair taint.

Every call is idempotent: placement records the prior state and the job id (Slurm: a
marker file; Kubernetes: annotations on the Job), so a retried placement never submits
twice and never records a state it changed itself.
"""

from __future__ import annotations

from typing import Any

from activities.validation.base import ValidationBackend, parse_result_text, run_slug
from workflows.config import ClusterConfig

__all__ = ["ValidationBackend", "parse_result_text", "run_slug", "validation_backend_for"]


def validation_backend_for(
    cluster: ClusterConfig, *, kube_api_client: Any = None
) -> ValidationBackend:
    """The validation backend of the scheduler ``cluster.scheduler`` names.

    ``kube_api_client``: a ``kubernetes_asyncio`` ``ApiClient`` for Kubernetes clusters
    (default: from the cluster's kubeconfig / in-cluster config). Raises ``ValueError``
    naming the field and value for an unknown scheduler.
    """
    if cluster.scheduler == "slurm":
        from activities.validation.slurm import SlurmValidation

        return SlurmValidation(cluster)
    if cluster.scheduler == "kubernetes":
        from activities.validation.kube import KubeValidation

        return KubeValidation(cluster, api_client=kube_api_client)
    raise ValueError(f"clusters[{cluster.name}].scheduler: unknown scheduler {cluster.scheduler!r}")
