"""Result shapes of the validation suite (dataclasses; JSON matches the control plane's
``workflows.models.ValidationResult`` / ``CheckResult`` field for field).

JSON shape printed by ``autorepair-agent validate --json``::

    {"machine": str, "verdict": "passed"|"failed"|"aborted", "reason": str,
     "checks": [{"name": str, "outcome": "passed"|"failed"|"skipped", "detail": str,
                 "measurements": {str: float}, "log": str}, ...]}

Measurement names carry their unit as a suffix (``_c``, ``_mb_per_s``, ``_gbps``, ``_s``,
``_count``); booleans are reported as 0.0 / 1.0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"
ABORTED = "aborted"

#: Process exit code per verdict (docs/design.md §4.1: 0 passed, 1 failed, 2 aborted).
EXIT_CODES: dict[str, int] = {PASSED: 0, FAILED: 1, ABORTED: 2}


@dataclass
class CheckResult:
    """One check. ``outcome`` is ``passed`` | ``failed`` | ``skipped``."""

    name: str
    outcome: str
    detail: str = ""
    measurements: dict[str, float] = field(default_factory=dict)
    log: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in (PASSED, FAILED, SKIPPED):
            raise ValueError(f"outcome: must be passed|failed|skipped, got {self.outcome!r}")


@dataclass
class SuiteResult:
    """The whole run. ``verdict`` is ``passed`` | ``failed`` | ``aborted``."""

    machine: str
    verdict: str
    checks: list[CheckResult] = field(default_factory=list)
    reason: str = ""

    @property
    def exit_code(self) -> int:
        """0 passed, 1 failed, 2 aborted."""
        return EXIT_CODES[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object described in the module docstring."""
        return asdict(self)

    def check(self, name: str) -> CheckResult:
        """The check called ``name``; ``KeyError`` naming it when absent."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"check {name!r} not in this result")


def clip_log(text: str, limit: int) -> str:
    """The last ``limit`` characters of ``text`` (the end of a tool's output matters most)."""
    if len(text) <= limit:
        return text
    return "[... clipped ...]\n" + text[-limit:]
