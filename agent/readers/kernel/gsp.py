"""GSP firmware and GPU reset/initialisation records (open-gpu-kernel-modules
``kernel_gsp.c``, ``osapi.c``, ``nv.c``).

- ``gsp_heartbeat``: ``NVRM: GPU1 _kgspIsHeartbeatTimedOut: Heartbeat timed out, … diff
  6600 timeout 5200`` (``details``: ``gpu_index``, ``diff_ms``, ``timeout_ms``).
- ``reset_required``: an RM assertion returning ``NV_ERR_RESET_REQUIRED``.
- ``gpu_init_failed``: ``NVRM: GPU <pci>: RmInitAdapter failed! (0x62:0x55:2477)`` and the
  ``rm_init_adapter failed, device minor number N`` line after it (``error``, ``minor``).
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import ANY_PCI, GPU_INDEX, MULTI_LINE_GAP, PCI_FULL, Record, single

_GSP_HB = re.compile(r"NVRM: .{0,120}?[Hh]eartbeat timed out")
_GSP_HB_NUM = re.compile(r"\b(?P<k>diff|timeout)\s+(?P<v>\d{1,12})\b")
_RESET_REQ = re.compile(r"NVRM: .{0,400}?NV_ERR_RESET_REQUIRED")
_RMINIT = re.compile(
    r"NVRM: (?:GPU (?P<pci>" + PCI_FULL + r"): )?RmInitAdapter failed!?"
    r"\s*(?:\((?P<code>[^)]{0,40})\))?"
)
_RMINIT_FOLLOW = re.compile(
    r"NVRM: (?:GPU (?P<pci>" + PCI_FULL + r"): )?rm_init_adapter failed"
    r"(?:.{0,40}?minor number (?P<minor>\d+))?"
)


def _index_and_pci(line: str, details: dict[str, object]) -> tuple[str | None, str]:
    gi = GPU_INDEX.search(line)
    if gi:
        details["gpu_index"] = int(gi.group("idx"))
    pm = ANY_PCI.search(line)
    pci = pm.group("pci") if pm else None
    who = f"GPU{details['gpu_index']}" if "gpu_index" in details else (pci or "GPU")
    return pci, who


def match_heartbeat(line: str) -> FaultEvent | None:
    """Needle ``eartbeat timed out``."""
    if not _GSP_HB.search(line):
        return None
    details: dict[str, object] = {}
    pci, who = _index_and_pci(line, details)
    for nm in _GSP_HB_NUM.finditer(line):
        details[f"{nm.group('k')}_ms"] = int(nm.group("v"))
    return single("gsp_heartbeat", line, f"GSP heartbeat timed out on {who}", pci=pci,
                  details=details)


def match_reset_required(line: str) -> FaultEvent | None:
    """Needle ``NV_ERR_RESET_REQUIRED``."""
    if not _RESET_REQ.search(line):
        return None
    details: dict[str, object] = {}
    pci, who = _index_and_pci(line, details)
    return single("reset_required", line, f"{who} requires a reset (NV_ERR_RESET_REQUIRED)",
                  pci=pci, details=details)


class InitFailRecord(Record):
    """``RmInitAdapter failed!`` and the ``rm_init_adapter failed`` line after it."""

    max_lines = 8
    max_gap = MULTI_LINE_GAP

    def __init__(self, line: str, pci: str | None, details: dict[str, object]) -> None:
        super().__init__(line)
        self.pci = pci
        self.details = details

    def accepts(self, line: str) -> bool:
        if len(self.lines) > 1 or "rm_init_adapter" not in line:
            return False
        m = _RMINIT_FOLLOW.search(line)
        return bool(m and (m.group("pci") in (None, self.pci) or self.pci is None))

    def finish(self) -> list[FaultEvent]:
        for line in self.lines[1:]:
            m = _RMINIT_FOLLOW.search(line)
            if m:
                if m.group("minor"):
                    self.details["minor"] = int(m.group("minor"))
                if self.pci is None and m.group("pci"):
                    self.pci = m.group("pci")
        where = f"GPU {self.pci}" if self.pci else "GPU"
        return [
            single("gpu_init_failed", self.text, f"{where} failed to initialise (RmInitAdapter)",
                   pci=self.pci, details=self.details)
        ]


def match_rminit(line: str) -> InitFailRecord | None:
    """Needle ``RmInitAdapter``: opens the record."""
    ri = _RMINIT.search(line)
    if not ri:
        return None
    details: dict[str, object] = {}
    if ri.group("code"):
        details["error"] = ri.group("code")
    return InitFailRecord(line, ri.group("pci"), details)


def match_rminit_follow(line: str) -> FaultEvent | None:
    """Needle ``rm_init_adapter``: the follow-up line on its own."""
    rf = _RMINIT_FOLLOW.search(line)
    if not rf:
        return None
    return InitFailRecord(line, rf.group("pci"), {}).finish()[0]
