"""``autorepair up`` front end: start the :class:`DevStack`, print where things are, wait.

Exit codes: 0 after a clean Ctrl-C stop, 1 when the stack cannot start (the message says
why: a port in use, a missing binary, a child that did not come up), 2 when ``--demo`` was
asked for and the demo cluster cannot run here (no Slurm, not root, demo ports busy):
nothing is started then, and the last line printed says what to do (:data:`DEMO_HOWTO`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from rich.console import Console
from rich.table import Table

from workers.config import load_config
from workers.demo import (
    SIM_CONTROL_PORT,
    DemoCluster,
    DemoTimings,
    DemoUnavailable,
    prepare_demo,
    run_demo,
)
from workers.devpeers import PeerStartError
from workers.devstack import DevStack, StackError, StackPorts
from workers.temporal_client import release_runtimes
from workflows.config import AutorepairConfig

EXIT_NO_DEMO = 2
"""Exit code of ``up --demo`` when the demo cluster cannot run here."""
DEMO_HOWTO = (
    "To run the demo, `make run` (as root on Debian) installs Slurm (slurmctld, slurmd, "
    "munge) and starts it; `autorepair up` without --demo starts the bare stack."
)
"""Last line of ``up --demo`` when the demo cluster cannot run here."""


def ports_from_config(cfg: AutorepairConfig) -> StackPorts:
    """Stack ports from the config (Temporal port parsed from ``temporal.address``)."""
    _, _, port = cfg.temporal.address.rpartition(":")
    return StackPorts(
        temporal=int(port or 7233),
        temporal_ui=cfg.temporal.ui_port,
        otlp_grpc=cfg.ingest.otlp_grpc_port,
        otlp_http=cfg.ingest.otlp_http_port,
        api=cfg.ingest.api_port,
        admin=cfg.ingest.admin_port,
        worker_metrics=cfg.worker.metrics_port or 9464,
    )


def demo_endpoints(demo: DemoCluster, control_port: int = SIM_CONTROL_PORT
                   ) -> list[tuple[str, str]]:
    """The demo's own endpoints: the Redfish emulator (one BMC system per machine) and
    the fleet simulator's control endpoint (inject a fault:
    ``POST /nodes/NODE/fault/KIND``)."""
    rows = []
    if demo.redfish is not None:
        rows.append(("Redfish emulator (BMCs)", f"{demo.redfish.url}/redfish/v1/Systems"))
    rows.append(("Simulator control",
                 f"http://127.0.0.1:{control_port}/nodes (POST /nodes/gpu-02/fault/xid79)"))
    return rows


def print_endpoints(stack: DevStack, console: Console,
                    extra: list[tuple[str, str]] | None = None) -> None:
    """The endpoint table of ``up``; a value is folded onto more lines, never cut (the
    ledger DSN is longer than an 80-column terminal leaves)."""
    table = Table(title="autorepair dev stack", show_lines=False)
    table.add_column("what", no_wrap=True)
    table.add_column("where", overflow="fold")
    for what, where in [*stack.endpoints(), *(extra or [])]:
        table.add_row(what, where)
    console.print(table)
    console.print("Press Ctrl-C to stop everything started here.")


async def _run(stack: DevStack, console: Console, demo: DemoCluster | None,
               timings: DemoTimings | None = None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    demo_task: asyncio.Task[None] | None = None
    try:
        await stack.start()
        print_endpoints(stack, console, demo_endpoints(demo) if demo is not None else None)
        if demo is not None:
            demo_task = asyncio.create_task(run_demo(stack, demo, console, stop, timings))
        await stack.supervise(stop)
        return 0
    except StackError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    finally:
        if demo_task is not None:
            demo_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await demo_task
        console.print("stopping ...")
        await asyncio.to_thread(stack.stop)
        if demo is not None:
            await asyncio.to_thread(demo.stop)


def run_up(
    cfg: AutorepairConfig, *, data_dir: Path, demo: bool, config_path: Path | None,
    auto_approve: bool = True,
) -> int:
    """Run the stack until Ctrl-C; returns the process exit code (module docstring).
    ``auto_approve``: whether the demo approves the storyline's own repair after
    :attr:`DemoTimings.approve_after_s` (``--no-auto-approve`` turns it off)."""
    console = Console()
    data_dir = data_dir.resolve()
    cluster: DemoCluster | None = None
    if demo:
        try:
            cluster = prepare_demo(data_dir)
        except (DemoUnavailable, PeerStartError) as exc:
            # Asking for the demo and getting a bare stack confuses: start nothing, and
            # make the instruction the last thing on the screen.
            err = Console(stderr=True)
            err.print(f"[red]error:[/red] --demo: {exc}", highlight=False)
            err.print(DEMO_HOWTO, highlight=False)
            return EXIT_NO_DEMO
        else:
            # The demo's config replaces the given one for every process of the stack.
            config_path = cluster.config_path
            cfg = load_config(config_path)
    stack = DevStack(config=cfg, data_dir=data_dir, ports=ports_from_config(cfg),
                     config_path=config_path.resolve() if config_path else None)
    try:
        timings = DemoTimings(auto_approve=auto_approve)
        return asyncio.run(_run(stack, console, cluster, timings))
    finally:
        release_runtimes()  # the demo's Temporal client: join its threads before exit
        if cluster is not None:
            cluster.stop()
