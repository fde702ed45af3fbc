"""The repair lifecycle as a pure state machine (issue 26 items 1 and 3): one repair of
one node, from the recommendation to its terminal stage.

``step(state, event, now) -> (state, commands)`` decides every (status, event) pair
(:data:`TRANSITIONS` is the table; docs/lifecycle.md is generated from it). The state
(:class:`RepairState`) is everything the repair must keep across an activity retry, a
worker restart or continue-as-new: the stage, the action and the rung it is at, the
lease, whether this repair cordoned, the approval and *what it covers*, a pending
cancel / reject / approval, the evidence, the attempt history once read, the idle
wait's start and poll, the actions that ran, the hold text, the deadlines and the
machine action's own state (:class:`~workflows.lifecycle.machine_action.MachineActionState`,
to which machine-action events are delegated). ``ContinueAsNew`` carries the whole
state, so nothing a person sent is lost across the hand-over.

Decisions (docs/design.md §5 rails; issue 26 item 3):

- **Cancel / reject stop at once (I19).** In a wait (approval, lease, idle poll,
  rejoin poll) the repair ends at once; while a scheduler call is out it ends when the
  call returns, before the next step; while the machine action runs the cancel goes to
  the action (a power cycle that sent ForceOff sends On), then the repair ends. Between
  two ladder rungs a pending cancel ends the repair before the next rung.
- **An approval covers one action at one rung.** It is recorded with the action, the
  rung (attempts counted on the node) and the decision's fingerprint (ladder rule and
  node cap); when any of them changes before acting, the person is asked again and the
  recorded rule names each step that changed it.
- **A removed machine stays out (I18).** A machine held for RMA is never cordoned,
  drained or acted on: the repair ends ``cancelled`` by ``system`` naming the hold. A
  cordon left by an ended repair is never adopted silently: a person is asked.
- **I22**: an attempt is recorded exactly when the action touched the machine.
- **A drain past its deadline leaves the node cordoned.** Nothing was touched, but the
  fault stands: the repair ends ``failed`` naming what still runs, and the node stays
  cordoned for a person (:func:`decision.drain_deadline_ending`), never put back in
  service because its work would not leave.
- **Maintenance (issue 29).** Before the cordon, a system or detector repair reads the
  maintenance windows; one covering the node is waited out holding no lease (read again
  at its end, at most every :data:`MAINTENANCE_RECHECK_S`); afterwards the evidence is
  checked and the lease asked for again. An operator's own request does not wait.
- **A lapsed lease is never reused.** A refused renewal or a TTL past (``lease_lapsed``)
  is remembered; before the next drain or attempt of a machine action the lease is
  asked for again and, on the grant, the evidence checked again. A retry inside an
  attempt resumes under the lease it started with (ending half-way could leave a host
  off).
- **Shadow mode (issue 29 item 3).** A repair whose policy read says ``shadow`` decides
  everything as in enforce (ladder, cap, consent, the lease) and, where it would cordon
  (the hold checked once more), ends ``shadowed``: the attempt it stood for is recorded
  with outcome ``shadowed`` and nothing is cordoned, drained or acted on.

The scheduler-side activities (cordon, idle check, drain, node health, rejoin, ledger
reads) retry transient failures under their Temporal retry policy; the machine sees
their final outcome only: ``ok`` or a permanent failure / time-out, which ends the repair
``failed`` (the cleanup runs). Machine actions retry in their own machine.

``defects`` (a parameter of :func:`step`, empty in production; only ``tests/model``
passes it) re-introduces known defects so the checker can show it finds them
(:data:`DEFECTS`).

This machine is model-checked (``tests/model/repair_world.py``). ``RepairWorkflow``
(workflows/repair.py) interprets its machine action (:mod:`machine_action`) and decides
with the same functions (:mod:`workflows.lifecycle.decision`: the decision, what an
approval covers, recurrence, what keeps a node cordoned), but still sequences the
stages in its own code — wiring it as a thin interpreter of this machine is the
remaining step of issue 26 item 2.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from workflows.config import PolicyConfig
from workflows.lifecycle import decision
from workflows.lifecycle import machine_action as ma
from workflows.lifecycle.decision import Approval
from workflows.models import Action, Alert, AttemptRecord, Requester, RequesterKind
from workflows.models import Stage as S
from workflows.policy import (
    consent_decision,
    evidence_current,
    is_shadow,
    node_actions_in_window,
    rail_attempts,
    reset_targets,
    would_do,
)

#: Test-only defects :func:`step` can re-introduce (``tests/model`` shows each is found).
DEFECTS: dict[str, str] = {
    "cancel_lost_across_can": "continue-as-new carries no pending cancel/reject and does not "
                              "check one first (reproduction 6)",
    "approval_carried_over": "an approval of one action covers a heavier action or a later "
                             "rung",
    "act_on_held_machine": "a machine held for RMA is cordoned and acted on (reproduction 4)",
    "adopt_stale_cordon": "a cordon left by an ended repair is adopted silently (I18)",
    "cancel_ignored_between_rungs": "a cancel pending when a rung ends is ignored and the "
                                    "next rung runs (reproduction 5)",
    "act_in_shadow": "a repair in shadow mode cordons and acts as in enforce (issue 29 "
                     "item 3)",
    "cordon_in_maintenance": "a maintenance window covering the node is not waited out: "
                             "the repair cordons inside it (issue 29: a planned rack "
                             "reboot's false faults cordon nodes)",
    "hold_read_only_before_cordon": "the RMA hold is read only at start and before the "
                                    "cordon: a machine removed by another repair while "
                                    "this one waits for idle is drained and acted on "
                                    "(I18; a break-test of 6f2cea4)",
    "reuse_lapsed_lease": "a lease the guard refused to renew (or whose TTL passed) is "
                          "used for the drain or the machine action (an expired lease is "
                          "never silently reused: docs/design.md §5 rails)",
}


class Status(StrEnum):
    """Where the repair's lifecycle is (finer than :class:`~workflows.models.Stage`)."""

    new = "new"
    reading_policy = "reading_policy"  # load_policy out
    reading_hold = "reading_hold"  # ledger_machine_held out
    reading_history = "reading_history"  # ledger_attempt_history out
    reading_maintenance = "reading_maintenance"  # ledger_maintenance_covering out
    maintenance_wait = "maintenance_wait"  # a window covers the node: its timer runs
    awaiting_approval = "awaiting_approval"  # a person decides
    awaiting_lease = "awaiting_lease"  # lease requested, no grant yet
    cordoning = "cordoning"  # cordon_node out
    probing_holder = "probing_holder"  # ledger_open_repair out (the cordon's holder)
    checking_idle = "checking_idle"  # check_idle out
    idle_backoff = "idle_backoff"  # poll timer runs
    draining = "draining"  # drain_node out
    acting = "acting"  # the machine action runs (delegated)
    joining = "joining"  # node_health out
    join_backoff = "join_backoff"  # rejoin poll timer runs
    rejoining = "rejoining"  # rejoin_node out
    ended = "ended"


#: Statuses in which a call (activity) of the repair's own is out.
CALL_OUT = frozenset({Status.reading_policy, Status.reading_hold, Status.reading_history,
                      Status.reading_maintenance, Status.cordoning, Status.probing_holder,
                      Status.checking_idle, Status.draining, Status.joining,
                      Status.rejoining})
#: Statuses in which the repair only waits (a cancel ends it at once).
WAITING = frozenset({Status.awaiting_approval, Status.awaiting_lease, Status.idle_backoff,
                     Status.join_backoff, Status.maintenance_wait})
#: Statuses whose call out is a read-only scheduler call a stop interrupts (the call is
#: abandoned, the repair ends at once: I19, never held up by a scheduler that is down).
INTERRUPTIBLE = frozenset({Status.checking_idle, Status.joining})
#: While a maintenance window holds a repair before its cordon, the windows are read
#: again at least this often, seconds (5 min: an operator ending a window early frees
#: the repairs it held within minutes, at one ledger read per held repair each time;
#: issue 29).
MAINTENANCE_RECHECK_S = 300.0
#: Which activity is out in each :data:`CALL_OUT` status.
CALL_OF: dict[Status, str] = {
    Status.reading_policy: "load_policy", Status.reading_hold: "ledger_machine_held",
    Status.reading_history: "ledger_attempt_history",
    Status.reading_maintenance: "ledger_maintenance_covering", Status.cordoning: "cordon_node",
    Status.probing_holder: "ledger_open_repair", Status.checking_idle: "check_idle",
    Status.draining: "drain_node", Status.joining: "node_health",
    Status.rejoining: "rejoin_node",
}


class Stop(BaseModel):
    """A pending cancel or reject: ``stage`` ``cancelled`` / ``rejected``."""

    stage: Literal["cancelled", "rejected"]
    by: str
    reason: str = ""


class RepairState(BaseModel):
    """Everything the repair keeps across retries, restarts and continue-as-new."""

    repair_id: str
    cluster: str
    node: str
    requester: Requester
    requested: Action
    machine: str | None = None
    pool: str | None = None
    status: Status = Status.new
    stage: S = S.recommended
    action: Action = Action.none
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    alerts: list[Alert] = Field(default_factory=list)
    cited: list[str] = Field(default_factory=list)  # alert ids the repair started with
    attempts: list[AttemptRecord] | None = None  # None until read
    rule: str = ""
    #: the action the last decision was decided from (the ladder starts there)
    decided_from: Action | None = None
    fingerprint: str = ""
    needs_human: str = ""  # why a person must decide ("" when the policy allows)
    approval: Approval | None = None
    pending_approve: Approval | None = None  # sent, not yet applied (by + action only)
    #: the pending approve named its action (not filled in with the one shown)
    pending_named: bool = False
    stop: Stop | None = None
    lease: Literal["none", "requested", "granted"] = "none"
    #: the lease granted is no longer held (a refused renewal, its TTL passed): it is
    #: asked for again before the next drain or machine action
    lease_lapsed: bool = False
    #: the maintenance window the repair waits out before its cordon ("": none)
    maintenance: str = ""
    #: what the re-acquired lease is for once granted ("": the first grant)
    reacquire_then: Literal["", "drain", "act"] = ""
    lease_deadline: datetime | None = None
    approval_deadline: datetime | None = None
    cordoned_by_us: bool = False
    stale_cordon: str | None = None  # an ended repair's cordon a person accepted
    recheck: bool = False  # history re-read at grant time (another repair may have acted)
    hold_then: Literal["decide", "cordon", "idle", "drain", "act"] = "decide"
    #: the hold was read again before the drain (I18: held for RMA while waiting for idle)
    drain_hold_read: bool = False
    #: the rung (``len(acted)``) before which the hold was last read again (-1: none)
    act_hold_read: int = -1
    idle_since: datetime | None = None
    idle_poll_s: float = 0.0
    acted: list[Action] = Field(default_factory=list)
    acted_at: datetime | None = None
    join_since: datetime | None = None
    hold: str | None = None
    can_due: bool = False  # continue-as-new is due once the idle check out returns
    unrecorded: Action | None = None  # an action that touched and ran, attempt not yet recorded
    machine_action: ma.MachineActionState | None = None
    continued: int = 0
    #: shadow mode (issue 29 item 3): decide and record, never cordon, drain or act
    shadow: bool = False


# ---- events ------------------------------------------------------------------------
class Start(BaseModel):
    kind: Literal["start"] = "start"


class PolicyRead(BaseModel):
    """``load_policy`` answered: the policy and the node's machine and pool; ``mode``:
    the repair's (its pool's ``clusters[].pools[].mode``; None = ``policy.mode``)."""

    kind: Literal["policy_read"] = "policy_read"
    policy: PolicyConfig
    machine: str | None = None
    pool: str | None = None
    mode: Literal["enforce", "shadow"] | None = None


class HoldRead(BaseModel):
    """``ledger_machine_held`` answered; ``reason`` names the hold when ``held``."""

    kind: Literal["hold_read"] = "hold_read"
    held: bool
    reason: str = ""


class HistoryRead(BaseModel):
    kind: Literal["history_read"] = "history_read"
    attempts: list[AttemptRecord] = Field(default_factory=list)


class MaintenanceRead(BaseModel):
    """``ledger_maintenance_covering`` answered: the window in force that covers the node
    and ends last (``window_id`` None: none), when it ends and why."""

    kind: Literal["maintenance_read"] = "maintenance_read"
    window_id: str | None = None
    ends_at: datetime | None = None
    reason: str = ""


class LedgerUnavailable(BaseModel):
    """A ledger read gave up (its retries spent)."""

    kind: Literal["ledger_unavailable"] = "ledger_unavailable"


class Approve(BaseModel):
    kind: Literal["approve"] = "approve"
    by: str
    action: Action | None = None


class Reject(BaseModel):
    kind: Literal["reject"] = "reject"
    by: str
    reason: str = ""


class Cancel(BaseModel):
    kind: Literal["cancel"] = "cancel"
    by: str
    reason: str = ""


class AlertAttached(BaseModel):
    kind: Literal["alert_attached"] = "alert_attached"
    alert: Alert


class AlertCleared(BaseModel):
    """A clear of the level fault ``alert_id`` names (its kind and code)."""

    kind: Literal["alert_cleared"] = "alert_cleared"
    alert_id: str


class LeaseReply(BaseModel):
    kind: Literal["lease"] = "lease"
    granted: bool
    reason: str = ""


class LeaseLapsed(BaseModel):
    """The lease granted is no longer held: the guard refused a renewal, or the grant's
    ``expires_at`` passed on the control plane's clock without a renewal answered."""

    kind: Literal["lease_lapsed"] = "lease_lapsed"


class CallOk(BaseModel):
    """The repair's own call (the one :data:`CALL_OF` names for the status) returned.
    ``cordoned_by_us`` / ``held_by_repair``: cordon; ``running``: the holder probe;
    ``idle``: idle check; ``drained``: drain (False: its deadline passed with
    ``remaining`` still running); ``healthy``: node health (ready, new boot)."""

    kind: Literal["call_ok"] = "call_ok"
    cordoned_by_us: bool = True
    held_by_repair: str | None = None
    running: bool = False
    idle: bool = True
    drained: bool = True
    remaining: list[str] = Field(default_factory=list)
    healthy: bool = True


class CallFailed(BaseModel):
    """The repair's own call failed for good (its retries spent, or permanent)."""

    kind: Literal["call_failed"] = "call_failed"
    outcome: Literal["permanent", "timed_out"] = "permanent"
    message: str = ""


class Machine(BaseModel):
    """An event of the machine action (delegated to :func:`machine_action.step`)."""

    kind: Literal["machine"] = "machine"
    event: ma.Event


class TimerFired(BaseModel):
    kind: Literal["timer"] = "timer"


class ContinueAsNewDue(BaseModel):
    """The run's history is long (Temporal suggests continue-as-new)."""

    kind: Literal["can_due"] = "can_due"


class WorkerRestart(BaseModel):
    """The worker restarted: the workflow's state is replayed; a call out is retried by
    the server. Nothing to decide (the machine action hears of its own restart)."""

    kind: Literal["worker_restart"] = "worker_restart"


class Clock(BaseModel):
    """Time passed (the control plane's clock); deadlines are judged here."""

    kind: Literal["clock"] = "clock"


Event = Annotated[
    Start | PolicyRead | HoldRead | HistoryRead | MaintenanceRead | LedgerUnavailable
    | Approve | Reject
    | Cancel | AlertAttached | AlertCleared | LeaseReply | LeaseLapsed | CallOk | CallFailed
    | Machine
    | TimerFired | ContinueAsNewDue | WorkerRestart | Clock,
    Field(discriminator="kind"),
]
EVENT_KINDS = ("start", "policy_read", "hold_read", "history_read", "maintenance_read",
               "ledger_unavailable",
               "approve", "reject", "cancel", "alert_attached", "alert_cleared", "lease",
               "lease_lapsed", "call_ok", "call_failed", "machine", "timer", "can_due",
               "worker_restart", "clock")


# ---- commands ----------------------------------------------------------------------
class RunActivity(BaseModel):
    """Run activity ``name`` (one of :data:`CALL_OF`'s) with ``key`` (idempotency)."""

    kind: Literal["run_activity"] = "run_activity"
    name: str
    key: str


class SignalGuard(BaseModel):
    kind: Literal["signal_guard"] = "signal_guard"
    what: Literal["acquire", "renew", "release"]


class StartTimer(BaseModel):
    kind: Literal["start_timer"] = "start_timer"
    seconds: float


class RecordTransition(BaseModel):
    """Ledger transition + ``RepairStage`` / ``RepairState`` search attributes + details."""

    kind: Literal["record_transition"] = "record_transition"
    stage: S
    by: str
    reason: str


class RecordAttempt(BaseModel):
    kind: Literal["record_attempt"] = "record_attempt"
    action: Action
    #: ``shadowed``: the action a shadow-mode repair stood for (nothing ran)
    outcome: Literal["failed", "succeeded", "cancelled", "shadowed"]


class MachineCommand(BaseModel):
    """A command of the machine action (run it on the BMC queue, its timers, details)."""

    kind: Literal["machine_command"] = "machine_command"
    command: ma.Command


class StartValidation(BaseModel):
    kind: Literal["start_validation"] = "start_validation"
    machine: str
    return_to: Literal["pool", "spare", "hold"]


class ContinueAsNew(BaseModel):
    kind: Literal["continue_as_new"] = "continue_as_new"
    state: RepairState


class Finish(BaseModel):
    """The repair ended: ``stage`` by ``by`` for ``reason``; ``uncordon``: lift the
    cordon this repair set; ``held``: why the node stays cordoned (a person looks)."""

    kind: Literal["finish"] = "finish"
    stage: S
    by: str
    reason: str
    uncordon: bool
    held: str | None = None


Command = (RunActivity | SignalGuard | StartTimer | RecordTransition | RecordAttempt
           | MachineCommand | StartValidation | ContinueAsNew | Finish)
Out = tuple[RepairState, list[Command]]


# ---- helpers -----------------------------------------------------------------------
def new_state(repair_id: str, cluster: str, node: str, requester: Requester,
              action: Action, alerts: list[Alert]) -> RepairState:
    """A fresh repair; raises ``ValueError`` naming ``action`` when it is ``none``."""
    if action == Action.none:
        raise ValueError("action: 'none' cannot be repaired")
    return RepairState(repair_id=repair_id, cluster=cluster, node=node, requester=requester,
                       requested=action, action=action, alerts=list(alerts),
                       cited=[a.alert_id for a in alerts])


def _run(s: RepairState, status: Status) -> Out:
    s = s.model_copy(update={"status": status})
    return s, [RunActivity(name=CALL_OF[status], key=f"{s.repair_id}/{CALL_OF[status]}")]


def _to(s: RepairState, stage: S, reason: str, by: str = "system") -> tuple[RepairState,
                                                                            Command]:
    return s.model_copy(update={"stage": stage}), RecordTransition(stage=stage, by=by,
                                                                   reason=reason)


def _evidence_ok(s: RepairState) -> bool:
    ev = [a for a in s.alerts if a.alert_id in s.cited or a.actionable] if s.cited else []
    return evidence_current(ev)


def _rung(s: RepairState, now: datetime) -> int:
    return node_actions_in_window(s.attempts or [], s.node, now,
                                  s.policy.rails.max_actions_window_s)


def _decide(s: RepairState, now: datetime, requested: Action,
            approver: str | None = None) -> RepairState:
    """Ladder + migrate gate + node cap on ``requested`` (:func:`decision.decide`, the
    function ``RepairWorkflow`` decides with)."""
    d = decision.decide(requested, s.policy, node=s.node, machine=s.machine, pool=s.pool,
                        alerts=s.alerts, attempts=s.attempts or [], now=now,
                        approver=approver)
    return s.model_copy(update={"action": d.action, "rule": d.rule, "decided_from": requested,
                                "needs_human": d.needs_human, "fingerprint": d.fingerprint})


def _decision_of(s: RepairState, now: datetime) -> decision.Decision:
    return decision.Decision(action=s.action, rule=s.rule, needs_human=s.needs_human,
                             rung=_rung(s, now), fingerprint=s.fingerprint,
                             policy_human=s.fingerprint.endswith("|human"))


def covers(s: RepairState, now: datetime, defects: frozenset[str] = frozenset()) -> bool:
    """Whether what would run now may run (:func:`decision.covers`, as in
    ``RepairWorkflow``): consent the policy gives (``automatic``) with nothing needing a
    human, or the recorded approval of the same action at the same rung under the same
    decision (issue 26 item 3)."""
    # an operator's own request approves the first rung of the action asked for only
    automatic = consent_decision(s.action, s.alerts, s.requester, s.policy.consent,
                                 requested=Action.none if s.acted else s.requested).automatic
    if "approval_carried_over" in defects and s.approval is not None:
        return True
    return decision.covers(s.approval, _decision_of(s, now), automatic)


def _ask(s: RepairState, now: datetime, why: str, keep_pending: bool = False,
         note: str = "") -> Out:
    """Wait for a person; the lease is handed back while they decide. ``keep_pending``: an
    approve sent while the decision was made again names the action now decided (it is
    applied at once); ``note``: why one that does not was not applied (recorded after the
    hand-back, before the question)."""
    cmds: list[Command] = []
    if s.lease != "none":
        cmds.append(SignalGuard(what="release"))
    if note:
        cmds.append(RecordTransition(stage=s.stage, by="system", reason=note))
    t = s.policy.consent.approval_timeout_s
    if (s.acted or s.recheck) and not keep_pending:
        # an approval sent before an earlier question does not cover this one: cleared,
        # and answered with a note (an approval never vanishes silently)
        pa = s.pending_approve
        if pa is not None and not note:
            cmds.append(RecordTransition(stage=s.stage, by="system",
                                         reason=decision.stale_approval_note(
                                             pa.by, pa.action, s.action)))
        s = s.model_copy(update={"pending_approve": None})
    # I18: the machine may be held for RMA while a person decides: read again before
    # the next rung (after a rung that could not run, ``acted`` is as it was)
    s = s.model_copy(update={"status": Status.awaiting_approval, "lease": "none",
                             "lease_lapsed": False, "reacquire_then": "",
                             "approval": None, "act_hold_read": -1,
                             "approval_deadline": None if t is None
                             else now + timedelta(seconds=t)})
    s, tr = _to(s, S.awaiting_approval, f"approval needed: {why}")
    cmds.append(tr)
    if s.pending_approve is not None:  # an approval sent before the question is kept
        return _apply_approval(s, now, cmds)
    return s, cmds


def _apply_approval(s: RepairState, now: datetime, cmds: list[Command]) -> Out:
    pa = s.pending_approve
    assert pa is not None
    asked = pa.action if pa.action != Action.none else s.action
    # decided again from where the decision shown was decided from (the rule keeps every
    # step that moved it); an action the person chose instead is decided from itself
    base = s.decided_from if asked == s.action and s.decided_from is not None else asked
    s = _decide(s, now, base, approver=pa.by)
    # an operator's own request approves the first rung of the action asked for only: an
    # approval at a later rung that the ladder turns into it is asked again
    automatic = consent_decision(s.action, s.alerts, s.requester, s.policy.consent,
                                 requested=Action.none if s.acted else s.requested).automatic
    again = decision.approved_as_asked(asked, pa.by, _decision_of(s, now), automatic)
    if again is not None:  # the ladder or the gate made it another action: asked again
        s2, more = _ask(s.model_copy(update={"pending_approve": None}), now, again)
        return s2, [*cmds, *more]
    approval = decision.approval_of(pa.by, _decision_of(s, now))
    s = s.model_copy(update={"approval": approval, "pending_approve": None,
                             "rule": f"approved by {pa.by}; {s.rule}",
                             "approval_deadline": None})
    return _go_on(s, now, cmds)


def _go_on(s: RepairState, now: datetime, cmds: list[Command]) -> Out:
    """Decided and covered: ask the guard for the lease (or go on holding it)."""
    t = s.policy.rails.lease_wait_max_s
    s = s.model_copy(update={"status": Status.awaiting_lease, "lease": "requested",
                             "lease_deadline": now + timedelta(seconds=t)})
    return s, [*cmds, SignalGuard(what="acquire")]


def _consent_or_ask(s: RepairState, now: datetime, why: str, cmds: list[Command],
                    defects: frozenset[str]) -> Out:
    if covers(s, now, defects):
        return _go_on(s, now, cmds)
    s2, more = _ask(s, now, why)
    return s2, [*cmds, *more]


def _end(s: RepairState, stage: S, by: str, reason: str) -> Out:
    """Finish: uncordon unless a disruptive action ran without a verified recovery, a
    remove held the machine, or the hold says why the node stays cordoned."""
    # rejoining: the node came back healthy and the fault did not recur; only the
    # uncordon was left, so an ending now (the uncordon refused for good) records the
    # action as succeeded and keeps no cordon for the fault (the cleanup's uncordon says
    # why it failed)
    verified = s.status == Status.rejoining
    # evidence that cleared after an action ran (not verified) resolves nothing
    stage, reason = decision.resolved_ending(stage, reason, [] if verified else s.acted)
    held = decision.left_cordoned(s.hold, [] if verified else s.acted, stage)
    cmds: list[Command] = []
    if s.unrecorded is not None:  # I22: an action that ran is recorded, whatever ended it
        cmds.append(RecordAttempt(action=s.unrecorded, outcome="succeeded"
                                  if stage == S.succeeded or verified else "failed"))
    if s.lease != "none":
        cmds.append(SignalGuard(what="release"))
    s = s.model_copy(update={"status": Status.ended, "stage": stage, "lease": "none",
                             "unrecorded": None})
    cmds += [RecordTransition(stage=stage, by=by, reason=reason),
             Finish(stage=stage, by=by, reason=reason,
                    uncordon=s.cordoned_by_us and held is None,
                    held=held if s.cordoned_by_us else None)]
    return s, cmds


def _end_shadowed(s: RepairState) -> Out:
    """Shadow mode where the cordon would come: the attempt it stood for is recorded
    (outcome ``shadowed``) and the repair ends ``shadowed`` saying what would have run."""
    plan = would_do(s.action, s.node, s.machine,
                    reset_targets(s.alerts) if s.action == Action.reset_gpu else [],
                    s.policy.wait_for_idle)
    s2, cmds = _end(s, S.shadowed, "system", f"shadow mode: {plan}")
    return s2, [RecordAttempt(action=s.action, outcome="shadowed"), *cmds]


def _stop_now(s: RepairState) -> Out:
    assert s.stop is not None
    st = S.cancelled if s.stop.stage == "cancelled" else S.rejected
    return _end(s, st, s.stop.by, s.stop.reason or st.value)


def _reacquire(s: RepairState, now: datetime, then: Literal["drain", "act"]) -> Out:
    """The lease lapsed: ask for it again before the ``then`` step (never reused)."""
    t = s.policy.rails.lease_wait_max_s
    step = "drain" if then == "drain" else s.action.value
    # the hold is read again once the lease is back (the machine may be held meanwhile)
    s = s.model_copy(update={"status": Status.awaiting_lease, "lease": "requested",
                             "lease_lapsed": False, "reacquire_then": then,
                             "drain_hold_read": False, "act_hold_read": -1,
                             "lease_deadline": now + timedelta(seconds=t)})
    return s, [RecordTransition(stage=s.stage, by="system",
                                reason=f"lease not held before {step}; re-acquiring"),
               SignalGuard(what="acquire")]


def _lapsed(s: RepairState, defects: frozenset[str]) -> bool:
    return s.lease_lapsed and "reuse_lapsed_lease" not in defects


def _drain(s: RepairState, now: datetime, defects: frozenset[str]) -> Out:
    """Idle (or the bound spent) and the evidence current: drain with a held lease."""
    if _lapsed(s, defects):
        return _reacquire(s, now, "drain")
    if not s.drain_hold_read and not defects & {"act_on_held_machine",
                                                 "hold_read_only_before_cordon"}:
        # I18: the machine may have been held for RMA while this repair waited for idle
        # (read right before the drain, it counts for the first rung that follows it)
        return _run(s.model_copy(update={"hold_then": "drain", "drain_hold_read": True,
                                         "act_hold_read": 0}), Status.reading_hold)
    s, tr = _to(s, S.draining, "")
    s2, cmds = _run(s, Status.draining)
    return s2, [tr, *cmds]


def _start_action(s: RepairState, now: datetime, defects: frozenset[str]) -> Out:
    """Before each rung: a pending stop ends; stale evidence ends; a lapsed lease is
    asked for again; else the action."""
    if s.stop is not None and not ("cancel_ignored_between_rungs" in defects and s.acted):
        return _stop_now(s)
    if not _evidence_ok(s):
        return _end(s, S.auto_resolved, "system", "every alert behind the repair cleared "
                    "before acting")
    if _lapsed(s, defects):
        return _reacquire(s, now, "act")
    if s.act_hold_read != len(s.acted) and not defects & {"act_on_held_machine",
                                                           "hold_read_only_before_cordon"}:
        # I18, before every rung: held for RMA meanwhile (a lease re-acquired, a person
        # asked, the node rejoining after the last rung)
        return _run(s.model_copy(update={"hold_then": "act", "act_hold_read": len(s.acted)}),
                    Status.reading_hold)
    key = f"{s.repair_id}/{s.action.value}/{len(s.acted) + 1}"
    m = ma.new_state(s.action, key, s.policy.rails.action_retry_max_s)
    m, mcmds = ma.step(m, ma.Start(), now)
    stage = S.migrating if s.action == Action.migrate else S.repairing
    s = s.model_copy(update={"status": Status.acting, "machine_action": m,
                             "acted": [*s.acted, s.action]})
    s, tr = _to(s, stage, f"{s.action.value} on {s.machine or s.node}")
    return s, [tr, *[MachineCommand(command=c) for c in mcmds]]


def _escalate(s: RepairState, now: datetime, why: str, defects: frozenset[str],
              cmds: list[Command]) -> Out:
    """A rung ended without a fix: the ladder (and node cap) decide the next; a person
    approves where consent or the cap asks. A pending stop ends first."""
    if s.stop is not None and "cancel_ignored_between_rungs" not in defects:
        s2, more = _stop_now(s)
        return s2, [*cmds, *more]
    before = s.rule
    s = _decide(s, now, s.action)
    s = s.model_copy(update={"rule": f"{s.rule}; after {why} (was: {before})"})
    if s.needs_human or s.action == Action.remove:
        s2, more = _ask_keep_lease(s, now, f"{why}; {s.needs_human or 'remove needs a person'}")
        return s2, [*cmds, *more]
    if covers(s, now, defects):
        s2, more = _start_action(s, now, defects)
        return s2, [*cmds, *more]
    s2, more = _ask_keep_lease(s, now, f"{why}; {s.action.value} at rung {_rung(s, now)}")
    return s2, [*cmds, *more]


def _ask_keep_lease(s: RepairState, now: datetime, why: str) -> Out:
    """Ask a person after acting: the node stays cordoned; the lease goes back and is
    asked for again once approved."""
    return _ask(s, now, why)


def _after_grant(s: RepairState, now: datetime, defects: frozenset[str]) -> Out:
    """The lease is granted: re-read the history once (another repair of the node may
    have acted meanwhile) unless acting already."""
    if s.acted:
        return _start_action(s, now, defects)
    if s.cordoned_by_us:
        return _run(s, Status.checking_idle)
    if s.stale_cordon is not None:  # a person accepted it: the hold is asked once more
        return _run(s.model_copy(update={"hold_then": "idle"}), Status.reading_hold)
    s = s.model_copy(update={"recheck": True})
    return _run(s, Status.reading_history)


def _on_call_ok(s: RepairState, ev: CallOk, now: datetime, defects: frozenset[str]) -> Out:
    st = s.status
    if st == Status.cordoning:  # what the cordon did counts whatever comes next (I1)
        s = s.model_copy(update={"cordoned_by_us": ev.cordoned_by_us})
    lost = ("cancel_lost_across_can" in defects and st == Status.checking_idle and s.can_due) \
        or ("cancel_ignored_between_rungs" in defects and bool(s.acted))
    if s.stop is not None and st != Status.rejoining and not lost:
        return _stop_now(s)  # decided when the call returned, before the next step
    if st == Status.reading_hold:
        raise AssertionError("hold reads come as hold_read")  # pragma: no cover
    if st == Status.cordoning:
        s = s.model_copy(update={"cordoned_by_us": ev.cordoned_by_us})
        if ev.held_by_repair is not None and not ev.cordoned_by_us:
            s = s.model_copy(update={"stale_cordon": ev.held_by_repair})
            return _run(s, Status.probing_holder)
        return _idle_start(s, now)
    if st == Status.probing_holder:
        holder = s.stale_cordon
        if ev.running:
            return _end(s.model_copy(update={"stale_cordon": None}), S.cancelled, "system",
                        f"{s.node} is held by repair {holder}: one repair acts on a node "
                        "at a time")
        if "adopt_stale_cordon" in defects:
            return _idle_start(s, now)
        return _ask(s, now, f"cordon left by repair {holder}, which has ended; approve to go "
                    "on (the cordon is kept as it is), or reject / cancel")
    if st == Status.checking_idle:
        if ev.idle or (not s.policy.wait_for_idle.do_not_interrupt and s.idle_since is not None
                       and (now - s.idle_since).total_seconds()
                       >= s.policy.wait_for_idle.max_wait_s):
            if not _evidence_ok(s):
                return _end(s, S.auto_resolved, "system",
                            "every alert behind the repair cleared before draining")
            return _drain(s, now, defects)
        wfi = s.policy.wait_for_idle
        poll = s.idle_poll_s or wfi.poll_s
        s = s.model_copy(update={"status": Status.idle_backoff,
                                 "idle_poll_s": min(poll * 2, max(wfi.poll_max_s, wfi.poll_s))})
        if s.can_due:  # the history is long: the next run polls (stop checked above)
            return s, [_carry(s, defects)]
        return s, [StartTimer(seconds=poll)]
    if st == Status.draining:
        if not ev.drained:
            # the drain's deadline passed: the fault stands, the node stays cordoned for a
            # person (decision.drain_deadline_ending, as the workflow decides)
            reason, hold = decision.drain_deadline_ending(ev.remaining,
                                                          s.policy.rails.drain_deadline_s)
            return _end(s.model_copy(update={"hold": hold}), S.failed, "system", reason)
        return _start_action(s, now, defects)
    if st == Status.joining:
        if _recurred(s):
            # a report that came while the health read was out: judged before the
            # answer (healthy or not), as in the poll's wait
            return _on_recurrence(s, now, defects)
        if ev.healthy:
            return _run(s, Status.rejoining)
        since = s.join_since or now
        if (now - since).total_seconds() >= s.policy.rails.rejoin_timeout_s:
            s = s.model_copy(update={"hold": "node not healthy after the action; left "
                                     "cordoned for a human"})
            return _end(s, S.timed_out, "system", "node not healthy within "
                        f"{s.policy.rails.rejoin_timeout_s:g} s after the action")
        s = s.model_copy(update={"status": Status.join_backoff, "join_since": since})
        return s, [StartTimer(seconds=s.policy.rails.rejoin_poll_s)]
    if st == Status.rejoining:
        s = s.model_copy(update={"cordoned_by_us": False})
        s, tr = _to(s, S.running, "node back in service")
        s2, more = _end(s, S.succeeded, "system", "node back in service")
        return s2, [tr, *more]
    return s, []  # pragma: no cover (no other status has a call out)


def _on_maintenance(s: RepairState, ev: MaintenanceRead, now: datetime,
                    defects: frozenset[str]) -> Out:
    """Before the cordon (the lease held, the decision made again): a window covering
    the node is waited out holding no lease — read again at its end, at most every
    :data:`MAINTENANCE_RECHECK_S`; once none covers it, the lease is asked for again
    (the evidence checked first) and the decision made again on the grant."""
    if s.stop is not None:
        return _stop_now(s)
    if ev.window_id is None or ev.ends_at is None or "cordon_in_maintenance" in defects:
        if not s.maintenance:
            return _run(s, Status.reading_hold)
        note = RecordTransition(stage=s.stage, by="system", reason="maintenance over: "
                                "evidence checked again before cordoning")
        s = s.model_copy(update={"maintenance": ""})
        if not _evidence_ok(s):
            s2, more = _end(s, S.auto_resolved, "system", "every alert behind the repair "
                            "cleared during the maintenance window")
            return s2, [note, *more]
        return _go_on(s, now, [note])
    cmds: list[Command] = []
    if not s.maintenance:
        cmds.append(RecordTransition(
            stage=s.stage, by="system",
            reason=f"paused before cordoning: {s.node} is in maintenance window "
                   f"{ev.window_id} until {ev.ends_at.isoformat()} ({ev.reason}); the "
                   "evidence is checked again when it ends"))
        if s.lease != "none":
            cmds.append(SignalGuard(what="release"))
    left = (ev.ends_at - now).total_seconds()
    s = s.model_copy(update={"status": Status.maintenance_wait, "lease": "none",
                             "lease_lapsed": False, "maintenance": ev.window_id})
    return s, [*cmds, StartTimer(seconds=min(max(left, 1.0), MAINTENANCE_RECHECK_S))]


def _idle_start(s: RepairState, now: datetime) -> Out:
    s = s.model_copy(update={"idle_since": s.idle_since or now})
    bound = ("do not interrupt" if s.policy.wait_for_idle.do_not_interrupt
             else f"max {s.policy.wait_for_idle.max_wait_s:g} s")
    s, tr = _to(s, S.waiting_for_idle, bound)
    s2, cmds = _run(s, Status.checking_idle)
    return s2, [tr, *cmds]


def _recurred(s: RepairState) -> bool:
    """An active alert of the repair's fault received at or after the action
    (:func:`decision.recurrence`, I17)."""
    return s.acted_at is not None and decision.recurrence(
        s.alerts, s.acted_at, rebooting=bool(s.acted) and s.acted[-1] in decision.REBOOTING
    ) is not None


def _on_recurrence(s: RepairState, now: datetime, defects: frozenset[str]) -> Out:
    """The fault came back after the action: the attempt is recorded ``failed`` and the
    ladder decides the next rung (a pending stop ends first)."""
    s = _count(s, s.acted[-1], "failed", now)
    rec: list[Command] = []
    if s.unrecorded is not None:
        rec.append(RecordAttempt(action=s.unrecorded, outcome="failed"))
    s = s.model_copy(update={"unrecorded": None})
    return _escalate(s, now, f"fault recurred after {s.acted[-1].value}", defects, rec)


def _on_machine(s: RepairState, ev: ma.Event, now: datetime, defects: frozenset[str]) -> Out:
    m = s.machine_action
    assert m is not None
    m, mcmds = ma.step(m, ev, now)
    s = s.model_copy(update={"machine_action": m})
    cmds: list[Command] = []
    fin: ma.Finish | None = None
    for c in mcmds:
        if isinstance(c, ma.RecordAttempt):
            cmds.append(RecordAttempt(action=m.action, outcome=c.outcome))
        elif isinstance(c, ma.Finish):
            fin = c
        else:
            cmds.append(MachineCommand(command=c))
    if fin is None:
        return s, cmds
    if fin.outcome == "not_run":
        s = s.model_copy(update={"acted": s.acted[:-1]})
        return _escalate(s, now, f"{m.action.value} cannot run, nothing touched", defects,
                         cmds)
    if fin.outcome == "cancelled":
        if not fin.touched:
            s = s.model_copy(update={"acted": s.acted[:-1]})
        else:
            s = s.model_copy(update={"hold": f"{m.action.value} was cancelled after it touched "
                                     f"the machine ({fin.detail}); left cordoned for a human"})
        stop = s.stop or Stop(stage="cancelled", by="system")
        st = S.cancelled if stop.stage == "cancelled" else S.rejected
        s2, more = _end(s, st, stop.by, f"{stop.reason or st.value}: {fin.detail}")
        return s2, [*cmds, *more]
    if fin.outcome == "failed":
        if not fin.touched:
            s = s.model_copy(update={"acted": s.acted[:-1]})
            s2, more = _end(s, S.failed, "system", f"{m.action.value} could not run and "
                            f"touched nothing: {fin.detail}")
            return s2, [*cmds, *more]
        s = _count(s, m.action, "failed", now)
        return _escalate(s, now, f"{m.action.value} failed", defects, cmds)
    # succeeded
    if m.action == Action.remove:
        s = s.model_copy(update={"hold": "machine removed for RMA; it stays out"})
        cmds.append(RecordAttempt(action=m.action, outcome="succeeded"))
        if s.machine:
            cmds.append(StartValidation(machine=s.machine, return_to="hold"))
        s2, more = _end(s, S.succeeded, "system", f"machine {s.machine or s.node} removed for RMA")
        return s2, [*cmds, *more]
    s = s.model_copy(update={"acted_at": now, "join_since": now,
                             "unrecorded": m.action if m.touched else None})
    s, tr = _to(s, S.joining, "waiting for the node to come back healthy")
    s2, more = _run(s, Status.joining)
    return s2, [*cmds, tr, *more]


def _count(s: RepairState, action: Action, outcome: str, now: datetime) -> RepairState:
    first = s.alerts[0] if s.alerts else None
    rec = AttemptRecord(repair_id=s.repair_id, cluster=s.cluster, node=s.node,
                        machine_id=s.machine, action=action,
                        alert_kind=first.kind if first else "manual",
                        code=first.code if first else None, outcome=outcome, at=now)
    return s.model_copy(update={"attempts": [*(s.attempts or []), rec]})


def _carry(s: RepairState, defects: frozenset[str]) -> ContinueAsNew:
    """Continue as new carrying the whole state (a pending stop and approval too)."""
    carried = s.model_copy(update={"continued": s.continued + 1, "can_due": False})
    if "cancel_lost_across_can" in defects:
        carried = carried.model_copy(update={"stop": None, "pending_approve": None})
    return ContinueAsNew(state=carried)


def _stop_event(s: RepairState, ev: Cancel | Reject, now: datetime,
                defects: frozenset[str] = frozenset()) -> Out:
    if s.stop is not None:
        return s, []  # the first cancel or reject decides
    stop = Stop(stage="cancelled" if isinstance(ev, Cancel) else "rejected", by=ev.by,
                reason=ev.reason)
    s = s.model_copy(update={"stop": stop})
    # the planted defect keeps the stop until the idle check returns, as before the fix
    deferred = ("cancel_lost_across_can" in defects and s.status == Status.checking_idle
                and s.can_due) or ("cancel_ignored_between_rungs" in defects
                                   and s.status == Status.joining)
    if s.status in WAITING or (s.status in INTERRUPTIBLE and not deferred) \
            or s.status == Status.new:
        return _stop_now(s)
    if s.status == Status.acting:
        return _on_machine(s, ma.Cancel(by=ev.by, reason=ev.reason), now, frozenset())
    return s, []  # a call is out: decided when it returns


def step(state: RepairState, event: Event, now: datetime,
         defects: frozenset[str] = frozenset()) -> Out:
    """Decide ``event`` in ``state`` at ``now`` (the control plane's clock): the next
    state and the commands to execute, in order. Pure: same input, same output."""
    s, st = state, state.status
    if st == Status.ended:
        return s, []
    if isinstance(event, (Cancel, Reject)):
        return _stop_event(s, event, now, defects)
    if isinstance(event, Approve):
        # without an action it approves the one the repair shows as it arrives
        shown = event.action if event.action not in (None, Action.none) else s.action
        s = s.model_copy(update={"pending_approve": Approval(
            by=event.by, action=shown, rung=-1, fingerprint=""),
            "pending_named": event.action not in (None, Action.none)})
        if st == Status.awaiting_approval:
            return _apply_approval(s, now, [])
        return s, []  # kept until the repair asks
    if isinstance(event, AlertAttached):
        if all(a.alert_id != event.alert.alert_id for a in s.alerts):
            s = s.model_copy(update={"alerts": [*s.alerts, event.alert]})
        if st == Status.join_backoff and _recurred(s):
            return _on_recurrence(s, now, defects)
        return s, []  # joining: judged when the health read returns
    if isinstance(event, AlertCleared):
        hit = {(a.kind, a.code) for a in s.alerts if a.alert_id == event.alert_id}
        s = s.model_copy(update={"alerts": [a.model_copy(update={"active": False})
                                            if (a.kind, a.code) in hit and a.level else a
                                            for a in s.alerts]})
        if st in (Status.awaiting_approval, Status.awaiting_lease) and not _evidence_ok(s):
            return _end(s, S.auto_resolved, "system", "alert cleared before acting")
        if st == Status.maintenance_wait and not _evidence_ok(s):
            return _end(s, S.auto_resolved, "system", "every alert behind the repair cleared "
                        f"during maintenance window {s.maintenance}")
        return s, []
    if isinstance(event, Clock):
        if st == Status.awaiting_approval and s.approval_deadline and now >= s.approval_deadline:
            return _end(s, S.timed_out, "system", "no approval in time; evidence is stale")
        if st == Status.awaiting_lease and s.lease_deadline and now >= s.lease_deadline:
            return _end(s, S.timed_out, "system", "no lease in time")
        return s, []
    if isinstance(event, WorkerRestart):
        if st == Status.acting and s.machine_action is not None \
                and s.machine_action.status in (ma.Status.running, ma.Status.making_safe):
            return _on_machine(s, ma.WorkerRestart(phase=s.machine_action.phase), now, defects)
        return s, []
    if isinstance(event, ContinueAsNewDue):
        if st == Status.checking_idle:
            return s.model_copy(update={"can_due": True}), []  # decided when it returns
        if st != Status.idle_backoff:
            return s, []  # only the long wait for idle continues as new
        if s.stop is not None:
            return _stop_now(s)
        return s, [_carry(s, defects)]
    if isinstance(event, Machine):
        if st != Status.acting:
            return s, []
        return _on_machine(s, event.event, now, defects)
    if isinstance(event, Start):
        if st != Status.new:
            return s, []
        return _run(s, Status.reading_policy)
    if isinstance(event, TimerFired):
        if st == Status.idle_backoff:
            if s.stop is not None:
                return _stop_now(s)
            return _run(s, Status.checking_idle)
        if st == Status.join_backoff:
            return _run(s, Status.joining)
        if st == Status.maintenance_wait:
            if s.stop is not None:
                return _stop_now(s)
            return _run(s, Status.reading_maintenance)
        return s, []
    if isinstance(event, LeaseReply):
        if st != Status.awaiting_lease:
            return s, []  # not asked: a late grant is never held
        if not event.granted:
            return s, []  # queued: keep waiting (the deadline is judged on the clock)
        then = s.reacquire_then
        s = s.model_copy(update={"lease": "granted", "reacquire_then": ""})
        if s.stop is not None and not ("cancel_ignored_between_rungs" in defects and s.acted):
            return _stop_now(s)
        if then:  # re-acquired: the evidence is checked again, then the step it was for
            if not _evidence_ok(s):
                return _end(s, S.auto_resolved, "system", "evidence is no longer current "
                            f"when the lease came back before {then}")
            return _drain(s, now, defects) if then == "drain" else _start_action(
                s, now, defects)
        return _after_grant(s, now, defects)
    if isinstance(event, LeaseLapsed):
        if s.lease != "granted":
            return s, []  # none held: nothing lapses
        return s.model_copy(update={"lease_lapsed": True}), []  # decided before the next step
    if st not in CALL_OUT:
        return s, []  # an answer to no call of ours
    if isinstance(event, (CallFailed, LedgerUnavailable)):
        what = CALL_OF[st]
        why = event.message if isinstance(event, CallFailed) else "ledger unavailable"
        return _end(s, S.failed, "system", f"{what} failed at stage {s.stage.value}: {why}")
    if isinstance(event, PolicyRead):
        if st != Status.reading_policy:
            return s, []
        s = s.model_copy(update={"policy": event.policy, "machine": event.machine or s.machine,
                                 "pool": event.pool or s.pool, "hold_then": "decide",
                                 "shadow": is_shadow(event.mode or event.policy.mode)})
        s, tr = _to(s, S.recommended, "repair requested", by=s.requester.name)
        s2, cmds = _run(s, Status.reading_hold)
        return s2, [tr, *cmds]
    if isinstance(event, HoldRead):
        if st != Status.reading_hold:
            return s, []
        if event.held and "act_on_held_machine" not in defects:
            return _end(s, S.cancelled, "system", f"machine {s.machine} is held for RMA "
                        f"({event.reason or 'removed'}); no repair acts on it until an "
                        "operator returns it")
        if s.stop is not None and not ("cancel_ignored_between_rungs" in defects
                                       and s.hold_then == "act" and s.acted):
            return _stop_now(s)
        if s.hold_then == "idle":
            return _idle_start(s, now)
        if s.hold_then == "drain":
            return _drain(s, now, defects)
        if s.hold_then == "act":
            return _start_action(s, now, defects)
        if s.hold_then == "cordon":
            if s.shadow and "act_in_shadow" not in defects:
                return _end_shadowed(s)
            s, tr = _to(s, S.cordoning, f"cordon for {s.action.value}")
            s2, cmds = _run(s, Status.cordoning)
            return s2, [tr, *cmds]
        return _run(s, Status.reading_history)
    if isinstance(event, HistoryRead):
        if st != Status.reading_history:
            return s, []
        if s.stop is not None:
            return _stop_now(s)
        known = {(a.repair_id, a.action, a.at) for a in s.attempts or []}
        s = s.model_copy(update={"attempts": rail_attempts(event.attempts, s.shadow)})
        if not s.recheck:
            s = _decide(s, now, s.requested)
            return _consent_or_ask(s, now, s.needs_human or s.rule, [], defects)
        before, rule_before = s.action, s.rule
        s = _decide(s, now, s.decided_from or (s.requested if s.approval is None
                                                 else s.approval.action))
        moved = any((a.repair_id, a.action, a.at) not in known and a.repair_id != s.repair_id
                    for a in s.attempts or [])
        if not covers(s, now, defects):
            s = s.model_copy(update={"rule": f"{s.rule}; was: {rule_before}"})
            why = s.needs_human or (f"ladder moved to {s.action.value}" if s.action != before
                                    else f"another attempt of {before.value} counted")
            # an approve sent since the approval in force is never dropped silently: one
            # naming the action now decided is applied, any other answered with a note
            pa, keep, note = s.pending_approve, False, ""
            if pa is not None and not s.acted:
                keep = decision.names_decided(pa.action, s.pending_named, s.action)
                if not keep:
                    note = decision.not_applied_note(pa.by, pa.action, before, s.action)
            return _ask(s, now, ("another repair acted on the node meanwhile; "
                                 if moved else "") + why, keep_pending=keep, note=note)
        s = s.model_copy(update={"hold_then": "cordon"})
        if s.requester.kind == RequesterKind.user:
            return _run(s, Status.reading_hold)  # an operator's request does not wait
        return _run(s, Status.reading_maintenance)
    if isinstance(event, MaintenanceRead):
        if st != Status.reading_maintenance:
            return s, []
        return _on_maintenance(s, event, now, defects)
    if isinstance(event, CallOk):
        if st in (Status.reading_policy, Status.reading_hold, Status.reading_history,
                  Status.reading_maintenance):
            return s, []  # reads answer with their own events
        return _on_call_ok(s, event, now, defects)
    return s, []  # pragma: no cover


# ---- the transition table ----------------------------------------------------------
#: (status, event kind) → what :func:`step` decides, in words. docs/lifecycle.md is
#: generated from it; ``tests/model`` checks that every pair is listed.
TRANSITIONS: dict[tuple[Status, str], str] = {}

_CALL_ANSWER = {
    Status.reading_policy: ("policy_read", "→ reading_hold (record `recommended`)"),
    Status.reading_hold: ("hold_read", "held → ended `cancelled` by system naming the hold "
                          "(I18); else → reading_history, or → cordoning when checked "
                          "before the cordon (shadow mode: → ended `shadowed`, the attempt "
                          "recorded as shadowed, nothing cordoned), → draining when "
                          "checked before the drain, → acting when checked before a rung "
                          "(read again before each rung after the first and after a "
                          "lease re-acquired)"),
    Status.reading_history: ("history_read", "decide (ladder, gate, cap); covered by consent "
                             "or an approval of this action at this rung → awaiting_lease; "
                             "else → awaiting_approval (at grant time: the rule names what "
                             "changed; covered → reading_maintenance, an operator's own "
                             "request → reading_hold)"),
    Status.reading_maintenance: ("maintenance_read", "none → reading_hold (before the "
                                 "cordon); none after a pause → the evidence checked, the "
                                 "lease asked for again (the decision made again on the "
                                 "grant); a window covers the node → lease released, → "
                                 "maintenance_wait (timer: the window's end, at most "
                                 f"{MAINTENANCE_RECHECK_S:g} s)"),
    Status.cordoning: ("call_ok", "ours → waiting for idle; held by another repair → "
                       "probing_holder"),
    Status.probing_holder: ("call_ok", "holder runs → ended `cancelled`; ended → "
                            "awaiting_approval naming the stale cordon (I18)"),
    Status.checking_idle: ("call_ok", "idle or bound spent → reading_hold, then draining "
                           "(evidence re-checked); "
                           "busy → idle_backoff (poll timer, doubling)"),
    Status.draining: ("call_ok", "drained → acting (pending stop or stale evidence ends "
                      "first); the drain's deadline passed with work still running → "
                      "ended `failed` naming what still runs, left cordoned for a human "
                      "(the fault stands)"),
    Status.joining: ("call_ok", "the fault recurred meanwhile (a report came while the "
                     "read was out) → attempt recorded, next rung; healthy → rejoining; not "
                     "yet → join_backoff; bound spent → ended `timed_out`, left cordoned"),
    Status.rejoining: ("call_ok", "→ ended `succeeded` (attempt recorded)"),
}


def _decision(st: Status, kind: str) -> str:
    if st == Status.ended:
        return "ignored: the repair ended"
    if kind in ("cancel", "reject"):
        if st in WAITING or st == Status.new:
            return f"→ ended `{'cancelled' if kind == 'cancel' else 'rejected'}` at once; " \
                "cleanup (I19)"
        if st in INTERRUPTIBLE:
            stage = "cancelled" if kind == "cancel" else "rejected"
            return (f"the read is abandoned → ended `{stage}` at once; cleanup (left "
                    "cordoned if an action ran; I19)")
        if st == Status.acting:
            return "to the machine action: safe power state, then ended (held if touched)"
        return "remembered; ends when the call returns, before the next step (I19)"
    if kind == "approve":
        return ("applied: decision re-made with the approver; the ladder or the gate made "
                "it another action than approved (consent does not allow it by itself) → "
                "asked again naming both; else the approval records action, rung and "
                "fingerprint → awaiting_lease" if st == Status.awaiting_approval
                else "kept until the repair asks")
    if kind == "alert_attached":
        return ("joins the evidence; a recurrence after the action → attempt recorded, "
                "next rung (a pending stop ends first)" if st == Status.join_backoff
                else "joins the evidence; a recurrence is judged when the health read "
                "returns" if st == Status.joining else "joins the evidence")
    if kind == "alert_cleared":
        return ("level fault cleared; no evidence left → ended `auto_resolved`"
                if st in (Status.awaiting_approval, Status.awaiting_lease,
                          Status.maintenance_wait)
                else "level fault marked cleared; re-checked before the next disruptive step")
    if kind == "clock":
        return {Status.awaiting_approval: "approval deadline passed → ended `timed_out`",
                Status.awaiting_lease: "lease wait bound passed → ended `timed_out`"}.get(
                    st, "nothing: time alone decides nothing here")
    if kind == "worker_restart":
        return ("to the machine action (its call was lost: resume from the phase reached)"
                if st == Status.acting else "nothing: state is replayed; the call is retried")
    if kind == "can_due":
        if st == Status.checking_idle:
            return ("remembered: when the idle check returns busy, a pending stop ends the "
                    "repair, else it continues as new carrying the whole state")
        return ("pending stop → ended at once; else continue as new carrying the whole state "
                "(stop, approval included)" if st == Status.idle_backoff
                else "ignored: only the idle wait continues as new")
    if kind == "machine":
        return ("delegated to machine_action.step; its finish: ok → joining, failed touched "
                "→ next rung, not touched → failed, not_run → fallback, cancelled → ended"
                if st == Status.acting else "ignored: no machine action runs")
    if kind == "start":
        return "→ reading_policy" if st == Status.new else "ignored"
    if kind == "timer":
        return {Status.idle_backoff: "pending stop → ended; else → checking_idle",
                Status.join_backoff: "→ joining",
                Status.maintenance_wait: "pending stop → ended; else → reading_maintenance "
                                         "(the windows read again)"}.get(
                    st, "ignored: no timer of ours runs")
    if kind == "lease":
        return ("granted: pending stop → ended; re-acquired after a lapse → the evidence "
                "checked again, then the drain or the action it was for; else re-read "
                "history (or act, or check idle); queued: keep waiting"
                if st == Status.awaiting_lease
                else "ignored: not asked (a late grant is never held)")
    if kind == "lease_lapsed":
        return ("lease held → remembered: asked for again before the next drain or machine "
                "action (→ awaiting_lease, never reused); none held → ignored")
    if st not in CALL_OUT:
        return "ignored: no call is out"
    if kind in ("call_failed", "ledger_unavailable"):
        return "→ ended `failed` naming the call (cleanup uncordons unless acted)"
    answer, what = _CALL_ANSWER[st]
    if kind == answer:
        return ("pending stop → ended; " if st != Status.reading_policy else "") + what
    return "ignored: not the answer to the call out"


def _table() -> None:
    for st in Status:
        for kind in EVENT_KINDS:
            TRANSITIONS[(st, kind)] = _decision(st, kind)


_table()
