"""``autorepair-agent simulate`` bad arguments exit 2 naming the option (its help: "2 bad
arguments"); they crashed with a traceback and exit 1 (``--push-interval 0`` in the
agents' config once they started, ``--control-port 99999`` in ``bind()``) or were taken
(``--gpus-per-node 0``: nodes with no GPU at all)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app

BASE = ["simulate", "--endpoint", "http://127.0.0.1:9", "--cluster", "c", "--nodes", "2",
        "--duration", "1"]


@pytest.mark.parametrize(("args", "option", "value"), [
    (["--push-interval", "0"], "--push-interval", "0"),
    (["--push-interval", "nan"], "--push-interval", "nan"),
    (["--gpus-per-node", "0"], "--gpus-per-node", "0"),
    (["--control-port", "99999"], "--control-port", "99999"),
    (["--duration", "-1"], "--duration", "-1"),
])
def test_bad_simulate_arguments_exit_2_naming_the_option(
        tmp_path: Path, args: list[str], option: str, value: str) -> None:
    r = CliRunner().invoke(app, [*BASE, "--state-dir", str(tmp_path), *args],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    out = " ".join(r.output.split())
    assert option in out and value in out, out
