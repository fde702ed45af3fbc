"""The repair's decisions, shared by the model-checked machine and the workflow that runs
(issue 26 items 2, 3 and 5): what :mod:`workflows.lifecycle.repair` decides in
``tests/model`` is decided by the same functions in ``RepairWorkflow``.

- :func:`decide`: the ladder, the migrate gate, the repeat-offender rule and the per-node
  cap on a requested action → a :class:`Decision` (the action, the rule that names every
  step, whether a person must decide, the rung and the decision's fingerprint).
- :func:`covers`: whether an :class:`Approval` (a person's, or the policy's own) covers a
  decision: one action at one rung under one decision. Anything else that changed before
  acting (an escalation, the node cap, the migrate gate, another action, another repair's
  attempt) asks again.
- :func:`recurrence`: the alert that makes an action's fix not hold (I17: judged on the
  control plane's receive time).
- :func:`resolved_ending`: ``auto_resolved`` only before any action ran.
- :func:`left_cordoned`: why an ending keeps the node cordoned (docs/design.md §5 rule
  zero), or None when the cleanup uncordons.
- :func:`drain_deadline`: the drain's absolute deadline, computed once when draining
  starts (every retry of the drain counts against it); :func:`drain_deadline_ending`:
  how a drain past it ends (``failed``, the node left cordoned for a person).

Pure: no I/O, no Temporal imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel

from workflows.config import PolicyConfig
from workflows.models import Action, Alert, AttemptRecord
from workflows.models import Stage as S
from workflows.policy import choose_action, node_actions_in_window, received_time


class Decision(BaseModel, frozen=True):
    """What runs next and why.

    ``rule``: every step that decided, ``; ``-joined (ladder, gate, cap, approver);
    ``needs_human``: why a person must decide, ``""`` when the policy allows it or an
    approver was given; ``rung``: disruptive actions on the node within
    ``rails.max_actions_window_s`` at the decision's time; ``fingerprint``:
    ``"<action>|rung <n>|human|policy"``, where the last part is what the policy itself
    said (before any approver), so an approval beyond the ladder is compared with the
    same fingerprint when the decision is made again; ``policy_human``: the policy itself
    asks a person (ladder exhausted, repeat offender, node cap), approver or not."""

    action: Action
    rule: str
    needs_human: str
    rung: int
    fingerprint: str
    policy_human: bool = False


class Approval(BaseModel, frozen=True):
    """An approval and what it covers: ``action`` at ``rung`` under ``fingerprint``
    (:attr:`Decision.fingerprint`). ``by``: the person, the requesting user, or
    :data:`workflows.models.AUTO_APPROVED` for the consent policy's own."""

    by: str
    action: Action
    rung: int
    fingerprint: str


def decide(requested: Action, policy: PolicyConfig, *, node: str, machine: str | None,
           pool: str | None, alerts: Sequence[Alert], attempts: Sequence[AttemptRecord],
           now: datetime, critical: Sequence[Alert] = (), approver: str | None = None,
           reset_blocked: str | None = None, with_reset: bool = True) -> Decision:
    """Reset preconditions (``with_reset``: ``policy.reset_gpu``; ``reset_blocked``: why
    the node said a reset cannot run), ladder, migrate gate and repeat-offender rule
    (:func:`workflows.policy.choose_action`), then the per-node cap
    (``rails.max_actions_per_node`` disruptive actions per ``rails.max_actions_window_s``
    seconds) on ``requested``. ``critical``: the node's critical alerts of the migrate
    gate's window; ``approver``: the person who approved beyond the ladder or the cap
    (their name joins the rule and nothing more needs a human). ``now``: the control
    plane's clock."""
    rails = policy.rails
    dec = choose_action(requested, alerts, attempts, critical, machine, now, policy.ladder,
                        policy.migrate_gate, reset=policy.reset_gpu if with_reset else None,
                        pool=pool, reset_blocked=reset_blocked, node=node,
                        repeat=rails.repeat_offender)
    rule = dec.rule
    human = ("" if not dec.needs_human else "repeat offender: a human must decide"
             if dec.repeat_offender is not None else "ladder exhausted: a human must decide")
    rung = node_actions_in_window(attempts, node, now, rails.max_actions_window_s)
    if dec.action not in (Action.none, Action.remove) and rung >= rails.max_actions_per_node:
        cap = (f"node cap: {rung} disruptive actions on {node} within "
               f"{rails.max_actions_window_s:g} s (max {rails.max_actions_per_node})")
        rule, human = f"{rule}; {cap}", human or f"{cap}: a human must decide"
    fingerprint = f"{dec.action.value}|rung {rung}|{'human' if human else 'policy'}"
    if approver is not None and human:
        rule, human = f"{rule}; approved by {approver} beyond the ladder", ""
    return Decision(action=dec.action, rule=rule, needs_human=human, rung=rung,
                    fingerprint=fingerprint, policy_human=fingerprint.endswith("|human"))


def approval_of(by: str, decision: Decision) -> Approval:
    """The approval ``by`` gives to ``decision`` (what it covers)."""
    return Approval(by=by, action=decision.action, rung=decision.rung,
                    fingerprint=decision.fingerprint)


def covers(approval: Approval | None, decision: Decision, automatic: bool) -> bool:
    """Whether ``decision`` may run: the policy's consent allows it (``automatic``, the
    consent decision for ``decision.action``) and nothing needs a human, or ``approval``
    was given to this same action at this same rung under this same decision."""
    if automatic and not decision.needs_human:
        return True
    return (approval is not None and approval.action == decision.action
            and approval.rung == decision.rung and approval.fingerprint == decision.fingerprint)


def names_decided(named: Action | None, explicit: bool, decided: Action) -> bool:
    """Whether an approve that came while the decision was made again (the lease queued,
    or its hand-back) approves the decision now made: only one that named ``decided``
    itself (``explicit``: the person typed the action). One that named nothing was of the
    action shown when it came, the earlier decision, which covers no other: the repair
    asks again and says why it was not applied (an approval never vanishes)."""
    return explicit and named == decided


def not_applied_note(by: str, named: Action, before: Action, decided: Action) -> str:
    """The note that answers an approve :func:`names_decided` did not apply: who sent it,
    what it approved, and that the repair asks again for the decision now made."""
    return (f"approve by {by} of {named.value} not applied: it was sent for the decision "
            f"before ({before.value}); the decision changed to {decided.value}, so the "
            "repair asks again")


def stale_approval_note(by: str, named: Action, decided: Action) -> str:
    """The note that answers an approve sent before the question the repair asks now (while
    a rung ran, or before a stale cordon was found) and cleared because it covers no later
    question (an approval covers one action at one rung): who sent it, what it approved,
    and what the repair asks for now. An approval never vanishes without a word."""
    return (f"approve by {by} of {named.value} not applied: it came before this question "
            "(an approval covers one action at one rung); the repair asks again for "
            f"{decided.value}")


def approved_as_asked(asked: Action, by: str, decided: Decision,
                      automatic: bool) -> str | None:
    """An approval ``by`` gave to ``asked`` (the action shown, or the one their approval
    named) and what the ladder and the migrate gate then decided (``decided``, made with
    ``by`` as approver): None when it may run — the same action, or another the consent
    policy allows by itself (``automatic`` for ``decided.action``, nothing the policy
    asks a person for); otherwise why the person is asked again, naming both actions and
    the rule that changed one into the other (an approval covers one action)."""
    if decided.action == asked or (automatic and not decided.policy_human):
        return None
    return (f"{by} approved {asked.value}, but {decided.rule} decides "
            f"{decided.action.value}: approve {decided.action.value}, approve with another "
            "action, or reject / cancel")


#: Actions after which the host comes back with a new boot (its boot id changes).
REBOOTING: frozenset[Action] = frozenset(
    {Action.reboot, Action.power_cycle, Action.reprovision, Action.migrate})

#: When the control plane received an alert (:func:`workflows.policy.received_time`).
received = received_time


def recurrence(alerts: Sequence[Alert], acted_at: datetime, boot_before: str | None = None,
               started_at: datetime | None = None, rebooting: bool = True) -> Alert | None:
    """An active alert of a fault the repair had before the action (same kind and code)
    that shows the fix did not hold: received at or after ``acted_at`` (the action's
    end), unless the action rebooted the host and its evidence names a boot from before
    the action (a late report); or, with ``started_at`` (the action's start) and a
    rebooting action, received after it from a boot not seen before it — the boot the
    action brought, whose agent may report before the action's last step returns (a
    reboot waits for "booted").

    The boots "from before the action" are the ``boot_id`` evidence of the alerts
    received before it started (ingest stamps the agent's boot id) and ``boot_before``
    (the scheduler's boot identity read before acting: Kubernetes's ``bootID`` is the
    agent's; Slurm's is not comparable and then simply matches nothing). A
    non-rebooting action (``rebooting`` False: a GPU reset) leaves the boot as it was,
    so a report of the same boot after it is a recurrence (I20). Only an actionable
    alert recurs: one the delivery path or the node marked observed only (inside a
    maintenance window: ``evidence.in_maintenance``) never counts.
    I17: judged on :func:`received`, never on a sender's clock."""

    def boot(a: Alert) -> object:
        return a.evidence.get("boot_id")

    cut = started_at if started_at is not None else acted_at
    old_boots = {boot(a) for a in alerts if boot(a) is not None and received(a) < cut}
    if boot_before is not None:
        old_boots.add(boot_before)

    def after_start_new_boot(a: Alert) -> bool:
        b = boot(a)
        return (rebooting and started_at is not None and bool(old_boots) and b is not None
                and b not in old_boots and received(a) >= started_at)

    faults = {(a.kind, a.code) for a in alerts
              if received(a) < acted_at and not after_start_new_boot(a)}
    for a in alerts:
        if not a.active or (a.kind, a.code) not in faults:
            continue
        if not a.actionable:
            # observed only (inside a planned maintenance window, a node outside the
            # inventory): recorded, never a repair's reason, so never its fault back
            continue
        if after_start_new_boot(a):
            return a
        if received(a) < acted_at:
            continue
        if rebooting and boot(a) is not None and boot(a) in old_boots:
            continue  # a late report from a boot before the action
        return a
    return None


def resolved_ending(stage: S, reason: str, acted: Sequence[Action]) -> tuple[S, str]:
    """The ending of a repair whose evidence cleared (``auto_resolved``): so only while
    no action ran (docs/design.md §5: auto-resolve when the alert clears *before*
    action). Once ``acted`` (actions that ran without a verified recovery) is not empty,
    a fault that went quiet — a level alert cleared while the host was off after a
    failed power cycle, say — is not resolved by itself: the repair ends ``failed``
    (the node stays cordoned for a person, :func:`left_cordoned`). Any other ending is
    returned as it is."""
    if stage != S.auto_resolved or not acted:
        return stage, reason
    ran = ", ".join(a.value for a in acted)
    return S.failed, (f"{reason}, but {ran} ran without a verified recovery: the fault "
                      "is not known to be resolved")


def left_cordoned(hold: str | None, acted: Sequence[Action], stage: S) -> str | None:
    """Why an ending keeps the node this repair cordoned: ``hold`` (a remove, a node
    that did not come back, an action cancelled after it touched the machine), or a
    disruptive action ran and the repair ends without a verified recovery (the fault
    stands, the machine's state is unknown). None: the cleanup uncordons."""
    if hold is not None:
        return hold
    if acted and stage != S.succeeded:
        return (f"{', '.join(a.value for a in acted)} ran and the node was not verified "
                "healthy; the fault stands, left cordoned for a human")
    return None


def drain_deadline(started: datetime, deadline_s: float) -> datetime:
    """The drain's absolute deadline: ``deadline_s`` seconds
    (``policy.rails.drain_deadline_s``) after ``started``, the control plane's time when
    the repair began draining. Computed once and carried (the repair's state, across
    activity retries, batches of tries and continue-as-new): a retry never restarts it."""
    return started + timedelta(seconds=deadline_s)


def drain_deadline_ending(remaining: Sequence[str], deadline_s: float) -> tuple[str, str]:
    """How a repair whose drain did not finish by its deadline (``deadline_s``,
    ``policy.rails.drain_deadline_s``) ends: ``(reason, hold)``. It ends ``failed`` with
    ``reason`` naming what still runs (``remaining``: pods or job ids, as the scheduler
    listed them), and ``hold`` keeps the node cordoned (:func:`left_cordoned`): nothing was
    touched, but the fault that started the repair stands, so the node is not put back in
    service because its work would not leave; a person decides (finish the drain by hand
    and ask again, or uncordon)."""
    running = ", ".join(remaining) or "unknown (the scheduler listed nothing)"
    reason = f"drain deadline of {deadline_s:g} s passed, still running: {running}"
    hold = ("the drain did not finish by its deadline and the fault stands; left cordoned "
            "for a human")
    return reason, hold
