"""NIC / HCA firmware faults: kind ``nic_fatal`` (a dead ConnectX or EFA device is a dead
fabric rail on a GPU node).

Formats (Linux ``drivers/net/ethernet/mellanox/mlx5/core/health.c``, ``events.c``,
``cmd.c``; ``drivers/infiniband/hw/efa/efa_com.c``), each with any kernel-log prefix:

- mlx5 firmware health (``fatal``): ``mlx5_core <pci>: poll_health:…: device's health
  compromised - reached miss count``; the ``print_health_info`` dump (``Health issue
  observed, firmware internal error, severity(3) ERROR:``, ``assert_var[0] 0x…``, ``synd 0x1:
  firmware internal error``, ``ext_synd 0x…``, ``raw fw_ver 0x…``); ``Fatal error N
  detected``; ``… unrecoverable hardware error``; ``… FW fatal …``; a command that timed out
  for good (``ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource``). The
  lines of one dump, same PCI function, come out as one event.
- mlx5 module, power and link (``nonfatal``): ``Port module event[error]: module 0, Cable
  error, High Temperature`` (the cable/transceiver of a rail); ``mlx5_pcie_event:…: Detected
  insufficient power on the PCIe slot (27W).``; ``… Gb/s available PCIe bandwidth, limited by
  … (capable of …)`` printed for an mlx5 function (link speed or width degraded).
- AWS EFA (``fatal``): ``efa <pci>: Device isn't ready, abort com init 0x…``, ``infiniband
  rdmap…: Admin queue is closed``, admin-command timeouts (``Wait for completion (polling)
  timeout``, ``The device didn't send any completion for admin cmd``), ``Reset indication
  didn't turn on``. The ENA network driver prints some of the same words: only lines of the
  ``efa`` driver or an ``infiniband rdmap…`` device count.

``details``: ``driver`` (``mlx5_core``, ``efa``…), ``device`` (``rdmap16s27``, ``mlx5_3``
when printed), ``nic_event`` (``health_compromised``, ``fw_internal_error``,
``fw_syndrome``, ``fw_fatal``, ``cmd_timeout``, ``module_error``,
``pcie_insufficient_power``, ``pcie_link_degraded``, ``efa_device_not_ready``,
``efa_admin_queue_closed``, ``efa_admin_timeout``, ``efa_reset_failed``),
``nic_severity`` (``fatal``/``nonfatal``, from the list above; the catalogue decides the
action), and where printed ``syndrome``, ``ext_syndrome``, ``fw_version``, ``module``,
``module_error``, ``slot_power_w``. ``pci`` is the PCI function as printed (None for the
``rdmap`` form, which names no address).
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import MULTI_LINE_GAP, PCI_FULL, Record, single

_MLX = re.compile(r"\b(?P<drv>mlx[45]_(?:core|ib))\s+(?P<pci>" + PCI_FULL + r")\s*:?")
_EFA_PCI = re.compile(r"\b(?P<drv>efa)\s+(?P<pci>" + PCI_FULL + r")\s*:")
_EFA_IB = re.compile(r"\binfiniband\s+(?P<dev>rdmap[0-9a-z]{1,24})\s*:")
_MLX_DEV = re.compile(r"\b(?P<dev>mlx5_\d{1,3})\b")

_MLX_EVENTS: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("health_compromised", "fatal", re.compile(r"device's health compromised", re.I)),
    ("fw_internal_error", "fatal", re.compile(r"firmware internal error", re.I)),
    ("fw_fatal", "fatal", re.compile(
        r"\bFW fatal\b|\bfw_fatal\b|\bFatal error \d{1,4} detected|\bunrecoverable hardware "
        r"error|\bhealth (?:issue observed|recovery failed)|\benter(?:ing)? error state|"
        r"\bis in error state|handling bad device|recovery flow aborted",
        re.I,
    )),
    ("fw_syndrome", "fatal", re.compile(r"\b(?:synd|syndrome)\s*0x[0-9a-f]{1,8}", re.I)),
    ("cmd_timeout", "fatal", re.compile(r"timeout\. Will cause a leak of a command resource")),
    ("module_error", "nonfatal", re.compile(
        r"Port module event\[error\]:\s*module\s*(?P<module>\d{1,3}),\s*(?P<what>[^\r\n]{1,120})"
    )),
    ("pcie_insufficient_power", "nonfatal", re.compile(
        r"Detected insufficient power on the PCIe slot(?:\s*\((?P<watts>\d{1,4})W\))?"
    )),
    ("pcie_link_degraded", "nonfatal", re.compile(
        r"available PCIe bandwidth, limited by [^\r\n]{1,120}\(capable of"
    )),
)
"""``(nic_event, nic_severity, pattern)`` for an mlx5 line, first match wins; a
``print_health_info`` line alone opens the health dump (the driver prints it only for a
health problem)."""

_EFA_EVENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("efa_device_not_ready", re.compile(r"Device isn't ready, abort com init")),
    ("efa_admin_queue_closed", re.compile(r"Admin queue is closed")),
    ("efa_admin_timeout", re.compile(
        r"Wait for completion \(polling\) timeout|didn't send any completion for admin cmd"
    )),
    ("efa_reset_failed", re.compile(r"Reset indication didn't turn (?:on|off)")),
)

_SYND = re.compile(r"\bsynd(?:rome)?\s*(?P<v>0x[0-9a-f]{1,8})", re.I)
_EXT_SYND = re.compile(r"\bext_synd\s*(?P<v>0x[0-9a-f]{1,8})", re.I)
_FW_VER = re.compile(r"\bfw_ver\s*(?P<v>[0-9a-fx.]{1,24})", re.I)
_LABELS = {
    "health_compromised": "health compromised (missed health polls)",
    "fw_internal_error": "firmware internal error",
    "fw_syndrome": "firmware health syndrome",
    "fw_fatal": "firmware fatal error",
    "cmd_timeout": "firmware command timeout",
    "module_error": "port module error",
    "pcie_insufficient_power": "insufficient PCIe slot power",
    "pcie_link_degraded": "PCIe link degraded",
    "efa_device_not_ready": "EFA device not ready",
    "efa_admin_queue_closed": "EFA admin queue closed",
    "efa_admin_timeout": "EFA admin command timeout",
    "efa_reset_failed": "EFA reset failed",
}
_RANK = ["health_compromised", "fw_internal_error", "fw_fatal", "cmd_timeout", "fw_syndrome"]
"""Health-dump events, most telling first: the event a multi-line dump is named after."""


def _mlx_event(line: str) -> tuple[str, str, re.Match[str]] | None:
    for name, sev, pattern in _MLX_EVENTS:
        m = pattern.search(line)
        if m:
            return name, sev, m
    return None


def _event(line: str, pci: str | None, details: dict[str, object]) -> FaultEvent:
    label = _LABELS.get(str(details.get("nic_event")), "fault")
    who = pci or str(details.get("device") or "NIC")
    return single("nic_fatal", line, f"NIC {who}: {label}", pci=pci, details=details)


class HealthDump(Record):
    """One mlx5 firmware health report: the ``poll_health`` / ``print_health_info`` lines of
    one PCI function (other lines may come between them)."""

    max_lines = 40
    max_gap = MULTI_LINE_GAP

    def __init__(self, line: str, drv: str, pci: str) -> None:
        super().__init__(line)
        self.drv = drv
        self.pci = pci

    def accepts(self, line: str) -> bool:
        if self.pci not in line:
            return False
        m = _MLX.search(line)
        if not m or m.group("pci") != self.pci:
            return False
        return "print_health_info" in line or "health" in line or bool(_mlx_event(line))

    def finish(self) -> list[FaultEvent]:
        found: set[str] = set()
        details: dict[str, object] = {"driver": self.drv}
        for line in self.lines:
            got = _mlx_event(line)
            if got and got[1] == "fatal":
                found.add(got[0])
            for key, pattern in (("syndrome", _SYND), ("ext_syndrome", _EXT_SYND),
                                 ("fw_version", _FW_VER)):
                m = pattern.search(line)
                if m and key not in details:
                    details[key] = m.group("v").lower()
            dm = _MLX_DEV.search(line)
            if dm and "device" not in details:
                details["device"] = dm.group("dev")
        event = next((n for n in _RANK if n in found), "fw_syndrome")
        details["nic_event"] = event
        details["nic_severity"] = "fatal"
        return [_event(self.text, self.pci, details)]


def match_mlx(line: str) -> FaultEvent | HealthDump | None:
    """Needle ``mlx``: an mlx5 firmware-health, module, power or link-degraded line."""
    m = _MLX.search(line)
    if not m:
        return None
    drv, pci = m.group("drv"), m.group("pci")
    rest = line[m.end():]
    got = _mlx_event(rest)
    if got is None:
        if "print_health_info" in rest:
            return HealthDump(line, drv, pci)
        return None
    name, sev, em = got
    if sev == "fatal":
        return HealthDump(line, drv, pci)
    details: dict[str, object] = {"driver": drv, "nic_event": name, "nic_severity": sev}
    dm = _MLX_DEV.search(rest)
    if dm:
        details["device"] = dm.group("dev")
    if name == "module_error":
        details["module"] = int(em.group("module"))
        details["module_error"] = em.group("what").strip().rstrip(".")
    elif name == "pcie_insufficient_power" and em.group("watts"):
        details["slot_power_w"] = int(em.group("watts"))
    return _event(line, pci, details)


def match_efa(line: str) -> FaultEvent | None:
    """Needles ``efa `` / ``rdmap``: an AWS EFA device failure (never an ENA line)."""
    pm = _EFA_PCI.search(line)
    im = None if pm else _EFA_IB.search(line)
    head = pm or im
    if head is None:
        return None
    rest = line[head.end():]
    for name, pattern in _EFA_EVENTS:
        if pattern.search(rest):
            details: dict[str, object] = {
                "driver": "efa",
                "nic_event": name,
                "nic_severity": "fatal",
            }
            if im is not None:
                details["device"] = im.group("dev")
            return _event(line, pm.group("pci") if pm else None, details)
    return None
