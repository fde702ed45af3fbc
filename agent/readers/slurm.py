"""Slurm readers: ``scontrol show node`` records and slurmctld log lines about node state.

``scontrol show node``: a record starts with ``NodeName=`` and continues on lines that hold
``Key=value`` pairs (indented as printed, with tabs, or with the indentation stripped).
``Reason=`` (and the other free-text keys ``Comment=``, ``Extra=``, ``OS=``) runs to the end
of its line; the ``[user@time]`` suffix of the reason is split off. State markers appended
to the base state (``*`` not responding, ``~`` powered off, ``#`` powering up, ``%``
powering down, ``!``, ``@``, ``^``, ``$``, ``-``; see ``sinfo(1)`` NODE STATE CODES) are
stripped; ``*`` is surfaced as the ``NOT_RESPONDING`` flag.

slurmctld log (:class:`SlurmctldReader`): the lines with which slurmctld sets a node
INVAL, DOWN or DRAIN, or returns it (wording of Slurm's ``src/slurmctld/node_mgr.c``,
``ping_nodes.c`` and ``power_save.c``, 20.x–25.x), with any log prefix
(``[2024-05-01T10:00:00.123] ``, ``slurmctld: ``, syslog/journald):

=========================================================  ===============================
line                                                        ``state``
=========================================================  ===============================
``error: Setting node N state to INVAL with reason:R``      ``INVALID_REG`` (reason R)
``drain_nodes: node N state set to DRAIN``                  ``DRAIN``
``update_node: node N state set to S``                      flags of S (``IDLE``: cleared)
``update_node: node N reason set to: R``                    (reason R only)
``error: Nodes H not responding, setting DOWN``             ``DOWN``, ``NOT_RESPONDING``
``error: Nodes H not responding``                           ``NOT_RESPONDING``
``Node N now responding``                                   none (cleared)
``node N returned to service``                              ``IDLE`` (cleared)
``…: Node N unexpectedly rebooted boot_time=…``             ``DOWN``
``…: Prolog or job env setup failure on node N, draining``  ``DRAIN``
``node N not resumed by ResumeTimeout(T), setting DOWN…``   ``DOWN``, ``POWERED_DOWN``
=========================================================  ===============================

A reason line and the state line that follows it for the same node (``update_node`` logs
both for one ``scontrol update``), or INVAL and the ``drain_nodes`` line after it, are one
event. ``slurm_node`` details: ``node`` (as printed, a hostlist for ``Nodes H``),
``nodes`` (the hostlist expanded, when it has brackets or commas), ``state`` (list of
upper-case flags), ``reason``, ``reason_user``, ``reason_time`` (None where not printed;
for slurmctld lines ``reason_time`` is the log line's timestamp), ``gres`` (scontrol, when
printed), ``responding`` (slurmctld ``now responding`` → True) and ``source``
(``"slurmctld"`` for log lines; scontrol records carry none).
"""

from __future__ import annotations

import re

from agent.readers.events import MAX_LINE_CHARS, FaultEvent

_KEY = re.compile(r"(?:(?<=\s)|^)(?P<key>[A-Za-z][A-Za-z0-9_/:.]{0,40})=")
_LEADING_KEY = re.compile(r"^[A-Z][A-Za-z0-9_/:.]{0,40}=\S*")
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
        "INVAL",
        "ERROR",
        "UNKNOWN",
    }
)
"""State flags that make a record an event (with or without a reason)."""


def is_slurm_start(line: str) -> bool:
    """True for the first line of a ``scontrol show node`` record."""
    return line.lstrip().startswith("NodeName=")


def is_slurm_continuation(line: str) -> bool:
    """True for a ``Key=value`` line inside a record: indented as printed, or any line that
    starts with a ``Key=`` pair (a paste that lost its indentation) other than a new
    ``NodeName=`` record."""
    if line[:1].isspace():
        return bool(_KEY.search(line))
    return bool(_LEADING_KEY.match(line)) and not line.startswith("NodeName=")


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


# --- slurmctld log lines ------------------------------------------------------------------


def _may_be_ctld(line: str) -> bool:
    """Cheap pre-filter: every line of the table in the module docstring names a node
    (``node``/``Node``/``Nodes``) and has one of these words."""
    return "ode" in line and (
        "respond" in line
        or "set to" in line
        or "INVAL" in line
        or "returned to service" in line
        or "unexpectedly rebooted" in line
        or "draining the node" in line
        or "ResumeTimeout" in line
    )


_HOST = r"(?P<node>[A-Za-z0-9][A-Za-z0-9_.\-\[\],]{0,300})"
_CTLD: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern.replace("HOST", _HOST)), what)
    for pattern, what in (
        (r"\bSetting node HOST state to INVAL with reason:(?P<reason>.*)$", "inval"),
        (r"\bdrain_nodes: node HOST state set to DRAIN\b", "drain"),
        (r"\bupdate_node: node HOST state set to (?P<state>[A-Za-z_+*~#%!@^$-]+)", "state"),
        (r"\bupdate_node: node HOST reason set to: ?(?P<reason>.*)$", "reason"),
        (r"\b(?:Nodes?|node) HOST not responding(?P<down>, setting DOWN)?", "noresp"),
        (r"\bNode HOST now responding\b", "resp"),
        (r"\bnode HOST returned to service\b", "up"),
        (r"\bNode HOST unexpectedly rebooted\b", "rebooted"),
        (r"\bProlog or job env setup failure on node HOST, draining the node", "prolog"),
        (r"\bnode HOST not resumed by ResumeTimeout\(\d+\), setting DOWN", "resume"),
    )
)
_LOG_TIME = re.compile(r"^\s*\[(?P<t>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?)\]")
MAX_HOSTS = 4096
"""Most node names a hostlist is expanded to; a larger one keeps only ``node`` as printed."""


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist → names: ``gpu-[01-03,05]`` → ``gpu-01, gpu-02, gpu-03, gpu-05``
    (zero padding kept), ``a,b[1-2]`` → ``a, b1, b2``, several bracket groups multiply.
    Malformed or larger than :data:`MAX_HOSTS` → ``[expr]``."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, c in enumerate(expr):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                return [expr]
        elif c == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        return [expr]
    parts.append(expr[start:])
    out: list[str] = []
    for part in parts:
        names = [""]
        for m in re.finditer(r"\[([^\]]*)\]|([^\[\]]+)", part):
            if m.group(2) is not None:
                names = [n + m.group(2) for n in names]
                continue
            choices: list[str] = []
            for rng in m.group(1).split(","):
                lo, _, hi = rng.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    return [expr]
                if not hi:
                    choices.append(lo)
                    continue
                if int(hi) < int(lo) or int(hi) - int(lo) >= MAX_HOSTS:
                    return [expr]
                choices.extend(str(k).zfill(len(lo)) for k in range(int(lo), int(hi) + 1))
            if len(names) * len(choices) + len(out) > MAX_HOSTS:
                return [expr]
            names = [n + c for n in names for c in choices]
        if not part or any(not n for n in names):
            return [expr]
        out.extend(names)
    return out


def parse_slurmctld(line: str) -> FaultEvent | None:
    """One slurmctld log line (table in the module docstring) → a ``slurm_node`` event
    with ``source="slurmctld"``, or None for any other line. ``active`` is False for the
    lines that return a node (``now responding``, ``returned to service``, a state set
    without a DOWN/DRAIN/FAIL flag)."""
    if not _may_be_ctld(line):
        return None
    line = line[:MAX_LINE_CHARS].rstrip("\r\n")
    for pattern, what in _CTLD:
        m = pattern.search(line)
        if m is None:
            continue
        node = m.group("node").rstrip(",")
        state: list[str] = []
        reason: str | None = None
        responding: bool | None = None
        if what == "inval":
            state, reason = ["INVALID_REG"], m.group("reason").strip() or None
        elif what in ("drain", "prolog"):
            state = ["DRAIN"]
            if what == "prolog":
                reason = "Prolog or job env setup failure"
        elif what == "state":
            state = parse_state(m.group("state"))
        elif what == "reason":
            reason = m.group("reason").strip() or None
        elif what == "noresp":
            state = ["DOWN", "NOT_RESPONDING"] if m.group("down") else ["NOT_RESPONDING"]
            responding = False
        elif what == "resp":
            responding = True
        elif what == "up":
            state = ["IDLE"]
        elif what == "rebooted":
            state, reason = ["DOWN"], "Node unexpectedly rebooted"
        elif what == "resume":
            state = ["DOWN", "POWERED_DOWN"]
        return _ctld_event(line, node, state, reason, responding, what)
    return None


def _ctld_event(
    line: str,
    node: str,
    state: list[str],
    reason: str | None,
    responding: bool | None,
    what: str,
) -> FaultEvent:
    tm = _LOG_TIME.match(line)
    details: dict[str, object] = {
        "node": node,
        "state": state,
        "reason": reason,
        "reason_user": None,
        "reason_time": tm.group("t") if tm and reason else None,
        "source": "slurmctld",
    }
    if "[" in node or "," in node:
        details["nodes"] = expand_hostlist(node)
    if responding is not None:
        details["responding"] = responding
    bad = any(s in BAD_FLAGS for s in state)
    active = bad or (not state and reason is not None)
    return FaultEvent(
        kind="slurm_node",
        xid=None,
        pci=None,
        pid=None,
        process=None,
        summary=_ctld_summary(node, state, reason, what),
        text=line,
        details=details,
        level=True,
        active=active,
    )


def _ctld_summary(node: str, state: list[str], reason: str | None, what: str) -> str:
    if what == "resp" and not state:
        text = f"Slurm node {node} now responding"
    elif not state:
        text = f"Slurm node {node} reason set"
    else:
        text = f"Slurm node {node} {'+'.join(state)}"
    if reason:
        text += f": {reason}"
    return text[:300]


def _merge(first: FaultEvent, second: FaultEvent) -> FaultEvent | None:
    """``first`` and ``second`` as one event when they are two lines of one change."""
    a, b = first.details, second.details
    if a.get("node") != b.get("node"):
        return None
    sa, sb = list(a.get("state") or []), list(b.get("state") or [])
    ra, rb = a.get("reason"), b.get("reason")
    if sa == ["INVALID_REG"] and sb == ["DRAIN"] and rb is None:
        state, reason, when = ["INVALID_REG", "DRAIN"], ra, a.get("reason_time")
    elif not sa and ra is not None and sb and rb is None and "responding" not in b:
        state, reason, when = sb, ra, a.get("reason_time")
    elif not sb and rb is not None and sa and ra is None and "responding" not in a:
        state, reason, when = sa, rb, b.get("reason_time")
    else:
        return None
    merged = _ctld_event(second.text, str(a["node"]), state, reason, None, "merged")
    merged.details["reason_time"] = when
    merged.text = first.text + "\n" + second.text
    return merged


class SlurmctldReader:
    """Streaming slurmctld lines → ``slurm_node`` events, pairing the two lines of one
    change (see the module docstring). :meth:`feed` returns None for a line that is not a
    slurmctld node-state line (the caller routes it elsewhere, after :meth:`flush`)."""

    def __init__(self) -> None:
        self._pending: FaultEvent | None = None

    @property
    def pending(self) -> bool:
        """True while an event is held for a possible second line."""
        return self._pending is not None

    def feed(self, line: str) -> list[FaultEvent] | None:
        """Events completed by ``line``; None when ``line`` is not a slurmctld line."""
        ev = parse_slurmctld(line)
        if ev is None:
            return None
        out: list[FaultEvent] = []
        if self._pending is not None:
            merged = _merge(self._pending, ev)
            if merged is not None:
                self._pending = None
                return [merged]
            out.append(self._pending)
        self._pending = ev
        return out

    def flush(self) -> list[FaultEvent]:
        """The event held for a possible second line, if any."""
        ev, self._pending = self._pending, None
        return [ev] if ev is not None else []
