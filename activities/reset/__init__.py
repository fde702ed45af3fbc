"""The ``reset_gpu`` machine activity: reset the GPU(s) named by the evidence on the node,
after cordon and drain (docs/design.md §5 ``reset_gpu``), through the scheduler's own placement.

Registered on the BMC task queue with the other machine actions (the repair sends every
machine action there), though it calls no BMC. One call:

1. targets: ``MachineActionInput.gpus`` (else ``gpu``), PCI addresses normalised;
2. the job (:mod:`activities.reset.backends`): ``ResetGpuConfig.command`` per GPU
   (default ``autorepair-agent reset-gpu --pci {pci} --json``), placed on the drained node
   only — Slurm maintenance reservation + pinned ``sbatch``; Kubernetes privileged Job
   pinned by ``nodeName``, tolerating the repair taint;
3. wait for it (heartbeating) up to ``ResetGpuConfig.timeout_s``; read its output
   (:mod:`activities.reset.job`); remove the placement and put the node's drain back.

Outcome (docs/design.md §4.1 exit codes): every GPU done (exit 0, read-back clean) →
``ActionResult(done=True)``, the detail naming each GPU; any GPU failed (exit 1, no exit
status, timeout) → non-retryable ``ERR_ACTION_FAILED`` whose message and details carry the
agent's evidence (a failed attempt: the ladder moves on); otherwise any GPU that cannot be
reset (exit 2, no GPU named, no PCI address for ``{pci}``, the job could not be placed) →
``ActionResult(done=False, not_run=reason)``: nothing was touched and the repair moves to
``reboot`` without counting an attempt.

Idempotency: the run id is the repair id; a retry after a worker crash finds the
placement (Slurm marker, Kubernetes Job) and waits for the same job. Finished runs are
released and forgotten, so a later reset of the same repair places a new job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.reset.backends import KubeResetJob, SlurmResetJob, reset_backend_for
from activities.reset.job import (
    CANNOT_RUN,
    DONE,
    FAILED,
    GpuReset,
    gpu_command,
    parse_reset_output,
    reset_script,
)
from workflows.activity_api import (
    ACT,
    ERR_ACTION_FAILED,
    ERR_CONFIGURATION,
    ERR_UNKNOWN_NODE,
    ActionResult,
    CollectInput,
    MachineActionInput,
    PlacementResult,
    ReturnMachineInput,
    ValidationPlacement,
    permanent,
)
from workflows.config import AutorepairConfig, ClusterConfig
from workflows.models import Verdict
from workflows.policy import gpu_pci

log = logging.getLogger(__name__)


def run_id_for(repair_id: str) -> str:
    """The placement's run id: the repair id (the reservation / Job name carry the
    ``reset`` prefix; one reset job of a repair at a time)."""
    return repair_id


class ResetActivities:
    """``reset_gpu`` for every configured cluster; ``kube_api_client``: an optional
    ``kubernetes_asyncio`` ``ApiClient`` (default: from the cluster's kubeconfig)."""

    def __init__(self, config: AutorepairConfig, kube_api_client: Any = None) -> None:
        self.config = config
        self.kube_api_client = kube_api_client

    def _cluster(self, name: str) -> ClusterConfig:
        try:
            return self.config.cluster(name)
        except KeyError as e:
            raise permanent(ERR_UNKNOWN_NODE, str(e)) from e

    @activity.defn(name=ACT.reset_gpu)
    async def reset_gpu(self, inp: MachineActionInput) -> ActionResult:
        """Reset the named GPU(s) on ``inp.node`` (see the module docstring)."""
        cluster = self._cluster(inp.cluster)
        gpus = [gpu_pci(g) or g.strip() for g in (inp.gpus or ([inp.gpu] if inp.gpu else []))]
        gpus = [g for g in dict.fromkeys(gpus) if g]
        if not gpus:
            return ActionResult(done=False, not_run="the evidence names no GPU to reset")
        try:
            cmds = [gpu_command(cluster.reset_gpu.command, g, gpu_pci(g)) for g in gpus]
        except ValueError as e:
            return ActionResult(done=False, not_run=str(e))
        backend = reset_backend_for(cluster, reset_script(cmds),
                                    kube_api_client=self.kube_api_client)
        try:
            return await self._run(backend, inp, gpus)
        finally:
            await backend.close()

    async def _run(self, backend: SlurmResetJob | KubeResetJob, inp: MachineActionInput,
                   gpus: list[str]) -> ActionResult:
        run_id = run_id_for(inp.repair_id)
        bound = backend.v.timeout_s
        try:
            placed = await backend.place(ValidationPlacement(
                cluster=inp.cluster, machine=inp.machine, node=inp.node, run_id=run_id,
                timeout_s=bound))
        except ApplicationError as e:
            if e.type != ERR_CONFIGURATION:
                raise
            # the job cannot be submitted with this configuration (e.g. a partition the
            # cluster does not have); placement put the drain back: nothing touched
            return ActionResult(done=False,
                                not_run=f"reset job not placed on {inp.node}: {e.message}")
        if not placed.placed or not placed.job_id:
            return ActionResult(done=False,
                                not_run=f"reset job not placed on {inp.node}: {placed.reason}")
        c = CollectInput(cluster=inp.cluster, machine=inp.machine, node=inp.node,
                         run_id=run_id, job_id=placed.job_id, wait_s=bound)
        log.info("event=reset_gpu_placed cluster=%s node=%s repair=%s job=%s gpus=%s",
                 inp.cluster, inp.node, inp.repair_id, placed.job_id, ",".join(gpus))
        try:
            out = await backend.job_output(c)
        except asyncio.CancelledError:
            await self._cleanup(backend, c, placed)
            raise
        # transient errors above propagate without cleanup: the retry finds the same job
        await self._cleanup(backend, c, placed)
        if out is None:
            results = [GpuReset(g, FAILED, f"reset job {placed.job_id} did not finish within "
                                f"{bound:g} s") for g in gpus]
        else:
            results = parse_reset_output(out.text, gpus)
            if out.taken:
                for r in results:
                    if r.result != DONE:
                        r.reason = f"job {out.state} ({out.why or 'taken away'}); {r.reason}"
        return self._outcome(inp, placed.job_id, results)

    async def _cleanup(self, backend: SlurmResetJob | KubeResetJob, c: CollectInput,
                       placed: PlacementResult) -> None:
        """Remove the placement, put the node's prior state (the repair's drain) back."""
        await backend.release(c)
        await backend.return_machine(ReturnMachineInput(
            cluster=c.cluster, machine=c.machine, node=c.node, run_id=c.run_id,
            verdict=Verdict.aborted, prior_state=placed.prior_state), None)
        backend.forget(c.run_id)

    @staticmethod
    def _outcome(inp: MachineActionInput, job_id: str, results: list[GpuReset]
                 ) -> ActionResult:
        lines = "; ".join(r.line() for r in results)
        verdicts = {r.result for r in results}
        log.info("event=reset_gpu_result cluster=%s node=%s repair=%s job=%s results=%s",
                 inp.cluster, inp.node, inp.repair_id, job_id,
                 ",".join(f"{r.gpu}:{r.result}" for r in results))
        if FAILED in verdicts:
            raise permanent(ERR_ACTION_FAILED,
                            f"reset_gpu on {inp.node} (job {job_id}) did not clear the fault: "
                            f"{lines}", [asdict(r) for r in results])
        if CANNOT_RUN in verdicts:
            return ActionResult(done=False, detail=lines,
                                not_run=f"reset_gpu cannot run on {inp.node}: {lines}")
        return ActionResult(done=True, detail=f"reset_gpu on {inp.node} (job {job_id}): {lines}")

    def all(self) -> list[Callable[..., Any]]:
        """The activity methods of this class."""
        return [self.reset_gpu]
