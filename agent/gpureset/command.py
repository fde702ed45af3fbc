"""The reset itself: ``nvidia-smi --gpu-reset -i <pci>`` as a subprocess, with a timeout.

NVML's ``nvmlDeviceResetGpuLockedClocks`` only undoes ``--lock-gpu-clocks`` and is not a
reset; the supported path is nvidia-smi(1) ``-r/--gpu-reset`` (NVIDIA, nvidia-smi manual,
docs.nvidia.com/deploy/nvidia-smi), which requires root and no application using the GPU.
Its documented return codes are kept in :data:`NVSMI_RETURN_CODES` for the evidence.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Protocol

from agent.nvml import ResetCommandResult, SimulatedBackend

#: nvidia-smi(1), "RETURN VALUE".
NVSMI_RETURN_CODES: dict[int, str] = {
    0: "success",
    2: "a supplied argument or flag is invalid",
    3: "the requested operation is not available on target device",
    4: "the current user does not have permission to access this device or perform this "
       "operation",
    6: "a query to find an object was unsuccessful",
    8: "a device's external power cables are not properly attached",
    9: "NVIDIA driver is not loaded",
    10: "NVIDIA kernel detected an interrupt issue with a GPU",
    12: "NVML shared library couldn't be found or loaded",
    13: "local version of NVML doesn't implement this function",
    14: "infoROM is corrupted",
    15: "the GPU has fallen off the bus or has otherwise become inaccessible",
    255: "other error or internal driver error occurred",
}

class Resetter(Protocol):
    """A reset command: kernel-log PCI address in, what it did out (never raises)."""

    def preflight(self) -> str | None:
        """``None`` when the reset can be attempted here, else the reason it cannot."""

    def describe(self) -> str:
        """What will run, for the evidence (e.g. ``/usr/bin/nvidia-smi``)."""

    def __call__(self, pci: str) -> ResetCommandResult:
        """Reset the GPU at ``pci`` (``"0000:c6:00"``)."""


def nvsmi_bus_id(pci: str) -> str:
    """``"0000:c6:00"`` → ``"00000000:C6:00.0"`` (the bus-id form nvidia-smi prints and
    accepts after ``-i``)."""
    domain, bus, dev = pci.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{dev.upper()}.0"


def explain_returncode(rc: int | None) -> str:
    """A reset command's exit status in words (nvidia-smi's documented codes)."""
    if rc is None:
        return "timed out"
    return f"rc={rc} ({NVSMI_RETURN_CODES.get(rc, 'undocumented return code')})"


class NvidiaSmiResetter:
    """Runs ``<path> --gpu-reset -i <bus id>``; ``path`` and ``timeout_s`` are injectable.

    :meth:`preflight` says why it cannot run here (binary missing, not root) before
    anything is touched; :meth:`__call__` never raises: a timeout or an exec failure comes
    back as a :class:`ResetCommandResult` with ``returncode`` ``None`` / 127.
    """

    def __init__(self, path: str = "nvidia-smi", timeout_s: float = 180.0,
                 require_root: bool = True) -> None:
        if timeout_s <= 0:
            raise ValueError(f"--reset-timeout: must be > 0 seconds, got {timeout_s!r}")
        self.path = shutil.which(path) or (path if Path(path).is_file() else None)
        self.requested = path
        self.timeout_s = timeout_s
        self.require_root = require_root

    def preflight(self) -> str | None:
        """``None`` when the reset can be attempted, else the reason it cannot."""
        if self.path is None:
            return f"{self.requested} not found (NVIDIA driver utilities not installed)"
        if self.require_root and os.geteuid() != 0:
            return "nvidia-smi --gpu-reset requires root (nvidia-smi(1)); run as root"
        return None

    def describe(self) -> str:
        return f"{self.path or self.requested} --gpu-reset (timeout {self.timeout_s:g} s)"

    def __call__(self, pci: str) -> ResetCommandResult:
        argv = (self.path or self.requested, "--gpu-reset", "-i", nvsmi_bus_id(pci))
        t0 = time.monotonic()
        try:
            cp = subprocess.run(list(argv), capture_output=True, text=True,
                                timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode()
            return ResetCommandResult(argv, None,
                                      out + f"\n(timed out after {self.timeout_s:g} s)",
                                      round(time.monotonic() - t0, 3))
        except OSError as exc:
            return ResetCommandResult(argv, 127, f"cannot execute: {exc}",
                                      round(time.monotonic() - t0, 3))
        output = (cp.stdout + (("\n" + cp.stderr) if cp.stderr else "")).strip()
        return ResetCommandResult(argv, cp.returncode, output, round(time.monotonic() - t0, 3))


class SimulatedResetter:
    """The simulated backend's own ``nvidia-smi --gpu-reset`` (see
    :meth:`agent.nvml.SimulatedBackend.simulate_reset`): no subprocess, no root needed."""

    def __init__(self, backend: SimulatedBackend) -> None:
        self.backend = backend

    def preflight(self) -> str | None:
        return None

    def describe(self) -> str:
        return f"simulated reset (outcome {self.backend.faults.reset_outcome})"

    def __call__(self, pci: str) -> ResetCommandResult:
        return self.backend.simulate_reset(pci)
