"""``read_text``: any mixture of kernel log, ``nvidia-smi -q``, ``scontrol show node``,
``sinfo`` tables, ``dcgmi diag`` tables and ``-j`` JSON, and slurmctld log lines."""

from __future__ import annotations

from agent.readers.dcgm import is_dcgm_table, is_table_line, parse_dcgm_diag
from agent.readers.dcgm_json import find_json, looks_like_dcgm_json, parse_dcgm_json
from agent.readers.events import FaultEvent
from agent.readers.kernel import KernelLogReader
from agent.readers.nvsmi import (
    is_known_section,
    is_kv_line,
    is_nvsmi_line,
    is_section_line,
    parse_nvsmi,
)
from agent.readers.sinfo import header_columns, is_sinfo_row, parse_sinfo
from agent.readers.slurm import (
    SlurmctldReader,
    is_slurm_continuation,
    is_slurm_start,
    parse_scontrol,
)

_LOOKAHEAD = 3
"""Lines a section title may be separated from the ``Key : Value`` line that confirms it
(blank lines between them in a paste)."""


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def _next_is_nvsmi(lines: list[str], i: int, deeper: bool) -> bool:
    """A title at ``i`` is nvidia-smi output when the next non-empty line is (``deeper``:
    and is indented further than the title)."""
    for j in range(i + 1, min(len(lines), i + 1 + _LOOKAHEAD)):
        nxt = lines[j]
        if not nxt.strip():
            continue
        if deeper and _indent(nxt) <= _indent(lines[i]):
            return False
        return (
            is_nvsmi_line(nxt)
            or is_kv_line(nxt)
            or is_known_section(nxt)
            or (is_section_line(nxt) and _indent(nxt) > _indent(lines[i]))
        )
    return False


def _starts_nvsmi(lines: list[str], i: int) -> bool:
    line = lines[i]
    if line[:1] == "[":
        return False  # a dmesg line: no nvidia-smi line starts with "["
    if is_nvsmi_line(line):
        return True
    if is_known_section(line):
        return _next_is_nvsmi(lines, i, deeper=False)
    return line[:1].isspace() and is_section_line(line) and _next_is_nvsmi(lines, i, True)


def _continues_nvsmi(lines: list[str], j: int) -> bool:
    line = lines[j]
    if is_nvsmi_line(line) or is_kv_line(line) or is_known_section(line):
        return True
    return is_section_line(line) and _next_is_nvsmi(lines, j, deeper=False)


def read_text(text: str) -> list[FaultEvent]:
    """Every fault event in ``text``, in order of appearance.

    Lines are routed by shape: ``NodeName=`` records (and their ``Key=value`` lines) to
    the Slurm reader; ``sinfo`` tables (a header of sinfo column titles and its rows) to
    :mod:`agent.readers.sinfo`; ``dcgmi diag -j`` JSON objects to :mod:`agent.readers.dcgm_json`;
    boxed ``dcgmi diag`` tables to :mod:`agent.readers.dcgm`; slurmctld
    node-state lines to :class:`~agent.readers.slurm.SlurmctldReader`; ``nvidia-smi -q``
    blocks (``Key : Value`` lines, known section titles, ``GPU 0000…`` headers; indented,
    tab-indented or flat) to the nvidia-smi reader; everything else to
    :class:`~agent.readers.kernel.KernelLogReader`. ``\\r\\n`` and lone ``\\r`` end lines.
    Never raises on any ``str``; anything else gives ``[]``.
    """
    if not isinstance(text, str):
        return []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    events: list[FaultEvent] = []
    kernel = KernelLogReader()
    ctld = SlurmctldReader()
    i, n = 0, len(lines)
    plain_table_end = 0  # a boxed table already found not to be dcgmi's: read line by line
    json_ok: bool | None = None  # decided at the first line that opens a JSON object
    while i < n:
        line = lines[i]
        if line[:64].lstrip()[:1] == "{":
            if json_ok is None:
                json_ok = looks_like_dcgm_json(text)
            found = find_json(lines, i) if json_ok else None
            if found is not None:
                events.extend(kernel.flush())
                events.extend(ctld.flush())
                j = found[1]
                events.extend(parse_dcgm_json(found[0], "\n".join(lines[i:j])))
                i = j
                continue
        if is_slurm_start(line):
            events.extend(kernel.flush())
            events.extend(ctld.flush())
            j = i + 1
            while j < n and is_slurm_continuation(lines[j]):
                j += 1
            ev = parse_scontrol(lines[i:j])
            if ev is not None:
                events.append(ev)
            i = j
            continue
        cols = (
            header_columns(line)
            if len(line) <= 400 and ("NODELIST" in line or "HOSTNAME" in line)
            else None
        )
        if cols is not None:
            j = i + 1
            while j < n and is_sinfo_row(cols, lines[j]):
                j += 1
            if j > i + 1:
                events.extend(kernel.flush())
                events.extend(ctld.flush())
                events.extend(parse_sinfo(cols, lines[i + 1 : j]))
                i = j
                continue
        if i >= plain_table_end and is_table_line(line):
            j = i + 1
            while j < n and is_table_line(lines[j]):
                j += 1
            if is_dcgm_table(lines[i:j]):
                events.extend(kernel.flush())
                events.extend(ctld.flush())
                events.extend(parse_dcgm_diag(lines[i:j]))
                i = j
                continue
            plain_table_end = j
        got = ctld.feed(line)
        if got is not None:
            events.extend(kernel.flush())
            events.extend(got)
            i += 1
            continue
        if _starts_nvsmi(lines, i):
            events.extend(kernel.flush())
            events.extend(ctld.flush())
            j = i + 1
            while j < n and _continues_nvsmi(lines, j):
                j += 1
            events.extend(parse_nvsmi(lines[i:j]))
            i = j
            continue
        if ctld.pending:
            events.extend(ctld.flush())
        events.extend(kernel.feed(line))
        i += 1
    events.extend(kernel.flush())
    events.extend(ctld.flush())
    return events
