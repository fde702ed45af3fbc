"""``sinfo`` tables → ``slurm_node`` events, one per node (as for ``scontrol show node``).

The tables operators paste (Slurm ``sinfo(1)``, 20.x–25.x):

- ``sinfo -R`` (``REASON USER TIMESTAMP NODELIST``; ``-Rl`` adds ``STATE``);
- ``sinfo -lNe`` / ``sinfo -Nel`` (``NODELIST NODES PARTITION STATE CPUS S:C:T MEMORY
  TMP_DISK WEIGHT AVAIL_FE REASON``), ``sinfo -N -o "%N %T %E …"`` with any columns;
- plain ``sinfo`` (``PARTITION AVAIL TIMELIMIT NODES STATE NODELIST``), a state per hostlist.

A table starts at a header line of upper-case ``sinfo`` column names with ``NODELIST`` (or
``HOSTNAMES``) and ``STATE`` or ``REASON``; rows follow until a blank line or a line that is
not a row. Every column but ``REASON`` is one word, so a row is split on blanks and the
reason is what lies between the columns before and after it. Hostlists (``gpu-[01-04,07]``)
are expanded; a node listed once per partition (``-N``) comes out once.

``state`` is the list of upper-case flags ``scontrol`` would print, from sinfo's state word
(sinfo(1) "NODE STATE CODES"): ``drained`` → ``IDLE``, ``DRAIN``; ``draining``/``drng`` →
``DRAINING``, ``DRAIN``; ``down*`` → ``DOWN``, ``NOT_RESPONDING``; ``idle~`` → ``IDLE``,
``POWERED_DOWN``; compact names expanded (``alloc`` → ``ALLOCATED``, ``mix`` → ``MIXED``,
``comp`` → ``COMPLETING``, ``failg`` → ``FAILING``, ``inval`` → ``INVALID_REG``, ``unk`` →
``UNKNOWN`` …); suffixes ``*`` ``NOT_RESPONDING``, ``~`` ``POWERED_DOWN``, ``#``
``POWERING_UP``, ``%`` ``POWERING_DOWN``, ``!`` ``POWER_DOWN``, ``$`` ``MAINTENANCE``, ``@``
``REBOOT_REQUESTED``, ``^`` ``REBOOT_ISSUED``, ``-`` ``PLANNED``.

``details``: ``node``, ``state``, ``reason`` (None for ``none``/``(null)``),
``reason_user``, ``reason_time`` (``TIMESTAMP``; None for ``Unknown``), ``partitions``
(when printed), ``source`` = ``"sinfo"``. An event is produced for a node with a flag of
:data:`~agent.readers.slurm.BAD_FLAGS` or a reason; ``active`` is True when a bad flag is
set, or when ``sinfo -R`` printed a reason without a state (it lists only unavailable nodes).
"""

from __future__ import annotations

import re

from agent.readers.events import MAX_LINE_CHARS, FaultEvent
from agent.readers.slurm import BAD_FLAGS, expand_hostlist

COLUMNS = frozenset(
    {
        "NODELIST", "HOSTNAMES", "NODES", "NODES(A/I)", "NODES(A/I/O/T)", "PARTITION",
        "STATE", "CPUS", "CPUS(A/I/O/T)", "S:C:T", "MEMORY", "FREE_MEM", "TMP_DISK",
        "WEIGHT", "AVAIL_FE", "AVAIL_FEATURES", "ACTIVE_FEATURES", "REASON", "USER",
        "TIMESTAMP", "AVAIL", "TIMELIMIT", "GRES", "GRES_USED", "CPU_LOAD", "ALLOCMEM",
        "SOCKETS", "CORES", "THREADS", "NODE_ADDR", "ROOT", "JOB_SIZE", "OVERSUBSCRIBE",
        "GROUPS", "PRIO_TIER", "PRIO_JOB_FACTOR", "DEFAULTTIME", "ACTIVE_FE", "CLUSTER",
        "FEATURES", "FEATURES_ACT", "PORT", "VERSION", "BOOT_TIME", "SLURMD_START_TIME",
        "PREEMPT_MODE", "PRIORITY", "RESERVATION", "MAX_CPUS_PER_NODE", "ALLOCNODES",
        "HOSTNAME",
    }
)
"""Column titles ``sinfo`` prints (``sinfo(1)`` ``--format`` field names)."""

_NODE_COLS = ("NODELIST", "HOSTNAMES", "HOSTNAME")
_HOSTLIST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-\[\],]{0,300}$")

BASE_STATES: dict[str, list[str]] = {
    "alloc": ["ALLOCATED"], "allocated": ["ALLOCATED"],
    "blocked": ["BLOCKED"],
    "boot": ["REBOOT"], "booting": ["REBOOT"],
    "comp": ["COMPLETING"], "completing": ["COMPLETING"],
    "down": ["DOWN"],
    "drain": ["IDLE", "DRAIN"], "drained": ["IDLE", "DRAIN"],
    "drng": ["DRAINING", "DRAIN"], "draining": ["DRAINING", "DRAIN"],
    "fail": ["FAIL"],
    "failg": ["FAILING"], "failing": ["FAILING"],
    "futr": ["FUTURE"], "future": ["FUTURE"],
    "idle": ["IDLE"],
    "inval": ["INVALID_REG"], "invalid": ["INVALID_REG"], "invalid_reg": ["INVALID_REG"],
    "maint": ["MAINTENANCE"], "maintenance": ["MAINTENANCE"],
    "mix": ["MIXED"], "mixed": ["MIXED"],
    "npc": ["PERFCTRS"], "perfctrs": ["PERFCTRS"],
    "plnd": ["PLANNED"], "planned": ["PLANNED"],
    "pow_dn": ["POWER_DOWN"], "power_down": ["POWER_DOWN"], "powered_down": ["POWERED_DOWN"],
    "pow_up": ["POWERING_UP"], "powering_up": ["POWERING_UP"],
    "powering_down": ["POWERING_DOWN"],
    "reboot": ["REBOOT"], "reboot_issued": ["REBOOT_ISSUED"],
    "reboot_requested": ["REBOOT_REQUESTED"],
    "resv": ["RESERVED"], "reserved": ["RESERVED"],
    "unk": ["UNKNOWN"], "unknown": ["UNKNOWN"],
    "not_responding": ["NOT_RESPONDING"],
}
"""sinfo state words (compact and long, lower case) → scontrol flags."""

SUFFIX_FLAGS: dict[str, str] = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "!": "POWER_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}


def sinfo_state(word: str) -> list[str]:
    """``"down*"`` → ``["DOWN", "NOT_RESPONDING"]``, ``"drained"`` → ``["IDLE", "DRAIN"]``,
    ``"idle~"`` → ``["IDLE", "POWERED_DOWN"]``, ``"IDLE+DRAIN"`` → ``["IDLE", "DRAIN"]``.
    A word outside the table is kept upper-cased; ``[]`` for no word."""
    flags: list[str] = []
    for part in word.strip().split("+"):
        base, suffix = part, list[str]()
        while base and base[-1] in SUFFIX_FLAGS:
            suffix.insert(0, SUFFIX_FLAGS[base[-1]])
            base = base[:-1]
        low = base.lower()
        names = BASE_STATES.get(low)
        if names is None and re.fullmatch(r"[a-z_]{1,40}", low):
            names = [low.upper()]
        for f in [*(names or []), *suffix]:
            if f not in flags:
                flags.append(f)
    return flags


def header_columns(line: str) -> list[str] | None:
    """The column titles of a ``sinfo`` header line, else None."""
    if not line or len(line) > 400 or not line.lstrip()[:1].isupper():
        return None
    cols = line.split()
    if len(cols) < 2 or any(c not in COLUMNS for c in cols):
        return None
    if not any(c in cols for c in _NODE_COLS) or not ("STATE" in cols or "REASON" in cols):
        return None
    return cols


def _row(cols: list[str], line: str) -> dict[str, str] | None:
    words = line.split()
    if "REASON" in cols:
        r = cols.index("REASON")
        after = len(cols) - r - 1
        if len(words) < len(cols) - 1:
            return None
        head, tail = words[:r], words[len(words) - after :] if after else []
        reason = " ".join(words[r : len(words) - after])
        row = dict(zip(cols[:r], head, strict=True))
        row.update(zip(cols[r + 1 :], tail, strict=True))
        row["REASON"] = reason
    else:
        if len(words) != len(cols):
            return None
        row = dict(zip(cols, words, strict=True))
    node = next((row[c] for c in _NODE_COLS if c in row), "")
    if not _HOSTLIST.match(node):
        return None
    return row


def is_sinfo_row(cols: list[str], line: str) -> bool:
    """True when ``line`` is a row of the table with header ``cols``."""
    return bool(line.strip()) and _row(cols, line[:MAX_LINE_CHARS]) is not None


def parse_sinfo(cols: list[str], lines: list[str]) -> list[FaultEvent]:
    """Rows of one ``sinfo`` table (header ``cols``) → ``slurm_node`` events, one per node,
    in table order. Rows that do not parse are skipped. Never raises."""
    nodes: dict[str, dict[str, object]] = {}
    texts: dict[str, list[str]] = {}
    for raw in lines:
        line = raw[:MAX_LINE_CHARS].rstrip("\r\n")
        row = _row(cols, line)
        if row is None:
            continue
        hostlist = next(row[c] for c in _NODE_COLS if c in row)
        state = sinfo_state(row["STATE"]) if "STATE" in row else []
        reason: str | None = row.get("REASON", "").strip() or None
        if reason is not None and reason.lower() in ("none", "(null)", "n/a"):
            reason = None
        user = row.get("USER") or None
        when = row.get("TIMESTAMP") or None
        if when is not None and when.lower() in ("unknown", "none", "n/a"):
            when = None
        part = row.get("PARTITION", "").rstrip("*") or None
        for node in expand_hostlist(hostlist):
            d = nodes.setdefault(
                node,
                {"node": node, "state": [], "reason": None, "reason_user": None,
                 "reason_time": None, "source": "sinfo"},
            )
            merged = list(d["state"]) if isinstance(d["state"], list) else []
            d["state"] = merged + [f for f in state if f not in merged]
            d["reason"] = d["reason"] or reason
            d["reason_user"] = d["reason_user"] or user
            d["reason_time"] = d["reason_time"] or when
            if part:
                parts = d.setdefault("partitions", [])
                if isinstance(parts, list) and part not in parts:
                    parts.append(part)
            texts.setdefault(node, []).append(line)
    events: list[FaultEvent] = []
    for node, d in nodes.items():
        state = [str(s) for s in d["state"]] if isinstance(d["state"], list) else []
        bad = any(s in BAD_FLAGS for s in state)
        why = d["reason"]
        if not bad and why is None:
            continue
        summary = f"Slurm node {node} {'+'.join(state) or 'UNAVAILABLE'}"
        if why:
            summary += f": {why}"
        events.append(
            FaultEvent(
                kind="slurm_node",
                xid=None,
                pci=None,
                pid=None,
                process=None,
                summary=summary[:300],
                text="\n".join([" ".join(cols), *texts[node]]),
                details=d,
                level=True,
                active=bad or (not state and "STATE" not in cols),
            )
        )
    return events
