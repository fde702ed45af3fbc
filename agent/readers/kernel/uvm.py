"""NVIDIA UVM global fatal error (``nvidia-uvm``, ``nv_gpu_ops.c``):
``NVRM: nvGpuOpsReportFatalError: uvm encountered global fatal error 0x60, requiring os
reboot to recover.`` → kind ``uvm_fatal`` (docs/design.md §4.1), ``details["error_code"]`` (int).
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import ANY_PCI, HEX, single

_UVM = re.compile(
    r"uvm encountered global fatal error\s*(?:(?P<code>0x" + HEX + r"{1,8})|(?P<dec>\d{1,10}))?",
    re.IGNORECASE,
)


def match(line: str) -> FaultEvent | None:
    """Needle ``global fatal error``."""
    m = _UVM.search(line)
    if not m:
        return None
    details: dict[str, object] = {}
    if m.group("code"):
        details["error_code"] = int(m.group("code"), 16)
    elif m.group("dec"):
        details["error_code"] = int(m.group("dec"))
    pm = ANY_PCI.search(line)
    pci = pm.group("pci") if pm else None
    code = f" {details['error_code']:#x}" if "error_code" in details else ""
    return single("uvm_fatal", line, f"UVM global fatal error{code}", pci=pci, details=details)
