"""``autorepair up`` front end: start the :class:`DevStack`, print where things are, wait.

Exit codes: 0 after a clean Ctrl-C stop, 1 when the stack cannot start (the message says
why: a port in use, a missing binary, a child that did not come up).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from rich.console import Console
from rich.table import Table

from workers.devstack import DevStack, StackError, StackPorts
from workflows.config import AutorepairConfig


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
    )


def print_endpoints(stack: DevStack, console: Console) -> None:
    table = Table(title="autorepair dev stack", show_lines=False)
    table.add_column("what")
    table.add_column("where")
    for what, where in stack.endpoints():
        table.add_row(what, where)
    console.print(table)
    console.print("Press Ctrl-C to stop everything started here.")


async def _run(stack: DevStack, console: Console, demo: bool) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    demo_task: asyncio.Task[None] | None = None
    try:
        await stack.start()
        print_endpoints(stack, console)
        if demo:
            from workers.demo import run_demo

            demo_task = asyncio.create_task(run_demo(stack, console, stop))
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


def run_up(
    cfg: AutorepairConfig, *, data_dir: Path, demo: bool, config_path: Path | None
) -> int:
    """Run the stack until Ctrl-C; returns the process exit code."""
    if config_path is not None:
        os.environ["AUTOREPAIR_CONFIG"] = str(config_path.resolve())
    console = Console()
    stack = DevStack(config=cfg, data_dir=data_dir.resolve(), ports=ports_from_config(cfg))
    return asyncio.run(_run(stack, console, demo))
