"""PCIe AER reports (Linux ``drivers/pci/pcie/aer.c``): header, ``PCIe Bus Error`` lines,
status/mask and bit lines, grouped into one record per report.

Uncorrected fatal → ``pcie_aer_fatal``; corrected (``Corrected``, or ``Correctable`` as
newer kernels print it: ``AER: Correctable error message received from …``,
``severity=Correctable``) and uncorrected non-fatal →
``pcie_aer_corrected`` (``details["uncorrected_nonfatal"]`` marks the latter).
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import (
    HEX,
    MULTI_LINE_GAP,
    PCI_FULL,
    Record,
    continuation_body,
    single,
)

_AER_DEV = re.compile(r"(?P<drv>[\w.-]{1,40}) (?P<pci>" + PCI_FULL + r"):\s")
_AER_HEAD = re.compile(
    r"AER: (?:Multiple )?(?P<sev>Correct(?:ed|able)|Uncorrected \((?:Non-)?Fatal\)|"
    r"Uncorrectable \((?:Non-)?Fatal\)) error (?:message )?(?:received|reported)"
    r"(?::| from)?\s*(?P<src>id=" + HEX + r"{1,8}|" + PCI_FULL + r")?",
    re.IGNORECASE,
)
_AER_BUS = re.compile(
    r"PCIe Bus Error: severity=(?P<sev>Correct(?:ed|able)|Uncorrect(?:ed|able) \((?:Non-)?Fatal\))"
    r"(?:,\s*type=(?P<type>[^,]{1,60}))?",
    re.IGNORECASE,
)
_AER_CONT = re.compile(
    r"(?:\bdevice \[" + HEX + r"{4}:" + HEX + r"{4}\] error status/mask"
    r"|\d\.[0-7]:\s+\[\s*\d{1,2}\]\s+\w"
    r"|AER:\s+(?:TLP Header|Error of this Agent|aer_)|\baer_(?:status|mask|layer|agent)\b)"
)


def aer_class(sev: str) -> str:
    """``fatal`` / ``nonfatal`` / ``corrected`` from an AER severity phrase (``Corrected`` and
    the newer kernels' ``Correctable`` are both ``corrected``)."""
    s = sev.lower()
    if s.startswith(("corrected", "correctable")):
        return "corrected"
    if "non-fatal" in s:
        return "nonfatal"
    return "fatal"


class AerRecord(Record):
    """One AER report."""

    max_lines = 24
    max_gap = MULTI_LINE_GAP

    def __init__(self, line: str, cls: str) -> None:
        super().__init__(line)
        self.cls = cls

    def accepts(self, line: str) -> bool:
        if not ("AER" in line or "Bus Error" in line or "error status" in line
                or "   [" in line or "aer_" in line):
            return False  # cheap reject: no part of an AER report (see _AER_CONT)
        if _AER_HEAD.search(line):
            return False
        bus = _AER_BUS.search(line)
        if bus:
            return aer_class(bus.group("sev")) == self.cls
        return bool(_AER_CONT.search(line))

    def _logical(self) -> list[str]:
        """The report's lines with wrapped continuations joined onto the line they
        continue (``… error message received`` + ``    from 0000:41:00.0``)."""
        out: list[str] = []
        pending = list(self.continued)
        for line in self.lines:
            if out and pending and continuation_body(line) == pending[0]:
                out[-1] = out[-1].rstrip() + " " + pending.pop(0)
            else:
                out.append(line)
        return out

    def finish(self) -> list[FaultEvent]:
        devices: list[str] = []
        pci: str | None = None
        details: dict[str, object] = {}
        for line in self._logical():
            dm = _AER_DEV.search(line)
            if dm and dm.group("pci") not in devices:
                devices.append(dm.group("pci"))
            bus = _AER_BUS.search(line)
            if bus:
                details.setdefault("aer_severity", bus.group("sev"))
                if bus.group("type"):
                    details.setdefault("type", bus.group("type").strip())
                if dm:
                    pci = dm.group("pci")
            head = _AER_HEAD.search(line)
            if head:
                details.setdefault("aer_severity", head.group("sev"))
                src = head.group("src")
                if src:
                    # not "source": Fault.from_reader's key for where the agent read it
                    details["aer_source"] = src
        src = details.get("aer_source")
        if pci is None and isinstance(src, str) and not src.startswith("id="):
            pci = src  # "error received: 0000:01:00.0" names the device that erred
        if pci is None and devices:
            pci = devices[0]
        details["devices"] = devices
        kind = "pcie_aer_fatal" if self.cls == "fatal" else "pcie_aer_corrected"
        if self.cls == "nonfatal":
            details["uncorrected_nonfatal"] = True
        label = {
            "fatal": "uncorrected fatal",
            "nonfatal": "uncorrected non-fatal",
            "corrected": "corrected",
        }[self.cls]
        where = f" on {pci}" if pci else ""
        return [single(kind, self.text, f"PCIe AER {label} error{where}", pci=pci,
                       details=details)]


def match(line: str) -> AerRecord | None:
    """Needles ``AER`` / ``PCIe Bus Error``: opens a report."""
    head = _AER_HEAD.search(line)
    if head:
        return AerRecord(line, aer_class(head.group("sev")))
    bus = _AER_BUS.search(line)
    if bus:
        return AerRecord(line, aer_class(bus.group("sev")))
    return None
