"""``autorepair-agent validate [--json]``: run the local validation suite.

Exit code 0 passed, 1 failed, 2 aborted (docs/design.md §4.1). ``--json`` prints the structured
result (see :mod:`agent.validation.result`) as one JSON object on stdout; without it a
plain table is printed. Also runnable as ``python -m agent.validation``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from agent.config import ConfigError
from agent.validation.config import SuiteConfig
from agent.validation.result import ABORTED, SuiteResult
from agent.validation.suite import run_suite

#: Environment variable naming the suite's config file when ``--config`` is not given.
CONFIG_ENV = "AUTOREPAIR_VALIDATE_CONFIG"


def render_table(result: SuiteResult) -> str:
    """Human-readable table of the result (one row per check)."""
    rows = [("check", "outcome", "detail")]
    for c in result.checks:
        rows.append((c.name, c.outcome, c.detail))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    for c in result.checks:
        if c.measurements:
            nums = ", ".join(f"{k}={v:g}" for k, v in c.measurements.items())
            lines.append(f"  {c.name}: {nums}")
    lines.append(f"machine {result.machine}: {result.verdict.upper()} — {result.reason}")
    return "\n".join(lines)


def run_validate(
    *, json_out: bool, config: Path | None = None, machine: str | None = None,
    backend: str | None = None,
) -> int:
    """Load the config (``config`` or ``$AUTOREPAIR_VALIDATE_CONFIG``), run the suite,
    print the result, return the exit code (0/1/2). A bad config prints an *aborted*
    result naming the field and returns 2."""
    import os

    path: Path | None = config
    if path is None and os.environ.get(CONFIG_ENV):
        path = Path(os.environ[CONFIG_ENV])
    try:
        cfg = SuiteConfig.load(path, machine=machine, backend=backend)
        result = run_suite(cfg)
    except ConfigError as exc:
        from agent.validation.config import default_machine

        result = SuiteResult(machine or default_machine(), ABORTED, [], f"configuration: {exc}")
    if json_out:
        sys.stdout.write(json.dumps(result.to_dict(), separators=(",", ":")) + "\n")
    else:
        sys.stdout.write(render_table(result) + "\n")
    sys.stdout.flush()
    return result.exit_code


app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def validate(
    json_out: Annotated[bool, typer.Option("--json", help="print the structured result")] = False,
    config: Annotated[
        Path | None, typer.Option("--config", help=f"suite YAML (default ${CONFIG_ENV})")
    ] = None,
    machine: Annotated[str | None, typer.Option("--machine", help="machine name")] = None,
    backend: Annotated[
        str | None, typer.Option("--backend", help="GPU backend: nvml | simulated")
    ] = None,
) -> None:
    """Run GPU, DCGM, NCCL, InfiniBand and storage checks; exit 0 passed, 1 failed, 2 aborted."""
    raise typer.Exit(run_validate(json_out=json_out, config=config, machine=machine,
                                  backend=backend))


def main() -> None:
    """Entry point of ``python -m agent.validation``."""
    app()
