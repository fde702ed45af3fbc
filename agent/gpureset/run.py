"""``reset-gpu``: preconditions, the reset, the wait for the GPU and the read-back.

Order: resolve ``--pci`` → open NVML → checks (``pci``, ``reset_tool``, ``mig``,
``processes``, ``services``, ``nvlink``) → read ``before`` → (dry run stops here) → close
NVML → stop services (``--stop-services`` only) → reset command → re-open NVML until the
GPU is back by PCI bus id → read ``after`` (``recovery_action``, ``remap``,
``ecc_volatile``) → restart the stopped services. Exit 0 done, 1 failed, 2 cannot run
(docs/design.md §4.1); nothing is touched before every precondition has passed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.gpureset.checks import (
    Holders,
    check_mig,
    check_nvlink,
    check_processes,
    check_services,
    dev_path,
    gpu_label,
    read_comm,
)
from agent.gpureset.command import Resetter, explain_returncode
from agent.gpureset.device import ResetDevice, find_gpu
from agent.gpureset.host import (
    FABRIC_MANAGER,
    FABRIC_MANAGER_UNIT,
    Systemctl,
    device_holders,
    nvswitch_devices,
    parse_pci_arg,
)
from agent.gpureset.result import CANNOT_RUN, DONE, FAILED, READY, Check, ResetResult
from agent.nvml import BackendUnavailable, GpuInfo, GpuState, SampleError, recovery_action_name

#: Characters of the reset command's output kept in the evidence (its end matters most).
OUTPUT_CHARS = 2000


@dataclass
class ResetOptions:
    """Inputs of one run. Units: seconds.

    ``wait_timeout_s`` bounds how long the GPU may take to reappear in NVML after the
    reset command returns; 60 s is an engineering choice (a function-level reset and the
    driver's re-initialisation take seconds on H100/A100 boards).
    """

    pci: str
    stop_services: bool = False
    dry_run: bool = False
    wait_timeout_s: float = 60.0
    poll_interval_s: float = 1.0
    proc_root: Path = field(default_factory=lambda: Path("/proc"))
    sys_root: Path = field(default_factory=lambda: Path("/sys"))

    def __post_init__(self) -> None:
        if self.wait_timeout_s < 0:
            raise ValueError(f"--wait-timeout: must be >= 0 seconds, got {self.wait_timeout_s!r}")
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s: must be > 0, got {self.poll_interval_s!r}")


def _state(gpu: GpuInfo, state: GpuState) -> dict[str, Any]:
    return {"index": gpu.index, "uuid": gpu.uuid, **state.to_dict()}


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= OUTPUT_CHARS else "[…] " + text[-OUTPUT_CHARS:]


def readback(before: GpuState | None, after: GpuState) -> list[Check]:
    """The three read-back checks: recovery action none, no remap pending (and no remap
    failure), volatile ECC counters zero. A value NVML does not report gives ``ok=None``."""
    checks: list[Check] = []
    was = "" if before is None else f" (was {recovery_action_name(before.recovery_action)})"
    if after.recovery_action is None:
        checks.append(Check("recovery_action", None, "not reported by this driver/binding "
                            "(NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION); skipped"))
    elif after.recovery_action == 0:
        checks.append(Check("recovery_action", True, f"none{was}"))
    else:
        checks.append(Check("recovery_action", False,
                            f"still {recovery_action_name(after.recovery_action)}{was}"))
    if after.remap_pending is None:
        checks.append(Check("remap", None, "row remapping not reported (Ampere and later)"))
    elif after.remap_failure:
        checks.append(Check("remap", False, "row-remapping failure: a reset cannot clear it"))
    elif after.remap_pending:
        checks.append(Check("remap", False, "row remap still pending after the reset"))
    else:
        pend = "" if before is None or not before.remap_pending else " (was pending)"
        checks.append(Check("remap", True, f"no remap pending{pend}"))
    corr, unc = after.ecc_volatile_corrected, after.ecc_volatile_uncorrected
    counts = f"corrected={corr}, uncorrected={unc}"
    if corr is None and unc is None:
        checks.append(Check("ecc_volatile", None, "volatile ECC counters not reported"))
    elif (corr or 0) or (unc or 0):
        checks.append(Check("ecc_volatile", False, f"volatile ECC counters not reset: {counts}"))
    else:
        checks.append(Check("ecc_volatile", True, f"volatile ECC counters reset ({counts})"))
    return checks


class _Run:
    """One run's state; :meth:`execute` returns the :class:`ResetResult`."""

    def __init__(self, opts: ResetOptions, device: ResetDevice, resetter: Resetter,
                 systemctl: Systemctl, sleep: Callable[[float], None],
                 clock: Callable[[], float]) -> None:
        self.opts, self.device, self.resetter = opts, device, resetter
        self.systemctl, self.sleep, self.clock = systemctl, sleep, clock
        self.t0 = clock()
        self.checks: list[Check] = []
        self.pci = opts.pci
        self.before: dict[str, Any] = {}
        self.after: dict[str, Any] = {}
        self._before_state: GpuState | None = None

    def done(self, result: str, reason: str) -> ResetResult:
        return ResetResult(self.pci, result, reason, self.checks, self.before, self.after,
                           round(self.clock() - self.t0, 3))

    def cannot_run(self) -> ResetResult:
        failed = [c for c in self.checks if c.ok is False]
        return self.done(CANNOT_RUN, "; ".join(f"{c.name}: {c.detail}" for c in failed))

    def holders(self, gpus: list[GpuInfo]) -> Holders:
        paths = {p for p in (dev_path(g) for g in gpus) if p}
        by_path, unreadable = device_holders(self.opts.proc_root, paths,
                                             frozenset({os.getpid()}))
        pids: list[int] = []
        for g in gpus:
            pids.extend(self.device.processes(g.index) or [])
        return Holders(by_path, unreadable, read_comm(self.opts.proc_root, pids))

    def execute(self) -> ResetResult:
        try:
            self.pci = parse_pci_arg(self.opts.pci)
        except ValueError as exc:
            self.checks.append(Check("pci", False, str(exc)))
            return self.cannot_run()
        try:
            self.device.open()
        except BackendUnavailable as exc:
            self.checks.append(Check("nvml", False, str(exc)))
            return self.cannot_run()
        units: list[str] = []
        try:
            try:
                target, units = self.preconditions()
            except SampleError as exc:
                self.checks.append(Check("nvml", False, f"NVML read failed: {exc}"))
                return self.cannot_run()
            if target is None or any(c.ok is False for c in self.checks):
                return self.cannot_run()
            if self.opts.dry_run:
                return self.done(READY, "dry run: every precondition met; nothing stopped, "
                                        "no reset run")
        finally:
            self.device.close()  # an NVML client holds the device: release it
        return self.act(target, units)

    def preconditions(self) -> tuple[GpuInfo | None, list[str]]:
        dev = self.device
        gpus = dev.gpus()
        target = find_gpu(dev, self.pci)
        if target is None:
            seen = ", ".join(gpu_label(g) for g in gpus) or "none"
            self.checks.append(Check("pci", False, f"no GPU at {self.pci} (NVML sees: {seen})"))
            return None, []
        self.checks.append(Check("pci", True, f"{gpu_label(target)} {target.uuid} "
                                 f"{dev_path(target) or '(no device minor)'}"))
        why = self.resetter.preflight()
        self.checks.append(Check("reset_tool", why is None, why or self.resetter.describe()))
        holders = self.holders(gpus)
        self.checks.append(check_mig(dev, target))
        self.checks.append(check_processes(dev, target, holders))
        svc, units = check_services(target, holders, self.opts.stop_services,
                                    self.opts.dry_run)
        self.checks.append(svc)
        nvswitches = nvswitch_devices(self.opts.sys_root)
        link = dev.nvlink(target.index)
        fm_active = None
        if link.to_switch or nvswitches:
            fm_active = self.systemctl.is_active(FABRIC_MANAGER_UNIT)
        self.checks.append(check_nvlink(dev, target, gpus, holders, nvswitches, fm_active))
        self._before_state = dev.gpu_state(target.index)
        self.before = _state(target, self._before_state)
        return target, units

    def stop_services(self, units: list[str]) -> list[str]:
        stopped: list[str] = []
        for unit in units:
            ok, out = self.systemctl.stop(unit)
            if not ok:
                self.checks.append(Check("stop_services", False,
                                         f"systemctl stop {unit} failed: {_clip(out)}"))
                return stopped
            stopped.append(unit)
        self.checks.append(Check("stop_services", True, f"stopped {', '.join(stopped)}"))
        return stopped

    def restart(self, stopped: list[str]) -> None:
        bad = []
        for unit in stopped:
            ok, out = self.systemctl.start(unit)
            if not ok:
                bad.append(f"{unit}: {_clip(out) or 'failed'}")
        if bad:
            self.checks.append(Check("restart_services", False,
                                     f"systemctl start failed: {'; '.join(bad)}"))
        else:
            self.checks.append(Check("restart_services", True,
                                     f"started {', '.join(stopped)}"))

    def still_held(self, target: GpuInfo) -> list[str]:
        path = dev_path(target)
        if path is None:
            return []
        by_path, _ = device_holders(self.opts.proc_root, {path}, frozenset({os.getpid()}))
        return [h.describe() for h in by_path[path] if h.daemon != FABRIC_MANAGER]

    def wait_back(self) -> tuple[GpuInfo | None, float]:
        """Re-initialise NVML until the GPU is enumerated at its PCI address again."""
        t_start = self.clock()
        deadline = t_start + self.opts.wait_timeout_s
        while True:
            try:
                self.device.open()
                found = find_gpu(self.device, self.pci)
                if found is not None:
                    return found, self.clock() - t_start
            except (BackendUnavailable, SampleError):
                pass
            self.device.close()
            if self.clock() >= deadline:
                return None, self.clock() - t_start
            self.sleep(self.opts.poll_interval_s)

    def act(self, target: GpuInfo, units: list[str]) -> ResetResult:
        stopped: list[str] = []
        ok, back = False, None
        try:
            if units:
                stopped = self.stop_services(units)
                if len(stopped) < len(units):
                    return self.cannot_run()
                held = self.still_held(target)
                if held:
                    self.checks.append(Check("processes_after_stop", False,
                                             f"still held after stopping services: "
                                             f"{', '.join(held)}"))
                    return self.cannot_run()
            cmd = self.resetter(self.pci)
            ok = cmd.returncode == 0
            self.checks.append(Check(
                "reset", ok, f"{' '.join(cmd.argv)}: {explain_returncode(cmd.returncode)} "
                f"after {cmd.duration_s:.1f} s; output: {_clip(cmd.output) or '(none)'}"))
            back, waited = self.wait_back()
            if back is None:
                self.checks.append(Check("gpu_back", False, f"{self.pci} not visible to NVML "
                                         f"{waited:.1f} s after the reset command"))
            else:
                self.checks.append(Check("gpu_back", True, f"{gpu_label(back)} back after "
                                         f"{waited:.1f} s"))
                try:
                    after = self.device.gpu_state(back.index)
                    self.after = _state(back, after)
                    self.checks.extend(readback(self._before_state, after))
                except SampleError as exc:
                    self.checks.append(Check("readback", False, f"NVML read failed: {exc}"))
                finally:
                    self.device.close()
        finally:
            if stopped:
                self.restart(stopped)
        failed = [c for c in self.checks if c.ok is False]
        if not failed:
            return self.done(DONE, "GPU reset and back; read-back clean")
        if not ok:
            lead = "reset command failed"
        elif back is None:
            lead = "GPU did not come back after the reset"
        else:
            lead = "GPU reset but not clean"
        return self.done(FAILED, f"{lead}: " + "; ".join(f"{c.name}: {c.detail}"
                                                          for c in failed))


def reset_gpu(opts: ResetOptions, device: ResetDevice, resetter: Resetter,
              systemctl: Systemctl | None = None, *,
              sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic) -> ResetResult:
    """Run ``reset-gpu`` for ``opts.pci`` (see the module docstring). Never raises for the
    GPU's or the host's trouble: every outcome is a :class:`ResetResult` (exit code 0 / 1 /
    2 via :attr:`ResetResult.exit_code`)."""
    return _Run(opts, device, resetter, systemctl or Systemctl(), sleep, clock).execute()
