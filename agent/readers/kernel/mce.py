"""Uncorrectable memory / machine-check errors (Linux ``drivers/edac``, ``arch/x86/kernel/
cpu/mce``, APEI ``[Hardware Error]``) → ``mce_ue``. Corrected errors are not events."""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import single

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


def match_mce(line: str) -> FaultEvent | None:
    """Needles ``mce`` / ``Hardware Error`` / ``Machine Check``."""
    if not _MCE_UE.search(line):
        return None
    return single("mce_ue", line, "Uncorrectable machine check (memory/CPU)")
