"""``read_text``: any mixture of kernel log, ``nvidia-smi -q`` and ``scontrol show node`` text."""

from __future__ import annotations

from agent.readers.events import FaultEvent
from agent.readers.kernel import KernelLogReader
from agent.readers.nvsmi import is_nvsmi_line, is_section_line, parse_nvsmi
from agent.readers.slurm import is_slurm_continuation, is_slurm_start, parse_scontrol


def _nvsmi_follows(lines: list[str], i: int) -> bool:
    """An indented section title counts as nvidia-smi when the next non-empty line does."""
    indent = len(lines[i]) - len(lines[i].lstrip())
    for j in range(i + 1, min(len(lines), i + 4)):
        nxt = lines[j]
        if not nxt.strip():
            continue
        nind = len(nxt) - len(nxt.lstrip())
        return nind > indent and (is_nvsmi_line(nxt) or is_section_line(nxt))
    return False


def read_text(text: str) -> list[FaultEvent]:
    """Every fault event in ``text``, in order of appearance.

    Lines are routed by shape: ``NodeName=`` records (and their indented ``Key=value``
    lines) to the Slurm reader, ``nvidia-smi -q`` blocks (``Key : Value`` lines, section
    titles, ``GPU 0000…`` headers) to the nvidia-smi reader, everything else to
    :class:`~agent.readers.kernel.KernelLogReader`. Never raises on any ``str``.
    """
    if not isinstance(text, str):
        return []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    events: list[FaultEvent] = []
    kernel = KernelLogReader()
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if is_slurm_start(line):
            events.extend(kernel.flush())
            j = i + 1
            while j < n and is_slurm_continuation(lines[j]):
                j += 1
            ev = parse_scontrol(lines[i:j])
            if ev is not None:
                events.append(ev)
            i = j
            continue
        if is_nvsmi_line(line) or (
            line[:1].isspace() and is_section_line(line) and _nvsmi_follows(lines, i)
        ):
            events.extend(kernel.flush())
            j = i + 1
            while j < n and (
                is_nvsmi_line(lines[j]) or (is_section_line(lines[j]) and _nvsmi_follows(lines, j))
            ):
                j += 1
            events.extend(parse_nvsmi(lines[i:j]))
            i = j
            continue
        events.extend(kernel.feed(line))
        i += 1
    events.extend(kernel.flush())
    return events
