"""InfiniBand / RoCE link state (``drivers/net/ethernet/mellanox/mlx5``, ``drivers/infiniband``):
``mlx5_core <pci> mlx5_7: Port: 1 Link DOWN`` / ``… Link ACTIVE``, ``mlx5_core <pci>
ens1f1np1: Link down``, ``mlx5_0: port 1 link state changed to: DOWN``.

Level kinds: ``ib_link_down`` raises, ``ib_link_up`` clears (``active=False``).
"""

from __future__ import annotations

import re

from agent.readers.events import FaultEvent
from agent.readers.kernel.common import PCI_FULL, single

_MLX_LINK = re.compile(
    r"(?P<drv>mlx\d_(?:core|ib))\s+(?P<pci>" + PCI_FULL + r")\s*:?\s*(?P<dev>[\w.-]{1,40})?:?\s+"
    r"(?:Port:?\s*(?P<port>\d{1,3})\s+)?[Ll]ink\s+(?P<state>DOWN|ACTIVE|UP|down|up)\b"
)
_IB_PORT = re.compile(
    r"\b(?P<dev>(?:mlx\d|ib|bnxt_re|hfi1)_?\d{0,3}):?\s+[Pp]ort:?\s*(?P<port>\d{1,3})"
    r"\s+(?:[Ll]ink|state)\s*(?:changed to\s*)?:?\s*(?P<state>DOWN|ACTIVE)\b"
)


def _link_event(line: str, pci: str | None, state: str, details: dict[str, object]) -> FaultEvent:
    who = str(details.get("device") or pci or "HCA")
    port = f" port {details['port']}" if "port" in details else ""
    if state == "DOWN":
        return single("ib_link_down", line, f"Link down on {who}{port}", pci=pci,
                      details=details, level=True)
    return single("ib_link_up", line, f"Link up on {who}{port}", pci=pci, details=details,
                  level=True, active=False)


def match_mlx(line: str) -> FaultEvent | None:
    """Needles ``Link`` / ``link``: the mlx5 driver's link lines."""
    ml = _MLX_LINK.search(line)
    if not ml:
        return None
    details: dict[str, object] = {"driver": ml.group("drv")}
    if ml.group("dev"):
        details["device"] = ml.group("dev")
    if ml.group("port"):
        details["port"] = int(ml.group("port"))
    return _link_event(line, ml.group("pci"), ml.group("state").upper(), details)


def match_port(line: str) -> FaultEvent | None:
    """Needles ``Port`` / ``port``: ``<hca>: port N link state …``."""
    ip = _IB_PORT.search(line)
    if not ip:
        return None
    details: dict[str, object] = {"device": ip.group("dev"), "port": int(ip.group("port"))}
    return _link_event(line, None, ip.group("state").upper(), details)
