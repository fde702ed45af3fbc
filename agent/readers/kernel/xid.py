"""NVIDIA Xid lines: ``NVRM: Xid (PCI:<addr>): <code>, …`` (open-gpu-kernel-modules ``nv.c``).

Tolerant of the shapes operators paste: extra blanks inside the marker
(``NVRM:  Xid  (PCI:…)``), a redacted or missing address (``Xid (PCI:...): 79``,
``Xid 154, …``: ``pci`` None), MIG instances (``(PCI:… GPU-I:05 GPU-CI:01)``), the oldest
``Xid (0003:00): 8``. Only the code is required.
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel import nvlink5
from agent.readers.kernel.common import HEX, PCI_ANY, to_int

_XID = re.compile(
    r"NVRM:[ \t]{0,8}Xid(?:[ \t]{0,8}\([ \t]{0,4}(?:PCI:[ \t]{0,4})?(?P<pci>" + PCI_ANY + r")?"
    r"(?P<extra>[^)]{0,80})\)[ \t]{0,4}:?[ \t]{0,8}|[ \t]{1,8})"  # "(addr):" or no address
    r"(?P<code>\d{1,6})\b[ \t]{0,8},?[ \t]{0,8}"
    r"(?P<rest>.*)"
)
_PID_NAME = re.compile(
    r"^pid=(?:'<unknown>'|<unknown>|'?(?P<pid>\d{1,10})'?)"
    r"(?:,\s*name=(?P<name>[^,]*?))?(?:,\s*|$)"
)
_CHANNEL = re.compile(
    r"\b(?:Ch|Channel ID|Channel|channel|ChID|ChId)\s+(?:0x)?(?P<ch>" + HEX + r"{1,8})\b"
)
_GPC = re.compile(r"\(GPC (?P<gpc>\d+), TPC (?P<tpc>\d+)(?:, SM (?P<sm>\d+))?\)")
_NVLINK5 = re.compile(
    r"(?P<subunit>[A-Z][A-Za-z0-9_]{1,40}(?: Degraded)?)\s+(?P<sev>Nonfatal|Non-fatal|Fatal)\s+"
    r"XC(?P<xc>\d+)\s+i(?P<inst>\d+)\s+Link\s+(?P<link>-?\d+)(?:\s*\((?P<regs>[^)]{0,200}))?"
)
_HEX_WORD = re.compile(r"0x(" + HEX + r"{1,8})\b")
_LINK = re.compile(r"\b[Ll]ink\s+(?P<link>-?\d{1,4})\b")
_RECOVERY = re.compile(
    r"recovery action changed from\s*(?P<from_code>0x" + HEX + r"{1,8})?\s*"
    r"(?:\((?P<from>[^)]{0,60})\)?)?\s*"
    r"(?:to\s*(?P<to_code>0x" + HEX + r"{1,8})?\s*(?:\((?P<to>[^)]{0,60})\)?)?)?",
    re.IGNORECASE,
)
_CAUSED_BY = re.compile(r"(?:caused by|due to) (?:a |the )?previous Xid[ :#]*(\d{1,6})", re.I)
_GSP_FN = re.compile(r"Expected function (?P<fn>\d+) \((?P<name>[A-Z0-9_]+)\)")
_MIG_GI = re.compile(r"GPU-I:\s*(\d+)")
_MIG_CI = re.compile(r"GPU-CI:\s*(\d+)")
_RST = re.compile(r"RST:\s*(Yes|No)", re.I)

RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "GPU reset",
    2: "node reboot",
    3: "drain P2P",
    4: "drain and reset",
}
"""Xid 154 "to" codes: NVML ``nvmlDeviceGpuRecoveryAction_t`` (``NVML_GPU_RECOVERY_ACTION_
NONE`` 0, ``_GPU_RESET`` 1, ``_NODE_REBOOT`` 2, ``_DRAIN_P2P`` 3, ``_DRAIN_AND_RESET`` 4;
nvml.h, R550+)."""


def _recovery(rest: str, details: dict[str, object]) -> str:
    """Xid 154 fields into ``details``; returns the summary suffix ("" when unreadable)."""
    rm = _RECOVERY.search(rest)
    if not rm:
        return ""
    if rm.group("from_code"):
        details["previous_recovery_action_code"] = int(rm.group("from_code"), 16)
    prev = (rm.group("from") or "").strip()
    if prev:
        details["previous_recovery_action"] = prev
    label = (rm.group("to") or "").strip()
    if label:
        details["recovery_action"] = label
    if rm.group("to_code"):
        code = int(rm.group("to_code"), 16)
        details["recovery_action_code"] = code
        return f": recovery action {code:#x} ({label or RECOVERY_ACTIONS.get(code, 'unknown')})"
    return f": recovery action {label}" if label else ""


def _nvlink(code: int, rest: str, details: dict[str, object]) -> str:
    nv = _NVLINK5.search(rest)
    if nv:
        details["subunit"] = nv.group("subunit")
        details["severity"] = "nonfatal" if nv.group("sev").lower().startswith("non") else "fatal"
        details["xc"] = int(nv.group("xc"))
        details["instance"] = int(nv.group("inst"))
        details["link"] = int(nv.group("link"))
        regs = [int(h, 16) for h in _HEX_WORD.findall(nv.group("regs") or "")]
        if 144 <= code <= 150:
            details.update(nvlink5.decode(code, nv.group("subunit"), regs))
        return f": {details['subunit']} {details['severity']} link {details['link']}"
    if code == 74 or "NVLink" in rest:
        suffix = ""
        lm = _LINK.search(rest)
        if lm:
            details["link"] = int(lm.group("link"))
            suffix = f": NVLink link {details['link']}"
        low = rest.lower()
        if "fatal" in low:
            details["severity"] = "nonfatal" if "non-fatal" in low else "fatal"
        return suffix
    return ""


def parse_xid(line: str) -> FaultEvent | None:
    """One ``NVRM: Xid (…): N, …`` logical line → an ``xid`` event, else None.

    Handles ``pid=``/``name=`` present, absent or ``'<unknown>'``; ``Ch 0000000x`` and
    ``channel 0x…``; MIG ``(PCI:… GPU-I:05)``; the oldest ``NVRM: Xid (0003:00): 8, …``;
    a redacted (``PCI:...``) or missing address (``pci`` None). ``details`` gets
    ``channel``, ``gpc``/``tpc``/``sm`` (Xid 13), ``link`` (Xid 74 and NVLink5),
    ``subunit``/``severity``/``xc``/``instance`` and the catalogue decode of
    :func:`agent.readers.kernel.nvlink5.decode` (Xid 144–150),
    ``recovery_action_code``/``recovery_action``/``previous_recovery_action(_code)``
    (Xid 154), ``caused_by_xid``, ``gpu_instance``/``compute_instance`` (MIG),
    ``gsp_function`` (Xid 119), ``reset_required`` (``RST: Yes``), ``message``.
    """
    m = _XID.search(line)
    if not m:
        return None
    code = to_int(m.group("code"))
    if code is None:
        return None
    pci = m.group("pci")
    rest = m.group("rest")
    pid: int | None = None
    process: str | None = None
    pm = _PID_NAME.match(rest)
    if pm:
        pid = to_int(pm.group("pid"))
        name = pm.group("name")
        if name is not None:
            name = name.strip().strip("'")
            if name and name != "<unknown>":
                process = name
        rest = rest[pm.end() :]
    details: dict[str, object] = {}
    extra = m.group("extra") or ""
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
    suffix = _nvlink(code, rest, details) or suffix
    if code == 154 or "recovery action" in rest:
        suffix = _recovery(rest, details) or suffix
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
    where = f" on GPU {pci}" if pci else ""
    return FaultEvent(
        kind="xid",
        xid=code,
        pci=pci,
        pid=pid,
        process=process,
        summary=f"Xid {code}{where}{suffix}",
        text=line,
        details=details,
    )


def match(line: str) -> FaultEvent | None:
    """Table matcher for the ``Xid`` needle."""
    return parse_xid(line)
