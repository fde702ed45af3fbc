"""Decode of the NVLink5 Xids 144–150 hardware fields.

Source: NVIDIA's Xid Catalog, "XID 144-150 Decode" tab
(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html and its spreadsheet). The
driver prints ``Xid (PCI:…): <xid>, <subunit> <Fatal|Nonfatal> XC<n> i<n> Link <n>
(<intrInfo> <errorStatus> <errorDebugData[0..4]>)``. The catalogue keys its resolution on
the subunit (encoded in ``intrInfo``: bits 9:0 before R575, "V1"; bits 6:0 from R575,
"V2"), on ``errorStatus``, and for the Xid 149 link-down events on ``intrInfo`` bits 25:20
(the link-down reason). The driver version is not on the line, so the subunit is taken
from the printed subunit name, else from whichever of the V1/V2 encodings matches.

Buckets (catalogue's words): ``IGNORE``, ``RESET_GPU``, ``XID_154_EVAL`` ("if an Xid 154
is seen along with this error, take that action; if none, RESTART_APP").
"""

from __future__ import annotations

from dataclasses import dataclass

_CS = "CONTACT_SUPPORT"
_IGN = "IGNORE"
_RST = "RESET_GPU"
_154 = "XID_154_EVAL"
_NVL_FLOW = "CHECK_NVLINK_FAILURE_FLOW"
_SI_CABLES = "INVESTIGATE_LINK_SI_AND_CABLES"
_PEER = "INVESTIGATE_PEER_DEVICE"

Row = tuple[str, str, str]
"""(immediate bucket, investigatory bucket, catalogue severity)."""

_F = "Fatal"
_NF = "Non-fatal"


@dataclass(frozen=True)
class _Unit:
    xid: int
    names: tuple[str, ...]
    v1: int  # intrInfo[9:0] before R575
    v2: int  # intrInfo[6:0] from R575
    by_status: dict[int, Row]
    fixed: Row | None = None  # one row whatever the status (Xid 149 NETIR)
    by_reason: dict[int, Row] | None = None  # Xid 149 link-down: intrInfo[25:20]


_TLW: dict[int, Row] = {
    0x1: (_IGN, _IGN, _NF),
    0x2: (_IGN, _CS, _NF),
    0x4: (_RST, _CS, _F),
    0x80000000: (_IGN, _CS, _NF),
}
_LINK_FATAL = "Link Fatal"

UNITS: tuple[_Unit, ...] = (
    _Unit(144, ("SAW_MVB",), 0x021, 1, {
        0x1: (_IGN, _CS, _NF), 0x2: (_RST, _CS, _F), 0x4: (_IGN, _IGN, _NF),
        0x8: (_IGN, _CS, _NF), 0x10: (_RST, _CS, _F), 0x20: (_IGN, _IGN, _NF),
    }),
    _Unit(145, ("RLW_CTRL",), 0x062, 3, {0x80000000: (_IGN, _CS, _NF)}),
    _Unit(145, ("RLW_REMAP",), 0x082, 4, {
        0x1: (_154, _CS, _NF), 0x2: (_154, _CS, _NF), 0x4: (_154, _NVL_FLOW, _NF),
        0x8: (_154, _NVL_FLOW, _NF), 0x10: (_154, _NVL_FLOW, _NF),
        0x20: (_154, _NVL_FLOW, _NF), 0x40: (_RST, _CS, _F), 0x80: (_RST, _CS, _F),
        0x100: (_IGN, _IGN, _NF), 0x200: (_IGN, _IGN, _NF), 0x80000000: (_IGN, _CS, _NF),
    }),
    _Unit(145, ("RLW_RSPCOL",), 0x0A2, 5, {
        0x1: (_IGN, _IGN, _NF), 0x2: (_RST, _CS, _F), 0x80000000: (_IGN, _CS, _NF),
    }),
    _Unit(145, ("RLW_RXPIPE",), 0x0C2, 6, {
        0x1: (_IGN, _CS, _NF), 0x2: (_IGN, _CS, _NF), 0x4: (_IGN, _CS, _NF),
        0x8: (_IGN, _CS, _NF), 0x80000000: (_IGN, _CS, _NF),
    }),
    _Unit(145, ("RLW_SRC_TRACK",), 0x0E2, 7, {
        0x1: (_RST, _CS, _F), 0x2: (_IGN, _IGN, _NF), 0x4: (_154, _IGN, _NF),
        0x8: (_154, _IGN, _NF), 0x10: (_RST, _CS, _F), 0x20: (_RST, _CS, _F),
        0x80000000: (_IGN, _CS, _NF),
    }),
    _Unit(145, ("RLW_TAGSTATE",), 0x102, 8, {
        0x1: (_IGN, _IGN, _NF), 0x2: (_RST, _CS, _F), 0x10000: (_IGN, _IGN, _NF),
        0x20000: (_RST, _CS, _F), 0x100000: (_RST, _CS, _F), 0x80000000: (_IGN, _CS, _NF),
    }),
    _Unit(146, ("TLW_CTRL",), 0x123, 9, _TLW),
    _Unit(146, ("TLW_RX", "TLW_RX_PIPE0"), 0x143, 10, _TLW),
    _Unit(146, ("TLW_RX_PIPE1",), 0x143, 11, _TLW),
    _Unit(146, ("TLW_TX", "TLW_TX_PIPE0"), 0x163, 12, _TLW),
    _Unit(146, ("TLW_TX_PIPE1",), 0x163, 13, _TLW),
    _Unit(147, ("TREX",), 0x184, 14, {0x1: (_IGN, _CS, _NF), 0x80000000: (_IGN, _CS, _NF)}),
    _Unit(148, ("NVLPW_CTRL", "NVLPW"), 0x005, 15, {0x80000000: (_IGN, _CS, _NF)}),
    _Unit(149, ("NETIR", "NETIR_INT"), 0x006, 24, {},
          fixed=(_RST, "SYMPATHETIC_REPORT_SOLO", _LINK_FATAL)),
    _Unit(149, ("NETIR_LINK_EVT", "NETIR_LINK_DOWN"), 0x1C6, 17, {}, by_reason={
        0b000000: (_RST, "SYMPATHETIC_REPORT_SOLO", _LINK_FATAL),
        0b000001: (_RST, "REPORT_ISSUE (if seen >1 per day)", _LINK_FATAL),
        0b000010: (_RST, "INVESTIGATE_LINK_SI", _LINK_FATAL),
        0b000100: (_RST, "INVESTIGATE_LINK_SI", _LINK_FATAL),
        0b001010: (_RST, "INVESTIGATE_LINK_SI", _LINK_FATAL),
        0b001111: (_RST, "INVESTIGATE_SW_USER", _LINK_FATAL),
        0b010000: (_RST, "INVESTIGATE_SW_USER_LINK_SI", _LINK_FATAL),
        0b010001: (_RST, "INVESTIGATE_SW_USER", _LINK_FATAL),
        0b010010: (_RST, "INVESTIGATE_SW_USER_LINK_SI", _LINK_FATAL),
        0b010101: (_RST, _PEER, _LINK_FATAL),
        0b010110: (_RST, "INVESTIGATE_SW_USER", _LINK_FATAL),
        0b100000: (_RST, _PEER, _LINK_FATAL),
        0b100001: (_RST, _PEER, _LINK_FATAL),
        0b100010: (_RST, _PEER, _LINK_FATAL),
        0b100011: (_RST, _PEER, _LINK_FATAL),
        0b100100: (_RST, _PEER, _LINK_FATAL),
        0b100101: (_RST, _PEER, _LINK_FATAL),
        0b100110: (_IGN, "INVESTIGATE_SW/USER", _LINK_FATAL),
        0b101000: (_IGN, "INVESTIGATE_HOST", _F),
        0b101010: (_RST, _SI_CABLES, _LINK_FATAL),
        0b101011: (_RST, _SI_CABLES, _LINK_FATAL),
    }),
    _Unit(149, ("NETIR_BER_EVENT",), 0x226, 19, {
        0x0: (_IGN, _SI_CABLES, _NF), 0x1: (_IGN, _SI_CABLES, _NF),
        0x2: (_IGN, _SI_CABLES, _NF), 0x3: (_IGN, _SI_CABLES, _NF),
    }),
    _Unit(149, ("NETIR_MFDE_EVENT",), 0x246, 20, {
        0x1: (_RST, _CS, _F), 0x3: (_IGN, _IGN, _NF), 0x4: (_RST, _CS, _F),
        0x5: (_RST, _CS, _F), 0x7: (_RST, _CS, _F),
    }),
    _Unit(150, ("MSE_DEGRADED", "MSE Degraded", "MSE_WATCHDOG", "MSE"), 0x000, 0, {
        0x0: (_RST, _CS, _F), 0xFFFFFFFF: (_RST, _CS, _F),
    }),
)
"""Rows of the catalogue's "XID 144-150 Decode" tab (immediate, investigatory, severity)."""

_RXPIPE_ACTION2_V1 = 1 << 10
_RXPIPE_ACTION2_V2 = 1 << 7


def _find_unit(xid: int, subunit: str, intr: int) -> _Unit | None:
    named = [u for u in UNITS if u.xid == xid and subunit in u.names]
    if len(named) > 1:  # TLW_RX/TLW_TX pipes share a name prefix: pick by encoding
        for u in named:
            if intr & 0x7F == u.v2:
                return u
    if named:
        return named[0]
    for u in UNITS:
        if u.xid == xid and (intr & 0x3FF == u.v1 or intr & 0x7F == u.v2):
            return u
    return None


def decode(xid: int, subunit: str, registers: list[int]) -> dict[str, object]:
    """The catalogue decode of one NVLink5 Xid, as ``details`` keys.

    ``registers``: the hex values in the parentheses, ``intrInfo`` first, then
    ``errorStatus``. Returns ``intr_info`` and ``error_status`` (ints) when printed and,
    where the catalogue has a row for them, ``nvlink5_unit`` (the catalogue's subcode),
    ``nvlink5_action`` (immediate bucket), ``nvlink5_investigatory``,
    ``nvlink5_severity`` (``Fatal``/``Non-fatal``/``Link Fatal``) and, for Xid 149 link
    events, ``link_down_reason`` (intrInfo bits 25:20). An empty dict for anything else.
    """
    out: dict[str, object] = {}
    if not registers:
        return out
    intr = registers[0]
    out["intr_info"] = intr
    status = registers[1] if len(registers) > 1 else None
    if status is not None:
        out["error_status"] = status
    unit = _find_unit(xid, subunit, intr)
    if unit is None:
        return out
    row: Row | None = None
    if unit.fixed is not None:
        row = unit.fixed
    elif unit.by_reason is not None:
        reason = (intr >> 20) & 0x3F
        out["link_down_reason"] = reason
        row = unit.by_reason.get(reason)
    elif status is not None:
        row = unit.by_status.get(status)
        if row is not None and unit.names[0] == "RLW_RXPIPE" and status in (0x1, 0x2, 0x4):
            v1 = intr & 0x3FF == unit.v1
            if intr & (_RXPIPE_ACTION2_V1 if v1 else _RXPIPE_ACTION2_V2):
                row = (_RST, row[1], row[2])  # the catalogue's "Action 2" bit
    if row is None:
        return out
    out["nvlink5_unit"] = "/".join(unit.names)
    out["nvlink5_action"], out["nvlink5_investigatory"], out["nvlink5_severity"] = row
    return out
