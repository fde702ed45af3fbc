"""Validation activities: place the check job on the machine, collect its result, release
the placement, return the machine (``ACT.place_validation`` / ``collect_validation`` /
``release_validation`` / ``return_machine`` / ``post_ticket``; DESIGN §1 step 5).

Slurm: a maintenance reservation ``{reservation_prefix}-<run>`` on the node (``Flags=MAINT``,
so nothing else lands there while the checks run) and an ``sbatch -w NODE
--reservation=...`` job running ``ValidationConfig.command`` (the agent's
``autorepair-agent validate --json``); the result is the last JSON object of the job's
output file in ``ValidationConfig.output_dir``. A node drained for the repair is resumed
for the run (the reservation keeps other jobs off) and put back afterwards.

Kubernetes: a ``batch/v1`` Job pinned to the node (``nodeName``) tolerating
``autorepair.io/repair:NoSchedule``; the result is read from the pod's log.

Verdict handling (``return_machine``):

* ``passed`` → ``pool``: drained/cordoned by autorepair (or not at all) → made
  schedulable; a node someone else took out keeps their reason.
  ``spare``: joins the cluster's hot-spare pool (:mod:`activities.spares`) and stays out
  of scheduling until a migrate draws it.
* ``failed`` → stays out: drained/cordoned with ``autorepair:<run> validation failed
  ticket <id>``, removed from the spare pool.
* ``aborted`` → the state recorded before placement is restored exactly (drain flag and
  reason / unschedulable and taints); nothing is condemned.

Every call is idempotent: placement records the prior state and the job id in a marker
(Slurm: ``<output_dir>/<run>.json``; Kubernetes: annotations on the Job), so a retried
placement never submits twice and never records a state it changed itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.scheduler.slurm import REASON_PREFIX, SlurmNode, SlurmScheduler
from activities.secrets import redact_url
from activities.spares import SparePool
from workflows.activity_api import (
    ACT,
    ERR_ACTION_FAILED,
    ERR_CONFIGURATION,
    ERR_UNKNOWN_NODE,
    CollectInput,
    CollectResult,
    PlacementResult,
    ReturnMachineInput,
    ReturnMachineResult,
    TicketPost,
    ValidationPlacement,
    permanent,
)
from workflows.config import AutorepairConfig, ClusterConfig, ValidationConfig
from workflows.models import ValidationResult, Verdict

#: Poll interval of the collecting activity while the job runs, seconds.
COLLECT_POLL_S = 1.0
#: How long placement waits for jobs that are only COMPLETING on the node (epilog,
#: KillWait) before calling the machine busy, seconds (Slurm KillWait default is 30 s;
#: the epilog of a finished job normally ends within seconds).
COMPLETING_WAIT_S = 20.0
#: Slurm job states in which the job is still queued or running (squeue(1) JOB STATE CODES).
SLURM_ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                          "RESV_DEL_HOLD", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SIGNALING",
                          "STAGE_OUT", "STOPPED"})
#: Slurm job states meaning someone else took the node or the job away (→ aborted).
SLURM_TAKEN = frozenset({"CANCELLED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
                         "REVOKED"})


def run_slug(run_id: str) -> str:
    """A Slurm/Kubernetes-safe name for a run id: lower-case ``[a-z0-9-]``, ≤ 40 chars,
    with 8 hex digits of its sha256 so distinct runs never collide."""
    base = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")[:30].strip("-")
    return f"{base}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def parse_result_text(text: str, machine: str) -> ValidationResult | None:
    """The last line of ``text`` that is a JSON result object, as a ``ValidationResult``
    with ``machine`` set; ``None`` when no line parses (job died before printing)."""
    for line in reversed(text.splitlines()):
        s = line.strip()
        if not (s.startswith("{") and s.endswith("}")):
            continue
        try:
            data = json.loads(s)
            if not isinstance(data, dict) or "verdict" not in data:
                continue
            data["machine"] = machine
            return ValidationResult.model_validate(data)
        except ValueError:
            continue
    return None


def _aborted(machine: str, reason: str) -> ValidationResult:
    return ValidationResult(machine=machine, verdict=Verdict.aborted, reason=reason)


def _heartbeat(*details: Any) -> None:
    if activity.in_activity():
        activity.heartbeat(*details)


# --------------------------------------------------------------------------------------
# Slurm
# --------------------------------------------------------------------------------------


class SlurmValidation(SlurmScheduler):
    """Validation placement on one Slurm cluster (reservation + pinned ``sbatch`` job)."""

    def __init__(self, cluster: ClusterConfig) -> None:
        super().__init__(cluster)
        self.v: ValidationConfig = cluster.validation

    def _reservation(self, run_id: str) -> str:
        return f"{self.v.reservation_prefix}-{run_slug(run_id)}"

    def _paths(self, run_id: str) -> tuple[Path, Path]:
        d = Path(self.v.output_dir)
        slug = run_slug(run_id)
        return d / f"{slug}.json", d / f"{slug}.out"

    @staticmethod
    def snapshot(n: SlurmNode) -> dict[str, Any]:
        """The restorable part of a node's state."""
        return {"scheduler": "slurm", "state": n.state, "drain": n.drain, "reason": n.reason}

    async def _sbatch(self, args: list[str]) -> tuple[int, str, str]:
        env = dict(os.environ)
        env.update(self.v.env)
        if self.cluster.slurm_conf:
            env["SLURM_CONF"] = self.cluster.slurm_conf
        proc = await asyncio.create_subprocess_exec(
            self._bin("sbatch"), *args, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60.0)
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    async def _reservation_exists(self, name: str) -> bool:
        rc, out, _err = await self._run("scontrol", "show", "reservation", name, check=False)
        return rc == 0 and f"ReservationName={name}" in out

    async def job_state(self, job_id: str) -> str | None:
        """``JobState`` of ``job_id``; ``None`` once Slurm forgot the job (after MinJobAge)."""
        rc, out, err = await self._run("scontrol", "-o", "show", "job", job_id, check=False)
        if rc != 0:
            if "Invalid job id" in (out + err):
                return None
            raise RuntimeError(f"scontrol show job {job_id} rc={rc}: {(err or out).strip()}")
        m = re.search(r"\bJobState=(\S+)", out)
        return m.group(1) if m else None

    async def _settled_jobs(self, node: str, n: SlurmNode) -> tuple[list[str], SlurmNode]:
        """Jobs on ``node`` once jobs merely COMPLETING there have finished (waits at most
        ``COMPLETING_WAIT_S``); a running, suspended or configuring job is returned at once."""
        deadline = time.monotonic() + COMPLETING_WAIT_S
        while True:
            rc, out, err = await self._run(
                "squeue", "--noheader", f"--nodelist={node}", "--states=R,CG,S,CF",
                "--format=%i %T", check=False,
            )
            if rc != 0:
                raise RuntimeError(f"squeue -w {node} rc={rc}: {err.strip()}")
            rows = [line.split() for line in out.splitlines() if line.strip()]
            busy = [r[0] for r in rows if len(r) < 2 or r[1] != "COMPLETING"]
            if busy or (not rows and not n.allocated) or time.monotonic() >= deadline:
                return busy or [r[0] for r in rows], n
            await asyncio.sleep(0.5)
            n = await self.read_node(node)

    async def place(self, p: ValidationPlacement) -> PlacementResult:
        """Reservation + pinned job; ``placed=False`` with the reason when impossible."""
        v = self.v
        marker, out_file = self._paths(p.run_id)
        res = self._reservation(p.run_id)
        timing = {"timeout_s": v.timeout_s, "poll_s": v.poll_s}
        state: dict[str, Any] = {}
        if marker.exists():
            state = json.loads(marker.read_text())
            if state.get("job_id"):
                return PlacementResult(placed=True, job_id=state["job_id"],
                                       prior_state=state["prior_state"], **timing)
        try:
            node = await self.read_node(p.node)
        except ApplicationError as e:
            if e.type == ERR_UNKNOWN_NODE:
                return PlacementResult(placed=False, reason=str(e), **timing)
            raise
        prior = state.get("prior_state") or self.snapshot(node)
        settle = time.monotonic() + COMPLETING_WAIT_S
        while (not node.ready and "NOT_RESPONDING" in node.flags
               and set(node.flags) <= {"NOT_RESPONDING", "DRAIN"}
               and time.monotonic() < settle):
            # slurmctld flags a just-resumed node NOT_RESPONDING until slurmd answers its
            # next ping (about a second on loopback); only a lasting one is a real fault.
            await asyncio.sleep(0.5)
            node = await self.read_node(p.node)
        if not node.ready:
            return PlacementResult(
                placed=False, prior_state=prior,
                reason=f"node {p.node} not ready ({'+'.join(node.state)})", **timing,
            )
        jobs, node = await self._settled_jobs(p.node, node)
        if jobs or node.allocated:
            return PlacementResult(
                placed=False, prior_state=prior,
                reason=f"machine reallocated: jobs {', '.join(jobs) or '(completing)'} on "
                f"{p.node}", **timing,
            )
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"prior_state": prior, "job_id": None}))
        minutes = max(1, int(v.timeout_s // 60) + 1)
        if not await self._reservation_exists(res):
            rc, out, err = await self._run(
                "scontrol", "create", "reservation", f"ReservationName={res}",
                f"Nodes={p.node}", "StartTime=now", f"Duration={minutes}",
                f"Users={v.reservation_user}", "Flags=MAINT", check=False,
            )
            if rc != 0:
                text = (err or out).strip()
                if "busy" in text.lower() or "not available" in text.lower():
                    marker.unlink(missing_ok=True)
                    return PlacementResult(
                        placed=False, prior_state=prior,
                        reason=f"maintenance reservation refused: {text}", **timing,
                    )
                raise RuntimeError(f"scontrol create reservation {res} rc={rc}: {text}")
        if node.drain:
            await self._update(p.node, "state=resume")
        args = [
            "--parsable", f"--job-name={res}", f"--nodelist={p.node}",
            f"--reservation={res}", f"--time={minutes}", f"--output={out_file}",
            "--ntasks=1", "--export=ALL",
        ]
        if v.partition:
            args.append(f"--partition={v.partition}")
        args.append("--wrap=" + shlex.join(v.command))
        rc, out, err = await self._sbatch(args)
        if rc != 0:
            raise RuntimeError(f"sbatch for {p.run_id} on {p.node} rc={rc}: {err.strip()}")
        job_id = out.strip().split(";", 1)[0]
        marker.write_text(json.dumps({"prior_state": prior, "job_id": job_id}))
        return PlacementResult(placed=True, job_id=job_id, prior_state=prior, **timing)

    async def collect(self, c: CollectInput) -> CollectResult:
        """Wait up to ``c.wait_s`` for the job to end, then read its result."""
        deadline = time.monotonic() + c.wait_s
        while True:
            state = await self.job_state(c.job_id)
            base = (state or "").split("+")[0]
            if base in SLURM_ACTIVE:
                _heartbeat({"job": c.job_id, "state": state})
                if time.monotonic() >= deadline:
                    return CollectResult(finished=False)
                await asyncio.sleep(COLLECT_POLL_S)
                continue
            break
        _, out_file = self._paths(c.run_id)
        try:
            text = out_file.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        if base in SLURM_TAKEN:
            return CollectResult(finished=True, result=_aborted(
                c.machine, f"check job {c.job_id} ended {state} (machine taken away)"))
        result = parse_result_text(text, c.machine)
        if result is None:
            tail = text[-2000:]
            return CollectResult(finished=True, result=_aborted(
                c.machine, f"check job {c.job_id} ended {state or 'GONE'} without a result: "
                f"{tail!r}"))
        return CollectResult(finished=True, result=result)

    async def release(self, c: CollectInput) -> None:
        """Cancel the job if it still runs and delete the reservation (both idempotent)."""
        if c.job_id:
            state = await self.job_state(c.job_id)
            if state is not None and state.split("+")[0] in SLURM_ACTIVE:
                await self._run("scancel", c.job_id, check=False)
                for _ in range(30):
                    st = await self.job_state(c.job_id)
                    if st is None or st.split("+")[0] not in SLURM_ACTIVE:
                        break
                    await asyncio.sleep(0.5)
        res = self._reservation(c.run_id)
        if await self._reservation_exists(res):
            rc, out, err = await self._run("scontrol", "delete", f"ReservationName={res}",
                                           check=False)
            if rc != 0 and await self._reservation_exists(res):
                raise RuntimeError(f"scontrol delete reservation {res}: {(err or out).strip()}")

    async def _drain(self, node: str, reason: str) -> None:
        await self._update(node, "state=drain", f"reason={reason}")

    async def return_machine(self, r: ReturnMachineInput, spares: SparePool | None
                             ) -> ReturnMachineResult:
        """Apply the verdict to the node (see module docstring)."""
        try:
            n = await self.read_node(r.node)
        except ApplicationError as e:
            if e.type == ERR_UNKNOWN_NODE:
                return ReturnMachineResult(detail=str(e))
            raise
        prior = r.prior_state or {}
        prior_drain = bool(prior.get("drain"))
        prior_reason = str(prior.get("reason") or "")
        if r.verdict == Verdict.aborted:
            if prior_drain:
                if not n.drain or n.reason != prior_reason:
                    await self._drain(r.node, prior_reason or f"{REASON_PREFIX}restored")
                detail = f"restored: drained ({prior_reason})"
            elif n.drain and n.reason.startswith(REASON_PREFIX):
                await self._update(r.node, "state=resume")
                detail = "restored: schedulable"
            else:
                detail = "unchanged" if not n.drain else f"kept foreign drain: {n.reason}"
        elif r.verdict == Verdict.failed:
            text = f"{REASON_PREFIX}{r.run_id} validation failed" + (
                f" ticket {r.ticket_id}" if r.ticket_id else "")
            if n.drain and not n.reason.startswith(REASON_PREFIX):
                detail = f"kept out (drained by someone else: {n.reason})"
            else:
                if not (n.drain and n.reason == text):
                    await self._drain(r.node, text)
                detail = f"kept out: {text}"
            if spares is not None:
                await spares.remove(self.cluster.name, r.machine)
        elif r.return_to == "spare":
            text = f"{REASON_PREFIX}{r.run_id} spare (validated)"
            if not (n.drain and n.reason == text):
                await self._drain(r.node, text)
            if spares is None:
                raise permanent(ERR_CONFIGURATION, "return_to=spare needs the ledger (spare pool)")
            await spares.add(self.cluster.name, r.machine, r.run_id)
            after = await self.read_node(r.node)
            return ReturnMachineResult(state=after.state, spare=True,
                                       detail=f"joined spare pool of {self.cluster.name}")
        else:  # passed → pool
            foreign = prior_drain and not prior_reason.startswith(REASON_PREFIX)
            if foreign:
                if not n.drain or n.reason != prior_reason:
                    await self._drain(r.node, prior_reason)
                detail = f"kept out: drained by someone else before validation ({prior_reason})"
            elif n.drain and n.reason.startswith(REASON_PREFIX):
                await self._update(r.node, "state=resume")
                detail = "returned to pool: resumed"
            elif n.drain:
                detail = f"kept out: drained by someone else meanwhile ({n.reason})"
            else:
                detail = "returned to pool: already schedulable"
        after = await self.read_node(r.node)
        return ReturnMachineResult(state=after.state, schedulable=not after.drain and after.ready,
                                   detail=detail)


# --------------------------------------------------------------------------------------
# Activities
# --------------------------------------------------------------------------------------


class ValidationActivities:
    """Bound methods are the validation activities; register ``.all()`` on a worker.

    ``pool`` (the ledger's asyncpg pool) backs the spare pool; ``kube_api_client`` is an
    optional ``kubernetes_asyncio`` ``ApiClient`` for Kubernetes clusters (default: from
    the cluster's kubeconfig / in-cluster config).
    """

    def __init__(
        self, config: AutorepairConfig, pool: asyncpg.Pool | None = None,
        kube_api_client: Any = None,
    ) -> None:
        self.config = config
        self.spares = SparePool(pool) if pool is not None else None
        self.kube_api_client = kube_api_client

    def _backend(self, cluster: str) -> Any:
        try:
            c = self.config.cluster(cluster)
        except KeyError as e:
            raise permanent(ERR_UNKNOWN_NODE, str(e)) from e
        if c.scheduler == "slurm":
            return SlurmValidation(c)
        from activities.validation_kube import KubeValidation

        return KubeValidation(c, api_client=self.kube_api_client)

    @activity.defn(name=ACT.place_validation)
    async def place_validation(self, p: ValidationPlacement) -> PlacementResult:
        """Place the check run on ``p.node``; ``placed=False`` + reason when impossible."""
        b = self._backend(p.cluster)
        try:
            return await b.place(p)  # type: ignore[no-any-return]
        finally:
            await b.close()

    @activity.defn(name=ACT.collect_validation)
    async def collect_validation(self, c: CollectInput) -> CollectResult:
        """Wait up to ``c.wait_s`` (heartbeating) for the run's structured result."""
        b = self._backend(c.cluster)
        try:
            return await b.collect(c)  # type: ignore[no-any-return]
        finally:
            await b.close()

    @activity.defn(name=ACT.release_validation)
    async def release_validation(self, c: CollectInput) -> None:
        """Stop the job if still running and remove the placement (reservation / Job)."""
        b = self._backend(c.cluster)
        try:
            await b.release(c)
        finally:
            await b.close()

    @activity.defn(name=ACT.return_machine)
    async def return_machine(self, r: ReturnMachineInput) -> ReturnMachineResult:
        """Apply the verdict: back to pool / spare pool, kept out, or prior state restored."""
        b = self._backend(r.cluster)
        try:
            return await b.return_machine(r, self.spares)  # type: ignore[no-any-return]
        finally:
            await b.close()

    @activity.defn(name=ACT.post_ticket)
    async def post_ticket(self, t: TicketPost) -> bool:
        """POST the ticket to the cluster's ``validation.ticket_webhook`` (JSON body,
        ``Idempotency-Key: <ticket_id>`` so a retried post is recognised); False when no
        webhook is configured. 4xx → non-retryable ``ActionFailed``; 5xx/network → retry."""
        try:
            url = self.config.cluster(t.cluster).validation.ticket_webhook
        except KeyError as e:
            raise permanent(ERR_UNKNOWN_NODE, str(e)) from e
        if not url:
            return False
        shown = redact_url(url)  # the path/query may hold the endpoint's credential
        try:
            async with httpx.AsyncClient(timeout=30.0) as client:
                resp = await client.post(url, json=t.model_dump(mode="json"),
                                         headers={"Idempotency-Key": t.ticket_id})
        except httpx.HTTPError as exc:  # its text and cause may quote the URL
            raise RuntimeError(f"ticket webhook {shown}: {type(exc).__name__}") from None
        if 400 <= resp.status_code < 500 and resp.status_code not in (408, 429):
            raise permanent(
                ERR_ACTION_FAILED,
                f"ticket webhook {shown} answered {resp.status_code} for {t.ticket_id}",
            )
        if resp.status_code >= 400:  # 5xx/408/429: retried by Temporal
            raise RuntimeError(f"ticket webhook {shown} answered {resp.status_code}")
        return True

    def all(self) -> list[Callable[..., Any]]:
        """Every validation activity, for ``Worker(activities=...)``."""
        return [self.place_validation, self.collect_validation, self.release_validation,
                self.return_machine, self.post_ticket]

