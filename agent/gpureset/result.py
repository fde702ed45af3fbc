"""Result of ``autorepair-agent reset-gpu`` and its JSON shape (docs/design.md §4.1).

``--json`` prints one object::

    {"pci": "0000:c6:00", "result": "done"|"failed"|"cannot_run"|"ready", "reason": str,
     "checks": [{"name": str, "ok": true|false|null, "detail": str}, ...],
     "before": {...GpuState...}, "after": {...GpuState...}, "duration_s": float}

``ok`` is ``null`` for a check that could not be measured here (``detail`` says why), never
``true``. ``before`` / ``after`` hold ``recovery_action`` (name, e.g. ``"gpu_reset"``),
``remap_pending``, ``remap_failure``, ``ecc_volatile_corrected``,
``ecc_volatile_uncorrected`` plus ``index`` and ``uuid``; ``{}`` when not read (no GPU,
or it did not come back). ``ready`` is only produced by ``--dry-run``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DONE = "done"
FAILED = "failed"
CANNOT_RUN = "cannot_run"
READY = "ready"

#: Exit code per result (docs/design.md §4.1: 0 done, 1 reset failed, 2 cannot run; a dry run
#: whose checks pass exits 0).
EXIT_CODES: dict[str, int] = {DONE: 0, READY: 0, FAILED: 1, CANNOT_RUN: 2}


@dataclass
class Check:
    """One named check. ``ok``: ``True`` passed, ``False`` failed, ``None`` not measured."""

    name: str
    ok: bool | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class ResetResult:
    """The whole run (see the module docstring for the JSON)."""

    pci: str
    result: str
    reason: str
    checks: list[Check] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def exit_code(self) -> int:
        """0 done (or dry run ready), 1 failed, 2 cannot run."""
        return EXIT_CODES[self.result]

    def check(self, name: str) -> Check:
        """The check called ``name``; ``KeyError`` naming it when absent."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"check {name!r} not in this result")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the module docstring."""
        return {
            "pci": self.pci, "result": self.result, "reason": self.reason,
            "checks": [c.to_dict() for c in self.checks],
            "before": self.before, "after": self.after, "duration_s": self.duration_s,
        }

    def render(self) -> str:
        """Human-readable table: one row per check, then the result line."""
        rows = [(c.name, {True: "ok", False: "FAIL", None: "n/a"}[c.ok], c.detail)
                for c in self.checks]
        w0 = max([len(r[0]) for r in rows] + [5])
        lines = [f"{name:<{w0}}  {ok:<4}  {detail}" for name, ok, detail in rows]
        lines.append(f"gpu {self.pci}: {self.result.upper()} — {self.reason} "
                     f"({self.duration_s:.1f} s)")
        return "\n".join(lines)
