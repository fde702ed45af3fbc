"""Plain ``--help`` for the typer apps of ``autorepair`` and ``autorepair-agent``.

Typer's rich help (typer ≥ 0.2x) prints a type column for every option, ``<bool>`` for
flags too (``--json``, ``--help``), which reads as if the flag took a value; and in its
``rich`` markup mode it keeps the single line breaks of a docstring, so a command's
description breaks mid-sentence where the source line ended. :func:`plain_help` fixes
both on the click command typer builds: flags get an empty metavar (no type shown), and
single line breaks inside a paragraph become spaces (blank lines still separate
paragraphs).
"""

from __future__ import annotations

import re
from typing import Any

import typer
import typer.main

_SINGLE_BREAK = re.compile(r"(?<!\n)[ \t]*\n[ \t]*(?!\n)")


def unwrap(text: str | None) -> str | None:
    """``text`` with every single line break (and the indentation around it) replaced by
    one space; paragraph breaks (blank lines) kept. ``None`` stays ``None``."""
    if not text:
        return text
    return _SINGLE_BREAK.sub(" ", text.strip())


def _fix(command: Any) -> None:
    command.help = unwrap(command.help)
    params = list(command.params)
    if getattr(command, "add_help_option", False):
        help_option = command.get_help_option(typer.Context(command))
        if help_option is not None:
            params.append(help_option)
    for param in params:
        if getattr(param, "is_flag", False) and getattr(param, "count", False) is False:
            param.metavar = ""
        if getattr(param, "help", None):
            param.help = unwrap(param.help)
    for sub in getattr(command, "commands", {}).values():
        _fix(sub)


def plain_help(app: typer.Typer) -> Any:
    """The click command of ``app`` with plain help (module docstring); call it instead
    of ``app()``: ``plain_help(app)(prog_name=...)``."""
    command = typer.main.get_command(app)
    _fix(command)
    return command
