"""``scontrol show node`` reader: state flags, reason, reason user and time.

A record starts with ``NodeName=`` and continues on indented lines. ``Reason=`` (and the
other free-text keys ``Comment=``, ``Extra=``, ``OS=``) runs to the end of its line; the
``[user@time]`` suffix of the reason is split off. State markers appended to the base state
(``*`` not responding, ``~`` powered off, ``#`` powering up, ``%`` powering down, ``!``,
``@``, ``^``, ``$``, ``-``; see ``sinfo(1)`` NODE STATE CODES) are stripped; ``*`` is
surfaced as the ``NOT_RESPONDING`` flag.
"""

from __future__ import annotations

import re

from agent.readers.events import MAX_LINE_CHARS, FaultEvent

_KEY = re.compile(r"(?:(?<=\s)|^)(?P<key>[A-Za-z][A-Za-z0-9_/:.]{0,40})=")
_FREE_TEXT = ("Reason", "Comment", "Extra", "OS")
_REASON_SUFFIX = re.compile(r"\s*\[(?P<user>[^@\]\s]{1,64})@(?P<time>[^\]]{1,40})\]\s*$")
_MARKERS = "*~#%!@^$-"
BAD_FLAGS = frozenset(
    {
        "DOWN",
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "FAIL",
        "FAILING",
        "NOT_RESPONDING",
        "INVALID_REG",
        "INVALID",
        "ERROR",
        "UNKNOWN",
    }
)
"""State flags that make a record an event (with or without a reason)."""


def is_slurm_start(line: str) -> bool:
    """True for the first line of a ``scontrol show node`` record."""
    return line.lstrip().startswith("NodeName=")


def is_slurm_continuation(line: str) -> bool:
    """True for an indented ``Key=value`` line inside a record."""
    return line[:1].isspace() and bool(_KEY.search(line))


def parse_state(raw: str) -> list[str]:
    """``"IDLE+DRAIN"`` → ``["IDLE", "DRAIN"]``; ``"DOWN*+DRAIN"`` →
    ``["DOWN", "DRAIN", "NOT_RESPONDING"]``. Upper-case, de-duplicated, order kept."""
    flags: list[str] = []
    not_responding = False
    for part in raw.split("+"):
        p = part.strip()
        if "*" in p:
            not_responding = True
        p = p.strip(_MARKERS).upper()
        if p and re.fullmatch(r"[A-Z_]{1,40}", p) and p not in flags:
            flags.append(p)
    if not_responding and "NOT_RESPONDING" not in flags:
        flags.append("NOT_RESPONDING")
    return flags


def _fields(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in lines:
        line = raw[:MAX_LINE_CHARS].rstrip("\r\n")
        keys = list(_KEY.finditer(line))
        for i, m in enumerate(keys):
            key = m.group("key")
            if key in _FREE_TEXT:
                out[key] = line[m.end() :].strip()
                break
            end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
            out.setdefault(key, line[m.end() : end].strip())
    return out


def parse_scontrol(lines: list[str]) -> FaultEvent | None:
    """One ``scontrol show node`` record → a ``slurm_node`` event, or None when healthy.

    ``details``: ``node``, ``state`` (list of flags), ``reason`` (without ``[user@time]``),
    ``reason_user``, ``reason_time``, and ``gres`` when printed. An event is produced when
    the state has a flag of :data:`BAD_FLAGS` or a reason is set.
    """
    f = _fields(lines)
    node = f.get("NodeName", "").split()[0] if f.get("NodeName", "").split() else ""
    if not node:
        return None
    state = parse_state(f.get("State", "").split()[0] if f.get("State", "").split() else "")
    reason_raw = f.get("Reason", "")
    reason: str | None = None
    user: str | None = None
    when: str | None = None
    if reason_raw and reason_raw.lower() not in ("none", "(null)"):
        m = _REASON_SUFFIX.search(reason_raw)
        if m:
            user, when = m.group("user"), m.group("time")
            reason_raw = reason_raw[: m.start()]
        reason = reason_raw.strip() or None
    bad = [s for s in state if s in BAD_FLAGS]
    if not bad and reason is None:
        return None
    details: dict[str, object] = {
        "node": node,
        "state": state,
        "reason": reason,
        "reason_user": user,
        "reason_time": when,
    }
    if f.get("Gres"):
        details["gres"] = f["Gres"]
    summary = f"Slurm node {node} {'+'.join(state) or 'UNKNOWN'}"
    if reason:
        summary += f": {reason}"
    return FaultEvent(
        kind="slurm_node",
        xid=None,
        pci=None,
        pid=None,
        process=None,
        summary=summary[:300],
        text="\n".join(x.rstrip("\r\n") for x in lines),
        details=details,
        level=True,
        active=bool(bad),
    )
