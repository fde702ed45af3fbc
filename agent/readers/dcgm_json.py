"""``dcgmi diag -j`` (JSON) reader: the same ``dcgm_diag`` event as the boxed table.

Shapes (NVIDIA DCGM ``nvvs/include/NvvsJsonStrings.h``, ``testing/python3/
dcgm_diag_schema.json``, ``testing/TestDiagManagerStrings.h``):

- DCGM 4.x: ``{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests":
  [{"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Fail",
  "warnings": [{"warning": "…", "error_id": 52, "error_category": 10, "error_severity":
  2}]}], "test_summary": {"status": "Fail"}}]}]}, "metadata": {"version": "4.2.3", "Driver
  Version Detected": "…"}}``;
- DCGM 2.x/3.x: ``{"DCGM GPU Diagnostic": {"test_categories": [… "results": [{"gpu_ids":
  "0", "status": "FAIL", "warnings": [{"warning": "…", "error_id": 52}]}] …]}}``, warnings
  also as plain strings in the oldest releases; a top-level ``runtime_error`` string;
- ``--iterations N``: ``{"iterations": [<one result object per iteration>], …}`` (one event
  per failing iteration); errors of no single entity sit in a test's ``test_summary``.

Statuses are read case-insensitively (``PASS``/``Pass``/``FAIL``/``Warn``/``SKIP``/``Not
Run``). ``error_id`` names the ``DCGM_FR_*`` code directly; a warning without one is
identified from its text (:func:`agent.readers.dcgm_codes.identify`). Details are those of
:mod:`agent.readers.dcgm`. Never raises.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agent.readers.dcgm import MAX_MESSAGES, add_codes
from agent.readers.dcgm_codes import NAMES, identify
from agent.readers.events import FaultEvent

_ROOT_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
_RANK = {"not run": 0, "skip": 1, "pass": 2, "warn": 3, "warning": 3, "fail": 4, "error": 4}
_LIST = {0: "skipped", 1: "skipped", 2: "passed", 3: "warned", 4: "failed"}
MAX_JSON_CHARS = 8_000_000
"""Largest JSON text looked at (a 16-GPU ``-r 4`` run prints well under 1 MB)."""


def looks_like_dcgm_json(text: str) -> bool:
    """Cheap test: the text names a DCGM diagnostic root key and ``test_categories``."""
    return "test_categories" in text and any(k in text for k in _ROOT_KEYS)


def _status(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    return _RANK.get(value.strip().lower())


def _gpus(result: dict[str, Any]) -> list[int]:
    if str(result.get("entity_group", "GPU")).upper() == "GPU" and isinstance(
        result.get("entity_id"), int
    ):
        return [result["entity_id"]]
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if isinstance(ids, int):
        return [ids]
    if isinstance(ids, str):
        return [int(x) for x in re.findall(r"\d{1,4}", ids)]
    return []


def parse_dcgm_json(obj: Any, text: str = "") -> list[FaultEvent]:
    """A decoded ``dcgmi diag -j`` object → one ``dcgm_diag`` event when a test failed or
    warned (or a ``runtime_error`` is printed), else ``[]``. ``text`` is kept as evidence."""
    try:
        return _parse(obj, text)
    except Exception:  # a reader never takes the agent down
        return []


def _parse(obj: Any, text: str) -> list[FaultEvent]:
    if not isinstance(obj, dict):
        return []
    runs = obj.get("iterations")
    if isinstance(runs, list) and not any(k in obj for k in _ROOT_KEYS):
        # ``dcgmi diag --iterations N -j``: one result object per iteration
        return [ev for run in runs[:64] for ev in _parse(run, text)]
    root = next((obj[k] for k in _ROOT_KEYS if isinstance(obj.get(k), dict)), None)
    if root is None:
        return []
    tests: dict[str, int] = {}
    failed_gpus: set[int] = set()
    warnings: list[str] = []
    found: list[tuple[str, str | None]] = []
    for cat in root.get("test_categories") or []:
        if not isinstance(cat, dict):
            continue
        for test in cat.get("tests") or []:
            if not isinstance(test, dict) or not isinstance(test.get("name"), str):
                continue
            name = test["name"][:100]
            summary = test.get("test_summary")
            rank = _status(summary.get("status")) if isinstance(summary, dict) else None
            results = list(test.get("results") or [])
            if isinstance(summary, dict) and summary.get("warnings"):
                results.append({"warnings": summary["warnings"]})  # errors of no one entity
            for result in results:
                if not isinstance(result, dict):
                    continue
                r = _status(result.get("status"))
                if r is not None:
                    rank = max(rank if rank is not None else -1, r)
                    if r == _RANK["fail"]:
                        failed_gpus.update(_gpus(result))
                for w in result.get("warnings") or []:
                    msg = w.get("warning", w.get("message")) if isinstance(w, dict) else w
                    if not isinstance(msg, str):
                        continue
                    msg = " ".join(msg.split())[:1000]
                    if len(warnings) < MAX_MESSAGES and msg not in warnings:
                        warnings.append(msg)
                    code = w.get("error_id") if isinstance(w, dict) else None
                    named = NAMES.get(code) if isinstance(code, int) else None
                    found.append((name, named or identify(msg)))
            if rank is not None:
                tests[name] = max(rank, tests.get(name, -1))
    runtime = root.get("runtime_error", obj.get("runtime_error"))
    errors = [" ".join(runtime.split())[:1000]] if isinstance(runtime, str) and runtime else []
    for msg in errors:
        found.append(("runtime_error", identify(msg)))
    lists: dict[str, list[str]] = {}
    for name, rank in tests.items():
        lists.setdefault(_LIST[rank], []).append(name)
    if "failed" not in lists and "warned" not in lists and not errors:
        return []
    details: dict[str, object] = {}
    for key in ("failed", "warned", "passed", "skipped"):
        if key in lists:
            details[key] = lists[key]
    if failed_gpus:
        details["failed_gpus"] = sorted(failed_gpus)
    if warnings:
        details["warnings"] = warnings
    if errors:
        details["errors"] = errors
    add_codes(details, found)
    meta = obj.get("metadata")
    if not isinstance(meta, dict):  # DCGM 3.x: the version keys sit in the root object
        meta = root
    if isinstance(meta, dict):
        if isinstance(meta.get("version"), str):
            details["dcgm_version"] = meta["version"][:64]
        if isinstance(meta.get("Driver Version Detected"), str):
            details["driver_version"] = meta["Driver Version Detected"][:64]
    parts = []
    if "failed" in lists:
        parts.append("failed " + ", ".join(lists["failed"]))
    if "warned" in lists:
        parts.append("warned " + ", ".join(lists["warned"]))
    if errors:
        parts.append("runtime error")
    return [
        FaultEvent(
            kind="dcgm_diag",
            xid=None,
            pci=None,
            pid=None,
            process=None,
            summary=("dcgmi diag -j: " + "; ".join(parts))[:300],
            text=text[:100_000] or json.dumps(obj)[:100_000],
            details=details,
            level=False,
        )
    ]


def find_json(lines: list[str], i: int) -> tuple[Any, int] | None:
    """When a JSON object starts on ``lines[i]`` (after blanks), ``(object, end)`` with
    ``end`` the index of the line after it; None when it does not decode."""
    if not lines[i].lstrip().startswith("{"):
        return None
    near = "\n".join(lines[i : i + 8])
    if not any(k in near for k in _ROOT_KEYS):
        return None  # a nested object, or JSON of another tool
    chunk = "\n".join(lines[i:])[:MAX_JSON_CHARS]
    start = chunk.index("{")
    try:
        obj, end = json.JSONDecoder().raw_decode(chunk, start)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    used = chunk[:end].count("\n") + 1
    return obj, i + used
