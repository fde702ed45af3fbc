"""Shared pieces of the kernel-log readers: address patterns, prefix stripping, records.

Every family module (``xid``, ``sxid``, ``gpu_lost`` …) builds on these. Nothing here
raises on any ``str`` input.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from agent.readers.events import MAX_LINE_CHARS, FaultEvent

HEX = "[0-9A-Fa-f]"
PCI_FULL = rf"{HEX}{{4,8}}:{HEX}{{2}}:{HEX}{{2}}\.[0-7]"
"""``domain:bus:device.function`` (domains of 5+ digits appear behind Intel VMD)."""

PCI_ANY = rf"{HEX}{{2,8}}(?::{HEX}{{2}}){{1,2}}(?:\.[0-7])?"
"""Any address the NVIDIA driver prints: ``0000:3b:00``, ``0000:3b:00.0``, ``18:00.0``,
the oldest ``0003:00``."""

ANY_PCI = re.compile(r"\b(?P<pci>" + PCI_FULL + r")\b")
GPU_INDEX = re.compile(r"NVRM: GPU(?P<idx>\d{1,3})\b")

_PREFIX = re.compile(
    r"(?:"
    r"[ \t]*\[\s*\d{1,12}\.\d{1,9}\]"  # dmesg: [12345.678901]
    r"|[ \t]*\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"  # dmesg -T
    r"|(?:line )?kern\s{0,4}:\s{0,4}[a-z]{2,7}\s{0,4}:"  # dmesg -x: "kern  :err   :"
    r"|\S{1,64}: kern: [a-z]{2,7}: \[[^\]]{1,40}\]:"  # forwarder: "192.0.2.10: kern: err: [ISO]:"
    r"|[^\W\d_]{3,4}\.? {1,2}\d{1,2} \d\d:\d\d:\d\d(?:\.\d{1,9})?(?: \S{1,64})? kernel:"  # syslog
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?(?: \S{1,64} kernel:)?"
    r"|kernel:"  # journald
    r") ?"
)
"""One timestamp/host prefix family (docs/design.md §4.1 classify inputs and the corpus README)."""

_NVRM_CONT = re.compile(r"NVRM:[ \t]{2,}\S")


def clean(line: str) -> str:
    """Strip the line ending and cut to :data:`MAX_LINE_CHARS`."""
    if len(line) > MAX_LINE_CHARS:
        line = line[:MAX_LINE_CHARS]
    return line.rstrip("\r\n")


def to_int(value: str | None, base: int = 10) -> int | None:
    """``int(value, base)`` or None for None / unparsable text."""
    if value is None:
        return None
    try:
        return int(value, base)
    except ValueError:
        return None


def strip_prefix(line: str) -> str:
    """``line`` without its leading timestamp / host / facility prefixes (up to four)."""
    pos = 0
    for _ in range(4):
        m = _PREFIX.match(line, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
    return line[pos:]


def maybe_continuation(line: str) -> bool:
    """Cheap necessary test for :func:`is_continuation_shape`: a body can only start with
    a blank (or be ``NVRM:`` plus blanks) when the line starts with one or holds ``]  ``,
    ``:  `` or a tab."""
    return line[:1] in " \t" or "]  " in line or ":  " in line or "\t" in line


def is_continuation_shape(line: str) -> bool:
    """True when ``line`` looks like the wrapped tail of the record above it.

    Two shapes: the body (after any prefix) starts with blanks, as pastes and syslog
    forwarders wrap long lines; or the driver's own indented follow-up lines,
    ``NVRM:`` followed by two or more blanks (``NVRM:     Reported by libos …`` after an
    Xid 120). The caller still checks that the line starts no record of its own.
    """
    if not maybe_continuation(line):
        return False
    body = strip_prefix(line)
    if not body.strip():
        return False
    return body[0] in " \t" or bool(_NVRM_CONT.match(body))


def continuation_body(line: str) -> str:
    """The text a continuation line adds to its record's logical line."""
    body = strip_prefix(line).strip()
    if body.startswith("NVRM:"):
        body = body[5:].strip()
    return body


def device_key(pci: str | None) -> str | None:
    """``bus:device`` of a printed address, lower case, for matching one GPU across formats
    (``0000:3B:00``, ``0000:3b:00.0`` and ``3b:00.0`` give ``3b:00``); None without one."""
    if not pci:
        return None
    parts = pci.lower().split(".")[0].split(":")
    if len(parts) < 2:
        return None
    return ":".join(parts[-2:])


def single(
    kind: str,
    line: str,
    summary: str,
    *,
    xid: int | None = None,
    pci: str | None = None,
    pid: int | None = None,
    process: str | None = None,
    details: dict[str, object] | None = None,
    level: bool = False,
    active: bool = True,
) -> FaultEvent:
    """A :class:`FaultEvent` read from one logical line."""
    return FaultEvent(
        kind=kind,
        xid=xid,
        pci=pci,
        pid=pid,
        process=process,
        summary=summary,
        text=line,
        details=dict(details or {}),
        level=level,
        active=active,
    )


MULTI_LINE_GAP = 3
"""Unrelated lines (blank lines included) a multi-line record waits across for its own next
part: a paste or a busy journal puts another program's line, a blank line or another
kernel record between two lines of one record."""


CUT_RECORD_S = 60.0
"""Most seconds (the agent's monotonic clock) a multi-line record that a flush (the end of
a read) closed while it waited for its next part still takes that part from a later read
(within its :attr:`Record.max_gap` lines), so the part raises no second fault. The driver
prints a record's parts back to back (corpus ``r2-h07``: an SXid's parts 34 ms apart);
split, the next part comes in the agent's next read, one ``sample_interval_s`` later
(default 2 s); the bound leaves room for a slow configured interval."""


class Record:
    """A kernel record being collected; emitted once (``finish``) when closed.

    - ``lines``: raw lines, the evidence (joined with ``\\n`` into ``FaultEvent.text``).
    - ``max_lines``: most lines one record takes (own parts plus wrapped continuations).
    - ``max_gap``: unrelated lines the record may stay open across, waiting for its own
      next part (NVSwitch SXid parts interleave with other driver output).
    """

    max_lines = 8
    max_gap = 0

    def __init__(self, line: str) -> None:
        self.lines = [line]
        self.continued: list[str] = []
        self.gap = 0
        self.closed = False

    def accepts(self, line: str) -> bool:
        """True when ``line`` is this record's own next part (not a wrapped continuation)."""
        return False

    def add(self, line: str) -> None:
        self.lines.append(line)
        self.gap = 0

    def add_continuation(self, line: str) -> None:
        self.lines.append(line)
        self.continued.append(continuation_body(line))

    def finish(self) -> list[FaultEvent]:  # pragma: no cover - overridden
        return []

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


Matcher = Callable[[str], FaultEvent | Record | list[FaultEvent] | None]
"""A family's matcher: one logical line → an event, an open record, several events or None."""


class Single(Record):
    """A one-line record; wrapped continuation lines are joined and the line re-read.

    ``reparse`` is the family matcher: at finish, the first line plus the continuations'
    text (joined with one blank) is read again, so fields wrapped onto the next line
    (an Xid 154 recovery label, an Xid 119 GSP function) are found; the event's ``text``
    is every raw line, joined with ``\\n``.
    """

    def __init__(self, event: FaultEvent, reparse: Matcher | None) -> None:
        super().__init__(event.text)
        self.event = event
        self.reparse = reparse

    def finish(self) -> list[FaultEvent]:
        ev = self.event
        if self.continued and self.reparse is not None:
            logical = " ".join([self.lines[0].rstrip(), *self.continued])
            again = self.reparse(logical)
            if isinstance(again, FaultEvent) and again.kind == ev.kind:
                ev = again
        ev.text = self.text
        return [ev]
