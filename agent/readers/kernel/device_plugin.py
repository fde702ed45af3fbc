"""The Kubernetes NVIDIA device plugin's health log (NVIDIA/k8s-device-plugin
``internal/rm/health.go``): ``XidCriticalError: Xid=79 on Device=GPU-…; marking device as
unhealthy.`` (older releases: ``…, the device will go unhealthy.`` and ``XidCriticalError:
Xid=N, All devices will go unhealthy.``).

It reports the same fault as the kernel's Xid line, so it comes out as kind ``xid`` with the
code (docs/design.md §4.1). ``pci`` is None unless the device is printed as an address;
``details``: ``device`` (the GPU UUID or name as printed), ``all_devices`` (the no-UUID
form), ``reporter`` = ``"k8s-device-plugin"``.
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import PCI_ANY, single

REPORTER = "k8s-device-plugin"

_DP = re.compile(
    r"XidCriticalError:\s*Xid\s*=\s*(?P<code>\d{1,6})\b"
    r"(?:\s*on\s+Device\s*=\s*(?P<dev>[^;,\s]{1,128}))?(?P<rest>.{0,80})"
)
_ADDR = re.compile(r"^(?:PCI:)?(?P<pci>" + PCI_ANY + r")$")


def match(line: str) -> FaultEvent | None:
    """Needle ``XidCriticalError``."""
    m = _DP.search(line)
    if not m:
        return None
    code = int(m.group("code"))
    dev = m.group("dev")
    details: dict[str, object] = {"reporter": REPORTER}
    pci: str | None = None
    if dev:
        details["device"] = dev
        am = _ADDR.match(dev)
        if am:
            pci = am.group("pci")
    elif "all devices" in m.group("rest").lower():
        details["all_devices"] = True
    who = f" on {dev}" if dev else (" on all devices" if details.get("all_devices") else "")
    return single("xid", line, f"Xid {code}{who} (Kubernetes device plugin)", xid=code, pci=pci,
                  details=details)
