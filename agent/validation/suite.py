"""Run the validation suite and decide the verdict.

Verdict rules (docs/design.md §1 step 5: passed → pool, failed → ticket, aborted → restored):

* ``failed`` — at least one check failed (explicit failure; the only verdict that opens a
  hardware ticket upstream);
* ``aborted`` — nothing failed, but a required check (``SuiteConfig.required``) was
  skipped, every check was skipped, or the suite itself could not run (bad config, a
  crash in a check): the machine is neither condemned nor returned;
* ``passed`` — every required check passed and none failed.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

from agent.config import ConfigError
from agent.nvml import GpuBackend
from agent.validation.checks import (
    check_dcgm,
    check_gpu,
    check_infiniband,
    check_nccl,
    check_storage,
)
from agent.validation.config import SuiteConfig
from agent.validation.result import (
    ABORTED,
    FAILED,
    PASSED,
    SKIPPED,
    CheckResult,
    SuiteResult,
    clip_log,
)


def decide(machine: str, checks: list[CheckResult], required: tuple[str, ...]) -> SuiteResult:
    """The verdict for ``checks`` under the rules in the module docstring."""
    failed = [c for c in checks if c.outcome == FAILED]
    if failed:
        reason = "; ".join(f"{c.name}: {c.detail}" for c in failed)
        return SuiteResult(machine, FAILED, checks, reason)
    by_name = {c.name: c for c in checks}
    missing = [n for n in required if by_name.get(n) is None or by_name[n].outcome != PASSED]
    if missing:
        why = "; ".join(
            f"{n}: {by_name[n].detail if n in by_name else 'not run'}" for n in missing
        )
        return SuiteResult(machine, ABORTED, checks, f"required check(s) could not run: {why}")
    if not checks or all(c.outcome == SKIPPED for c in checks):
        return SuiteResult(machine, ABORTED, checks, "every check was skipped")
    ran = [c.name for c in checks if c.outcome == PASSED]
    return SuiteResult(machine, PASSED, checks, f"passed: {', '.join(ran)}")


def run_suite(cfg: SuiteConfig, *, backend: GpuBackend | None = None) -> SuiteResult:
    """Run every configured check in order (gpu, dcgm, nccl, infiniband, storage).

    ``backend`` overrides the configured GPU backend (tests). Never raises for a check's
    own trouble: a crash inside a check is recorded as that check ``skipped`` with the
    traceback in its log, which aborts the run when the check is required; a
    :class:`ConfigError` (e.g. a bad faults file) aborts the run with the message.
    """
    machine = cfg.machine_name
    results: list[CheckResult] = []
    gpu_count: int | None = None
    runners: dict[str, Callable[[], CheckResult]] = {
        "gpu": lambda: check_gpu(cfg, machine, backend),
        "dcgm": lambda: check_dcgm(cfg),
        "nccl": lambda: check_nccl(cfg, gpu_count),
        "infiniband": lambda: check_infiniband(cfg),
        "storage": lambda: check_storage(cfg),
    }
    for name in ("gpu", "dcgm", "nccl", "infiniband", "storage"):
        if name not in cfg.checks:
            continue
        try:
            res = runners[name]()
        except ConfigError as exc:
            results.append(CheckResult(name, SKIPPED, f"configuration error: {exc}"))
            return SuiteResult(machine, ABORTED, results, f"{name}: configuration error: {exc}")
        except Exception as exc:  # a check's own bug or an unexpected host condition
            res = CheckResult(
                name, SKIPPED, f"check crashed: {exc!r}",
                log=clip_log(traceback.format_exc(), cfg.max_log_chars),
            )
        if name == "gpu":
            gpu_count = int(res.measurements.get("gpu_count", 0)) or None
        results.append(res)
    return decide(machine, results, cfg.required)
