"""Escalation ladder and the migrate evidence gate (docs/design.md §5 ladder and migrate)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from workflows.config import LadderConfig, MigrateGateConfig, RepeatOffenderConfig, ResetGpuPolicy
from workflows.models import ACTION_WEIGHT, Action, Alert, AttemptRecord, Severity
from workflows.policy.rails import received_time
from workflows.policy.reset import reset_decision

#: Attempt outcomes that never count for the ladder (docs/design.md §5).
NOT_COUNTED: frozenset[str] = frozenset({"cancelled", "auto_resolved"})
#: Attempt outcomes that are no action executed on the node, for the per-node cap. A
#: ``cancelled`` attempt is recorded only when the action touched the machine (the
#: machine action's I22: a power cycle cancelled after ForceOff), so it ran and counts.
NOT_EXECUTED: frozenset[str] = frozenset({"auto_resolved"})


@dataclass(frozen=True)
class LadderDecision:
    """``action``: what to run; ``escalated``: moved up at least one rung;
    ``needs_human``: the top automatic rung is exhausted (ask a person; remove is never
    automatic, docs/design.md §5);
    ``rule``: e.g. ``"ladder:reboot x2 in 604800s -> reprovision"``."""

    action: Action
    escalated: bool
    needs_human: bool
    rule: str
    #: set when the repeat-offender rule decided (``remove`` for a person)
    repeat_offender: RepeatOffender | None = None


@dataclass(frozen=True)
class GateDecision:
    """Result of :func:`migrate_gate`: the action and the rule that decided."""

    action: Action
    rule: str


def next_rung(action: Action, ladder: LadderConfig) -> Action | None:
    """The lightest rung heavier than ``action``, or None above the top automatic rung.

    Rungs default to reboot → reprovision → migrate; actions off the ladder
    (``reset_gpu``, ``power_cycle``) move to the next heavier rung by weight.
    """
    w = ACTION_WEIGHT[action]
    heavier = [r for r in ladder.rungs if ACTION_WEIGHT[r] > w]
    return min(heavier, key=lambda r: ACTION_WEIGHT[r]) if heavier else None


def _same_target(a: AttemptRecord, machine_id: str | None, node: str | None) -> bool:
    """``a`` ran on the machine ``machine_id`` or on the node ``node`` (None = any).

    Counting the node as well as the machine keeps the ladder climbing for a node's fault
    episode after a migrate moved it onto a spare: the fault followed the node."""
    if machine_id is None:
        return True
    return a.machine_id in (None, machine_id) or (node is not None and a.node == node)


def counted_attempts(
    attempts: Sequence[AttemptRecord],
    action: Action,
    alert_kind: str,
    code: int | None,
    machine_id: str | None,
    now: datetime,
    window_s: float,
    node: str | None = None,
) -> int:
    """Attempts of ``action`` on the same machine (or, when ``node`` is given, on the same
    node) for the same alert kind (and code) within ``window_s`` seconds before ``now``;
    cancelled and self-resolved excluded."""
    since = now - timedelta(seconds=window_s)
    return sum(
        1
        for a in attempts
        if a.action == action
        and a.alert_kind == alert_kind
        and a.code == code
        and _same_target(a, machine_id, node)
        and a.outcome not in NOT_COUNTED
        and since <= a.at <= now
    )


def node_actions_in_window(
    attempts: Sequence[AttemptRecord], node: str, now: datetime, window_s: float
) -> int:
    """Disruptive actions executed on ``node`` (any machine, action, fault or outcome but
    self-resolved; a cancelled attempt is recorded only when it touched the machine, so it
    counts) within ``window_s`` seconds before ``now``: the count that
    ``rails.max_actions_per_node`` caps (docs/design.md §5 rails)."""
    since = now - timedelta(seconds=window_s)
    return sum(
        1
        for a in attempts
        if a.node == node
        and a.action != Action.none
        and a.outcome not in NOT_EXECUTED
        and since <= a.at <= now
    )


def ladder_decision(
    action: Action,
    attempts: Sequence[AttemptRecord],
    alert_kind: str,
    code: int | None,
    machine_id: str | None,
    now: datetime,
    ladder: LadderConfig,
    node: str | None = None,
) -> LadderDecision:
    """Apply the ladder: while ``action`` already ran ``ladder.attempts`` times (default 2)
    on this machine (or on ``node``, when given) for this alert kind/code within
    ``ladder.window_s`` (default 7 days), move one rung up. Past the top rung (default
    ``migrate``) a human is needed. ``none`` and ``remove`` are returned unchanged."""
    if action in (Action.none, Action.remove):
        return LadderDecision(action, False, False, "ladder:not applicable")
    current: Action = action
    steps: list[str] = []
    while True:
        n = counted_attempts(
            attempts, current, alert_kind, code, machine_id, now, ladder.window_s, node
        )
        if n < ladder.attempts:
            break
        up = next_rung(current, ladder)
        if up is None:
            steps.append(f"{current.value} x{n}: top automatic rung exhausted")
            return LadderDecision(current, bool(steps[:-1]), True, "ladder:" + "; ".join(steps))
        steps.append(f"{current.value} x{n} in {ladder.window_s:g}s -> {up.value}")
        current = up
    if not steps:
        return LadderDecision(current, False, False, "ladder:first rung")
    return LadderDecision(current, True, False, "ladder:" + "; ".join(steps))


def migrate_gate(
    action: Action,
    alerts: Sequence[Alert],
    critical_history: Sequence[Alert],
    now: datetime,
    gate: MigrateGateConfig,
) -> GateDecision:
    """Migrate needs a critical alert firing now or one on the same machine within
    ``gate.window_s`` (default 10 days, docs/design.md §5 migrate); otherwise it runs as a quick
    ``reprovision``. Other actions pass unchanged.

    "Firing now" is a critical level fault still raised; every other critical alert — the
    repair's own ``alerts`` (an Xid event, a level fault cleared since) or the machine's
    ``critical_history`` — counts by its age (received by the control plane within the
    window, :func:`~workflows.policy.rails.received_time`; I17: never a sender's clock),
    never by whether it is still active."""
    if action != Action.migrate:
        return GateDecision(action, "gate:not applicable")
    if any(a.severity == Severity.critical and a.active and a.level for a in alerts):
        return GateDecision(Action.migrate, "gate:critical alert now")
    since = now - timedelta(seconds=gate.window_s)
    if any(
        a.severity == Severity.critical and since <= received_time(a)
        for a in [*alerts, *critical_history]
    ):
        return GateDecision(Action.migrate, f"gate:critical alert within {gate.window_s:g}s")
    return GateDecision(Action.reprovision, "gate:no critical evidence -> reprovision")


#: Actions that make a repair "disruptive" for the repeat-offender rule: each interrupts
#: the machine's work (``remove`` is the rule's answer, ``none`` touches nothing).
DISRUPTIVE_ACTIONS: frozenset[Action] = frozenset(
    {Action.reset_gpu, Action.reboot, Action.power_cycle, Action.reprovision, Action.migrate}
)


@dataclass(frozen=True)
class RepeatOffender:
    """Result of :func:`repeat_offender`: ``repairs`` (ids, oldest first) of the disruptive
    repairs counted on ``machine_id``; ``rule`` names the rule and lists them."""

    machine_id: str
    repairs: tuple[str, ...]
    rule: str


def repeat_offender(
    attempts: Sequence[AttemptRecord],
    machine_id: str | None,
    now: datetime,
    cfg: RepeatOffenderConfig,
) -> RepeatOffender | None:
    """Whether ``machine_id`` is a repeat offender (issue 31 item 2): at least
    ``cfg.threshold`` distinct repairs executed a disruptive action
    (:data:`DISRUPTIVE_ACTIONS`, any outcome but cancelled / self-resolved: an attempt is
    recorded only when it touched the machine) on this machine within ``cfg.window_s``
    seconds before ``now``, across every fault kind, and after the machine's last
    succeeded ``remove`` (a machine returned from RMA starts clean). Counted per
    machine, not per node: a migrated node's new machine starts clean. None when it is
    not (or no machine is known)."""
    if not machine_id:
        return None
    since = now - timedelta(seconds=cfg.window_s)
    # a removal for RMA answered the repairs before it: a machine returned since (its
    # hardware repaired) is counted from its removal on, not condemned again by them
    removed = [a.at for a in attempts
               if a.machine_id == machine_id and a.action == Action.remove
               and a.outcome == "succeeded" and a.at <= now]
    after = max(removed) if removed else None
    first: dict[str, datetime] = {}
    for a in attempts:
        if (
            a.machine_id == machine_id
            and a.action in DISRUPTIVE_ACTIONS
            and a.outcome not in NOT_COUNTED
            and since <= a.at <= now
            and (after is None or a.at > after)
        ):
            first[a.repair_id] = min(first.get(a.repair_id, a.at), a.at)
    if len(first) < cfg.threshold:
        return None
    repairs = tuple(sorted(first, key=lambda r: (first[r], r)))
    return RepeatOffender(
        machine_id,
        repairs,
        f"repeat offender: machine {machine_id} had {len(repairs)} disruptive repairs within "
        f"{cfg.window_s:g} s (threshold {cfg.threshold}: {', '.join(repairs)}) -> remove "
        "(a person decides)",
    )


def choose_action(
    requested: Action,
    alerts: Sequence[Alert],
    attempts: Sequence[AttemptRecord],
    critical_history: Sequence[Alert],
    machine_id: str | None,
    now: datetime,
    ladder: LadderConfig,
    gate: MigrateGateConfig,
    reset: ResetGpuPolicy | None = None,
    pool: str | None = None,
    reset_blocked: str | None = None,
    node: str | None = None,
    repeat: RepeatOffenderConfig | None = None,
) -> LadderDecision:
    """Reset preconditions, ladder, then migrate gate for ``requested``; returns the final
    action and the rule string of every step. With ``repeat`` (the cluster's
    ``rails.repeat_offender``), a repeat-offender machine (:func:`repeat_offender`) gets
    ``remove`` for a person instead of any other disruptive action, the rule naming the
    repairs counted (issue 31 item 2); the ladder and the per-node cap are unchanged.
    The ladder key is the first alert's kind/code (``"manual"`` with no code when the
    repair has no alert behind it).

    ``reset``: the cluster's ``reset_gpu`` policy; with it a requested ``reset_gpu`` goes
    through :func:`workflows.policy.reset.reset_decision` (node ``pool``, and
    ``reset_blocked``: why the node said the reset cannot run) before the ladder, so a
    reset the platform forbids becomes ``reboot`` before acting. ``None``: no such step.
    ``node`` makes attempts on the node count as well as those on ``machine_id`` (see
    :func:`counted_attempts`)."""
    kind = alerts[0].kind if alerts else "manual"
    code = alerts[0].code if alerts else None
    steps: list[str] = []
    if reset is not None:
        rd = reset_decision(requested, alerts, attempts, machine_id, now, ladder.window_s,
                            reset, pool, reset_blocked)
        requested = rd.action
        if rd.rule:
            steps.append(rd.rule)
    lad = ladder_decision(requested, attempts, kind, code, machine_id, now, ladder, node)
    g = migrate_gate(lad.action, alerts, critical_history, now, gate)
    steps += [lad.rule, g.rule]
    if repeat is not None and g.action in DISRUPTIVE_ACTIONS:
        ro = repeat_offender(attempts, machine_id, now, repeat)
        if ro is not None:
            steps.append(ro.rule)
            return LadderDecision(Action.remove, True, True, "; ".join(steps), ro)
    return LadderDecision(g.action, lad.escalated, lad.needs_human, "; ".join(steps))
