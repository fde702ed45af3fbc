"""Host samplers: CPU contention (PSI, /proc/stat fallback), memory, ids, InfiniBand.

All readers take a root directory so tests point them at a real temporary tree.
A reader that cannot read its file raises :class:`HostReadError` (the agent then treats
that signal as unknown, never as a low value).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class HostReadError(RuntimeError):
    """A host file could not be read or parsed; the message names the file."""


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise HostReadError(f"{path}: {exc.strerror or exc}") from exc


@dataclass
class CpuSampler:
    """CPU availability in [0, 1].

    Primary: ``/proc/pressure/cpu`` ``some avg10`` (percent of the last 10 s in which at
    least one runnable task waited for a CPU; kernel PSI docs) → ``1 - avg10/100``.
    Fallback when PSI is absent (kernel without ``CONFIG_PSI`` or ``psi=0``):
    ``procs_running`` from ``/proc/stat`` against the CPU count →
    ``min(1, ncpu / procs_running)`` (run-queue share a runnable task gets).
    """

    proc_root: str = "/proc"
    ncpu: int | None = None

    def __post_init__(self) -> None:
        self.source = "psi"
        self._ncpu = self.ncpu or os.cpu_count() or 1

    def read(self) -> float:
        root = Path(self.proc_root)
        if self.source == "psi":
            try:
                return _parse_psi_some_avg10(_read(root / "pressure" / "cpu"))
            except HostReadError:
                self.source = "stat"
        text = _read(root / "stat")
        for line in text.splitlines():
            if line.startswith("procs_running "):
                running = max(1, int(line.split()[1]))
                return min(1.0, self._ncpu / running)
        raise HostReadError(f"{root / 'stat'}: no procs_running line")


def _parse_psi_some_avg10(text: str) -> float:
    for line in text.splitlines():
        if line.startswith("some "):
            for part in line.split()[1:]:
                key, _, value = part.partition("=")
                if key == "avg10":
                    return max(0.0, min(1.0, 1.0 - float(value) / 100.0))
    raise HostReadError(f"PSI: no 'some avg10' in {text[:80]!r}")


def memory_available_fraction(proc_root: str = "/proc") -> float:
    """``MemAvailable / MemTotal`` from ``/proc/meminfo`` in [0, 1].

    Raises :class:`HostReadError` when the file or the fields are missing.
    """
    path = Path(proc_root) / "meminfo"
    values: dict[str, int] = {}
    for line in _read(path).splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            values[key] = int(rest.split()[0])
    if values.get("MemTotal", 0) <= 0 or "MemAvailable" not in values:
        raise HostReadError(f"{path}: MemTotal/MemAvailable missing")
    return max(0.0, min(1.0, values["MemAvailable"] / values["MemTotal"]))


def boot_id(proc_root: str = "/proc") -> str:
    """``/proc/sys/kernel/random/boot_id`` (changes on every boot; docs/design.md §4.3)."""
    return _read(Path(proc_root) / "sys" / "kernel" / "random" / "boot_id").strip()


def machine_id(path: str = "/etc/machine-id") -> str | None:
    """systemd machine id (``host.id``), or None when absent/unreadable."""
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class IbPort:
    """One InfiniBand port as sysfs shows it."""

    device: str
    port: int
    state: str  # e.g. "ACTIVE", "DOWN", "INIT"
    phys_state: str  # e.g. "LinkUp", "Polling", "Disabled"
    link_downed: int | None  # counters/link_downed (cumulative link-down transitions)


def read_ib_ports(root: str = "/sys/class/infiniband") -> list[IbPort]:
    """Every port under ``{root}/{dev}/ports/{n}``; [] when the root does not exist.

    ``state`` files read like ``4: ACTIVE``; ``phys_state`` like ``5: LinkUp``.
    Raises :class:`HostReadError` when a port's state file is unreadable.
    """
    base = Path(root)
    if not base.is_dir():
        return []
    ports: list[IbPort] = []
    for dev in sorted(p for p in base.iterdir() if (p / "ports").is_dir()):
        for port_dir in sorted((dev / "ports").iterdir(), key=lambda p: p.name):
            if not port_dir.name.isdigit():
                continue
            state = _read(port_dir / "state").strip().partition(":")[2].strip()
            phys = ""
            if (port_dir / "phys_state").exists():
                phys = _read(port_dir / "phys_state").strip().partition(":")[2].strip()
            downed: int | None = None
            counter = port_dir / "counters" / "link_downed"
            if counter.exists():
                try:
                    downed = int(_read(counter).strip())
                except ValueError:
                    downed = None
            ports.append(IbPort(dev.name, int(port_dir.name), state, phys, downed))
    return ports


@dataclass
class IbWatcher:
    """Turns successive :func:`read_ib_ports` snapshots into link events.

    Yields ``(kind, port, flaps)`` with kind ``ib_link_down`` when a port leaves ACTIVE
    or its ``link_downed`` counter rises (a flap, even if it is ACTIVE again), and
    ``ib_link_up`` when a port that was reported down is ACTIVE again.

    ``announce_first``: a port's first snapshot that is ACTIVE also yields ``ib_link_up``
    (its clear), so a started agent sends the current state of every port once (I20: a
    restarted agent clears an ``ib_link_down`` its predecessor raised if the link came
    back while no agent ran); a first snapshot not ACTIVE yields ``ib_link_down`` either way.
    """

    root: str = "/sys/class/infiniband"
    announce_first: bool = False

    def __post_init__(self) -> None:
        self._last: dict[tuple[str, int], IbPort] = {}
        self._down: set[tuple[str, int]] = set()

    def poll(self) -> list[tuple[str, IbPort, int]]:
        events: list[tuple[str, IbPort, int]] = []
        for port in read_ib_ports(self.root):
            if not port.state:
                continue  # an empty or unparseable state file: unknown, never "down"
            key = (port.device, port.port)
            prev = self._last.get(key)
            self._last[key] = port
            flaps = 0
            if prev is not None and prev.link_downed is not None and port.link_downed is not None:
                flaps = max(0, port.link_downed - prev.link_downed)
            active = port.state == "ACTIVE"
            if (not active or flaps) and key not in self._down:
                self._down.add(key)
                events.append(("ib_link_down", port, flaps))
            elif active and key in self._down and not flaps:
                self._down.discard(key)
                events.append(("ib_link_up", port, 0))
            elif active and prev is None and self.announce_first:
                events.append(("ib_link_up", port, 0))
        return events
