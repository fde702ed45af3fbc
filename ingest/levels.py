"""Level faults and events: what an agent fault record means for its node (docs/design.md §5
rails, "persistence per signal").

A *level* fault is a state with a raise and a matching clear — a GPU NVML no longer lists,
pending ECC remaps, an InfiniBand port down, a node that stopped pushing. Persistence
windows apply to it and its clear auto-resolves a pending recommendation. An *event* is
one observation read from a log (an Xid or SXid line): it never clears.

:func:`fault_shape` decides, per record:

- ``level``: the record's own ``autorepair.fault.level`` flag when it sends one (the
  agent marks every state it samples — NVML counters, GPU count, sysfs port state); else
  whether the kind is a state kind (:data:`agent.readers.events.LEVEL_KINDS`, re-exported
  by :mod:`workflows.catalogue.vocabulary`); a clear (``active=False``) is always level.
- clear kinds (:data:`~workflows.catalogue.vocabulary.CLEARS`): ``ib_link_up`` is the
  clear of ``ib_link_down``, so it is re-keyed to the kind it clears.
- InfiniBand device: an ``ib_link_*`` record names its HCA port in the evidence
  (``device``, ``port``); the port becomes the alert's device (``mlx5_0/1``) so one port's
  clear ends that port's fault and no other. The agent reads a port from two sources: sysfs
  (``device``/``port`` only) and the kernel log, whose mlx5 lines also name the HCA's PCI
  function in ``autorepair.gpu.pci``; a record naming ``device`` and ``port`` is keyed by
  the port either way (the PCI function goes to the evidence as ``pci``), so the sysfs
  clear ends the kernel line's raise. A record with a PCI function and no port (a netdev
  line, ``ens1f1np1: Link down``) keeps the PCI function as its device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workflows.catalogue.vocabulary import CLEARS, LEVEL_KINDS

_IB_KINDS = frozenset({"ib_link_down", "ib_link_up"})


@dataclass(frozen=True, slots=True)
class FaultShape:
    """``kind`` (after clear re-keying), ``gpu`` (device), ``active``, ``level``."""

    kind: str
    gpu: str | None
    active: bool
    level: bool
    #: the PCI function the record named when its port became its device (evidence ``pci``)
    pci: str | None = None


def fault_shape(kind: str, gpu: str | None, active: bool, evidence: dict[str, Any]) -> FaultShape:
    """The shape of one fault record (rules in the module docstring). Raises nothing."""
    flag = evidence.get("level")
    level = flag if isinstance(flag, bool) else kind in LEVEL_KINDS
    if kind in CLEARS:
        kind, active, level = CLEARS[kind], False, True
    if not active:
        level = True
    pci = None
    if kind in _IB_KINDS and evidence.get("device"):
        port = evidence.get("port")
        has_port = port not in (None, "")
        if not gpu or has_port:
            key = (f"{evidence['device']}" + (f"/{port}" if has_port else ""))[:64]
            pci = gpu if gpu and gpu != key else None
            gpu = key
    return FaultShape(kind, gpu, active, level, pci)
