"""The fault event every reader produces (stdlib only: the agent ships alone).

A :class:`FaultEvent` is one detected fault as read from text: a kernel-log record, an
``nvidia-smi -q`` GPU block, a ``scontrol show node`` record or slurmctld node-state line,
or a ``dcgmi diag`` result table. It carries what was read,
never a decision: severity and action come from :mod:`workflows.catalogue` on the control
plane (or in ``autorepair classify``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS: frozenset[str] = frozenset(
    {
        "xid",
        "sxid",
        "gpu_lost",
        "pcie_aer_fatal",
        "pcie_aer_corrected",
        "xfs_shutdown",
        "ext4_readonly",
        "hung_task",
        "ib_link_down",
        "ib_link_up",
        "oom_kill",
        "mce_ue",
        "gsp_heartbeat",
        "reset_required",
        "gpu_init_failed",
        "nvsmi",
        "slurm_node",
        "uvm_fatal",
        "npd_condition",
        "dcgm_diag",
    }
)
"""The ``autorepair classify`` kinds (DESIGN §4.1): every kind the readers and the agent
emit. The control plane's vocabulary (``workflows.catalogue.vocabulary``) re-exports this
list, so a new kind added here must also get a catalogue entry (a test checks)."""

LEVEL_KINDS: frozenset[str] = frozenset({"ib_link_down", "ib_link_up", "nvsmi", "slurm_node"})
"""Kinds that describe a state with raise/clear edges; every other kind is an event."""

CLEARS: dict[str, str] = {"ib_link_up": "ib_link_down"}
"""``kind → level kind it clears``: an ``ib_link_up`` event has ``active=False`` and ends
the ``ib_link_down`` fault on the same device and port."""

MAX_LINE_CHARS = 16_384
"""Longest line the readers look at; the rest is cut. printk records are at most 1024
bytes (kernel ``LOG_LINE_MAX``) and nvidia-smi / scontrol lines far shorter, so only junk
is ever cut; the bound keeps every pattern linear and memory flat."""


@dataclass
class FaultEvent:
    """One fault read from text.

    - ``kind``: one of :data:`KINDS`.
    - ``xid``: the Xid or SXid code, else None.
    - ``pci``: the device address exactly as printed (``0000:c6:00``, ``0000:84:00.0``,
      the oldest ``0003:00``), else None.
    - ``pid`` / ``process``: from the line; None where it has none or prints ``<unknown>``.
    - ``summary``: stable one-line text (no timestamps, pids or counters that change
      between re-reports of the same fault).
    - ``text``: the raw evidence, lines of a multi-line record joined with ``\\n``.
    - ``details``: kind-specific evidence (``gpc``/``tpc``/``sm`` for Xid 13,
      ``link``/``subunit``/``severity`` for NVLink, ``recovery_action`` for Xid 154,
      ``caused_by_xid`` for secondary Xids, Slurm ``state``/``reason``/..., nvidia-smi
      counters and flags, ``dcgmi diag`` ``failed``/``warned`` tests). Values are
      JSON-serialisable.
    - ``level``: True for a state (raise/clear edges), False for a single observation.
    - ``active``: False marks the clear edge of a level fault.
    """

    kind: str
    xid: int | None
    pci: str | None
    pid: int | None
    process: str | None
    summary: str
    text: str
    details: dict[str, Any] = field(default_factory=dict)
    level: bool = False
    active: bool = True
