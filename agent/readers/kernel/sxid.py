"""NVSwitch SXid records (NVSwitch driver; Fabric Manager user guide, "SXid errors").

One error prints up to three lines with the same address and code: the headline
(``SXid (PCI:…): 12028, Non-fatal, Link 32 …``), ``…: 12028, Severity 1 Engine instance …``
and ``…: 12028, Data {…}``. Other driver output can interleave with them, so the record
stays open across up to two unrelated lines. Severity comes only from the headline's
``Fatal``/``Non-fatal`` word; a ``Severity N`` or ``Data`` part never sets it.
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import MULTI_LINE_GAP, PCI_ANY, Record, to_int

_SXID = re.compile(
    r"(?:(?P<dev>nvidia-nvswitch\d*):\s*)?SXid[ \t]{0,8}\([ \t]{0,4}(?:PCI:[ \t]{0,4})?"
    r"(?P<pci>" + PCI_ANY + r")?[^)]{0,40}\)[ \t]{0,4}:?[ \t]{0,8}(?P<code>\d{1,6})\b,?\s*"
    r"(?P<rest>.*)"
)
_LINK = re.compile(r"\b[Ll]ink\s+(?P<link>-?\d{1,4})\b")
_HEAD_SEV = re.compile(r"^(?P<sev>Non-fatal|Nonfatal|Non fatal|Fatal)\b,?\s*", re.I)


def _part(rest: str) -> str:
    """``severity`` / ``data`` / ``headline``: which of the three lines ``rest`` is."""
    low = rest[:9].lower()
    if low.startswith("severity"):
        return "severity"
    if low.startswith("data"):
        return "data"
    return "headline"


class SXidRecord(Record):
    """The lines of one SXid error (headline, ``Severity``, ``Data``), each part once."""

    max_lines = 8
    max_gap = MULTI_LINE_GAP

    def __init__(self, line: str, dev: str | None, pci: str | None, code: int, part: str) -> None:
        super().__init__(line)
        self.dev, self.pci, self.code = dev, pci, code
        self.parts = {part}
        self.last_part = part
        self.wrapped: dict[str, str] = {}  # part → text of its wrapped continuation lines

    def add_continuation(self, line: str) -> None:
        super().add_continuation(line)
        self.wrapped[self.last_part] = (
            self.wrapped.get(self.last_part, "") + " " + self.continued[-1]
        ).strip()

    def accepts(self, line: str) -> bool:
        if "SXid" not in line:
            return False
        m = _SXID.search(line)
        if not m or m.group("pci") != self.pci or to_int(m.group("code")) != self.code:
            return False
        part = _part(m.group("rest"))
        if part in self.parts:
            return False  # a second headline or Data line is the next error
        self.parts.add(part)
        self.last_part = part
        return True

    def finish(self) -> list[FaultEvent]:
        details: dict[str, object] = {}
        if self.dev:
            details["nvswitch"] = self.dev
        for line in self.lines:
            m = _SXID.search(line)
            if not m:
                continue
            rest = m.group("rest")
            part = _part(rest)
            if part in self.wrapped:
                rest = f"{rest} {self.wrapped.pop(part)}"
            if part == "headline":
                hs = _HEAD_SEV.match(rest)
                if hs and "severity" not in details:
                    sev = hs.group("sev").lower()
                    details["severity"] = "fatal" if sev == "fatal" else "nonfatal"
                message = rest[hs.end() :] if hs else rest
                if message.strip() and "message" not in details:
                    details["message"] = message.strip()[:200]
                lm = _LINK.search(rest)
                if lm and "link" not in details:
                    details["link"] = int(lm.group("link"))
            elif part == "severity":
                lm = re.match(r"Severity\s+(\d{1,3})", rest, re.I)
                if lm:
                    details["severity_level"] = int(lm.group(1))
        suffix = f" link {details['link']}" if "link" in details else ""
        sev = f" ({details['severity']})" if "severity" in details else ""
        where = f" on NVSwitch {self.pci}" if self.pci else " on NVSwitch"
        return [
            FaultEvent(
                kind="sxid",
                xid=self.code,
                pci=self.pci,
                pid=None,
                process=None,
                summary=f"SXid {self.code}{sev}{where}{suffix}",
                text=self.text,
                details=details,
            )
        ]


def match(line: str) -> SXidRecord | None:
    """Table matcher for the ``SXid`` needle: opens a record for any of the three parts."""
    m = _SXID.search(line)
    if not m:
        return None
    code = to_int(m.group("code"))
    if code is None:
        return None
    return SXidRecord(line, m.group("dev"), m.group("pci"), code, _part(m.group("rest")))
