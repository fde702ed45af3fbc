"""The node side of the evidence capture: one ``autorepair-agent capture`` job through the
node-side path of ``reset_gpu`` (:mod:`activities.reset.backends`: Slurm maintenance
reservation + pinned ``sbatch``; Kubernetes privileged Job pinned by ``nodeName``,
``hostPID``, the NVIDIA runtime class, and the evidence directory mounted from the node),
with the cluster's ``reset_gpu`` placement and ``reset_gpu.capture_command``.

The job's output ends with the agent's JSON line (``{"path", "size_bytes", "sha256",
"tool", "collected_at", "notes"}``, :mod:`agent.capture`); it is parsed into a
:class:`workflows.evidence.NodeCapture`. Any other ending is a :class:`NodeCaptureFailed`
naming the job and its exit (the caller turns it into a note).

Idempotency: the run id is the repair id (the placement takes over the repair's own drain
or cordon only for its own run id), under names of its own — the Slurm reservation
``autorepair-evidence-<run>``, marker and output files ``evidence-<run>.*``, the Kubernetes
Job ``autorepair-evidence-<run>`` — so it never meets a reset job's placement. A retry
after a worker crash finds the placement and waits for the same job. The placement is
removed and the node's drain put back whatever happens, a cancellation included.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.reset.backends import KubeResetJob, SlurmResetJob, job_config
from activities.validation.base import run_slug
from workflows.activity_api import CollectInput, ReturnMachineInput, ValidationPlacement
from workflows.config import ClusterConfig, ValidationConfig
from workflows.evidence import EvidenceCaptureInput, NodeCapture
from workflows.models import Verdict

JOB_MARGIN_S = 15.0
"""Seconds of the node budget kept for placement and clean-up (an ``sbatch`` and a
``scontrol`` each, or two Kubernetes calls)."""
TOOL_SHARE = 0.8
"""Share of the job's bound each tool of the agent may run (the rest: archiving, hashing)."""


class NodeCaptureFailed(RuntimeError):
    """The node job did not give an archive; the message says why."""


RESERVATION_PREFIX = "autorepair-evidence"
"""Slurm: name prefix of the capture's maintenance reservation."""


class SlurmCaptureJob(SlurmResetJob):
    """The capture job on Slurm: the reset job's placement under names of its own."""

    def _reservation(self, run_id: str) -> str:
        return f"{RESERVATION_PREFIX}-{run_slug(run_id)}"

    def _paths(self, run_id: str) -> tuple[Path, Path]:
        d = Path(self.v.output_dir)
        slug = run_slug(run_id)
        return d / f"evidence-{slug}.json", d / f"evidence-{slug}.out"


class KubeCaptureJob(KubeResetJob):
    """The capture Job on Kubernetes: the reset Job's pod spec under its own name, plus the
    node's evidence directory as a ``hostPath`` volume (``DirectoryOrCreate``) mounted at
    the same path, so the archive stays on the node after the pod is gone."""

    JOB_PREFIX = "autorepair-evidence"
    CONTAINER = "capture"
    APP = "autorepair-evidence"
    VOLUME = "evidence"

    def __init__(self, cluster: ClusterConfig, job: ValidationConfig, runtime_class: str | None,
                 evidence_dir: str, api_client: Any = None) -> None:
        super().__init__(cluster, job, runtime_class, api_client=api_client)
        self.evidence_dir = evidence_dir

    def _job_body(self, p: ValidationPlacement, prior: dict[str, Any]) -> dict[str, Any]:
        body = super()._job_body(p, prior)
        spec = body["spec"]["template"]["spec"]
        spec["volumes"] = [{"name": self.VOLUME, "hostPath": {
            "path": self.evidence_dir, "type": "DirectoryOrCreate"}}]
        spec["containers"][0]["volumeMounts"] = [
            {"name": self.VOLUME, "mountPath": self.evidence_dir}]
        return body


def run_id_for(repair_id: str) -> str:
    """The placement's run id: the repair id (see the module docstring)."""
    return repair_id


def capture_script(cluster: ClusterConfig, inp: EvidenceCaptureInput, job_s: float) -> str:
    """The job's ``sh`` script: ``reset_gpu.capture_command`` with ``{dir}``, ``{repair}``
    and ``{tool_timeout}`` filled in."""
    tool = f"{max(1.0, job_s * TOOL_SHARE):g}"
    cmd = [a.replace("{dir}", inp.dir).replace("{repair}", inp.repair_id)
           .replace("{tool_timeout}", tool) for a in cluster.reset_gpu.capture_command]
    return shlex.join(cmd)


def parse_capture(text: str) -> NodeCapture | None:
    """The agent's result: the last JSON line with ``path`` and ``sha256``; ``None``
    without one."""
    for line in reversed(text.splitlines()):
        s = line.strip()
        if not (s.startswith("{") and s.endswith("}")):
            continue
        try:
            doc: Any = json.loads(s)
        except ValueError:
            continue
        if isinstance(doc, dict) and "path" in doc and "sha256" in doc:
            return NodeCapture.model_validate({
                "path": doc["path"], "size_bytes": doc["size_bytes"], "sha256": doc["sha256"],
                "tool": doc["tool"],
                "collected_at": doc.get("collected_at") or datetime.now(UTC).isoformat()})
    return None


def _backend(cluster: ClusterConfig, script: str, job_s: float, evidence_dir: str,
             kube_api_client: Any) -> SlurmCaptureJob | KubeCaptureJob:
    job = job_config(cluster.reset_gpu, script).model_copy(update={"timeout_s": job_s})
    if cluster.scheduler == "slurm":
        return SlurmCaptureJob(cluster, job)
    if cluster.scheduler == "kubernetes":
        return KubeCaptureJob(cluster, job, cluster.reset_gpu.runtime_class, evidence_dir,
                              api_client=kube_api_client)
    raise ValueError(f"clusters[{cluster.name}].scheduler: unknown scheduler {cluster.scheduler!r}")


async def capture_on_node(cluster: ClusterConfig, inp: EvidenceCaptureInput, budget_s: float,
                          kube_api_client: Any = None) -> tuple[NodeCapture, list[str]]:
    """Run the capture job on ``inp.node`` within ``budget_s`` seconds: the archive and the
    agent's notes. Raises :class:`NodeCaptureFailed` (not placed, did not finish, no
    result line) and what the scheduler client raises for a transient failure."""
    job_s = max(1.0, budget_s - JOB_MARGIN_S)
    backend = _backend(cluster, capture_script(cluster, inp, job_s), job_s, inp.dir,
                       kube_api_client)
    run_id = run_id_for(inp.repair_id)
    machine = inp.machine_id or inp.node
    try:
        placed = await backend.place(ValidationPlacement(
            cluster=inp.cluster, machine=machine, node=inp.node, run_id=run_id,
            timeout_s=job_s))
    except BaseException:
        await backend.close()
        raise
    if not placed.placed or not placed.job_id:
        await backend.close()
        raise NodeCaptureFailed(f"capture job not placed on {inp.node}: {placed.reason}")
    c = CollectInput(cluster=inp.cluster, machine=machine, node=inp.node, run_id=run_id,
                     job_id=placed.job_id, wait_s=job_s)
    try:
        out = await backend.job_output(c)
    finally:
        # removed, the drain put back and the client closed even when the overall bound
        # cancels the wait (the clean-up runs on in its own task)
        await asyncio.shield(_cleanup(backend, c, placed.prior_state))
    if out is None:
        raise NodeCaptureFailed(f"capture job {placed.job_id} on {inp.node} did not finish "
                                f"within {job_s:g} s")
    got = parse_capture(out.text)
    if got is None:
        tail = out.text.strip().splitlines()[-1:] or [""]
        raise NodeCaptureFailed(f"capture job {placed.job_id} on {inp.node} ended "
                                f"{out.state} without a result: {tail[0][:200]}")
    return got, _agent_notes(out.text)


def _agent_notes(text: str) -> list[str]:
    for line in reversed(text.splitlines()):
        try:
            doc = json.loads(line.strip())
        except ValueError:
            continue
        if isinstance(doc, dict) and "sha256" in doc:
            return [f"node: {n}" for n in doc.get("notes") or [] if isinstance(n, str)]
    return []


async def _cleanup(backend: SlurmCaptureJob | KubeCaptureJob, c: CollectInput,
                   prior_state: Any) -> None:
    try:
        await backend.release(c)
        await backend.return_machine(ReturnMachineInput(
            cluster=c.cluster, machine=c.machine, node=c.node, run_id=c.run_id,
            verdict=Verdict.aborted, prior_state=prior_state), None)
        backend.forget(c.run_id)
    finally:
        await backend.close()
