"""Permanent activity errors come from ``workflows.activity_api.permanent`` with an ``ERR_*``.

docs/design.md §6: activities raise non-retryable ``ApplicationError`` types for permanent
failures; the workflows name the same types in ``non_retryable_error_types``. One
spelling of each type keeps both sides in step.
"""

from __future__ import annotations

import ast
from pathlib import Path

from temporalio.exceptions import ApplicationError

from workflows import activity_api
from workflows.activity_api import ERR_CONFIGURATION, ERR_DRAIN_DEADLINE, permanent

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ingest", "workflows", "activities", "workers")
HOME = Path("workflows/activity_api.py")
#: Files allowed to spell error types (none).
ALLOWED: set[Path] = set()
ERR_VALUES = {v for k, v in vars(activity_api).items() if k.startswith("ERR_")}


def _offences(source: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ApplicationError":
            if any(k.arg == "non_retryable" for k in node.keywords):
                out.append((node.lineno, "ApplicationError(non_retryable=...): use permanent()"))
        elif isinstance(node, ast.Constant) and node.value in ERR_VALUES:
            out.append((node.lineno, f"error type literal {node.value!r}: use the ERR_* constant"))
    return out


def test_permanent_builds_a_non_retryable_application_error() -> None:
    err = permanent(ERR_DRAIN_DEADLINE, "node gpu-01: jobs still running", {"remaining": ["7"]})
    assert isinstance(err, ApplicationError)
    assert err.type == "DrainDeadline" and err.non_retryable
    assert err.message == "node gpu-01: jobs still running"
    assert err.details == ({"remaining": ["7"]},)
    assert permanent(ERR_CONFIGURATION, "x").type == "ConfigurationError"


def test_the_scan_finds_both_kinds() -> None:
    src = 'raise ApplicationError("m", type="ActionFailed", non_retryable=True)\n'
    assert len(_offences(src)) == 2
    assert not _offences('raise permanent(ERR_ACTION_FAILED, "m")\n')


def test_no_hand_built_permanent_error_outside_the_contract() -> None:
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel == HOME or rel in ALLOWED:
                continue
            found += [f"{rel}:{line}: {what}" for line, what in _offences(path.read_text())]
    assert not found, "\n".join(found)
