"""Local validation suite behind ``autorepair-agent validate [--json]`` (docs/design.md §1 step 5).

GPU (NVML health, device count), DCGM diagnostics, NCCL all-reduce, InfiniBand ports,
storage read/write/fsync; verdict passed / failed / aborted with exit code 0 / 1 / 2.
Stdlib + the agent's NVML backends only (no pydantic, no control-plane imports).
"""

from agent.validation.cli import run_validate
from agent.validation.config import CHECK_NAMES, SuiteConfig
from agent.validation.result import (
    ABORTED,
    EXIT_CODES,
    FAILED,
    PASSED,
    SKIPPED,
    CheckResult,
    SuiteResult,
)
from agent.validation.suite import decide, run_suite

__all__ = [
    "ABORTED",
    "CHECK_NAMES",
    "EXIT_CODES",
    "FAILED",
    "PASSED",
    "SKIPPED",
    "CheckResult",
    "SuiteConfig",
    "SuiteResult",
    "decide",
    "run_suite",
    "run_validate",
]
