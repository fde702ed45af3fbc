"""The demo storyline of ``autorepair up --demo`` (issue 10).

Not available yet in this build: ``run_demo`` says so and returns; the stack itself
runs normally.
"""

from __future__ import annotations

import asyncio

from rich.console import Console

from workers.devstack import DevStack


async def run_demo(stack: DevStack, console: Console, stop: asyncio.Event) -> None:
    """Announce that the demo cluster is not available in this build."""
    del stack, stop
    console.print("[yellow]--demo: the demo cluster is not available yet in this build[/yellow]")
