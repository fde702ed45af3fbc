"""Where ``reset_gpu`` may run, and where the repair goes when it may not (docs/design.md §5:
"``reset_gpu`` (GPU reset on the node, where the platform allows it) → ``reboot``").

Decided before acting, from the node pool's platform (:class:`ResetGpuPlatform`), the
GPUs the evidence names and the failed resets already recorded; and again when the node
itself says the reset cannot run (``autorepair-agent reset-gpu`` exit 2). Either way the
repair moves to ``reboot`` with the reason in its rule — never as a failed attempt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from workflows.config import ResetGpuPlatform, ResetGpuPolicy
from workflows.models import Action, Alert, AttemptRecord

#: PCI address as the kernel log, NVML and nvidia-smi print it: ``[domain:]bus:device[.fn]``
#: (``0000:c6:00``, ``00000000:C6:00.0``, ``c6:00.0``).
_PCI = re.compile(
    r"^(?:(?P<dom>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})"
    r"(?:\.[0-7])?$"
)
#: The action a reset that may not run moves to (the next rung by weight, docs/design.md §5).
FALLBACK = Action.reboot


@dataclass(frozen=True)
class ResetDecision:
    """``action``: ``reset_gpu`` or :data:`FALLBACK`; ``rule``: why, e.g.
    ``"reset:MIG mode enabled on pool hgx -> reboot"``."""

    action: Action
    rule: str


def gpu_pci(gpu: str) -> str | None:
    """``gpu`` as the kernel-log PCI form ``0000:bb:dd`` (lower case), or ``None`` when it
    is not a PCI address (a GPU index, a UUID). Never raises."""
    m = _PCI.match(gpu.strip())
    if m is None:
        return None
    dom = int(m["dom"], 16) if m["dom"] else 0
    return f"{dom:04x}:{m['bus'].lower()}:{m['dev'].lower()}"


def reset_targets(alerts: Sequence[Alert]) -> list[str]:
    """The GPUs the active evidence names, first seen first, each once: a PCI address
    normalised by :func:`gpu_pci`, anything else (index, UUID) stripped as given."""
    out: list[str] = []
    for a in alerts:
        if not a.active or not a.gpu or not a.gpu.strip():
            continue
        g = gpu_pci(a.gpu) or a.gpu.strip()
        if g not in out:
            out.append(g)
    return out


def failed_resets(
    attempts: Sequence[AttemptRecord], alert_kind: str, code: int | None,
    machine_id: str | None, now: datetime, window_s: float,
) -> int:
    """Failed ``reset_gpu`` attempts of the same fault (kind and code) on the machine within
    ``window_s`` seconds before ``now``."""
    since = now - timedelta(seconds=window_s)
    return sum(
        1 for a in attempts
        if a.action == Action.reset_gpu and a.outcome == "failed"
        and a.alert_kind == alert_kind and a.code == code
        and (machine_id is None or a.machine_id in (None, machine_id))
        and since <= a.at <= now
    )


def platform_blocker(platform: ResetGpuPlatform, pool: str | None) -> str | None:
    """Why ``platform`` forbids a single-GPU reset, or ``None``."""
    where = f"pool {pool}" if pool else "this node"
    if not platform.allowed:
        return f"not allowed on {where} (reset_gpu.allowed=false)"
    if platform.mig:
        return (f"MIG mode enabled on {where}: a reset needs MIG disabled, which autorepair "
                "never changes (reset_gpu.mig=true)")
    if not platform.single_gpu:
        return (f"{where} cannot reset one GPU while its NVLink peers stay up "
                "(reset_gpu.single_gpu=false)")
    return None


def reset_decision(
    action: Action,
    alerts: Sequence[Alert],
    attempts: Sequence[AttemptRecord],
    machine_id: str | None,
    now: datetime,
    window_s: float,
    policy: ResetGpuPolicy,
    pool: str | None = None,
    blocked: str | None = None,
) -> ResetDecision:
    """Keep ``reset_gpu`` or move it to :data:`FALLBACK` before acting.

    In order: ``blocked`` (the node said the reset cannot run, with that reason) → the
    pool's platform (:func:`platform_blocker`) → no GPU named by the active evidence →
    ``policy.failed_attempts`` failed resets of the same fault on the machine within
    ``window_s`` (the ladder window). Any other ``action`` is returned with an empty rule.
    """
    if action != Action.reset_gpu:
        return ResetDecision(action, "")
    to = f" -> {FALLBACK.value}"
    if blocked:
        return ResetDecision(FALLBACK, f"reset:cannot run on the node ({blocked}){to}")
    platform = policy.for_pool(pool)
    why = platform_blocker(platform, pool)
    if why:
        return ResetDecision(FALLBACK, f"reset:{why}{to}")
    gpus = reset_targets(alerts)
    if not gpus:
        return ResetDecision(FALLBACK, f"reset:the evidence names no GPU{to}")
    kind = alerts[0].kind if alerts else "manual"
    code = alerts[0].code if alerts else None
    n = failed_resets(attempts, kind, code, machine_id, now, window_s)
    if n >= policy.failed_attempts:
        return ResetDecision(
            FALLBACK,
            f"reset:reset_gpu failed x{n} for this fault within {window_s:g}s (a GPU still "
            f"unhealthy after a reset needs the node restarted, nvidia-smi(1)){to}",
        )
    board = "; NVSwitch baseboard: node drained, every GPU idle" if platform.nvswitch else ""
    return ResetDecision(Action.reset_gpu, f"reset:allowed for GPU {', '.join(gpus)}{board}")
