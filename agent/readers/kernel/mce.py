"""Uncorrectable memory / machine-check errors (Linux ``drivers/edac``, ``arch/x86/kernel/
cpu/mce``, APEI ``[Hardware Error]``) → ``mce_ue``. Corrected errors are not events.

A fatal APEI GHES record (``[Hardware Error]: event severity: fatal`` and the lines of the
same error source after it, drivers/firmware/efi/cper.c) is read whole: its
``section_type`` says what failed. A ``PCIe error`` section is the firmware-first form of
a fatal AER error, ``pcie_aer_fatal`` of the section's ``device_id`` (like the OS-native
``AER: Uncorrected (Fatal)`` record); every other section stays ``mce_ue``."""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import PCI_FULL, Record, single

_EDAC_UE = re.compile(
    r"EDAC (?P<mc>[\w ]{0,30}?MC\d{1,3}|[\w]{1,20}):\s*(?P<n>\d{1,10}) UE\b\s*(?P<what>.{0,200})"
)
_MCE_UE = re.compile(
    r"(?:mce: Uncorrected hardware memory error|Machine Check Exception:|"
    r"\[Hardware Error\]:.{0,60}?(?:[Ee]vent severity: fatal|Uncorrected error|UE memory))"
)


def match_edac(line: str) -> FaultEvent | None:
    """Needle ``EDAC``: ``EDAC MC0: 2 UE memory read error on …``."""
    ed = _EDAC_UE.search(line)
    if not ed:
        return None
    details: dict[str, object] = {"controller": ed.group("mc").strip(), "count": int(ed.group("n"))}
    loc = ed.group("what").strip()
    if loc:
        details["location"] = loc[:200]
    return single("mce_ue", line, f"Uncorrectable memory error on {details['controller']}",
                  details=details)


_GHES_FATAL = re.compile(r"(?P<src>\{\d{1,9}\})?\[Hardware Error\]:\s*[Ee]vent severity: fatal")
_GHES_LINE = re.compile(r"(?P<src>\{\d{1,9}\})?\[Hardware Error\]:(?P<rest>.*)")
_GHES_PCIE = re.compile(r"section_type:\s*PCIe error", re.IGNORECASE)
_GHES_DEVICE = re.compile(r"^\s*device_id:\s*(?P<pci>" + PCI_FULL + r")\s*$")


class GhesRecord(Record):
    """A fatal APEI GHES record: the ``event severity: fatal`` line and the
    ``[Hardware Error]:`` lines of the same error source (``{N}``) after it, up to the next
    record's header (module docstring)."""

    max_lines = 40
    max_gap = 2

    def __init__(self, line: str, src: str | None) -> None:
        super().__init__(line)
        self.src = src

    def accepts(self, line: str) -> bool:
        m = _GHES_LINE.search(line)
        if m is None or m.group("src") != self.src:
            return False
        rest = m.group("rest")
        return "event severity:" not in rest and "Hardware error from APEI" not in rest

    def finish(self) -> list[FaultEvent]:
        if _GHES_PCIE.search(self.text):
            pci = None
            for line in self.lines:
                m = _GHES_LINE.search(line)
                d = _GHES_DEVICE.match(m.group("rest")) if m else None
                if d:
                    pci = d.group("pci")
                    break
            return [single("pcie_aer_fatal", self.text,
                           f"Fatal PCIe error (firmware first) on {pci or 'a PCIe device'}",
                           pci=pci, details={"aer_severity": "Fatal", "firmware_first": True})]
        return [single("mce_ue", self.text, "Uncorrectable machine check (memory/CPU)")]


def match_mce(line: str) -> FaultEvent | Record | None:
    """Needles ``mce`` / ``Hardware Error`` / ``Machine Check``."""
    g = _GHES_FATAL.search(line)
    if g:
        return GhesRecord(line, g.group("src"))
    if not _MCE_UE.search(line):
        return None
    return single("mce_ue", line, "Uncorrectable machine check (memory/CPU)")
