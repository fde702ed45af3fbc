"""The reset job's script and the reading of its output (pure; no I/O).

The job runs ``ResetGpuConfig.command`` once per GPU, one after the other, each followed
by a marker line carrying its exit status::

    autorepair-reset-gpu --pci 0000:18:00 --json; echo "autorepair-reset-exit 0 $?"

so the output splits into one segment per GPU. A segment's last line that is a JSON
object with a ``result`` is the agent's result (``autorepair-agent reset-gpu --json``,
docs/design.md §4.1: ``{"pci","result","reason","checks","before","after","duration_s"}``);
without one (``nvidia-smi --gpu-reset``) the exit status decides: 0 done, 2 cannot run,
anything else failed (docs/design.md §4.1 exit codes).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DONE = "done"
FAILED = "failed"
CANNOT_RUN = "cannot_run"
#: Exit status → result when the command printed no agent JSON (docs/design.md §4.1).
EXIT_RESULT = {0: DONE, 2: CANNOT_RUN}
#: Marker line after each GPU's command: ``autorepair-reset-exit <position> <status>``.
MARKER = "autorepair-reset-exit"
_MARKER_RE = re.compile(rf"^{MARKER} (\d+) (\d+)\s*$")
#: Characters of a command's raw output kept as evidence when it printed no JSON.
TAIL_CHARS = 1500


@dataclass
class GpuReset:
    """One GPU's outcome: ``result`` (done | failed | cannot_run), ``reason``, the exit
    status (``None``: the job ended before the command returned) and ``evidence`` (the
    agent's JSON object, or ``{"output": tail}``)."""

    gpu: str
    result: str
    reason: str
    exit_status: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """``"GPU 0000:18:00: failed (exit 1): <reason>"``."""
        rc = "no exit status" if self.exit_status is None else f"exit {self.exit_status}"
        return f"GPU {self.gpu}: {self.result} ({rc}): {self.reason}"


def gpu_command(command: Sequence[str], gpu: str, pci: str | None) -> list[str]:
    """``command`` with ``{gpu}`` → ``gpu`` and ``{pci}`` → ``pci``. Raises ``ValueError``
    naming the GPU when ``{pci}`` is needed but the evidence gave no PCI address."""
    if pci is None and any("{pci}" in a for a in command):
        raise ValueError(
            f"GPU {gpu!r} is not a PCI address and the reset command needs {{pci}}"
        )
    return [a.replace("{gpu}", gpu).replace("{pci}", pci or "") for a in command]


def reset_script(commands: Sequence[Sequence[str]]) -> str:
    """A POSIX ``sh`` script running each command in turn, each followed by its marker."""
    return "\n".join(
        f'{shlex.join(cmd)}; echo "{MARKER} {i} $?"' for i, cmd in enumerate(commands)
    )


def _agent_result(lines: list[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        s = line.strip()
        if not (s.startswith("{") and s.endswith("}")):
            continue
        try:
            data = json.loads(s)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("result"), str):
            return data
    return None


def _outcome(gpu: str, status: int, lines: list[str]) -> GpuReset:
    data = _agent_result(lines)
    if data is None:
        tail = "\n".join(lines).strip()[-TAIL_CHARS:]
        result = EXIT_RESULT.get(status, FAILED)
        return GpuReset(gpu, result, f"exit {status}; output: {tail or '(none)'}", status,
                        {"output": tail})
    result = data["result"]
    reason = str(data.get("reason") or "")
    if result == "ready":  # a --dry-run command: every check passed, nothing was reset
        return GpuReset(gpu, CANNOT_RUN, f"the command ran a dry run, nothing was reset: "
                        f"{reason}", status, data)
    if result not in (DONE, FAILED, CANNOT_RUN):
        result = EXIT_RESULT.get(status, FAILED)
        reason = f"unknown result {data['result']!r}; {reason}"
    return GpuReset(gpu, result, reason, status, data)


def parse_reset_output(text: str, gpus: Sequence[str]) -> list[GpuReset]:
    """One :class:`GpuReset` per entry of ``gpus`` from the job's whole output. A GPU whose
    marker is missing (job killed, timed out) is ``failed`` with the output seen. Never
    raises."""
    found: dict[int, GpuReset] = {}
    seg: list[str] = []
    for line in text.splitlines():
        m = _MARKER_RE.match(line.strip())
        if m is None:
            seg.append(line)
            continue
        i, status = int(m[1]), int(m[2])
        if 0 <= i < len(gpus) and i not in found:
            found[i] = _outcome(gpus[i], status, seg)
        seg = []
    out: list[GpuReset] = []
    for i, gpu in enumerate(gpus):
        if i in found:
            out.append(found[i])
            continue
        data = _agent_result(seg)
        tail = "\n".join(seg).strip()[-TAIL_CHARS:]
        out.append(GpuReset(gpu, FAILED, "the reset job ended before the command returned; "
                            f"output: {tail or '(none)'}", None,
                            data or {"output": tail}))
        seg = []
    return out
