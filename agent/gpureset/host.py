"""Host side of a GPU reset: the ``--pci`` argument, who holds a GPU's device node
(``/proc/*/fd``), NVSwitch devices on the PCI bus (sysfs) and systemd units (``systemctl``).

Readers here never raise on what they read: an unreadable ``/proc`` entry is counted, a
missing sysfs tree means "none found". Roots are parameters so tests plant their own trees.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: ``domain:bus:device.function`` with optional domain (4 or 8 hex digits, as NVML prints)
#: and optional function; bus 00-ff, device 00-1f (PCI Local Bus spec: 256 buses, 32 devices).
_PCI = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<dev>[0-9a-f]{1,2})"
    r"(?:\.(?P<fn>[0-7]))?$"
)

#: ``/proc/PID/comm`` of the NVIDIA daemons that keep GPU device nodes open (the kernel
#: truncates comm to 15 characters): the persistence daemon, DCGM's host engine and Fabric
#: Manager. Sources: NVIDIA driver persistence docs (``nvidia-persistenced``), DCGM user
#: guide (``nv-hostengine``), Fabric Manager user guide (``nv-fabricmanager``).
DAEMONS: dict[str, str] = {
    "nvidia-persiste": "nvidia-persistenced",
    "nv-hostengine": "nv-hostengine",
    "nv-fabricmanage": "nv-fabricmanager",
}
#: Fabric Manager is never stopped: nvidia-smi(1), ``--gpu-reset``: "On Ampere NVSwitch
#: systems, Fabric Manager is required to facilitate reset"; without it every NVLink peer
#: must be reset in the same command.
FABRIC_MANAGER = "nv-fabricmanager"
#: The systemd unit Fabric Manager's packages install.
FABRIC_MANAGER_UNIT = "nvidia-fabricmanager.service"

#: PCI vendor id of NVIDIA and the class of an NVSwitch (0x0680: bridge, "other").
NVIDIA_VENDOR = "0x10de"
NVSWITCH_CLASS_PREFIX = "0x0680"


def parse_pci_arg(text: str) -> str:
    """A GPU's PCI address as typed → the kernel-log form ``"0000:c6:00"``.

    Accepts ``0000:c6:00``, ``0000:C6:00.0``, ``c6:00.0``, ``00000000:C6:00.0`` (NVML's
    8-digit domain). Raises ``ValueError`` naming ``--pci`` and the value when it is not a
    PCI address, or names a function other than 0 (a GPU is function 0; ``.1`` is its
    HDMI audio function on boards that have one).
    """
    raw = text
    m = _PCI.match(text.strip().lower())
    if m is None:
        raise ValueError(
            f"--pci: expected a PCI address like 0000:c6:00.0 or c6:00.0, got {raw!r}"
        )
    if m.group("fn") not in (None, "0"):
        raise ValueError(f"--pci: a GPU is PCI function 0, got function {m.group('fn')} "
                         f"in {raw!r}")
    domain = int(m.group("domain") or "0", 16)
    if domain > 0xFFFF:
        raise ValueError(f"--pci: PCI domain above ffff in {raw!r}")
    dev = int(m.group("dev"), 16)
    if dev > 0x1F:
        raise ValueError(f"--pci: PCI device number above 1f in {raw!r}")
    return f"{domain:04x}:{int(m.group('bus'), 16):02x}:{dev:02x}"


@dataclass(frozen=True)
class Holder:
    """A process with a GPU device node open. ``unit``: its systemd service, if any."""

    pid: int
    comm: str
    unit: str | None

    @property
    def daemon(self) -> str | None:
        """Name of the NVIDIA daemon this is (:data:`DAEMONS`), else ``None``."""
        return DAEMONS.get(self.comm)

    def describe(self) -> str:
        """``"pid 4242 (python3)"``; with a unit
        ``"pid 17 (nvidia-persiste, nvidia-persistenced.service)"``."""
        unit = f", {self.unit}" if self.unit else ""
        return f"pid {self.pid} ({self.comm}{unit})"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def unit_of(proc_root: Path, pid: int) -> str | None:
    """The systemd service a process runs in, from ``/proc/PID/cgroup`` (cgroup v1 or v2:
    the last path component ending in ``.service``); ``None`` when not under a service."""
    text = _read(proc_root / str(pid) / "cgroup") or ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        units = [part for part in path.split("/") if part.endswith(".service")]
        if units:
            return units[-1]
    return None


def device_holders(
    proc_root: Path, device_paths: set[str], exclude_pids: frozenset[int] = frozenset()
) -> tuple[dict[str, list[Holder]], int]:
    """Which processes have each of ``device_paths`` (e.g. ``/dev/nvidia3``) open.

    Walks ``proc_root/<pid>/fd/*`` links (what ``fuser /dev/nvidia3`` does). Returns
    ``({device_path: [Holder, ...]}, unreadable)`` where ``unreadable`` counts processes
    whose fd table could not be read (not root, or the process exited mid-walk). Never
    raises.
    """
    found: dict[str, list[Holder]] = {p: [] for p in device_paths}
    unreadable = 0
    try:
        entries = [e for e in os.scandir(proc_root) if e.name.isdigit()]
    except OSError:
        return found, 0
    for entry in entries:
        pid = int(entry.name)
        if pid in exclude_pids:
            continue
        fd_dir = Path(entry.path) / "fd"
        try:
            fds = list(os.scandir(fd_dir))
        except OSError:
            unreadable += 1
            continue
        hit: set[str] = set()
        for fd in fds:
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target in found:
                hit.add(target)
        if not hit:
            continue
        comm = (_read(Path(entry.path) / "comm") or "?").strip() or "?"
        holder = Holder(pid, comm, unit_of(proc_root, pid))
        for path in sorted(hit):
            found[path].append(holder)
    return found, unreadable


def nvswitch_devices(sys_root: Path) -> list[str]:
    """PCI addresses of NVSwitches under ``sys_root/bus/pci/devices`` (vendor 0x10de,
    class 0x0680xx). Third-generation NVSwitches (HGX A100/H100) appear here; fourth-
    generation ones (HGX B200) are managed out of band and do not (NVIDIA Fabric Manager
    user guide, "NVSwitch core software stack"), so NVML's NVLink remote device type is
    checked too. Never raises; ``[]`` when the tree is absent."""
    base = sys_root / "bus" / "pci" / "devices"
    out: list[str] = []
    try:
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except OSError:
        return out
    for e in entries:
        vendor = (_read(Path(e.path) / "vendor") or "").strip().lower()
        cls = (_read(Path(e.path) / "class") or "").strip().lower()
        if vendor == NVIDIA_VENDOR and cls.startswith(NVSWITCH_CLASS_PREFIX):
            out.append(e.name)
    return out


class Systemctl:
    """``systemctl`` as a subprocess (path injectable for tests), with a timeout.

    ``available`` is false when the binary is not found; then :meth:`is_active` answers
    ``None`` and :meth:`stop` / :meth:`start` report failure without running anything.
    """

    def __init__(self, path: str = "systemctl", timeout_s: float = 60.0) -> None:
        self.path = shutil.which(path) or (path if Path(path).is_file() else None)
        self.timeout_s = timeout_s

    @property
    def available(self) -> bool:
        return self.path is not None

    def _run(self, *args: str) -> tuple[int | None, str]:
        if self.path is None:
            return None, "systemctl not found"
        try:
            cp = subprocess.run([self.path, *args], capture_output=True, text=True,
                                timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None, f"systemctl {' '.join(args)}: timed out after {self.timeout_s:.0f} s"
        except OSError as exc:
            return None, f"systemctl {' '.join(args)}: {exc}"
        return cp.returncode, (cp.stdout + cp.stderr).strip()

    def is_active(self, unit: str) -> bool | None:
        """``True`` active, ``False`` anything else, ``None`` when systemctl cannot tell."""
        rc, out = self._run("is-active", unit)
        if rc is None:
            return None
        return rc == 0 and out.splitlines()[:1] == ["active"]

    def stop(self, unit: str) -> tuple[bool, str]:
        """``systemctl stop UNIT`` → ``(ok, output)``."""
        rc, out = self._run("stop", unit)
        return rc == 0, out

    def start(self, unit: str) -> tuple[bool, str]:
        """``systemctl start UNIT`` → ``(ok, output)``."""
        rc, out = self._run("start", unit)
        return rc == 0, out
