"""GPU lost: fallen off the bus, no NVML device handle, ``NV_ERR_GPU_IS_LOST``.

Formats: the three-line ``nv.c`` block (``NVRM: The NVIDIA GPU <pci>`` / ``(PCI ID: …)
installed in this system has`` / ``fallen off the bus and is not responding to
commands.``), printed on one line by newer drivers; the one-liners ``NVRM: GPU
0000:3b:00.0: GPU has fallen off the bus.``, ``NVRM: GPU at 0000:af:00.0 has fallen off the
bus.`` and the domain-less ``NVRM: GPU 18:00.0: GPU has fallen off the bus.``; NVML
clients' ``Unable to determine the device handle for GPU <pci>: <why>`` (``… requires
reset`` → ``reset_required``); RM assertions carrying ``NV_ERR_GPU_IS_LOST``.

The driver usually prints the matching ``Xid 79`` next to these lines; the reader folds
the two into one fault (see :mod:`agent.readers.kernel.fold`).
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import (
    ANY_PCI,
    GPU_INDEX,
    HEX,
    MULTI_LINE_GAP,
    PCI_FULL,
    Record,
    single,
)

_FALLEN_START = re.compile(r"NVRM:\s{0,4}The NVIDIA GPU (?P<pci>" + PCI_FULL + r")")
_FALLEN_ONE = re.compile(
    r"NVRM:\s{0,4}GPU (?:at )?(?:PCI:)?(?P<pci>(?:" + HEX + r"{4,8}:)?" + HEX + r"{2}:"
    + HEX + r"{2}(?:\.[0-7])?):?\s.{0,40}?(?:has )?fallen off the bus"
)
_NO_HANDLE = re.compile(
    r"Unable to determine the device handle for (?:GPU|gpu)\s*(?P<pci>"
    + PCI_FULL
    + r")\s*:\s*(?P<why>.{0,200})"
)
_GPU_IS_LOST = re.compile(r"NVRM: .{0,200}?NV_ERR_GPU_IS_LOST")


_BLOCK_PARTS = ("(PCI ID:", "installed in this system", "fallen off the bus",
                "responding to commands")
"""Words of the block's continuation lines (``nv.c``): a line holding none is not a part."""
_OTHER_BLOCK = re.compile(r"not supported|requires use of|driver release|open kernel modules")
"""Continuations of the other ``The NVIDIA GPU <pci> (PCI ID: …)`` messages of ``nv.c``."""
_HOST = re.compile(r"(?P<host>\S{1,64}) kernel:")


def _host(line: str) -> str | None:
    m = _HOST.search(line)
    return m.group("host") if m else None


class FallenOffBus(Record):
    """The ``nv.c`` "fallen off the bus" block (up to four lines). Its parts join across a
    blank line or up to :attr:`max_gap` unrelated lines (another program's syslog line,
    another kernel record); with a syslog host prefix, only lines of the same host join.
    The first line alone (``NVRM: The NVIDIA GPU <pci>`` without ``(PCI ID:`` on it, as the
    driver prints the fallen-off-the-bus block) already yields ``gpu_lost``."""

    max_lines = 4
    max_gap = MULTI_LINE_GAP

    def __init__(self, line: str, pci: str) -> None:
        super().__init__(line)
        self.pci = pci
        self.host = _host(line)

    def accepts(self, line: str) -> bool:
        if (
            "NVRM:" not in line
            or "Xid" in line
            or "responding to commands" in self.lines[-1]
            or not any(p in line for p in _BLOCK_PARTS)
            or _FALLEN_START.search(line)
            or _FALLEN_ONE.search(line)
        ):
            return False
        host = _host(line)
        return self.host is None or host is None or host == self.host

    def finish(self) -> list[FaultEvent]:
        if "fallen off the bus" not in self.text and (
            "(PCI ID:" in self.lines[0] or _OTHER_BLOCK.search(self.text)
        ):
            return []  # e.g. "… is not supported by the NVIDIA … driver release"
        return [
            single(
                "gpu_lost",
                self.text,
                f"GPU {self.pci} has fallen off the bus",
                pci=self.pci,
                details={"record": "multi_line"},
            )
        ]


def match_block(line: str) -> FaultEvent | FallenOffBus | None:
    """Needle ``The NVIDIA GPU``: the block's first line (or the whole block on one line)."""
    fs = _FALLEN_START.search(line)
    if not fs:
        return None
    rec = FallenOffBus(line, fs.group("pci"))
    if "fallen off the bus" in line and "responding" in line:
        return rec.finish()[0]
    return rec


def match_fallen(line: str) -> FaultEvent | None:
    """Needle ``fallen off the bus``: the one-line forms."""
    fm = _FALLEN_ONE.search(line)
    if not fm:
        return None
    pci = fm.group("pci")
    return single("gpu_lost", line, f"GPU {pci} has fallen off the bus", pci=pci)


def match_no_handle(line: str) -> FaultEvent | None:
    """Needle ``device handle``: NVML's "Unable to determine the device handle"."""
    nh = _NO_HANDLE.search(line)
    if not nh:
        return None
    pci, why = nh.group("pci"), nh.group("why").strip()
    details: dict[str, object] = {"nvml_error": why[:120]}
    if "requires reset" in why.lower():
        return single("reset_required", line, f"GPU {pci} requires a reset", pci=pci,
                      details=details)
    return single("gpu_lost", line, f"GPU {pci} not reachable through NVML", pci=pci,
                  details=details)


def match_is_lost(line: str) -> FaultEvent | None:
    """Needle ``NV_ERR_GPU_IS_LOST``: an RM assertion returning it."""
    if not _GPU_IS_LOST.search(line):
        return None
    pm = ANY_PCI.search(line)
    pci = pm.group("pci") if pm else None
    details: dict[str, object] = {"assertion": "NV_ERR_GPU_IS_LOST"}
    gi = GPU_INDEX.search(line)
    if gi:
        details["gpu_index"] = int(gi.group("idx"))
    who = f"GPU {pci}" if pci else "GPU"
    return single("gpu_lost", line, f"{who} lost (NV_ERR_GPU_IS_LOST)", pci=pci, details=details)
