"""The machine action lifecycle: one attempt of ``power_cycle`` / ``reboot`` /
``reset_gpu`` / ``reprovision`` (and ``migrate`` / ``remove``, whose activities report
no phases yet) on one machine, across activity retries, BMC read
failures, worker restarts, back-off timers and a cancel (issue 26, reproduction 2).

``step(state, event, now) -> (state, commands)`` decides every (status, event) pair
(:data:`TRANSITIONS` is the table; docs/lifecycle.md is generated from it). The state
carries the *phase the action reached* (reported by the activity in its heartbeats, its
failure details and its result), so a retry resumes from there instead of starting over.

Invariants (checked by ``tests/model/``):

- **I16** the disruptive command (ForceOff, the restart, the GPU reset, the provisioning
  start) is sent at most once per attempt: every retry resumes from the phase reached.
- **I19** a cancel during the action brings the machine to a safe, defined power state (a
  power cycle that sent ForceOff sends On), then nothing more is done and the action ends
  ``cancelled``.
- **I22** an attempt is recorded exactly when the action touched the machine.

``defects`` (a parameter of :func:`step`, empty in production; only ``tests/model``
passes it) re-introduces known defects so the checker can show it finds them
(:data:`DEFECTS`).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from workflows.models import Action

#: Back-off between tries after a transient failure, seconds: 10 s doubling to 2 min (the
#: retry interval of the first release's machine actions).
BACKOFF_S = (10.0, 120.0)

#: Phases each action passes through, in order (the activity reports the last reached).
PHASES: dict[Action, tuple[str, ...]] = {
    # off_requested: ForceOff possibly sent (set before the request goes out: its answer
    # may be lost); a retry waits for Off before it sends ForceOff again
    Action.power_cycle: ("not_started", "off_requested", "off_sent", "off_seen", "on_sent",
                         "booted"),
    # a GracefulRestart the OS never acted on (restart_unseen: the try that sent it ends
    # there, so a cancel meanwhile is decided before anything more is sent) is followed by
    # ForceRestart, once, by the retry (its own phase); restart_seen: the restart showed
    # (power Off), only power On is waited for
    Action.reboot: ("not_started", "restart_sent", "restart_unseen", "force_restart_sent",
                    "restart_seen", "booted"),
    Action.reset_gpu: ("not_started", "reset_sent", "done"),
    Action.reprovision: ("not_started", "provision_started", "booted"),
    Action.migrate: ("not_started", "started", "restart_sent", "done"),
    Action.remove: ("not_started", "started", "done"),
}
#: Phase in which each action's disruptive command has been sent (at most once, I16).
DISRUPTIVE: dict[Action, str] = {
    Action.power_cycle: "off_requested",
    Action.reboot: "restart_sent",
    Action.reset_gpu: "reset_sent",
    Action.reprovision: "provision_started",
    Action.migrate: "started",
    Action.remove: "started",
}
#: Phases after which the machine is not in a safe power state: a power cycle that sent
#: (or may have sent) ForceOff may have left the host off until On is sent (I19).
UNSAFE: dict[Action, frozenset[str]] = {
    Action.power_cycle: frozenset({"off_requested", "off_sent", "off_seen"}),
}
#: The phase in which an action's disruptive command is only possibly sent (reported
#: before the request goes out; its answer may be lost): a ``make_safe`` run may prove it
#: never landed (:attr:`ActivityOk.nothing_landed`).
_POSSIBLY_SENT: dict[Action, str] = {Action.power_cycle: "off_requested"}
#: Test-only defects :func:`step` can re-introduce (``tests/model`` shows each is found).
DEFECTS: dict[str, str] = {
    "retry_from_scratch": "a retry starts the action again from not_started (double ForceOff)",
    "cancel_leaves_off": "a cancel after ForceOff ends at once, leaving the host off",
    "record_untouched": "a failure is recorded as an attempt although nothing was touched",
}


class Status(StrEnum):
    """Where the action's lifecycle is."""

    idle = "idle"  # not started yet
    running = "running"  # an activity call is out
    backing_off = "backing_off"  # a transient failure; a back-off timer runs
    making_safe = "making_safe"  # cancelled after an unsafe phase: On being sent
    safe_backing_off = "safe_backing_off"  # making safe failed transiently; timer runs
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    not_run = "not_run"


TERMINAL = frozenset({Status.succeeded, Status.failed, Status.cancelled, Status.not_run})


class MachineActionState(BaseModel):
    """Everything the action must keep across an activity retry, a worker restart or
    continue-as-new. ``phase``: one of :data:`PHASES` ``[action]``; ``touched``: the
    disruptive command went out; ``first_failure``: when the first transient failure of
    this attempt was seen (the retry bound ``retry_max_s`` counts from it)."""

    action: Action
    key: str  # idempotency key of the attempt (repair id / action / attempt number)
    retry_max_s: float = Field(gt=0)
    status: Status = Status.idle
    phase: str = "not_started"
    tries: int = 0
    first_failure: datetime | None = None
    backoff_s: float = BACKOFF_S[0]
    touched: bool = False
    #: a try ended without a phase it reported itself (the worker died, a heartbeat or
    #: start-to-close time-out): its last heartbeat may lag what it sent, so a later
    #: "host already rebooted" may be this attempt's own doing (I22 counts it touched)
    phase_uncertain: bool = False
    #: when the attempt's restart request went out (UTC, as the activity that sent it
    #: recorded it: a reboot's GracefulRestart, phase ``restart_sent``), from the first
    #: failure that reported it, never moved: every retry gets it
    #: (:attr:`RunActivity.sent_at`) and waits only what is left of its window
    sent_at: datetime | None = None
    cancel: str | None = None  # who/why, once a cancel arrived
    recorded: bool = False
    detail: str = ""


# ---- events ------------------------------------------------------------------------
class Start(BaseModel):
    """Run the action (the workflow reached ``repairing``)."""

    kind: Literal["start"] = "start"


class ActivityOk(BaseModel):
    """The activity returned: ``phase`` reached (the last one), ``not_run`` when it
    could not run and touched nothing, ``detail`` its text."""

    kind: Literal["ok"] = "ok"
    phase: str
    not_run: str = ""
    detail: str = ""
    #: the activity found the host already rebooted since the attempt began (its boot
    #: identity changed) and sent nothing: untouched (the host came back by itself, I22:
    #: no attempt) unless a try of this attempt reported the disruptive phase, or ended
    #: without reporting its phase itself (``phase_uncertain``: the reboot may be ours)
    skipped: bool = False
    #: a ``make_safe`` run proved that the disruptive command only possibly sent (the
    #: attempt's phase is the first of :data:`UNSAFE`, e.g. ``off_requested``) never
    #: landed: the host's power stayed as it was. Untouched after all (I22: no attempt;
    #: the repair's cleanup uncordons) unless a try ended without reporting its phase.
    nothing_landed: bool = False


class ActivityFailed(BaseModel):
    """The activity failed after reaching ``phase``: ``transient`` (a retry may fix it),
    ``permanent`` (it will not), ``timed_out`` (heartbeat or start-to-close)."""

    kind: Literal["failed"] = "failed"
    outcome: Literal["transient", "permanent", "timed_out"]
    phase: str
    message: str = ""
    #: when the attempt's restart request went out, as reported (UTC; None: not reported)
    sent_at: datetime | None = None


class BmcReadFailed(BaseModel):
    """A BMC status read failed after ``phase`` (e.g. ``wait_power("On")`` raised
    ``BmcUnavailable``): the activity ended with a transient failure there."""

    kind: Literal["bmc_read_failed"] = "bmc_read_failed"
    phase: str
    message: str = ""
    #: as :attr:`ActivityFailed.sent_at`
    sent_at: datetime | None = None


class WorkerRestart(BaseModel):
    """The worker running the activity died; ``phase`` is the last heartbeat's."""

    kind: Literal["worker_restart"] = "worker_restart"
    phase: str
    #: as :attr:`ActivityFailed.sent_at` (from the last heartbeat)
    sent_at: datetime | None = None


class Cancel(BaseModel):
    """A person cancelled (or rejected) the repair."""

    kind: Literal["cancel"] = "cancel"
    by: str = "operator"
    reason: str = ""


class TimerFired(BaseModel):
    """The back-off timer the machine started fired."""

    kind: Literal["timer"] = "timer"


class Clock(BaseModel):
    """Time passed (the control plane's clock, ``now`` of :func:`step`); nothing else."""

    kind: Literal["clock"] = "clock"


Event = Annotated[
    Start | ActivityOk | ActivityFailed | BmcReadFailed | WorkerRestart | Cancel | TimerFired
    | Clock,
    Field(discriminator="kind"),
]
EVENT_KINDS = ("start", "ok", "failed", "bmc_read_failed", "worker_restart", "cancel",
               "timer", "clock")


# ---- commands ----------------------------------------------------------------------
class RunActivity(BaseModel):
    """Run the machine activity once with ``key`` from ``resume_phase`` (and ``sent_at``,
    the state's: when the attempt's restart request went out); ``purpose`` ``make_safe``:
    only to bring the machine to a safe power state (finish the cycle's On)."""

    kind: Literal["run_activity"] = "run_activity"
    action: Action
    key: str
    resume_phase: str
    purpose: Literal["act", "make_safe"] = "act"
    sent_at: datetime | None = None


class StartTimer(BaseModel):
    kind: Literal["start_timer"] = "start_timer"
    seconds: float


class RecordAttempt(BaseModel):
    """Record the attempt for the ladder and the per-node cap (ledger)."""

    kind: Literal["record_attempt"] = "record_attempt"
    outcome: Literal["failed", "cancelled"]


class SetDetails(BaseModel):
    kind: Literal["set_details"] = "set_details"
    text: str


class Finish(BaseModel):
    """The action ended: ``outcome`` as :class:`Status`; ``touched`` as in the state."""

    kind: Literal["finish"] = "finish"
    outcome: Literal["succeeded", "failed", "cancelled", "not_run"]
    touched: bool
    detail: str = ""


Command = RunActivity | StartTimer | RecordAttempt | SetDetails | Finish


# ---- the machine -------------------------------------------------------------------
def new_state(action: Action, key: str, retry_max_s: float) -> MachineActionState:
    """A machine for one attempt of ``action``; raises ``ValueError`` naming the action
    when it has no phases (``none``)."""
    if action not in PHASES:
        raise ValueError(f"action: {action.value!r} is not a phased machine action")
    return MachineActionState(action=action, key=key, retry_max_s=retry_max_s)


def phase_index(action: Action, phase: str) -> int:
    """Position of ``phase`` in :data:`PHASES`; raises ``ValueError`` naming it."""
    try:
        return PHASES[action].index(phase)
    except ValueError:
        raise ValueError(f"phase: {phase!r} is not a phase of {action.value}") from None


def _advance(s: MachineActionState, phase: str) -> MachineActionState:
    """The furthest phase reached (a report never moves it back) and whether touched."""
    a = s.action
    best = max(phase_index(a, s.phase), phase_index(a, phase))
    p = PHASES[a][best]
    touched = s.touched or best >= phase_index(a, DISRUPTIVE[a])
    return s.model_copy(update={"phase": p, "touched": touched})


def _end(s: MachineActionState, status: Status, detail: str,
         defects: frozenset[str]) -> tuple[MachineActionState, list[Command]]:
    cmds: list[Command] = []
    record = s.touched or ("record_untouched" in defects and status == Status.failed)
    if status in (Status.failed, Status.cancelled) and record and not s.recorded:
        cmds.append(RecordAttempt(outcome="failed" if status == Status.failed else "cancelled"))
        s = s.model_copy(update={"recorded": True})
    s = s.model_copy(update={"status": status, "detail": detail})
    cmds.append(Finish(outcome=status.value, touched=s.touched, detail=detail))  # type: ignore[arg-type]
    return s, cmds


def _run(s: MachineActionState, purpose: Literal["act", "make_safe"],
         defects: frozenset[str]) -> tuple[MachineActionState, list[Command]]:
    resume = s.phase
    if "retry_from_scratch" in defects and purpose == "act":
        resume = "not_started"
    status = Status.running if purpose == "act" else Status.making_safe
    s = s.model_copy(update={"status": status, "tries": s.tries + 1})
    return s, [RunActivity(action=s.action, key=s.key, resume_phase=resume, purpose=purpose,
                           sent_at=s.sent_at)]


def _cancelled(s: MachineActionState, defects: frozenset[str]
               ) -> tuple[MachineActionState, list[Command]]:
    """After a cancel, with no activity out: make the machine safe, or end."""
    if s.phase in UNSAFE.get(s.action, frozenset()) and "cancel_leaves_off" not in defects:
        s, cmds = _run(s, "make_safe", defects)
        return s, [SetDetails(text=f"cancelled after {s.phase}: powering the host on"), *cmds]
    return _end(s, Status.cancelled, f"cancelled by {s.cancel} after {s.phase}; "
                "no further action", defects)


def _maybe_off(s: MachineActionState) -> str:
    """What a failure in an :data:`UNSAFE` phase must tell: the host may be left off."""
    if s.phase not in UNSAFE.get(s.action, frozenset()):
        return ""
    return (f"; the host may be off after {s.phase} (On was never sent): a person must "
            "check its power before the node is used")


def _transient(s: MachineActionState, now: datetime, message: str, defects: frozenset[str]
               ) -> tuple[MachineActionState, list[Command]]:
    first = s.first_failure or now
    spent = (now - first).total_seconds()
    making_safe = s.status == Status.making_safe
    if spent >= s.retry_max_s:
        if making_safe:
            return _end(s, Status.cancelled, f"cancelled by {s.cancel}; the host may be off "
                        f"after {s.phase} (powering on failed: {message}): a human must "
                        "power it on", defects)
        return _end(s, Status.failed, f"{s.action.value} failed after {s.tries} tries "
                    f"({spent:g} s): {message}{_maybe_off(s)}", defects)
    wait = min(s.backoff_s, s.retry_max_s - spent)
    s = s.model_copy(update={
        "status": Status.safe_backing_off if making_safe else Status.backing_off,
        "first_failure": first,
        "backoff_s": min(s.backoff_s * 2, BACKOFF_S[1]),
    })
    text = (f"{s.action.value}: transient failure after {s.phase} (try {s.tries}, retrying "
            f"for up to {s.retry_max_s:g} s): {message}")
    return s, [SetDetails(text=text), StartTimer(seconds=wait)]


def step(state: MachineActionState, event: Event, now: datetime,
         defects: frozenset[str] = frozenset()) -> tuple[MachineActionState, list[Command]]:
    """Decide ``event`` in ``state`` at ``now`` (the control plane's clock): the next
    state and the commands to execute, in order. Pure: same input, same output.

    Raises ``ValueError`` naming the phase when an event reports a phase the action does
    not have."""
    s, st = state, state.status
    if st in TERMINAL or isinstance(event, Clock):
        return s, []  # an ended action takes no further step; time alone decides nothing
    if isinstance(event, Cancel):
        if s.cancel is not None:
            return s, []
        s = s.model_copy(update={"cancel": event.by + (f": {event.reason}" if event.reason
                                                       else "")})
        if st in (Status.running, Status.making_safe):
            return s, []  # decided when the call out returns
        if st == Status.idle:
            return _end(s, Status.cancelled, f"cancelled by {s.cancel} before acting", defects)
        return _cancelled(s, defects)  # backing off (or making safe between tries)
    if isinstance(event, Start):
        if st != Status.idle:
            return s, []
        return _run(s, "act", defects)
    if isinstance(event, TimerFired):
        if st == Status.backing_off:
            return _run(s, "act", defects)
        if st == Status.safe_backing_off:
            return _run(s, "make_safe", defects)
        return s, []  # no timer of ours runs
    # an activity outcome: only meaningful while a call is out
    if st not in (Status.running, Status.making_safe):
        return s, []
    if isinstance(event, ActivityOk) and event.skipped and not s.touched \
            and not s.phase_uncertain and st == Status.running:
        # the host rebooted by itself before any try of this attempt sent the command
        # (every try reported its phase itself): done, untouched (I22)
        if s.cancel is not None:
            return _end(s, Status.cancelled, f"cancelled by {s.cancel}; the host had "
                        "already rebooted by itself, nothing sent", defects)
        s = s.model_copy(update={"phase": PHASES[s.action][-1]})
        return _end(s, Status.succeeded, event.detail, defects)
    if isinstance(event, ActivityOk) and event.nothing_landed and st == Status.making_safe \
            and not s.phase_uncertain and s.phase == _POSSIBLY_SENT.get(s.action):
        # the command possibly sent never landed (the power stayed as it was): nothing
        # was touched, so nothing is recorded and the node is not held for it (I22, I1)
        s = s.model_copy(update={"touched": False})
        return _end(s, Status.cancelled, f"cancelled by {s.cancel}; the {s.action.value}'s "
                    f"command possibly sent at {s.phase} never landed ({event.detail}): "
                    "nothing touched", defects)
    s = _advance(s, event.phase)
    sent_at = getattr(event, "sent_at", None)
    if sent_at is not None and s.sent_at is None:
        s = s.model_copy(update={"sent_at": sent_at})  # the first report stands
    if isinstance(event, WorkerRestart) or (isinstance(event, ActivityFailed)
                                            and event.outcome == "timed_out"):
        s = s.model_copy(update={"phase_uncertain": True})
    if isinstance(event, ActivityOk) and event.skipped and s.phase_uncertain \
            and not s.touched:
        # an earlier try may have sent the command before its phase was reported: the
        # reboot the activity found may be ours, so it counts (never undercounted, I22)
        s = s.model_copy(update={"touched": True})
    if isinstance(event, ActivityOk):
        if event.not_run and not s.touched:
            return _end(s, Status.not_run, event.not_run, defects)
        if st == Status.making_safe or s.cancel is not None:
            return _end(s, Status.cancelled, f"cancelled by {s.cancel}; {s.action.value} "
                        f"reached {s.phase}, no further action", defects)
        s = s.model_copy(update={"phase": PHASES[s.action][-1]})
        return _end(s, Status.succeeded, event.detail, defects)
    if isinstance(event, ActivityFailed) and event.outcome == "permanent":
        if st == Status.making_safe:
            return _end(s, Status.cancelled, f"cancelled by {s.cancel}; the host may be off "
                        f"after {s.phase} (powering on failed: {event.message}): a human "
                        "must power it on", defects)
        if s.cancel is not None:
            return _cancelled(s, defects)
        detail = f"{s.action.value} failed after {s.phase}: {event.message}{_maybe_off(s)}"
        return _end(s, Status.failed, detail, defects)
    message = getattr(event, "message", "") or event.kind.replace("_", " ")
    if s.cancel is not None and st == Status.running:
        return _cancelled(s, defects)
    return _transient(s, now, message, defects)


#: The transition table: (status, event kind) → what :func:`step` decides, in words.
#: docs/lifecycle.md is generated from it; ``tests/model`` checks that every pair is
#: listed and that :func:`step` answers each.
TRANSITIONS: dict[tuple[Status, str], str] = {}


def _table() -> None:
    for st in Status:
        for kind in EVENT_KINDS:
            if st in TERMINAL:
                what = "ignored: the action ended"
            elif kind == "clock":
                what = "nothing: time alone decides nothing (bounds are judged on failures)"
            elif kind == "cancel":
                what = {
                    Status.idle: "→ cancelled before acting; nothing touched, no attempt",
                    Status.running: "remembered; decided when the call returns",
                    Status.making_safe: "already cancelled: ignored",
                    Status.backing_off: "unsafe phase → making_safe (send On); "
                                        "else → cancelled (attempt recorded if touched)",
                    Status.safe_backing_off: "already cancelled: ignored",
                }[st]
            elif kind == "start":
                what = "→ running: run from not_started" if st == Status.idle else "ignored"
            elif kind == "timer":
                what = {
                    Status.backing_off: "→ running: retry from the phase reached",
                    Status.safe_backing_off: "→ making_safe: retry sending On",
                }.get(st, "ignored: no timer of ours runs")
            elif st not in (Status.running, Status.making_safe):
                what = "ignored: no call is out"
            elif kind == "ok":
                what = ("→ cancelled (safe now; attempt recorded); nothing_landed (the "
                        "command possibly sent at off_requested never landed, every try "
                        "reported its phase) → cancelled untouched, no attempt"
                        if st == Status.making_safe
                        else "→ succeeded; or cancelled if a cancel came meanwhile; "
                             "not_run when nothing was touched; skipped (the host "
                             "rebooted by itself, nothing sent) → succeeded / cancelled "
                             "untouched unless a try reported the disruptive phase or "
                             "ended without reporting its own (worker died, time-out)")
            elif st == Status.making_safe:
                what = ("back off and retry On (→ safe_backing_off); permanent or bound "
                        "spent → cancelled, a human must power on") if kind != "failed" else (
                        "transient: → safe_backing_off; permanent: → cancelled, a human "
                        "must power on")
            else:
                what = ("phase kept; cancel pending → making_safe / cancelled; transient "
                        "→ backing_off (timer) or failed once retry_max_s is spent; "
                        "permanent → failed; attempt recorded iff touched")
            TRANSITIONS[(st, kind)] = what


_table()
