"""Fault-signal readers: kernel log, ``nvidia-smi -q``, ``scontrol show node``, slurmctld log,
``dcgmi diag``.

Stdlib only (the agent is deployed alone on GPU nodes). Public interface:

- :class:`FaultEvent` — one detected fault (kind, Xid/SXid code, PCI address, pid, process,
  stable summary, raw text, kind-specific details, level/active).
- :class:`KernelLogReader` — streaming ``feed(line)`` / ``flush()``.
- :class:`SlurmctldReader` — streaming slurmctld node-state lines.
- :func:`read_text` — any mixture of the sources.
- :func:`parse_xid`, :func:`parse_nvsmi`, :func:`parse_scontrol`, :func:`parse_slurmctld`,
  :func:`parse_dcgm_diag` — single-record parsers.
"""

from agent.readers.dcgm import parse_dcgm_diag
from agent.readers.events import CLEARS, KINDS, LEVEL_KINDS, MAX_LINE_CHARS, FaultEvent
from agent.readers.kernel import KernelLogReader, parse_xid
from agent.readers.nvsmi import parse_nvsmi
from agent.readers.slurm import SlurmctldReader, parse_scontrol, parse_slurmctld, parse_state
from agent.readers.text import read_text

__all__ = [
    "CLEARS",
    "KINDS",
    "LEVEL_KINDS",
    "MAX_LINE_CHARS",
    "FaultEvent",
    "KernelLogReader",
    "SlurmctldReader",
    "parse_dcgm_diag",
    "parse_nvsmi",
    "parse_scontrol",
    "parse_slurmctld",
    "parse_state",
    "parse_xid",
    "read_text",
]
