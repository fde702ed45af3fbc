"""``autorepair classify [FILE|-]``: one JSON object per detected fault event (docs/design.md §4.1).

Reads kernel-log / ``nvidia-smi -q`` / ``scontrol show node`` text from FILE, or stdin for
``-`` or no argument, decodes it as UTF-8 with ``errors="replace"`` (invalid bytes never
crash it), runs :func:`agent.readers.read_text` and prints, per event::

    {"kind", "xid", "pci", "pid", "process", "mnemonic", "severity", "action", "summary", ...}

followed by kind-specific fields: ``slurm_node`` adds ``state``, ``reason``,
``reason_user``, ``reason_time``; ``nvsmi`` the counters and flags it read; other kinds
their reader details (``gpc``/``tpc``/``sm``, ``link``, ``recovery_action``,
``caused_by_xid``, ...); a detail whose name is taken by a base field is printed as
``error_<name>`` (the NVLink/SXid ``severity`` fatal/nonfatal becomes
``error_severity``). ``action`` is the default catalogue's lightest node action;
``"unmapped": true`` follows the base fields whenever the catalogue has no row for the
event (e.g. ``Xid 999``): its ``none`` is "not decided", never a silent decision.
Lines that are not events print nothing.

Exit codes: 0 on success (with or without events); 2 when FILE cannot be read (the
message on stderr names the path and the reason).
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from agent.readers import FaultEvent, read_text
from workflows.alerts import summarize
from workflows.catalogue import entry_for
from workflows.config import CatalogueConfig

BASE_FIELDS = ("kind", "xid", "pci", "pid", "process", "mnemonic", "severity", "action", "summary")
"""Fields every classify object starts with, in this order (docs/design.md §4.1)."""

_SKIP_DETAILS = frozenset({"message"})


def event_to_json(ev: FaultEvent, catalogue: CatalogueConfig | None = None) -> dict[str, Any]:
    """The classify object of one event under ``catalogue`` (default catalogue if None)."""
    cat = catalogue if catalogue is not None else CatalogueConfig()
    entry = entry_for(ev.kind, ev.xid, ev.details, cat)
    evidence = {**ev.details, "pid": ev.pid, "process": ev.process}
    out: dict[str, Any] = {
        "kind": ev.kind,
        "xid": ev.xid,
        "pci": ev.pci,
        "pid": ev.pid,
        "process": ev.process,
        "mnemonic": entry.mnemonic,
        "severity": entry.severity.value,
        "action": entry.action.value,
        "summary": summarize(ev.kind, ev.xid, ev.pci, entry.mnemonic, evidence),
    }
    if not entry.mapped:
        out["unmapped"] = True  # the catalogue has no row: observed, never a silent none
    if ev.kind == "slurm_node":
        for key in ("state", "reason", "reason_user", "reason_time"):
            out[key] = ev.details.get(key)
    for key, value in ev.details.items():
        if key in _SKIP_DETAILS or (key in out and out[key] == value):
            continue  # already printed (e.g. the slurm_node fields above)
        if key in out:
            # e.g. NVLink/SXid "severity" (fatal/nonfatal) vs the catalogue severity
            key = f"error_{key}"
        if key not in out:
            out[key] = value
    if ev.level:
        out["active"] = ev.active
    return out


def classify_text(text: str, catalogue: CatalogueConfig | None = None) -> list[dict[str, Any]]:
    """Every classify object of ``text`` (the code path of :func:`classify_command`)."""
    return [event_to_json(ev, catalogue) for ev in read_text(text)]


def classify_command(path: str | None, out: TextIO | None = None) -> int:
    """Read FILE (``None`` or ``-``: stdin), print one JSON object a line, return exit code."""
    stream = out if out is not None else sys.stdout
    try:
        if path is None or path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        print(f"error: FILE {path!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    text = data.decode("utf-8", errors="replace")
    for obj in classify_text(text):
        stream.write(json.dumps(obj, ensure_ascii=False, sort_keys=False) + "\n")
    stream.flush()
    return 0
