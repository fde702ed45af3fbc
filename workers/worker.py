"""The worker process (``autorepair worker``): workflows + activities on the task queues.

Two Temporal workers share one client:

- task queue ``autorepair`` (docs/design.md §4.4): every workflow and the main-queue activities;
- task queue ``temporal.bmc_task_queue``: machine-side (BMC) activities, limited to
  ``temporal.bmc_rate_per_s`` activity starts per second across all workers.

Which activity runs on which queue is :func:`activities.registry.build_activities`'s
business; this module only builds the Workers.

It also runs the cluster watchers (Slurm / Kubernetes, annotation intake) unless
``worker.watchers`` is false, and serves its Prometheus registry (spare-pool size) on
``worker.metrics_port``.

The ledger schema is migrated at start (idempotent, advisory-locked).
"""

from __future__ import annotations

import asyncio
import atexit
import compileall
import contextlib
import logging
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

import asyncpg
from prometheus_client import start_http_server
from temporalio.client import Client
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import connect, migrate
from activities.registry import WorkerActivities, build_activities
from workers.temporal_client import temporal_client
from workers.versioning import deployment_config, promote_current_version
from workflows.config import AutorepairConfig

log = logging.getLogger("autorepair.worker")


def connect_temporal(config: AutorepairConfig) -> AbstractAsyncContextManager[Client]:
    """``async with connect_temporal(config) as client``: a client for ``config.temporal``
    with the pydantic data converter, on a runtime that
    :func:`workers.temporal_client.release_runtimes` shuts down once the block is left.

    Raises :class:`workers.temporal_client.TemporalUnreachable` (a ``RuntimeError``)
    naming the address when Temporal cannot be reached."""
    return temporal_client(config.temporal.address, config.temporal.namespace,
                           config=config.temporal)


def precompile_workflow_modules() -> str | None:
    """Compile the ``workflows`` package to bytecode once, when the interpreter writes none.

    The workflow sandbox imports each workflow's module afresh for every new workflow
    instance (and every replay after a cache eviction). With bytecode writing off
    (``PYTHONDONTWRITEBYTECODE``, common in containers and CI) and no ``.pyc`` beside an
    editable install, every such import compiles the module from source: measured 17 % of
    the worker's CPU and 10-60 ms per new NodeWorkflow/RepairWorkflow on a 2-core dev stack
    (``tests/bench/orchestration.py`` with ``--py-spy``). This compiles the package into a
    private ``sys.pycache_prefix`` directory (the source tree stays untouched) so those
    imports read bytecode. Returns that directory, or ``None`` when nothing was needed
    (bytecode writing on, or a ``pycache_prefix`` chosen by the operator). Never raises: a
    failure leaves imports compiling from source, as before.
    """
    if not sys.dont_write_bytecode or sys.pycache_prefix:
        return None
    import workflows

    try:
        prefix = tempfile.mkdtemp(prefix="autorepair-pyc-")
        atexit.register(shutil.rmtree, prefix, ignore_errors=True)
        sys.pycache_prefix = prefix
        sys.dont_write_bytecode = False
        try:
            for path in workflows.__path__:
                compileall.compile_dir(path, quiet=1)
        finally:
            sys.dont_write_bytecode = True
    except OSError as exc:
        log.warning("event=precompile_failed error=%s", exc)
        return None
    return prefix


def workflow_classes(versioned: bool = False) -> list[type]:
    """Every workflow class of the project: ``workflows.registry.WORKFLOWS``, or with
    ``versioned`` the same workflows declaring their versioning behaviour
    (``workflows.versioned.VERSIONED_WORKFLOWS``: repairs pinned, entities auto-upgrading)."""
    if versioned:
        from workflows.versioned import VERSIONED_WORKFLOWS

        return list(VERSIONED_WORKFLOWS)
    from workflows.registry import WORKFLOWS

    return list(WORKFLOWS)


def build_workers(
    client: Client,
    config: AutorepairConfig,
    pool: asyncpg.Pool,
    *,
    workflows: Sequence[type] | None = None,
    acts: WorkerActivities | None = None,
) -> list[Worker]:
    """The two workers of this process (not yet running): every workflow (default
    ``workflows.registry.WORKFLOWS``) and the activities of
    :func:`activities.registry.build_activities` (or ``acts``) on their task queues."""
    acts = acts or build_activities(config, pool)
    # both queues poll as this build's Worker Deployment Version (None: unversioned), so
    # a pinned repair's machine actions run on the build that started it
    deployment = deployment_config(config.temporal)
    wfs = (list(workflows) if workflows is not None
           else workflow_classes(versioned=deployment is not None))
    workers = [
        Worker(
            client,
            task_queue=config.temporal.task_queue,
            workflows=wfs,
            # the guard's lease replies signal through this worker's client (issue 30)
            activities=[*acts.main, *GuardReplyActivities(client).all()],
            deployment_config=deployment,
        )
    ]
    if acts.bmc:
        workers.append(
            Worker(
                client,
                task_queue=config.temporal.bmc_task_queue,
                activities=acts.bmc,
                max_task_queue_activities_per_second=config.temporal.bmc_rate_per_s,
                deployment_config=deployment,
            )
        )
    return workers


async def run_worker(config: AutorepairConfig, stop: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or ``stop`` is set). Raises ``RuntimeError`` when the
    ledger DSN is missing or PostgreSQL / Temporal cannot be reached."""
    if not config.ledger.dsn:
        raise RuntimeError("ledger.dsn: empty; set AUTOREPAIR__LEDGER__DSN or ledger.dsn")
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        pool = await connect(
            config.ledger.dsn, min_size=config.ledger.min_pool, max_size=config.ledger.max_pool
        )
    except (OSError, asyncpg.PostgresError) as exc:
        raise RuntimeError(f"ledger.dsn: cannot reach PostgreSQL: {exc}") from exc
    try:
        applied = await migrate(pool)
        if applied:
            log.info("event=ledger_migrated applied=%s", ",".join(applied))
        async with connect_temporal(config) as client:
            pyc = precompile_workflow_modules()
            if pyc:
                log.info("event=workflows_precompiled pycache_prefix=%s", pyc)
            try:
                acts = build_activities(config, pool)
            except ValueError as exc:
                raise RuntimeError(str(exc)) from exc
            workers = build_workers(client, config, pool, acts=acts)
            if config.worker.metrics_port:
                # The default registry holds the worker-side gauges (spare-pool size).
                start_http_server(config.worker.metrics_port, addr=config.worker.metrics_host)
            log.info(
                "event=worker_started task_queue=%s bmc_task_queue=%s metrics_port=%s",
                config.temporal.task_queue,
                config.temporal.bmc_task_queue,
                config.worker.metrics_port or "off",
            )
            watcher_tasks: list[asyncio.Task[None]] = []
            async with contextlib.AsyncExitStack() as stack:
                for w in workers:
                    await stack.enter_async_context(w)
                await promote_current_version(client, config.temporal)
                if config.worker.watchers:
                    from workers.watchers import start_watchers

                    watcher_tasks = start_watchers(config, client, stop)
                await stop.wait()
                for t in watcher_tasks:
                    t.cancel()
                await asyncio.gather(*watcher_tasks, return_exceptions=True)
            if acts.notifier is not None:
                await acts.notifier.aclose()
        log.info("event=worker_stopped")
    finally:
        await pool.close()
