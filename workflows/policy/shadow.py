"""Shadow mode (issue 29 item 3; docs/runbook.md "Rolling out a policy in shadow mode"):
what a repair in ``policy.mode: shadow`` would have done, and which attempts the rails
count in each mode.

A shadow-mode repair runs every decision as in ``enforce`` — catalogue, consent, ladder,
node cap, budget and breaker lease, maintenance windows, RMA holds — and then, where an
enforcing repair would cordon, ends ``shadowed`` recording the attempt it stood for
(outcome :data:`SHADOWED`). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from workflows.config import PolicyMode, WaitForIdleConfig
from workflows.models import Action, AttemptRecord

#: ``AttemptRecord.outcome`` of the action a shadow-mode repair stood for (nothing ran).
SHADOWED = "shadowed"

_WHAT: dict[Action, str] = {
    Action.reset_gpu: "reset GPU {gpus} of {machine} in place",
    Action.reboot: "reboot {machine}",
    Action.power_cycle: "power-cycle {machine} through its BMC",
    Action.reprovision: "reprovision {machine} (re-image it, then re-validate it)",
    Action.migrate: "migrate node {node} off machine {machine} onto a hot spare (then "
                    "re-validate {machine})",
    Action.remove: "remove {machine} for RMA (it stays out)",
}


def is_shadow(mode: PolicyMode | str) -> bool:
    """Whether ``mode`` (``policy.mode`` / a pool's ``mode``) is ``shadow``."""
    return mode == "shadow"


def would_do(action: Action, node: str, machine: str | None, gpus: Sequence[str],
             wait_for_idle: WaitForIdleConfig) -> str:
    """In words, what an enforcing repair would have done from here, e.g. ``"would
    cordon gpu-03, wait for idle (max 3600 s) and drain it, then power-cycle m-gpu-03
    through its BMC"``. ``machine`` None: the node's own; ``gpus``: the GPUs a reset
    targets (none named: "all GPUs"). Raises ``ValueError`` naming ``action`` for
    ``none`` (nothing to do is never a repair)."""
    if action not in _WHAT:
        raise ValueError(f"action: {action.value!r} is not a repair action")
    bound = ("do not interrupt" if wait_for_idle.do_not_interrupt
             else f"max {wait_for_idle.max_wait_s:g} s")
    what = _WHAT[action].format(machine=machine or node, node=node,
                                gpus=", ".join(gpus) if gpus else "(all GPUs)")
    return (f"would cordon {node}, wait for idle ({bound}) and drain it, then {what}; "
            "nothing was done (shadow mode)")


def rail_attempts(attempts: Sequence[AttemptRecord], shadow: bool) -> list[AttemptRecord]:
    """The attempts the ladder, the per-node cap and the repeat-offender rule count.

    In shadow mode every attempt counts, the :data:`SHADOWED` ones as the action they
    stood for, so a shadow rollout's escalations and caps predict what enforcing would
    do. In enforce mode shadowed attempts do not count: nothing touched the machine, and
    switching a pool to ``enforce`` must not start its nodes on a heavier rung."""
    if shadow:
        return list(attempts)
    return [a for a in attempts if a.outcome != SHADOWED]
