"""Wiring of ``autorepair-agent reset-gpu`` (registered in :mod:`agent.cli`).

Always prints a result (``--json``: one JSON object on stdout, see
:mod:`agent.gpureset.result`), bad arguments included: they come back as ``cannot_run``
with an ``arguments`` check naming the option and value, exit 2.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from agent.gpureset.command import NvidiaSmiResetter, Resetter, SimulatedResetter
from agent.gpureset.device import NvmlResetDevice, ResetDevice
from agent.gpureset.host import Systemctl
from agent.gpureset.result import CANNOT_RUN, Check, ResetResult
from agent.gpureset.run import ResetOptions, reset_gpu
from agent.nvml import SIM_RESET_OUTCOMES, SimFaults, SimulatedBackend


def load_sim_faults(path: Path) -> SimFaults:
    """A JSON object of :class:`agent.nvml.SimFaults` fields → ``SimFaults``. Raises
    ``ValueError`` naming ``--sim-faults``, the file and the bad field or value."""
    try:
        data = json.loads(path.read_text() or "{}")
    except OSError as exc:
        raise ValueError(f"--sim-faults {str(path)!r}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"--sim-faults {str(path)!r}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"--sim-faults {str(path)!r}: expected a JSON object, got {data!r}")
    known = {f.name for f in fields(SimFaults)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"--sim-faults {str(path)!r}: unknown field(s) {unknown} "
                         f"(known: {sorted(known)})")
    if data.get("reset_outcome", "clears") not in SIM_RESET_OUTCOMES:
        raise ValueError(f"--sim-faults {str(path)!r}: reset_outcome must be one of "
                         f"{list(SIM_RESET_OUTCOMES)}, got {data['reset_outcome']!r}")
    if "gpu_processes" in data:
        gp = data["gpu_processes"]
        if not isinstance(gp, dict):
            raise ValueError(f"--sim-faults: gpu_processes must map GPU index to pids, "
                             f"got {gp!r}")
        try:
            data["gpu_processes"] = {int(k): [int(p) for p in v] for k, v in gp.items()}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--sim-faults: gpu_processes {gp!r}: {exc}") from exc
    return replace(SimFaults(), **data)


def build(
    *, backend: str, sim_faults: Path | None, sim_gpus: int, nvidia_smi: str | None,
    reset_timeout: float,
) -> tuple[ResetDevice, Resetter]:
    """The NVML device and the reset command for ``backend``. With ``simulated`` the
    backend's own reset is used unless ``nvidia_smi`` names a command. Raises
    ``ValueError`` naming the option and value."""
    if backend == "nvml":
        return NvmlResetDevice(), NvidiaSmiResetter(nvidia_smi or "nvidia-smi", reset_timeout)
    if backend != "simulated":
        raise ValueError(f"--backend: must be 'nvml' or 'simulated', got {backend!r}")
    if sim_gpus < 1:
        raise ValueError(f"--sim-gpus: must be >= 1, got {sim_gpus!r}")
    sim = SimulatedBackend(gpu_count=sim_gpus, seed=7)
    if sim_faults is not None:
        sim.faults = load_sim_faults(sim_faults)
    if nvidia_smi is not None:
        return sim, NvidiaSmiResetter(nvidia_smi, reset_timeout, require_root=False)
    return sim, SimulatedResetter(sim)


def run_reset_gpu(
    *, pci: str, json_out: bool, dry_run: bool = False, stop_services: bool = False,
    backend: str = "nvml", sim_faults: Path | None = None, sim_gpus: int = 8,
    nvidia_smi: str | None = None, systemctl: str = "systemctl",
    reset_timeout: float = 180.0, wait_timeout: float = 60.0,
    proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys"),
) -> int:
    """Build, run, print; return the exit code (0 done / dry run ready, 1 failed, 2 cannot
    run)."""
    result: ResetResult
    try:
        opts = ResetOptions(pci=pci, stop_services=stop_services, dry_run=dry_run,
                            wait_timeout_s=wait_timeout, proc_root=proc_root,
                            sys_root=sys_root)
        device, resetter = build(backend=backend, sim_faults=sim_faults, sim_gpus=sim_gpus,
                                 nvidia_smi=nvidia_smi, reset_timeout=reset_timeout)
    except ValueError as exc:
        result = ResetResult(pci, CANNOT_RUN, f"arguments: {exc}",
                             [Check("arguments", False, str(exc))])
    else:
        result = reset_gpu(opts, device, resetter, Systemctl(systemctl))
    out: dict[str, Any] | str = result.to_dict() if json_out else result.render()
    text = json.dumps(out, separators=(",", ":")) if json_out else str(out)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return result.exit_code
