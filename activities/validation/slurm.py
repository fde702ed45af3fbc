"""Slurm side of the validation activities (verdict rules: :mod:`activities.validation.base`).

Placement: a maintenance reservation ``{reservation_prefix}-<run>`` on the node
(``Flags=MAINT``, so nothing else lands there while the checks run) and an ``sbatch -w
NODE --reservation=...`` job running ``ValidationConfig.command`` (the agent's
``autorepair-agent validate --json``); the result is the last JSON object of the job's
output file in ``ValidationConfig.output_dir``. A node drained for the repair is resumed
for the run (the reservation keeps other jobs off) and put back afterwards.

Idempotency: placement records the node's prior state and the job id in a marker
``<output_dir>/<run>.json``, so a retried placement never submits twice and never
records a state it changed itself. Verdicts: ``failed`` and ``spare`` drain the node with
a reason starting ``autorepair:<run id>`` (:data:`~activities.scheduler.slurm.REASON_PREFIX`);
``aborted`` restores the drain flag and reason exactly.

Whose drain: placement resumes only a drain it may take over — the run's own, the one of
the repair that started the run, or one of a repair no longer in flight — and is refused
(``placed=False``) on a node an operator drained or another repair holds. Afterwards only
the run's own drain is ever resumed; an operator's drain set while the check ran keeps
the operator's reason on every verdict.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.scheduler.slurm import REASON_PREFIX, SlurmNode, SlurmScheduler
from activities.validation.base import (
    COLLECT_POLL_S,
    JobOutput,
    ValidationBackend,
    aborted,
    heartbeat,
    parse_result_text,
    run_slug,
)
from workflows.activity_api import (
    ERR_CONFIGURATION,
    ERR_UNKNOWN_NODE,
    CollectInput,
    CollectResult,
    PlacementResult,
    ReturnMachineInput,
    ValidationPlacement,
    permanent,
)
from workflows.config import ClusterConfig, ValidationConfig

#: How long placement waits for jobs that are only COMPLETING on the node (epilog,
#: KillWait) before calling the machine busy, seconds (Slurm KillWait default is 30 s;
#: the epilog of a finished job normally ends within seconds).
COMPLETING_WAIT_S = 20.0
#: Slurm job states in which the job is still queued or running (squeue(1) JOB STATE CODES).
SLURM_ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                          "RESV_DEL_HOLD", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SIGNALING",
                          "STAGE_OUT", "STOPPED"})
#: ``sbatch`` refusals no retry fixes (the check job's request does not fit the cluster's
#: configuration), each with the setting to look at: (lower-case part of Slurm's own
#: message, src/common/slurm_errno.c as printed by sbatch, what it means here). A node
#: not in ``validation.partition`` is "Requested node configuration is not available"
#: (seen on Slurm 22.05/23.02 with ``--nodelist`` outside the partition); a
#: ``validation.reservation_user`` that is not the user the worker submits as is
#: "Access denied to requested reservation". Anything else (slurmctld unreachable or
#: busy, a QOS submit limit, the run's reservation gone) is retried.
SBATCH_CONFIGURATION_ERRORS: tuple[tuple[str, str], ...] = (
    ("invalid partition", "validation.partition {partition!r} is not a partition of the "
                          "cluster"),
    ("requested node configuration is not available",
     "the node is not in validation.partition {partition!r}, or cannot run the check "
     "job's request"),
    ("requested nodes not in this partition",
     "the node is not in validation.partition {partition!r}"),
    ("access denied to requested reservation",
     "validation.reservation_user {user!r} is not the user the worker runs sbatch as"),
    ("user's group not permitted to use this partition",
     "the worker's user may not use validation.partition {partition!r}"),
    ("invalid account", "the worker's user has no usable Slurm account for "
                        "validation.partition {partition!r}"),
    ("invalid qos", "the worker's user has no usable QOS"),
    ("access/permission denied", "the worker's user may not submit the check job"),
)


def sbatch_configuration_error(stderr: str, v: ValidationConfig) -> str | None:
    """What in the configuration an ``sbatch`` refusal (its stderr) points to, or None
    when the refusal may pass on a retry (:data:`SBATCH_CONFIGURATION_ERRORS`)."""
    low = stderr.lower()
    for needle, meaning in SBATCH_CONFIGURATION_ERRORS:
        if needle in low:
            return meaning.format(partition=v.partition or "(the default partition)",
                                  user=v.reservation_user)
    return None


#: Slurm job states meaning someone else took the node or the job away (→ aborted).
SLURM_TAKEN = frozenset({"CANCELLED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
                         "REVOKED"})


class SlurmValidation(SlurmScheduler, ValidationBackend):
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
    def holder(n: SlurmNode) -> str | None:
        """The repair (or run) id a drain reason ``autorepair:<id> …`` names, else None."""
        if not n.reason.startswith(REASON_PREFIX):
            return None
        return n.reason[len(REASON_PREFIX):].split(" ", 1)[0] or None

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
        others = await self.other_repairs(p.node, p.run_id)
        if others:
            return PlacementResult(
                placed=False, prior_state=prior,
                reason=f"repair {', '.join(others)} in flight on {p.node}: validation "
                "leaves the node to it", **timing,
            )
        settle = time.monotonic() + COMPLETING_WAIT_S
        while (not node.ready and "NOT_RESPONDING" in node.flags
               and set(node.flags) <= {"NOT_RESPONDING", "DRAIN", "MAINTENANCE", "RESERVED"}
               and time.monotonic() < settle):
            # slurmctld flags a just-resumed node NOT_RESPONDING until slurmd answers its
            # next ping (about a second on loopback); only a lasting one is a real fault.
            # MAINTENANCE / RESERVED: this run's own reservation, kept by an earlier try.
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
        holder = self.holder(node)
        if node.drain and (holder is None
                           or not await self.may_take_over(holder, p.node, p.run_id)):
            return PlacementResult(
                placed=False, prior_state=prior,
                reason=f"node {p.node} drained by {node.reason_user or 'someone else'}: "
                f"{node.reason}; validation resumes no drain it did not set or take over",
                **timing,
            )
        marker.parent.mkdir(parents=True, exist_ok=True)
        _write_marker(marker, {"prior_state": prior, "job_id": None})
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
            # the drain lifted for the job goes back before the failure is raised: no
            # release or verdict follows a placement that never got its job, and the
            # reservation that keeps other jobs off ends with its Duration
            await self._put_drain_back(p.node, prior)
            text = f"sbatch for {p.run_id} on {p.node} rc={rc}: {err.strip()}"
            wrong = sbatch_configuration_error(err, v)
            if wrong is not None:
                # a setting no retry fixes: said at once, naming it
                raise permanent(ERR_CONFIGURATION, f"{text} ({wrong})")
            raise RuntimeError(text)
        job_id = out.strip().split(";", 1)[0]
        _write_marker(marker, {"prior_state": prior, "job_id": job_id})
        return PlacementResult(placed=True, job_id=job_id, prior_state=prior, **timing)

    async def job_output(self, c: CollectInput) -> JobOutput | None:
        """Wait up to ``c.wait_s`` for the job to end; its output, or ``None`` while it runs."""
        deadline = time.monotonic() + c.wait_s
        while True:
            state = await self.job_state(c.job_id)
            base = (state or "").split("+")[0]
            if base not in SLURM_ACTIVE:
                break
            heartbeat({"job": c.job_id, "state": state})
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(COLLECT_POLL_S)
        _, out_file = self._paths(c.run_id)
        try:
            text = out_file.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        return JobOutput(state=state or "GONE", text=text, taken=base in SLURM_TAKEN)

    async def collect(self, c: CollectInput) -> CollectResult:
        """Wait up to ``c.wait_s`` for the job to end, then read its result."""
        out = await self.job_output(c)
        if out is None:
            return CollectResult(finished=False)
        if out.taken:
            return CollectResult(finished=True, result=aborted(
                c.machine, f"check job {c.job_id} ended {out.state} (machine taken away)"))
        result = parse_result_text(out.text, c.machine)
        if result is None:
            return CollectResult(finished=True, result=aborted(
                c.machine, f"check job {c.job_id} ended {out.state} without a result: "
                f"{out.text[-2000:]!r}"))
        return CollectResult(finished=True, result=result)

    async def release(self, c: CollectInput) -> None:
        """Cancel the job if it still runs and delete the reservation (both idempotent).

        A placement that resumed the node's drain for the run and then never submitted
        its job (``sbatch`` failing on every try, the worker dying in between: the
        marker names no job) has the drain put back first, with its reason, before the
        reservation that kept other jobs off goes: a machine the repair drained and
        nobody validated never returns to service through a failed placement (the
        verdict is ``aborted``, which restores the prior state)."""
        await self._restore_unsubmitted(c)
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

    async def _restore_unsubmitted(self, c: CollectInput) -> None:
        """Put back a drain that placement resumed for a job it never submitted (see
        :meth:`release`); nothing when the marker names a job, or the node is drained."""
        marker, _ = self._paths(c.run_id)
        try:
            state = json.loads(marker.read_text())
        except (FileNotFoundError, ValueError):
            return
        if not state.get("job_id"):
            await self._put_drain_back(c.node, state.get("prior_state") or {})

    async def _put_drain_back(self, node: str, prior: dict[str, Any]) -> None:
        """Drain ``node`` with ``prior``'s reason when ``prior`` was drained and the node
        is not (placement lifted it for a job that never ran); nothing otherwise."""
        if not prior.get("drain"):
            return
        if not (await self.read_node(node)).drain:
            await self._drain(node, str(prior.get("reason") or f"{REASON_PREFIX}restored"))

    async def _drain(self, node: str, reason: str) -> None:
        await self._update(node, "state=drain", f"reason={reason}")


    # -- verdict hooks (ValidationBackend.return_machine) --------------------------------
    async def _read_target(self, node: str) -> SlurmNode:
        return await self.read_node(node)

    async def _restore_prior(self, r: ReturnMachineInput, n: SlurmNode) -> str:
        prior = r.prior_state or {}
        prior_drain = bool(prior.get("drain"))
        prior_reason = str(prior.get("reason") or "")
        ours = n.drain and n.owned_by(r.run_id)
        if n.drain and not ours and n.reason != prior_reason:
            # drained while the check ran (an operator, another repair): theirs stays
            return (f"kept: drained meanwhile by {n.reason_user or 'someone else'}: "
                    f"{n.reason}")
        if prior_drain:
            if not n.drain or n.reason != prior_reason:
                await self._drain(r.node, prior_reason or f"{REASON_PREFIX}restored")
            return f"restored: drained ({prior_reason})"
        if ours:
            others = await self.other_repairs(r.node, r.run_id)
            if others:
                return f"kept drained: repair {', '.join(others)} in flight on {r.node}"
            await self._update(r.node, "state=resume")
            return "restored: schedulable"
        return "unchanged" if not n.drain else f"kept foreign drain: {n.reason}"

    async def _keep_out(self, r: ReturnMachineInput, n: SlurmNode) -> str:
        text = f"{REASON_PREFIX}{r.run_id} validation failed" + (
            f" ticket {r.ticket_id}" if r.ticket_id else "")
        if n.drain and not n.reason.startswith(REASON_PREFIX):
            return f"kept out (drained by someone else: {n.reason})"
        if not (n.drain and n.reason == text):
            await self._drain(r.node, text)
        return f"kept out: {text}"

    async def _hold_as_spare(self, r: ReturnMachineInput, n: SlurmNode) -> str | None:
        text = f"{REASON_PREFIX}{r.run_id} spare (validated)"
        if n.drain and n.reason != text and not n.owned_by(r.run_id):
            # never overwrite someone else's drain (an operator's, another repair's)
            return (f"kept out: drained by {n.reason_user or 'someone else'}: {n.reason}; "
                    "not added to the spare pool")
        others = await self.other_repairs(r.node, r.run_id)
        if others:
            return (f"kept: repair {', '.join(others)} in flight on {r.node}; not added to "
                    "the spare pool")
        if not (n.drain and n.reason == text):
            await self._drain(r.node, text)
        return None

    async def _return_to_pool(self, r: ReturnMachineInput, n: SlurmNode) -> str:
        prior = r.prior_state or {}
        prior_reason = str(prior.get("reason") or "")
        if prior.get("drain") and not prior_reason.startswith(REASON_PREFIX):
            if not n.drain or n.reason != prior_reason:
                await self._drain(r.node, prior_reason)
            return f"kept out: drained by someone else before validation ({prior_reason})"
        if n.drain and n.owned_by(r.run_id):
            others = await self.other_repairs(r.node, r.run_id)
            if others:
                return f"kept drained: repair {', '.join(others)} in flight on {r.node}"
            await self._update(r.node, "state=resume")
            return "returned to pool: resumed"
        if n.drain:
            return (f"kept out: drained by {n.reason_user or 'someone else'} meanwhile "
                    f"({n.reason})")
        return "returned to pool: already schedulable"

    async def _placement_state(self, node: str) -> tuple[list[str], bool]:
        after = await self.read_node(node)
        return after.state, not after.drain and after.ready


def _write_marker(marker: Path, doc: dict[str, Any]) -> None:
    """Replace the placement marker at once (a temporary file renamed over it): a worker
    killed mid-write leaves the old marker or the new one, never a truncated file that
    every retry of ``place`` would fail to read."""
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, marker)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
