"""The ``autorepair`` command line (DESIGN §4.1), built with typer.

Process entry points (``up``, ``worker``, ``ingest``), the offline reader (``classify``),
and the operator commands (``status``, ``repairs``, ``validate``, ``breaker``), which
talk to the HTTP API and to Temporal.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from workers.config import ConfigError, load_config
from workflows.config import AutorepairConfig

app = typer.Typer(
    name="autorepair",
    help="GPU fleet health detection and durable auto-repair on Temporal.",
    no_args_is_help=True,
    add_completion=False,
)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="autorepair.yaml (default: $AUTOREPAIR_CONFIG)"),
]


def setup_logging(level: str = "INFO") -> None:
    """One event a line: ``ts level logger key=value ...`` on stderr."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )


def _load(config: Path | None) -> AutorepairConfig:
    try:
        return load_config(config)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def up(
    config: ConfigOpt = None,
    demo: Annotated[bool, typer.Option("--demo", help="add the demo cluster")] = False,
    data_dir: Annotated[Path, typer.Option("--data-dir")] = Path(".autorepair"),
) -> None:
    """Start Temporal dev server, PostgreSQL, worker and ingest (Ctrl-C stops all)."""
    from workers.up import run_up

    setup_logging()
    cfg = _load(config)
    raise typer.Exit(run_up(cfg, data_dir=data_dir, demo=demo, config_path=config))


@app.command()
def worker(config: ConfigOpt = None) -> None:
    """Run the Temporal worker (workflows and activities)."""
    from workers.worker import run_worker

    setup_logging()
    cfg = _load(config)
    try:
        asyncio.run(run_worker(cfg))
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def ingest(config: ConfigOpt = None) -> None:
    """Run the ingest service (OTLP receivers, threshold engine, HTTP API)."""
    from ingest.service import run_ingest

    setup_logging()
    cfg = _load(config)
    try:
        run_ingest(cfg)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def classify(
    file: Annotated[
        str | None,
        typer.Argument(help="kernel log / nvidia-smi / scontrol text; - for stdin"),
    ] = None,
) -> None:
    """Print one JSON object per detected fault event."""
    from workers.classify import classify_command

    raise typer.Exit(classify_command(file))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
