"""`--help` of both CLIs: no `<bool>` on flags, no line break mid-sentence, every option
described (issue 28 item 17)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.cli import app as agent_app
from agent.clihelp import plain_help, unwrap
from workers.cli import app

BIN = Path(sys.executable).parent


def _help(exe: str, *args: str) -> str:
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}
    res = subprocess.run([str(BIN / exe), *args, "--help"], capture_output=True, text=True,
                         env=env, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize("args", [("status",), ("report",), ("repairs", "list"),
                                  ("breaker", "reset"), ("up",)])
def test_flags_show_no_type(args: tuple[str, ...]) -> None:
    out = _help("autorepair", *args)
    assert "<bool>" not in out
    assert "--help" in out and "Show this message and exit." in out


def test_descriptions_are_not_broken_where_the_source_line_ended() -> None:
    assert "top fault kinds and machines" in " ".join(_help("autorepair", "report").split(
        "│"))
    out = _help("autorepair-agent", "simulate")
    assert "<bool>" not in out and "--token-file" in out


def _options(command: Any, path: str) -> list[tuple[str, Any]]:
    out = [(path, p) for p in command.params]
    for name, sub in getattr(command, "commands", {}).items():
        out += _options(sub, f"{path} {name}")
    return out


@pytest.mark.parametrize("typer_app,name", [(app, "autorepair"), (agent_app, "autorepair-agent")])
def test_every_option_and_argument_is_described(typer_app: Any, name: str) -> None:
    missing = [f"{path} {p.name}" for path, p in _options(plain_help(typer_app), name)
               if not getattr(p, "help", None)]
    assert missing == []


def test_unwrap_keeps_paragraphs() -> None:
    assert unwrap("a line\n    broken here.\n\nSecond paragraph\nhere.") == (
        "a line broken here.\n\nSecond paragraph here.")
