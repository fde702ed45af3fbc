"""Kernel-log reader: NVIDIA Xid/SXid, GPU loss, PCIe AER, filesystems, IB links, OOM, EDAC.

Lines may carry any timestamp prefix (``[secs.usecs]``, ``dmesg -T``, syslog
``Mon DD HH:MM:SS host kernel:``, journald ``kernel:``, ``dmesg -x``
``kern  :err   :``, ISO ``dmesg --time-format iso``) or none: every pattern is searched
inside the line, so the prefix never matters. Multi-line records (the "fallen off the
bus" block, an NVSwitch SXid record, a PCIe AER record, an XFS shutdown, RmInitAdapter
with its ``rm_init_adapter failed`` follow-up) are buffered and emitted once, when the
next line does not continue them or on :meth:`KernelLogReader.flush`.

Formats follow the NVIDIA driver sources (``open-gpu-kernel-modules``: ``nv.c``,
``osapi.c``, ``kernel_gsp.c``), the NVSwitch driver, and the Linux kernel
(``drivers/pci/pcie/aer.c``, ``fs/xfs``, ``fs/ext4``, ``kernel/hung_task.c``,
``mm/oom_kill.c``, ``drivers/edac``, ``drivers/net/ethernet/mellanox/mlx5``).

Nothing here raises on any input: junk, truncated and over-long lines produce no event.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from agent.readers.events import MAX_LINE_CHARS, FaultEvent

_HEX = "[0-9A-Fa-f]"
PCI_FULL = rf"{_HEX}{{4,8}}:{_HEX}{{2}}:{_HEX}{{2}}\.[0-7]"
"""``domain:bus:device.function`` (domains of 5+ digits appear behind Intel VMD)."""

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>"
    + _HEX
    + r"{2,8}(?::"
    + _HEX
    + r"{2}){1,2}(?:\.[0-7])?)(?P<extra>[^)]{0,80})\):?\s*(?P<code>\d{1,6})\b,?\s*(?P<rest>.*)"
)
_SXID = re.compile(
    r"(?:(?P<dev>nvidia-nvswitch\d*):\s*)?SXid \((?:PCI:)?(?P<pci>"
    + _HEX
    + r"{2,8}(?::"
    + _HEX
    + r"{2}){1,2}(?:\.[0-7])?)\):?\s*(?P<code>\d{1,6})\b,?\s*(?P<rest>.*)"
)
_PID_NAME = re.compile(
    r"^pid=(?:'<unknown>'|<unknown>|'?(?P<pid>\d{1,10})'?)"
    r"(?:,\s*name=(?P<name>[^,]*?))?(?:,\s*|$)"
)
_CHANNEL = re.compile(
    r"\b(?:Ch|Channel ID|Channel|channel|ChID|ChId)\s+(?:0x)?(?P<ch>" + _HEX + r"{1,8})\b"
)
_GPC = re.compile(r"\(GPC (?P<gpc>\d+), TPC (?P<tpc>\d+)(?:, SM (?P<sm>\d+))?\)")
_NVLINK5 = re.compile(
    r"(?P<subunit>[A-Z][A-Z0-9_]{1,40})\s+(?P<sev>Nonfatal|Non-fatal|Fatal)\s+"
    r"XC(?P<xc>\d+)\s+i(?P<inst>\d+)\s+Link\s+(?P<link>-?\d+)"
)
_LINK = re.compile(r"\b[Ll]ink\s+(?P<link>-?\d{1,4})\b")
_RECOVERY = re.compile(
    r"recovery action changed from (?P<from_code>0x" + _HEX + r"+)\s*\((?P<from>[^)]*)\)\s*"
    r"to (?P<to_code>0x" + _HEX + r"+)(?:\s*\((?P<to>[^)]*)\))?",
    re.IGNORECASE,
)
_CAUSED_BY = re.compile(r"(?:caused by|due to) (?:a |the )?previous Xid[ :#]*(\d{1,6})", re.I)
_GSP_FN = re.compile(r"Expected function (?P<fn>\d+) \((?P<name>[A-Z0-9_]+)\)")
_MIG_GI = re.compile(r"GPU-I:\s*(\d+)")
_MIG_CI = re.compile(r"GPU-CI:\s*(\d+)")
_RST = re.compile(r"RST:\s*(Yes|No)", re.I)

_FALLEN_START = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>" + PCI_FULL + r")")
_FALLEN_ONE = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>"
    + _HEX
    + r"{4,8}:"
    + _HEX
    + r"{2}:"
    + _HEX
    + r"{2}(?:\.[0-7])?):?\s.{0,40}?(?:has )?fallen off the bus"
)
_NO_HANDLE = re.compile(
    r"Unable to determine the device handle for (?:GPU|gpu)\s*(?P<pci>"
    + PCI_FULL
    + r")\s*:\s*(?P<why>.{0,200})"
)
_RMINIT = re.compile(
    r"NVRM: (?:GPU (?P<pci>" + PCI_FULL + r"): )?RmInitAdapter failed!?"
    r"\s*(?:\((?P<code>[^)]{0,40})\))?"
)
_RMINIT_FOLLOW = re.compile(
    r"NVRM: (?:GPU (?P<pci>" + PCI_FULL + r"): )?rm_init_adapter failed"
    r"(?:.{0,40}?minor number (?P<minor>\d+))?"
)
_GPU_INDEX = re.compile(r"NVRM: GPU(?P<idx>\d{1,3})\b")
_GSP_HB = re.compile(r"NVRM: .{0,120}?[Hh]eartbeat timed out")
_GSP_HB_NUM = re.compile(r"\b(?P<k>diff|timeout)\s+(?P<v>\d{1,12})\b")
_RESET_REQ = re.compile(r"NV_ERR_RESET_REQUIRED")
_GPU_IS_LOST = re.compile(r"NVRM: .{0,200}?NV_ERR_GPU_IS_LOST")
_ANY_PCI = re.compile(r"\b(?P<pci>" + PCI_FULL + r")\b")

_AER_DEV = re.compile(r"(?P<drv>[\w.-]{1,40}) (?P<pci>" + PCI_FULL + r"):\s")
_AER_HEAD = re.compile(
    r"AER: (?:Multiple )?(?P<sev>Corrected|Uncorrected \((?:Non-)?Fatal\)|"
    r"Uncorrectable \((?:Non-)?Fatal\)) error (?:message )?(?:received|reported)"
    r"(?::| from)?\s*(?P<src>id=" + _HEX + r"{1,8}|" + PCI_FULL + r")?",
    re.IGNORECASE,
)
_AER_BUS = re.compile(
    r"PCIe Bus Error: severity=(?P<sev>Corrected|Uncorrect(?:ed|able) \((?:Non-)?Fatal\))"
    r"(?:,\s*type=(?P<type>[^,]{1,60}))?",
    re.IGNORECASE,
)
_AER_CONT = re.compile(
    r"(?:\bdevice \[" + _HEX + r"{4}:" + _HEX + r"{4}\] error status/mask"
    r"|\d\.[0-7]:\s+\[\s*\d{1,2}\]\s+\w"
    r"|AER:\s+(?:TLP Header|Error of this Agent|aer_)|\baer_(?:status|mask|layer|agent)\b)"
)

_XFS = re.compile(r"XFS \((?P<dev>[^)\s]{1,64})\):")
_XFS_SHUT = re.compile(
    r"Shutting down filesystem|xfs_do_force_shutdown|[Ff]ilesystem has been shut down|"
    r"Log I/O [Ee]rror.{0,40}[Ss]hutting down"
)
_EXT4_RO = re.compile(
    r"EXT[234]-fs (?:error )?\((?:device )?(?P<dev>[^)\s]{1,64})\):.{0,80}?"
    r"[Rr]emounting filesystem read-only"
)
_HUNG = re.compile(
    r"INFO: task (?P<name>.{1,64}?):(?P<pid>\d{1,10}) blocked for more than (?P<s>\d{1,10}) seconds"
)
_MLX_LINK = re.compile(
    r"(?P<drv>mlx\d_(?:core|ib))\s+(?P<pci>" + PCI_FULL + r")\s*:?\s*(?P<dev>[\w.-]{1,40})?:?\s+"
    r"(?:Port:?\s*(?P<port>\d{1,3})\s+)?[Ll]ink\s+(?P<state>DOWN|ACTIVE|UP|down|up)\b"
)
_IB_PORT = re.compile(
    r"\b(?P<dev>(?:mlx\d|ib|bnxt_re|hfi1)_?\d{0,3}):?\s+[Pp]ort:?\s*(?P<port>\d{1,3})"
    r"\s+(?:[Ll]ink|state)\s*(?:changed to\s*)?:?\s*(?P<state>DOWN|ACTIVE)\b"
)
_OOM = re.compile(
    r"(?:Memory cgroup )?[Oo]ut of memory(?: \(oom_kill_allocating_task\))?: "
    r"Kill(?:ed)? process (?P<pid>\d{1,10}) \((?P<name>[^)]{0,64})\)"
)
_EDAC_UE = re.compile(
    r"EDAC (?P<mc>[\w ]{0,30}?MC\d{1,3}|[\w]{1,20}):\s*(?P<n>\d{1,10}) UE\b\s*(?P<what>.{0,200})"
)
_MCE_UE = re.compile(
    r"(?:mce: Uncorrected hardware memory error|Machine Check Exception:|"
    r"\[Hardware Error\]:.{0,60}?(?:[Ee]vent severity: fatal|Uncorrected error|UE memory))"
)


def _clean(line: str) -> str:
    """Strip the line ending and cut to :data:`MAX_LINE_CHARS`."""
    if len(line) > MAX_LINE_CHARS:
        line = line[:MAX_LINE_CHARS]
    return line.rstrip("\r\n")


def _int(value: str | None, base: int = 10) -> int | None:
    if value is None:
        return None
    try:
        return int(value, base)
    except ValueError:
        return None


def _aer_class(sev: str) -> str:
    """``fatal`` / ``nonfatal`` / ``corrected`` from an AER severity phrase."""
    s = sev.lower()
    if s.startswith("corrected"):
        return "corrected"
    if "non-fatal" in s:
        return "nonfatal"
    return "fatal"


class _Record:
    """A multi-line record being collected; emitted once when closed."""

    max_lines = 8

    def __init__(self, line: str) -> None:
        self.lines = [line]

    def accepts(self, line: str) -> bool:  # pragma: no cover - overridden
        return False

    def finish(self) -> list[FaultEvent]:  # pragma: no cover - overridden
        return []

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class _FallenOffBus(_Record):
    """``NVRM: The NVIDIA GPU <pci>`` / ``(PCI ID: …) installed in this system has`` /
    ``fallen off the bus and is not responding to commands.`` (``nv.c``)."""

    max_lines = 4

    def __init__(self, line: str, pci: str) -> None:
        super().__init__(line)
        self.pci = pci

    def accepts(self, line: str) -> bool:
        return (
            "NVRM:" in line
            and "Xid" not in line
            and not _FALLEN_START.search(line)
            and "responding to commands" not in self.lines[-1]
        )

    def finish(self) -> list[FaultEvent]:
        if "fallen off the bus" not in self.text:
            return []
        return [
            FaultEvent(
                kind="gpu_lost",
                xid=None,
                pci=self.pci,
                pid=None,
                process=None,
                summary=f"GPU {self.pci} has fallen off the bus",
                text=self.text,
                details={"record": "multi_line"},
            )
        ]


class _SXidRecord(_Record):
    """NVSwitch SXid lines of one error: the text line, ``Severity …`` and ``Data {…}``."""

    max_lines = 6

    def __init__(self, line: str, dev: str | None, pci: str, code: int) -> None:
        super().__init__(line)
        self.dev, self.pci, self.code = dev, pci, code

    def accepts(self, line: str) -> bool:
        m = _SXID.search(line)
        return bool(m and m.group("pci") == self.pci and _int(m.group("code")) == self.code)

    def finish(self) -> list[FaultEvent]:
        details: dict[str, object] = {}
        if self.dev:
            details["nvswitch"] = self.dev
        message = ""
        for line in self.lines:
            m = _SXID.search(line)
            rest = m.group("rest") if m else ""
            low = rest.lower()
            if "severity" not in details:
                if low.startswith("non-fatal") or low.startswith("nonfatal"):
                    details["severity"] = "nonfatal"
                elif low.startswith("fatal"):
                    details["severity"] = "fatal"
            lm = _LINK.search(rest)
            if lm and "link" not in details:
                details["link"] = int(lm.group("link"))
            if not message and not rest.startswith("Data") and not low.startswith("severity"):
                message = rest
        if message:
            details["message"] = re.sub(r"^(?:Non-fatal|Nonfatal|Fatal),\s*", "", message)[:200]
        suffix = f" link {details['link']}" if "link" in details else ""
        sev = f" ({details['severity']})" if "severity" in details else ""
        return [
            FaultEvent(
                kind="sxid",
                xid=self.code,
                pci=self.pci,
                pid=None,
                process=None,
                summary=f"SXid {self.code}{sev} on NVSwitch {self.pci}{suffix}",
                text=self.text,
                details=details,
            )
        ]


class _AerRecord(_Record):
    """One AER report: header, ``PCIe Bus Error`` lines, status/mask and bit lines."""

    max_lines = 24

    def __init__(self, line: str, cls: str) -> None:
        super().__init__(line)
        self.cls = cls

    def accepts(self, line: str) -> bool:
        if _AER_HEAD.search(line):
            return False
        bus = _AER_BUS.search(line)
        if bus:
            return _aer_class(bus.group("sev")) == self.cls
        return bool(_AER_CONT.search(line))

    def finish(self) -> list[FaultEvent]:
        devices: list[str] = []
        pci: str | None = None
        details: dict[str, object] = {}
        for line in self.lines:
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
                    details["source"] = src
        src = details.get("source")
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
        return [
            FaultEvent(
                kind=kind,
                xid=None,
                pci=pci,
                pid=None,
                process=None,
                summary=f"PCIe AER {label} error{where}",
                text=self.text,
                details=details,
            )
        ]


class _XfsRecord(_Record):
    """XFS shutdown: the lines ``XFS (<dev>): …`` printed together for one shutdown."""

    max_lines = 8

    def __init__(self, line: str, dev: str) -> None:
        super().__init__(line)
        self.dev = dev

    def accepts(self, line: str) -> bool:
        m = _XFS.search(line)
        return bool(m and m.group("dev") == self.dev)

    def finish(self) -> list[FaultEvent]:
        return [
            FaultEvent(
                kind="xfs_shutdown",
                xid=None,
                pci=None,
                pid=None,
                process=None,
                summary=f"XFS filesystem on {self.dev} shut down",
                text=self.text,
                details={"device": self.dev},
            )
        ]


class _InitFailRecord(_Record):
    """``RmInitAdapter failed!`` and the ``rm_init_adapter failed`` line after it."""

    max_lines = 2

    def __init__(self, line: str, pci: str | None, details: dict[str, object]) -> None:
        super().__init__(line)
        self.pci = pci
        self.details = details

    def accepts(self, line: str) -> bool:
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
            FaultEvent(
                kind="gpu_init_failed",
                xid=None,
                pci=self.pci,
                pid=None,
                process=None,
                summary=f"{where} failed to initialise (RmInitAdapter)",
                text=self.text,
                details=self.details,
            )
        ]


def parse_xid(line: str) -> FaultEvent | None:
    """One ``NVRM: Xid (…): N, …`` line → an ``xid`` event, else None.

    Handles ``pid=``/``name=`` present, absent or ``'<unknown>'``; ``Ch 0000000x`` and
    ``channel 0x…``; MIG ``(PCI:… GPU-I:05)``; the oldest ``NVRM: Xid (0003:00): 8, …``.
    ``details`` gets ``channel``, ``gpc``/``tpc``/``sm`` (Xid 13), ``subunit``/``severity``/
    ``link`` (NVLink5 Xid 144–150, ``link`` for Xid 74), ``recovery_action`` (Xid 154),
    ``caused_by_xid`` ("caused by previous Xid N"), ``gpu_instance``/``compute_instance``
    (MIG), ``gsp_function`` (Xid 119), ``reset_required`` (``RST: Yes``), ``message``.
    """
    m = _XID.search(line)
    if not m:
        return None
    code = _int(m.group("code"))
    if code is None:
        return None
    pci = m.group("pci")
    rest = m.group("rest")
    pid: int | None = None
    process: str | None = None
    pm = _PID_NAME.match(rest)
    if pm:
        pid = _int(pm.group("pid"))
        name = pm.group("name")
        if name is not None:
            name = name.strip().strip("'")
            if name and name != "<unknown>":
                process = name
        rest = rest[pm.end() :]
    details: dict[str, object] = {}
    extra = m.group("extra")
    gi = _MIG_GI.search(extra)
    if gi:
        details["gpu_instance"] = int(gi.group(1))
    ci = _MIG_CI.search(extra)
    if ci:
        details["compute_instance"] = int(ci.group(1))
    ch = _CHANNEL.search(rest)
    if ch:
        details["channel"] = int(ch.group("ch"), 16)
    suffix = ""
    gm = _GPC.search(rest)
    if gm:
        details["gpc"] = int(gm.group("gpc"))
        details["tpc"] = int(gm.group("tpc"))
        if gm.group("sm") is not None:
            details["sm"] = int(gm.group("sm"))
        suffix = f" (GPC {details['gpc']}, TPC {details['tpc']})"
    nv = _NVLINK5.search(rest)
    if nv:
        details["subunit"] = nv.group("subunit")
        details["severity"] = "nonfatal" if nv.group("sev").lower().startswith("non") else "fatal"
        details["xc"] = int(nv.group("xc"))
        details["instance"] = int(nv.group("inst"))
        details["link"] = int(nv.group("link"))
        suffix = f": {details['subunit']} {details['severity']} link {details['link']}"
    elif code == 74 or "NVLink" in rest:
        lm = _LINK.search(rest)
        if lm:
            details["link"] = int(lm.group("link"))
            suffix = f": NVLink link {details['link']}"
        if "fatal" in rest.lower():
            details["severity"] = "nonfatal" if "non-fatal" in rest.lower() else "fatal"
    rm = _RECOVERY.search(rest)
    if rm:
        details["recovery_action"] = (rm.group("to") or "").strip() or rm.group("to_code")
        details["recovery_action_code"] = int(rm.group("to_code"), 16)
        details["previous_recovery_action"] = rm.group("from").strip()
        suffix = f": recovery action {details['recovery_action']}"
    cb = _CAUSED_BY.search(rest)
    if cb:
        details["caused_by_xid"] = int(cb.group(1))
        suffix = f" (caused by Xid {details['caused_by_xid']})"
    gf = _GSP_FN.search(rest)
    if gf:
        details["gsp_function"] = gf.group("name")
    rs = _RST.search(rest)
    if rs:
        details["reset_required"] = rs.group(1).lower() == "yes"
    message = rest.strip()
    if message:
        details["message"] = message[:200]
    return FaultEvent(
        kind="xid",
        xid=code,
        pci=pci,
        pid=pid,
        process=process,
        summary=f"Xid {code} on GPU {pci}{suffix}",
        text=line,
        details=details,
    )


def _single(
    kind: str,
    line: str,
    summary: str,
    *,
    pci: str | None = None,
    pid: int | None = None,
    process: str | None = None,
    details: dict[str, object] | None = None,
    level: bool = False,
    active: bool = True,
) -> FaultEvent:
    return FaultEvent(
        kind=kind,
        xid=None,
        pci=pci,
        pid=pid,
        process=process,
        summary=summary,
        text=line,
        details=dict(details or {}),
        level=level,
        active=active,
    )


def _match_single(line: str) -> FaultEvent | None:
    """Every one-line kind except Xid (tested first by the caller)."""
    if "fallen off the bus" in line:
        fm = _FALLEN_ONE.search(line)
        if fm:
            pci = fm.group("pci")
            return _single("gpu_lost", line, f"GPU {pci} has fallen off the bus", pci=pci)
    if "device handle" in line:
        nh = _NO_HANDLE.search(line)
        if nh:
            pci, why = nh.group("pci"), nh.group("why").strip()
            details: dict[str, object] = {"nvml_error": why[:120]}
            if "requires reset" in why.lower():
                return _single(
                    "reset_required", line, f"GPU {pci} requires a reset", pci=pci, details=details
                )
            return _single(
                "gpu_lost", line, f"GPU {pci} not reachable through NVML", pci=pci, details=details
            )
    if "NVRM" in line:
        if "eartbeat timed out" in line and _GSP_HB.search(line):
            details = {}
            gi = _GPU_INDEX.search(line)
            if gi:
                details["gpu_index"] = int(gi.group("idx"))
            for nm in _GSP_HB_NUM.finditer(line):
                details[f"{nm.group('k')}_ms"] = int(nm.group("v"))
            pm = _ANY_PCI.search(line)
            pci = pm.group("pci") if pm else None
            who = f"GPU{details['gpu_index']}" if "gpu_index" in details else (pci or "GPU")
            return _single(
                "gsp_heartbeat", line, f"GSP heartbeat timed out on {who}", pci=pci, details=details
            )
        if "NV_ERR_RESET_REQUIRED" in line and _RESET_REQ.search(line):
            details = {}
            gi = _GPU_INDEX.search(line)
            if gi:
                details["gpu_index"] = int(gi.group("idx"))
            pm = _ANY_PCI.search(line)
            pci = pm.group("pci") if pm else None
            who = f"GPU{details['gpu_index']}" if "gpu_index" in details else (pci or "GPU")
            return _single(
                "reset_required",
                line,
                f"{who} requires a reset (NV_ERR_RESET_REQUIRED)",
                pci=pci,
                details=details,
            )
        if "NV_ERR_GPU_IS_LOST" in line and _GPU_IS_LOST.search(line):
            pm = _ANY_PCI.search(line)
            pci = pm.group("pci") if pm else None
            details = {"assertion": "NV_ERR_GPU_IS_LOST"}
            gi = _GPU_INDEX.search(line)
            if gi:
                details["gpu_index"] = int(gi.group("idx"))
            return _single(
                "gpu_lost",
                line,
                f"GPU {pci or ''} lost (NV_ERR_GPU_IS_LOST)".replace("  ", " "),
                pci=pci,
                details=details,
            )
    if "SXid" in line:
        return None
    if "EXT" in line and "read-only" in line:
        em = _EXT4_RO.search(line)
        if em:
            dev = em.group("dev")
            return _single(
                "ext4_readonly",
                line,
                f"EXT4 filesystem on {dev} remounted read-only",
                details={"device": dev},
            )
    if "blocked for more than" in line:
        hm = _HUNG.search(line)
        if hm:
            name, pid = hm.group("name"), int(hm.group("pid"))
            return _single(
                "hung_task",
                line,
                f"Task {name} blocked for more than {hm.group('s')} s",
                pid=pid,
                process=name,
                details={"blocked_s": int(hm.group("s"))},
            )
    if "ink" in line or "ort" in line:
        ml = _MLX_LINK.search(line)
        if ml:
            state = ml.group("state").upper()
            details = {"driver": ml.group("drv")}
            if ml.group("dev"):
                details["device"] = ml.group("dev")
            if ml.group("port"):
                details["port"] = int(ml.group("port"))
            return _link_event(line, ml.group("pci"), state, details)
        ip = _IB_PORT.search(line)
        if ip:
            details = {"device": ip.group("dev"), "port": int(ip.group("port"))}
            return _link_event(line, None, ip.group("state").upper(), details)
    if "ill" in line and "process" in line:
        om = _OOM.search(line)
        if om:
            name = om.group("name") or None
            pid = int(om.group("pid"))
            details = {"cgroup": line[om.start() : om.start() + 13] == "Memory cgroup"}
            return _single(
                "oom_kill",
                line,
                f"OOM killer killed {name or 'a process'}",
                pid=pid,
                process=name,
                details=details,
            )
    if "EDAC" in line and " UE" in line:
        ed = _EDAC_UE.search(line)
        if ed:
            details = {"controller": ed.group("mc").strip(), "count": int(ed.group("n"))}
            loc = ed.group("what").strip()
            if loc:
                details["location"] = loc[:200]
            return _single(
                "mce_ue",
                line,
                f"Uncorrectable memory error on {details['controller']}",
                details=details,
            )
    if ("mce" in line or "Hardware Error" in line or "Machine Check" in line) and _MCE_UE.search(
        line
    ):
        return _single("mce_ue", line, "Uncorrectable machine check (memory/CPU)")
    return None


def _link_event(line: str, pci: str | None, state: str, details: dict[str, object]) -> FaultEvent:
    who = str(details.get("device") or pci or "HCA")
    port = f" port {details['port']}" if "port" in details else ""
    if state == "DOWN":
        return _single(
            "ib_link_down", line, f"Link down on {who}{port}", pci=pci, details=details, level=True
        )
    return _single(
        "ib_link_up",
        line,
        f"Link up on {who}{port}",
        pci=pci,
        details=details,
        level=True,
        active=False,
    )


class KernelLogReader:
    """Streaming kernel-log reader.

    ``feed(line)`` returns the events completed by that line (possibly an earlier
    multi-line record that this line closed, then this line's own event); ``flush()``
    returns the record still open at end of input. Each record is emitted exactly once.
    Never raises on any ``str`` input.
    """

    def __init__(self) -> None:
        self._pending: _Record | None = None

    def feed(self, line: str) -> list[FaultEvent]:
        """Read one line (with or without its line ending); returns completed events."""
        try:
            return self._feed(_clean(str(line)))
        except Exception:  # a reader never takes the agent down
            self._pending = None
            return []

    def flush(self) -> list[FaultEvent]:
        """Close and return the open multi-line record, if any."""
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        try:
            return pending.finish()
        except Exception:
            return []

    def _feed(self, line: str) -> list[FaultEvent]:
        out: list[FaultEvent] = []
        if self._pending is not None:
            p = self._pending
            if len(p.lines) < p.max_lines and p.accepts(line):
                p.lines.append(line)
                return out
            out.extend(self.flush())
        if not line.strip():
            return out
        start = self._start(line)
        if isinstance(start, _Record):
            self._pending = start
        elif start is not None:
            out.append(start)
        return out

    def _start(self, line: str) -> FaultEvent | _Record | None:
        if "Xid" in line:
            if "SXid" in line:
                sm = _SXID.search(line)
                if sm:
                    code = _int(sm.group("code"))
                    if code is not None:
                        return _SXidRecord(line, sm.group("dev"), sm.group("pci"), code)
            ev = parse_xid(line)
            if ev is not None:
                return ev
        if "NVRM" in line:
            fs = _FALLEN_START.search(line)
            if fs:
                rec = _FallenOffBus(line, fs.group("pci"))
                if "fallen off the bus" in line and "responding" in line:
                    return rec.finish()[0]
                return rec
            if "nit" in line:
                ri = _RMINIT.search(line)
                if ri:
                    details: dict[str, object] = {}
                    if ri.group("code"):
                        details["error"] = ri.group("code")
                    return _InitFailRecord(line, ri.group("pci"), details)
                rf = _RMINIT_FOLLOW.search(line)
                if rf:
                    rec2 = _InitFailRecord(line, rf.group("pci"), {})
                    return rec2.finish()[0]
        if "AER" in line or "PCIe Bus Error" in line:
            head = _AER_HEAD.search(line)
            if head:
                return _AerRecord(line, _aer_class(head.group("sev")))
            bus = _AER_BUS.search(line)
            if bus:
                return _AerRecord(line, _aer_class(bus.group("sev")))
        if "XFS" in line:
            xm = _XFS.search(line)
            if xm and _XFS_SHUT.search(line):
                return _XfsRecord(line, xm.group("dev"))
        return _match_single(line)


def read_kernel_lines(lines: list[str], sink: Callable[[FaultEvent], None]) -> None:
    """Feed ``lines`` through a fresh :class:`KernelLogReader`, passing each event to ``sink``."""
    reader = KernelLogReader()
    for line in lines:
        for ev in reader.feed(line):
            sink(ev)
    for ev in reader.flush():
        sink(ev)
