"""The named precondition checks of ``reset-gpu``; each returns a :class:`Check`.

Conditions come from nvidia-smi(1), ``-r/--gpu-reset`` (docs.nvidia.com/deploy/nvidia-smi):
"There can't be any applications using these devices (e.g. CUDA application, graphics
application like X server, monitoring application like other instance of nvidia-smi).
There also can't be any compute applications running on any other GPU in the system if
individual GPU reset is not feasible." Individual reset of NVLink-connected GPUs needs
Ampere or later, and on Ampere NVSwitch systems a running Fabric Manager.

A check that could not measure its condition answers ``ok=None`` (not a blocker: the
driver refuses an unsafe reset itself, and the command's output becomes the evidence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.gpureset.device import ARCH_ORDER, ResetDevice
from agent.gpureset.host import FABRIC_MANAGER, Holder
from agent.gpureset.result import Check
from agent.nvml import GpuInfo


def dev_path(gpu: GpuInfo) -> str | None:
    """``/dev/nvidia{minor}``, the node CUDA and NVML open; ``None`` when NVML gave no minor."""
    return None if gpu.minor is None else f"/dev/nvidia{gpu.minor}"


def gpu_label(gpu: GpuInfo) -> str:
    """``"gpu3 0000:c6:00"``."""
    return f"gpu{gpu.index} {gpu.pci}"


@dataclass
class Holders:
    """Who holds each GPU: NVML's process list and the ``/proc`` fd walk, split into
    ordinary users and NVIDIA daemons (:data:`agent.gpureset.host.DAEMONS`)."""

    by_path: dict[str, list[Holder]]
    unreadable: int = 0
    comm: dict[int, str] = field(default_factory=dict)

    def users(self, device: ResetDevice, gpu: GpuInfo) -> tuple[list[str], list[str]]:
        """``(holders, notes)`` of ``gpu`` that are not NVIDIA daemons, as ``"pid N (comm)"``."""
        notes: list[str] = []
        found: dict[int, str] = {}
        nvml = device.processes(gpu.index)
        if nvml is None:
            notes.append("NVML cannot list its processes")
        for pid in nvml or []:
            found[pid] = f"pid {pid} ({self.comm.get(pid, 'listed by NVML')})"
        path = dev_path(gpu)
        if path is None:
            notes.append("no device minor from NVML: /proc not searched")
        for h in self.by_path.get(path or "", []):
            if h.daemon is None:
                found[h.pid] = h.describe()
        return [found[p] for p in sorted(found)], notes

    def daemons(self, gpu: GpuInfo) -> list[Holder]:
        """NVIDIA daemons holding ``gpu``'s device node."""
        return [h for h in self.by_path.get(dev_path(gpu) or "", []) if h.daemon is not None]


def check_mig(device: ResetDevice, target: GpuInfo) -> Check:
    """MIG mode (current or pending) enabled → cannot run: the GPU and compute instances
    must be destroyed and MIG disabled first (``nvidia-smi mig -dci``, ``-dgi``,
    ``nvidia-smi -mig 0``), which would change the node's configuration."""
    mode = device.mig_mode(target.index)
    if mode is None:
        return Check("mig", True, "MIG not supported on this GPU")
    current, pending = mode
    if current or pending:
        return Check("mig", False,
                     f"MIG mode enabled (current={'on' if current else 'off'}, pending="
                     f"{'on' if pending else 'off'}): a reset needs every GPU and compute "
                     "instance destroyed and MIG disabled first; this command does not "
                     "change MIG configuration")
    return Check("mig", True, "MIG mode disabled")


def check_processes(device: ResetDevice, target: GpuInfo, holders: Holders) -> Check:
    """No process uses the GPU: NVML's running compute/graphics/MPS processes and every
    process with ``/dev/nvidiaN`` open (NVIDIA daemons are the ``services`` check)."""
    users, notes = holders.users(device, target)
    if holders.unreadable:
        notes.append(f"{holders.unreadable} process(es) could not be inspected")
    note = f" ({'; '.join(notes)})" if notes else ""
    if users:
        return Check("processes", False, f"{len(users)} process(es) hold {gpu_label(target)}: "
                     f"{', '.join(users)}{note}")
    if dev_path(target) is None and device.processes(target.index) is None:
        return Check("processes", None, f"could not tell who uses the GPU{note}")
    return Check("processes", True, f"no process holds {dev_path(target) or 'the GPU'}{note}")


def check_services(target: GpuInfo, holders: Holders, stop_allowed: bool,
                   dry_run: bool) -> tuple[Check, list[str]]:
    """NVIDIA daemons holding the GPU's device node (persistence daemon, DCGM host engine).

    Returns ``(check, units to stop)``. Without ``stop_allowed`` any such daemon fails the
    check naming it; with it, each must run under a systemd unit (stopped and restarted
    around the reset). Fabric Manager is never stopped (nvidia-smi(1): it facilitates the
    reset on Ampere NVSwitch systems) and never blocks.
    """
    daemons = holders.daemons(target)
    fm = [h for h in daemons if h.daemon == FABRIC_MANAGER]
    blocking = [h for h in daemons if h.daemon != FABRIC_MANAGER]
    fm_note = f"; {fm[0].describe()} left running (facilitates the reset)" if fm else ""
    if not blocking:
        return Check("services", True, f"no NVIDIA daemon holds the GPU{fm_note}"), []
    names = ", ".join(h.describe() for h in blocking)
    if not stop_allowed:
        return Check("services", False,
                     f"held by {names}; rerun with --stop-services to stop them through "
                     f"systemctl and restart them after the reset{fm_note}"), []
    outside = [h for h in blocking if h.unit is None]
    if outside:
        return Check("services", False,
                     f"{', '.join(h.describe() for h in outside)} run(s) outside systemd: "
                     f"stop it by hand{fm_note}"), []
    units = sorted({h.unit for h in blocking if h.unit})
    verb = "would stop" if dry_run else "stopping"
    return Check("services", True, f"held by {names}; {verb} {', '.join(units)} and "
                 f"restarting after the reset{fm_note}"), units


def single_reset_blocker(arch: str | None, on_fabric: bool, fm_active: bool | None) -> str | None:
    """Why one NVLink-connected GPU cannot be reset alone, or ``None`` (nvidia-smi(1)
    tables): pre-Ampere parts need every NVLink peer in the same command; Ampere NVSwitch
    systems need Fabric Manager running; Hopper and later do not."""
    if arch in ARCH_ORDER and ARCH_ORDER.index(arch) < ARCH_ORDER.index("ampere"):
        return (f"{arch} GPU with NVLink: every NVLink peer must be reset in the same "
                "command, so a single-GPU reset cannot run")
    if on_fabric and arch == "ampere" and fm_active is False:
        return ("Ampere NVSwitch system with Fabric Manager not running: every NVLink "
                "peer must be reset in the same command")
    return None


def check_nvlink(device: ResetDevice, target: GpuInfo, gpus: list[GpuInfo],
                 holders: Holders, nvswitches: list[str],
                 fm_active: bool | None) -> Check:
    """NVLink / NVSwitch baseboards: a single-GPU reset must be feasible and every other
    GPU of the baseboard idle (all GPUs on an NVSwitch fabric; the NVLink-active GPUs on a
    direct-NVLink board). Busy peers are named with their pids."""
    link = device.nvlink(target.index)
    on_fabric = link.to_switch or bool(nvswitches)
    if link.active_links == 0 and not on_fabric:
        return Check("nvlink", True, "no active NVLink and no NVSwitch: a standalone GPU")
    arch = device.architecture(target.index)
    why = single_reset_blocker(arch, on_fabric, fm_active)
    if why:
        return Check("nvlink", False, why)
    peers = [g for g in gpus if g.index != target.index]
    if not on_fabric:
        peers = [g for g in peers if device.nvlink(g.index).active_links > 0]
    busy = []
    for g in peers:
        users, _ = holders.users(device, g)
        if users:
            busy.append(f"{gpu_label(g)} ({', '.join(users)})")
    board = (f"NVSwitch baseboard ({len(nvswitches)} NVSwitch(es) on PCI"
             f"{', links to NVSwitch' if link.to_switch else ''})" if on_fabric
             else f"direct-NVLink board ({link.active_links} active links)")
    facts = f"{board}; architecture {arch or 'unknown'}"
    if on_fabric:
        fm = {True: "running", False: "not running", None: "unknown"}[fm_active]
        facts += f"; Fabric Manager {fm}"
    if busy:
        return Check("nvlink", False, f"{facts}; a single-GPU reset here needs every GPU of "
                     f"the baseboard idle, busy: {'; '.join(busy)}")
    return Check("nvlink", True, f"{facts}; {len(peers)} peer GPU(s) idle")


def read_comm(proc_root: Path, pids: list[int]) -> dict[int, str]:
    """``{pid: comm}`` for the pids whose ``/proc/PID/comm`` is readable (never raises)."""
    out: dict[int, str] = {}
    for pid in pids:
        try:
            out[pid] = (proc_root / str(pid) / "comm").read_text(errors="replace").strip()
        except OSError:
            continue
    return out
