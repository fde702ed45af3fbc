"""``autorepair-agent reset-gpu --pci ADDR [--json]``: reset one GPU in place (docs/design.md §4.1,
§5 ``reset_gpu``): named preconditions, ``nvidia-smi --gpu-reset``, wait for the GPU,
read back the state that motivated it. Exit 0 done, 1 reset failed, 2 cannot run.

Stdlib + the agent's NVML layer only (the agent imports nothing of the control plane).
"""

from agent.gpureset.command import NvidiaSmiResetter, Resetter, SimulatedResetter
from agent.gpureset.device import NvmlResetDevice, ResetDevice
from agent.gpureset.host import Systemctl, parse_pci_arg
from agent.gpureset.result import (
    CANNOT_RUN,
    DONE,
    EXIT_CODES,
    FAILED,
    READY,
    Check,
    ResetResult,
)
from agent.gpureset.run import ResetOptions, reset_gpu

__all__ = [
    "CANNOT_RUN",
    "DONE",
    "EXIT_CODES",
    "FAILED",
    "READY",
    "Check",
    "NvidiaSmiResetter",
    "NvmlResetDevice",
    "ResetDevice",
    "ResetOptions",
    "ResetResult",
    "Resetter",
    "SimulatedResetter",
    "Systemctl",
    "parse_pci_arg",
    "reset_gpu",
]
