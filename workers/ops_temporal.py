"""Operator commands that talk to Temporal directly: ``autorepair validate`` and
``autorepair breaker status|reset`` (docs/design.md §4.1). Declared in :mod:`workers.cli`.

Every coroutine here opens its client with :func:`workers.temporal_client.temporal_client`
and runs under :func:`run_async`, which releases the client's runtime threads before the
command returns, so a command never aborts at interpreter exit after it succeeded.

Exit codes: 0 ok; 1 the server refused or a validation failed; 2 Temporal unreachable
or a validation aborted; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from workers.ops import EXIT_INTERRUPTED
from workers.temporal_client import TemporalUnreachable, release_runtimes, temporal_client
from workflows.config import AutorepairConfig, TemporalConfig
from workflows.console import validation_details, validation_summary
from workflows.policy.rails import breaker_threshold, concurrency_budget

T = TypeVar("T")

_out = Console()
_err = Console(stderr=True)

GUARD_NOT_STARTED = (
    "no guard running for this cluster yet: the breaker is closed and nothing holds a "
    "lease. The guard (workflow guard/{cluster}) starts with the first lease request, "
    "when a repair is about to cordon a node."
)
"""Note shown by ``breaker status`` for a cluster whose guard has not started."""


def run_async(coro: Coroutine[Any, Any, T], interrupted: str = "interrupted") -> T:
    """Run ``coro`` to completion, then release every Temporal runtime it opened (their
    threads are joined here, before the interpreter exits).

    Errors become messages and exit codes: :class:`TemporalUnreachable` and other
    ``RuntimeError`` → 2, any other exception → 1 (``error: TYPE: message``), Ctrl-C →
    130 with the message ``interrupted``; a ``typer.Exit`` raised inside keeps its code.
    No traceback is printed."""
    message, code = "", 0
    try:
        result = asyncio.run(coro)
    except typer.Exit as e:
        code = e.exit_code
    except KeyboardInterrupt:
        message, code = interrupted, EXIT_INTERRUPTED
    except TemporalUnreachable as e:
        message, code = (f"error: {e}; is the stack up? `autorepair up` starts one (pass "
                         "--temporal-address or the stack's --data-dir)"), 2
    except RuntimeError as e:
        message, code = f"error: {e}", 2
    except Exception as e:
        message, code = f"error: {type(e).__name__}: {e}", 1
    # Outside the except blocks: the exception and its frames (which hold the client)
    # are gone, so collecting now frees the runtime and joins its threads.
    release_runtimes()
    if code:
        if message:
            _err.print(message, highlight=False)
        raise typer.Exit(code)
    return result


# ---------------------------------------------------------------------- validate
def validation_id(machine: str, now: datetime | None = None) -> str:
    """Workflow id of an operator's validation: ``validate/{machine}/op-{UTC time}-{hex}``
    (docs/design.md §4.4 ``validate/{machine}/{n}``; the random suffix keeps two requests in the
    same second apart)."""
    from workflows.protocol import workflow_id_validation

    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d%H%M%S")
    return workflow_id_validation(machine, f"op-{stamp}-{secrets.token_hex(3)}")


async def start_validations(address: str, namespace: str, task_queue: str,
                            targets: Sequence[tuple[str, str]], by: str, reason: str,
                            wait: bool = False, announce: bool = True,
                            temporal: TemporalConfig | None = None
                            ) -> list[dict[str, Any]]:
    """Start one ``ValidationWorkflow`` per ``(cluster, machine)`` of ``targets``.

    Returns ``[{"machine", "cluster", "workflow_id"}]``; with ``wait`` each also gets
    ``"verdict"`` (passed, failed, aborted) and ``"reason"``, while a rich progress bar
    counts finished runs and names the stage of each (the workflow's ``status`` query).
    ``announce``: print ``started WORKFLOW_ID`` as each starts. ``temporal``: the
    configuration's ``temporal`` section (TLS, API key; ``None`` = plain). Raises
    :class:`TemporalUnreachable`; Ctrl-C while waiting raises ``KeyboardInterrupt`` (the
    workflows go on)."""
    from temporalio.client import WorkflowFailureError, WorkflowQueryFailedError
    from temporalio.service import RPCError

    from workflows.models import ValidationRequest
    from workflows.validation import ValidationWorkflow

    async with temporal_client(address, namespace, config=temporal) as client:
        started: list[dict[str, Any]] = []
        for cluster, machine in targets:
            wf_id = validation_id(machine)
            req = ValidationRequest(cluster=cluster, machine=machine, reason=reason,
                                    requested_by=by)
            await client.start_workflow(
                ValidationWorkflow.run, req, id=wf_id, task_queue=task_queue,
                static_summary=validation_summary(req), static_details=validation_details(req))
            started.append({"machine": machine, "cluster": cluster, "workflow_id": wf_id})
            if announce:
                _out.print(f"started {wf_id}", highlight=False)
        if not wait:
            return started
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                      console=_err, transient=True) as progress:
            bar = progress.add_task("validating", total=len(started))

            def describe() -> str:
                running = [f"{e['machine']}: {e.get('stage') or 'starting'}"
                           for e in started if "verdict" not in e]
                return "validating " + ", ".join(running) if running else "done"

            async def one(entry: dict[str, Any]) -> None:
                handle = client.get_workflow_handle_for(ValidationWorkflow.run,
                                                        entry["workflow_id"])
                result = asyncio.ensure_future(handle.result())
                try:
                    while not result.done():
                        # the status query fails until a worker has run the first task
                        with contextlib.suppress(RPCError, WorkflowQueryFailedError):
                            entry["stage"] = (await handle.query(ValidationWorkflow.status)
                                              ).get("stage", "")
                            progress.update(bar, description=describe())
                        await asyncio.wait({result}, timeout=2.0)
                finally:
                    if not result.done():  # Ctrl-C: stop waiting, leave the workflow be
                        result.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await result
                try:
                    res = result.result()
                except WorkflowFailureError as e:
                    entry["verdict"], entry["reason"] = failed_run_outcome(e)
                else:
                    entry["verdict"], entry["reason"] = res.verdict.value, res.reason
                progress.update(bar, advance=1, description=describe())

            await asyncio.gather(*(one(e) for e in started))
        return started


def failed_run_outcome(err: Exception) -> tuple[str, str]:
    """``(verdict, reason)`` of a ``ValidationWorkflow`` that failed (its
    ``WorkflowFailureError``): the recorded verdict and reason when the failure carries the
    result (``VerdictNotApplied``, :data:`workflows.protocol.VALIDATION_VERDICT_NOT_APPLIED`:
    recorded, not applied to the machine), else ``aborted`` with the failure's message —
    never a traceback for the person waiting."""
    cause = getattr(err, "cause", None)
    details = getattr(cause, "details", None) or ()
    first = details[0] if details else None
    message = str(getattr(cause, "message", "") or cause or err)
    if isinstance(first, dict) and first.get("verdict") in ("passed", "failed", "aborted"):
        return str(first["verdict"]), f"{first.get('reason') or ''} ({message})".strip()
    return "aborted", f"validation workflow failed: {message}"


def validation_exit_code(results: Sequence[dict[str, Any]]) -> int:
    """0 when every run passed (or none was waited for), 1 when any failed, else 2 when
    any aborted — the exit codes of ``autorepair-agent validate`` (docs/design.md §4.1)."""
    verdicts = {r.get("verdict") for r in results if r.get("verdict")}
    if "failed" in verdicts:
        return 1
    return 2 if "aborted" in verdicts else 0


# ----------------------------------------------------------------------- breaker
def breaker_not_started(cfg: AutorepairConfig, cluster: str) -> dict[str, Any]:
    """The breaker of a cluster whose guard has not started: closed, no leases, nothing
    queued, and the budget and trip threshold the guard will use
    (:func:`workflows.policy.rails.concurrency_budget` / ``breaker_threshold`` of the
    configured policy and the cluster's GPU node count; 0 nodes for a cluster that is
    not configured, which the guard counts from lease requests). The GuardStatus shape
    plus ``"guard_running": false`` and ``"note"``."""
    rails = cfg.policy.rails
    try:
        gpu = cfg.cluster(cluster).gpu_node_count
    except KeyError:
        gpu = 0
    return {
        "cluster": cluster, "gpu_nodes": gpu,
        "budget": concurrency_budget(gpu, rails),
        "breaker_threshold": breaker_threshold(gpu, rails),
        "breaker_window_s": rails.breaker_window_s, "breaker_open": False,
        "tripped_at": None, "tripped_reason": "", "reset_at": None, "reset_by": None,
        "leases": [], "pending": [], "recent_automatic": [], "refused_total": 0,
        "guard_running": False, "note": GUARD_NOT_STARTED.format(cluster=cluster),
    }


def reset_decision(breaker_open: bool, reason: str) -> str:
    """What ``breaker reset`` does: ``"already_closed"`` (a closed breaker: send nothing,
    record nothing), ``"reason_required"`` (an open breaker and no ``--reason``: refuse,
    exit 2) or ``"send"`` (signal ``reset_breaker`` with the reason)."""
    if not breaker_open:
        return "already_closed"
    return "send" if reason.strip() else "reason_required"


async def breaker_call(address: str, namespace: str, cfg: AutorepairConfig, cluster: str,
                       reset_by: str | None = None, reason: str = "") -> dict[str, Any]:
    """Query (and with ``reset_by`` reset) ``guard/{cluster}``: the GuardStatus as
    JSON plus ``"guard_running": true``. A reset is sent only to an OPEN breaker and only
    with a ``reason`` (else ``typer.Exit(2)`` with the message); on a closed one nothing
    is sent and the answer carries ``"reset": "already_closed"`` (``"sent"`` after a
    reset). A cluster without a guard yet answers :func:`breaker_not_started` (a reset
    then has nothing to close and sends nothing), or exits 1 naming the configured
    clusters when the config does not list it (:func:`check_cluster_known`). Raises
    :class:`TemporalUnreachable` and ``RPCError`` (other than not-found)."""
    from temporalio.service import RPCError, RPCStatusCode

    from workflows.guard import ClusterGuardWorkflow
    from workflows.protocol import ResetBreakerSignal, workflow_id_guard

    async with temporal_client(address, namespace, config=cfg.temporal) as client:
        h = client.get_workflow_handle_for(ClusterGuardWorkflow.run, workflow_id_guard(cluster))
        try:
            st = await h.query(ClusterGuardWorkflow.status)
            if reset_by is not None:
                decision = reset_decision(st.breaker_open, reason)
                if decision == "already_closed":
                    return {**st.model_dump(mode="json"), "guard_running": True,
                            "reset": "already_closed"}
                if decision == "reason_required":
                    raise typer.Exit(_usage(
                        f"breaker of {cluster} is OPEN ({st.tripped_reason or 'tripped'}): "
                        "--reason is required to reset it (why it is safe to repair "
                        "again; recorded with the reset)"))
                await h.signal(ClusterGuardWorkflow.reset_breaker,
                               ResetBreakerSignal(by=reset_by, reason=reason))
                st = await h.query(ClusterGuardWorkflow.status)
                return {**st.model_dump(mode="json"), "guard_running": True,
                        "reset": "sent"}
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
            check_cluster_known(cfg, cluster)
            return breaker_not_started(cfg, cluster)
        return {**st.model_dump(mode="json"), "guard_running": True}


EXIT_UNKNOWN = 1
"""Exit code of a client command given a machine or cluster nobody knows."""


def _usage(message: str) -> int:
    """Print ``error: message`` and return exit code 2 (bad usage)."""
    _err.print(f"error: {message}", highlight=False)
    return 2


def check_cluster_known(cfg: AutorepairConfig, cluster: str) -> None:
    """Exit 1 naming the configured clusters when ``cluster`` is not one of them and the
    config lists any (with none configured every name is accepted: the guard counts
    nodes from lease requests)."""
    known = sorted(c.name for c in cfg.clusters)
    if known and cluster not in known:
        _err.print(f"error: unknown cluster {cluster!r} (no guard runs for it and the "
                   f"config does not list it); known clusters: {', '.join(known)}",
                   highlight=False)
        raise typer.Exit(EXIT_UNKNOWN)


def breaker_print(doc: dict[str, Any], as_json: bool, reset: bool = False) -> None:
    """Print a :func:`breaker_call` answer as JSON or a table; for a cluster without a
    guard, the note says when it starts (and, after ``reset``, that nothing was sent)."""
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    t = Table(title=f"breaker {doc['cluster']}", show_header=False)
    t.add_column("field")
    t.add_column("value")
    t.add_row("state", "OPEN" if doc["breaker_open"] else "closed")
    if not doc.get("policy_loaded", True):
        t.add_row("policy", "not read yet: budget and threshold below are the defaults")
    for k in ("tripped_at", "tripped_reason", "reset_at", "reset_by", "gpu_nodes", "budget",
              "breaker_threshold", "breaker_window_s", "refused_total"):
        t.add_row(k, "" if doc.get(k) is None else str(doc[k]))
    t.add_row("leases", ", ".join(f"{x['node']}:{x['repair_id']}" for x in doc["leases"])
              or "none")
    t.add_row("queued", ", ".join(f"{x['node']}:{x['repair_id']}" for x in doc["pending"])
              or "none")
    _out.print(t)
    if not doc.get("guard_running", True):
        _out.print(doc["note"], highlight=False)
        if reset:
            _out.print("nothing to reset: the breaker is closed.", highlight=False)
    elif doc.get("reset") == "already_closed":
        _out.print("already closed: nothing reset, nothing recorded.", highlight=False)
    elif doc.get("reset") == "sent":
        _out.print(f"breaker of {doc['cluster']} reset: closed.", highlight=False)
