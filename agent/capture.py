"""``autorepair-agent capture``: what a fault left on the node, written to one archive before
a disruptive action destroys it (docs/design.md §5 evidence capture).

What goes in (the tools together bounded by ``tool_timeout_s``: each gets what is left of
it, at least :data:`MIN_TOOL_S`; a tool that is missing, fails or runs out of time is a
note in the manifest, never a failed capture):

- ``nvidia-bug-report.sh`` where it is on ``PATH``: run with ``--output-file`` inside the
  work directory (it appends ``.gz`` when gzip is there; NVIDIA's report already holds
  ``nvidia-smi -q``, the kernel log and the driver state) → ``tool: nvidia-bug-report``;
- otherwise (``tool: fallback``): ``nvidia-smi -q`` → ``nvidia-smi-q.txt``; the kernel log
  since boot, ``journalctl -k -b --no-pager`` → ``kernel.log`` (else ``dmesg``, else what
  ``/dev/kmsg`` holds, read without blocking); the NVML counters the agent itself reads
  (:class:`agent.nvml.GpuSample` of each GPU) → ``nvml.json``.

Every archive carries ``manifest.json`` (repair id, host, boot id, time, tool, each
part's command, exit status and note). The archive is ``DIR/autorepair-evidence-
<repair>-<UTC time>.tar.gz``, written to a temporary name and renamed, so a reader never
sees half an archive. The printed result (one JSON object with ``--json``) is
``{"path", "size_bytes", "sha256", "tool", "collected_at", "notes"}``.

Exit codes: 0 archive written; 2 cannot run (the directory cannot be created or written;
the message names it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BUG_REPORT = "nvidia-bug-report.sh"
"""NVIDIA's bug report script (installed with the driver)."""
TOOL_TIMEOUT_S = 240.0
"""Seconds one tool may run by default: nvidia-bug-report.sh takes one to a few minutes
on an 8-GPU host; the control plane bounds the whole job (policy.evidence_capture.timeout_s
= 300) and passes a smaller value."""
MIN_TOOL_S = 5.0
"""Seconds a tool gets at least (the whole budget when smaller), even when the budget is
spent (a fallback after a ``nvidia-bug-report.sh`` that ran out of time still gets the
kernel log)."""
KMSG_MAX_BYTES = 16 * 1024 * 1024
"""Most bytes read from ``/dev/kmsg`` (the kernel's ring buffer is far smaller)."""
EXIT_OK = 0
EXIT_CANNOT_RUN = 2
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class Part:
    """One tool's run: its file in the archive (``None`` = nothing written), the command,
    exit status (``None``: did not run or timed out) and a note."""

    name: str
    file: str | None
    command: list[str]
    exit_status: int | None = None
    note: str = ""


@dataclass
class Capture:
    """The written archive (the command's result)."""

    path: str
    size_bytes: int
    sha256: str
    tool: str
    collected_at: str
    notes: list[str] = field(default_factory=list)


class CaptureError(RuntimeError):
    """The capture cannot run at all (the directory); the message names it."""


def _run(cmd: list[str], out: Path, timeout_s: float) -> tuple[int | None, str]:
    """Run ``cmd`` in its own process group with stdout to ``out``; (exit status, note).
    On timeout the whole group is killed (``nvidia-bug-report.sh`` starts many children).
    Never raises for the tool's own failure."""
    try:
        with out.open("wb") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                _, err_bytes = p.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                return None, f"{cmd[0]} did not finish within {timeout_s:g} s"
    except FileNotFoundError:
        return None, f"{cmd[0]} not found"
    except OSError as e:
        return None, f"{cmd[0]}: {e.strerror or e}"
    if p.returncode != 0:
        err = err_bytes.decode("utf-8", "replace").strip().splitlines()
        return p.returncode, f"{cmd[0]} exit {p.returncode}" + (f": {err[-1][:200]}" if err
                                                                 else "")
    return 0, ""


def _read_kmsg(path: Path, out: Path) -> str:
    """What ``path`` (``/dev/kmsg``) holds now, read without blocking; a note on failure."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    total = 0
    try:
        with out.open("wb") as f:
            while total < KMSG_MAX_BYTES:
                try:
                    rec = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError as e:  # EPIPE: a record overwritten while reading
                    if e.errno == 32:
                        continue
                    return f"{path}: {e.strerror or e}"
                if not rec:
                    break
                f.write(rec if rec.endswith(b"\n") else rec + b"\n")
                total += len(rec)
    finally:
        os.close(fd)
    return ""


def kernel_log(work: Path, timeout_s: float, kmsg: Path) -> Part:
    """The kernel log since boot: journalctl, else dmesg, else ``kmsg``."""
    out = work / "kernel.log"
    notes: list[str] = []
    for cmd in (["journalctl", "-k", "-b", "--no-pager"], ["dmesg"]):
        if shutil.which(cmd[0]) is None:
            notes.append(f"{cmd[0]} not found")
            continue
        rc, note = _run(cmd, out, timeout_s)
        if rc == 0:
            return Part("kernel_log", out.name, cmd, 0, "; ".join(notes))
        notes.append(note)
    note = _read_kmsg(kmsg, out)
    if not note:
        return Part("kernel_log", out.name, [str(kmsg)], 0, "; ".join(notes))
    out.unlink(missing_ok=True)
    return Part("kernel_log", None, [str(kmsg)], None, "; ".join([*notes, note]))


def nvml_counters(work: Path, sample: Callable[[], list[dict[str, Any]]]) -> Part:
    """The agent's NVML counters of every GPU (``nvml.json``)."""
    out = work / "nvml.json"
    try:
        rows = sample()
    except Exception as e:  # NVML missing or failing: a note, the capture goes on
        return Part("nvml", None, ["nvml"], None, f"NVML: {type(e).__name__}: {e}")
    out.write_text(json.dumps(rows, indent=1, default=str))
    return Part("nvml", out.name, ["nvml"], 0)


def nvml_sample(backend: str = "nvml", gpus: int = 8) -> list[dict[str, Any]]:
    """One :class:`agent.nvml.GpuSample` per GPU from ``backend`` (nvml | simulated), as
    dicts. Raises what the backend raises (``BackendUnavailable`` without NVML)."""
    from agent.nvml import make_backend

    b = make_backend(backend, gpu_count=gpus)
    b.open()
    try:
        return [asdict(s) for s in b.sample()]
    finally:
        b.close()


def capture(
    directory: Path, repair_id: str, *, tool_timeout_s: float = TOOL_TIMEOUT_S,
    kmsg: Path = Path("/dev/kmsg"), sample: Callable[[], list[dict[str, Any]]] = nvml_sample,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Capture:
    """Write the archive of the module docstring under ``directory`` for ``repair_id``.
    Raises :class:`CaptureError` naming the directory when it cannot be created or
    written; ``ValueError`` naming ``repair_id`` when it is empty."""
    if not repair_id.strip():
        raise ValueError(f"--repair: {repair_id!r} is empty")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".capture-", dir=directory))
    except OSError as e:
        raise CaptureError(f"--dir {directory}: {e.strerror or e}") from None
    deadline = time.monotonic() + tool_timeout_s

    def left() -> float:
        return max(min(MIN_TOOL_S, tool_timeout_s), deadline - time.monotonic())

    try:
        at = now()
        parts: list[Part] = []
        bug = shutil.which(BUG_REPORT)
        tool = "fallback"
        if bug is not None:
            target = work / "nvidia-bug-report.log"
            cmd = [bug, "--output-file", str(target)]
            rc, note = _run(cmd, work / "nvidia-bug-report.stdout", left())
            made = next((p for p in (work / "nvidia-bug-report.log.gz", target) if p.exists()),
                        None)
            parts.append(Part("nvidia_bug_report", made.name if made else None, cmd, rc, note))
            if made is not None:
                tool = "nvidia-bug-report"
        if tool == "fallback":
            if shutil.which("nvidia-smi") is None:
                parts.append(Part("nvidia_smi", None, ["nvidia-smi", "-q"], None,
                                  "nvidia-smi not found"))
            else:
                rc, note = _run(["nvidia-smi", "-q"], work / "nvidia-smi-q.txt", left())
                parts.append(Part("nvidia_smi", "nvidia-smi-q.txt", ["nvidia-smi", "-q"], rc,
                                  note))
            parts.append(kernel_log(work, left(), kmsg))
            parts.append(nvml_counters(work, sample))
        manifest = {"repair_id": repair_id, "host": socket.gethostname(),
                    "boot_id": _boot_id(), "collected_at": at.isoformat(), "tool": tool,
                    "parts": [asdict(p) for p in parts]}
        (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
        stamp = at.strftime("%Y%m%dT%H%M%SZ")
        final = directory / f"autorepair-evidence-{_SAFE.sub('_', repair_id)}-{stamp}.tar.gz"
        tmp = directory / f".{final.name}.part"
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(work / "manifest.json", arcname="manifest.json")
            for p in parts:
                if p.file is not None and (work / p.file).exists():
                    tar.add(work / p.file, arcname=p.file)
        os.replace(tmp, final)
    except OSError as e:
        raise CaptureError(f"--dir {directory}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    h = hashlib.sha256()
    with final.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return Capture(path=str(final), size_bytes=final.stat().st_size, sha256=h.hexdigest(),
                   tool=tool, collected_at=at.isoformat(),
                   notes=[f"{p.name}: {p.note}" for p in parts if p.note])


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def run_capture(*, directory: Path, repair_id: str, json_out: bool, tool_timeout_s: float,
                backend: str, kmsg: Path) -> int:
    """The command: capture, print the result; exit code of the module docstring."""
    import typer

    try:
        got = capture(directory, repair_id, tool_timeout_s=tool_timeout_s, kmsg=kmsg,
                      sample=lambda: nvml_sample(backend))
    except (CaptureError, ValueError) as e:
        if json_out:
            typer.echo(json.dumps({"error": str(e)}))
        typer.echo(f"error: {e}", err=True)
        return EXIT_CANNOT_RUN
    if json_out:
        typer.echo(json.dumps(asdict(got)))
    else:
        typer.echo(f"{got.path} ({got.size_bytes} bytes, sha256 {got.sha256}, {got.tool})")
        for n in got.notes:
            typer.echo(f"note: {n}")
    return EXIT_OK
