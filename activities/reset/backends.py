"""Where the reset job runs: the validation placement of each scheduler, reused.

* Slurm (:class:`SlurmResetJob`): a maintenance reservation ``{reservation_prefix}-<run>``
  on the drained node (``Flags=MAINT``: nothing else lands there) and an ``sbatch -w
  NODE --reservation=...`` job; the node's drain is lifted for the job and put back with
  the repair's reason afterwards (:class:`activities.validation.slurm.SlurmValidation`).
* Kubernetes (:class:`KubeResetJob`): a ``batch/v1`` Job ``autorepair-reset-<run>`` with
  ``nodeName`` = the node, tolerating ``autorepair.io/repair:NoSchedule``,
  ``backoffLimit: 0``, and what the NVIDIA reset needs: a privileged container (the GPU
  device nodes and root), ``hostPID`` (the agent's ``/proc/*/fd`` holder check sees the
  node's processes), ``NVIDIA_VISIBLE_DEVICES=all`` through the NVIDIA runtime class
  (nvidia-smi and NVML without claiming ``nvidia.com/gpu``) and no service account token
  (the pod calls no API). :class:`activities.validation.kube.KubeValidation` does the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s

from activities.validation.kube import KubeValidation
from activities.validation.slurm import SlurmValidation
from workflows.activity_api import ValidationPlacement
from workflows.config import ClusterConfig, ResetGpuConfig, ValidationConfig

#: How often the collecting loop re-reads the job, seconds (the collect poll of the
#: validation backends is per call; one call waits for the whole job here).
RESET_POLL_S = 5.0


def job_config(r: ResetGpuConfig, script: str) -> ValidationConfig:
    """The validation job settings that run ``script`` under ``/bin/sh`` with ``r``'s
    placement (output directory, reservation, namespace, image, bound)."""
    return ValidationConfig(
        command=["/bin/sh", "-c", script], env=dict(r.env), timeout_s=r.timeout_s,
        poll_s=RESET_POLL_S, output_dir=r.output_dir, reservation_prefix=r.reservation_prefix,
        reservation_user=r.reservation_user, partition=r.partition, namespace=r.namespace,
        image=r.image, gpus=0,
    )


class SlurmResetJob(SlurmValidation):
    """The reset job on Slurm (see the module docstring)."""

    def __init__(self, cluster: ClusterConfig, job: ValidationConfig) -> None:
        super().__init__(cluster)
        self.v = job

    def forget(self, run_id: str) -> None:
        """Drop the run's placement marker, so the next reset of the repair places anew."""
        marker, _out = self._paths(run_id)
        Path(marker).unlink(missing_ok=True)


class KubeResetJob(KubeValidation):
    """The reset Job on Kubernetes (see the module docstring)."""

    JOB_PREFIX = "autorepair-reset"
    CONTAINER = "reset"
    APP = "autorepair-reset-gpu"

    def __init__(self, cluster: ClusterConfig, job: ValidationConfig,
                 runtime_class: str | None, api_client: k8s.ApiClient | None = None) -> None:
        super().__init__(cluster, api_client=api_client)
        self.v = job
        self.runtime_class = runtime_class

    def _job_body(self, p: ValidationPlacement, prior: dict[str, Any]) -> dict[str, Any]:
        body = super()._job_body(p, prior)
        spec = body["spec"]["template"]["spec"]
        spec["hostPID"] = True
        spec["automountServiceAccountToken"] = False
        if self.runtime_class:
            spec["runtimeClassName"] = self.runtime_class
        c = spec["containers"][0]
        c["securityContext"] = {"privileged": True}
        c["env"] += [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                     {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}]
        return body

    def forget(self, run_id: str) -> None:
        """Nothing to drop: the Job itself is the marker and ``release`` deletes it."""


def reset_backend_for(
    cluster: ClusterConfig, script: str, *, kube_api_client: Any = None
) -> SlurmResetJob | KubeResetJob:
    """The reset job backend of ``cluster.scheduler`` running ``script``. Raises
    ``ValueError`` naming the field and value for an unknown scheduler."""
    job = job_config(cluster.reset_gpu, script)
    if cluster.scheduler == "slurm":
        return SlurmResetJob(cluster, job)
    if cluster.scheduler == "kubernetes":
        return KubeResetJob(cluster, job, cluster.reset_gpu.runtime_class,
                            api_client=kube_api_client)
    raise ValueError(f"clusters[{cluster.name}].scheduler: unknown scheduler {cluster.scheduler!r}")
