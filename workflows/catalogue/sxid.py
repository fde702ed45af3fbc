"""NVSwitch SXid entries: NVIDIA Fabric Manager user guide's SXid lists.

Source: NVIDIA Fabric Manager User Guide (DU-09883-001 v1.3, October 2023),
https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/ — appendix "NVSwitch
SXid errors": "Non-Fatal NVSwitch SXid Errors", "Fatal NVSwitch SXid Errors", "Always
Fatal NVSwitch SXid Errors" and "Other Notable NVSwitch SXid Errors", with each code's
guest-VM impact and recovery.

Decision, per occurrence: the severity the SXid's headline prints (``Fatal`` /
``Non-fatal``, ``details["severity"]`` — set by the readers only from the headline) wins;
otherwise the code's list decides. A fatal SXid needs the GPUs and NVSwitches of the
baseboard reset, which on an HGX node is a node reboot. A non-fatal SXid needs no action,
also for the three the guide lists as non-fatal while its recovery column restarts the
system, where the product follows the list and an operator override can say otherwise
(see :data:`NONFATAL_SXIDS`). A code in no list is observed, unmapped — never a
default reboot.
"""

from __future__ import annotations

from typing import Any

from workflows.catalogue.entry import CatalogueEntry, make_entry
from workflows.models import Action, Severity

FM_GUIDE = (
    "NVIDIA Fabric Manager User Guide DU-09883-001 v1.3 (docs.nvidia.com/datacenter/tesla/"
    "fabric-manager-user-guide), NVSwitch SXid errors"
)

NONFATAL_SXIDS: frozenset[int] = frozenset(
    {
        # "Non-Fatal NVSwitch SXid Errors" whose recovery is "Not Applicable": single-bit
        # ECC errors the switch corrects, the TX replay error, the minion DLREQ interrupt
        # ("can be safely ignored") and the broken/inconsistent connection notice.
        11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011,
        19049, 19055, 19057, 19059, 19062, 19065, 19068, 19071,
        24001, 24002, 24003, 20001, 22013, 20012,
        # "Other Notable NVSwitch SXid Errors" the guide calls not fatal: host privilege
        # error/timeout (may be followed by fatal SXids, which then decide) and the
        # thermal event start/end notices (ensure cooling).
        10001, 10002, 10004, 10005,
        # Listed non-fatal, though the guide's recovery restarts: 11004 ingress invalid ACL
        # and 12028 egress non-posted PRIV error ("Restart Guest VM"), 19084 AN1 heartbeat
        # timeout ("Reset all GPUs and all NVSwitches"; usually accompanied by a fatal
        # SXid, which then decides). Peers disagree on 12028 (gpud: fatal, NVSentinel:
        # non-fatal); the product follows the list, and the driver's own "Non-fatal"
        # headline says the same. `policy.catalogue.sxid` overrides it per site.
        11004, 12028, 19084,
        # Not in the guide: NVSWITCH_ERR_HW_DLPL_RX_SHORT_ERROR_RATE (NVIDIA
        # open-gpu-kernel-modules, src/common/nvswitch/interface/ctrl_dev_nvswitch.h) is a
        # link error-rate threshold on a link that keeps running: non-fatal.
        20009,
    }
)  # fmt: skip
"""SXids that need no node action."""

FATAL_SXIDS: frozenset[int] = frozenset(
    {
        # "Fatal NVSwitch SXid Errors"
        11001, 11009, 11013, 11018, 11019, 11020,
        12001, 12002, 12022, 12024, 12025, 12026, 12027, 12030, 12031, 12032,
        14017, 15001, 15006, 15009, 15010, 15012, 15013,
        19047, 19048, 19054, 19056, 19058, 19060, 19061, 19063, 19064,
        19066, 19067, 19069, 19070, 20034, 22012, 24004, 24005, 24006, 24007,
        # "Always Fatal NVSwitch SXid Errors"
        12020, 22003, 22011,
        23001, 23002, 23003, 23004, 23005, 23006, 23007, 23008, 23009,
        23010, 23011, 23012, 23013, 23014, 23015, 23016, 23017,
        # "Other Notable": host unhandled interrupt, "if it occurs, it is fatal".
        10003,
    }
)  # fmt: skip
"""SXids that need the baseboard's GPUs and NVSwitches reset (a node reboot)."""


def sxid_entry(code: int, details: dict[str, Any]) -> CatalogueEntry:
    """Default entry for SXid ``code``; ``details["severity"]`` is the headline's
    ``fatal`` / ``nonfatal`` when the reader saw one. Raises nothing."""
    sev = str(details.get("severity", "")).lower()
    if sev == "fatal":
        fatal, why = True, "the SXid headline says Fatal"
    elif sev.startswith("non"):
        fatal, why = False, "the SXid headline says Non-fatal"
    elif code in FATAL_SXIDS:
        fatal, why = True, f"{FM_GUIDE}: fatal list"
    elif code in NONFATAL_SXIDS:
        fatal, why = False, f"{FM_GUIDE}: non-fatal list"
    else:
        return make_entry(
            Severity.warning,
            f"SXID_{code}",
            Action.none,
            f"NVSwitch SXid {code} is in none of NVIDIA's SXid lists and its line prints no "
            "severity; recorded for an operator to review, no action decided.",
            f"{FM_GUIDE}: code not listed; observed, unmapped",
            mapped=False,
        )
    if fatal:
        return make_entry(
            Severity.critical,
            "NVSWITCH_FATAL",
            Action.reboot,
            f"Fatal NVSwitch error (SXid {code}): the GPUs and NVSwitches of the "
            "baseboard need a reset; reboot the node.",
            why,
        )
    return make_entry(
        Severity.warning,
        "NVSWITCH_NON_FATAL",
        Action.none,
        f"Non-fatal NVSwitch error (SXid {code}); the switch recovered.",
        why,
    )
