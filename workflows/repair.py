"""``RepairWorkflow`` (id ``repair/{cluster}/{node}/{repair_id}``): one repair of one node.

Stages (docs/design.md §4.4): ``recommended → awaiting_approval → cordoning → waiting_for_idle →
draining → repairing | migrating → joining → running`` and terminal ``succeeded``,
``failed``, ``rejected``, ``cancelled``, ``auto_resolved``, ``timed_out``, ``shadowed``.
Every transition is recorded in the ledger (``ledger_record_transition``), in the
``RepairStage`` / ``RepairState`` search attributes and in
``workflow.set_current_details``.

``RepairState`` is the terminal stage name once ended, ``awaiting_approval`` while waiting
for a person, and ``in_progress`` otherwise.

Signals (JSON a person can type in the Temporal UI): ``approve`` ``{"by": "alice",
"action": "reprovision"}`` (action optional; ladder and migrate gate still apply, and
when they make it another action the person is asked again for that one; an
approval sent before the repair asks for one is kept), ``reject`` ``{"by", "reason"}``,
``cancel`` ``{"by", "reason"}``; internal signals ``attach_alert`` (:class:`Alert`, from
the NodeWorkflow) and ``lease`` (:class:`LeaseReply`, from the guard). Query ``status`` →
:class:`RepairStatus`. Returns the final :class:`RepairStatus`.

Every ending cleans up (docs/design.md §5 rule zero and rails): whether the repair succeeds, is
rejected or cancelled at any stage (signal, or workflow cancellation from the Temporal UI
or CLI), times out, or an activity fails for good (Kubernetes 403/404, a missing ``slurm``
binary, a configuration error), the node this repair cordoned is uncordoned, the lease is
released, the ledger row gets its terminal stage with the cause and the NodeWorkflow is
told (``repair_finished``). The node stays cordoned — with the reason in the ledger and a
critical notification — only when: the action was ``remove`` (pulled for RMA; its
re-validation never returns it), the node did not come back healthy after the action, or
a disruptive action ran and the repair ended without a verified recovery (the fault
stands and the machine's state is unknown), or the drain's deadline passed with work still
running (the repair ends ``failed`` naming it: the fault stands, so the node is not put
back in service because its work would not leave). A cleanup step that keeps failing is retried,
then noted; it never keeps the ledger row from its terminal stage.

Evidence is re-checked before every disruptive step (before cordon, before drain, before
each action); a machine action's transient failure is retried for up to
``rails.action_retry_max_s`` before it counts as a ladder attempt; at most
``rails.max_actions_per_node`` actions run on a node per window before a person decides;
and success needs the fault not to recur after the action.

Shadow mode (``policy.mode: shadow``, a cluster's ``mode`` or its pool's
``clusters[].pools[].mode``; issue 29 item 3): every decision runs as in enforce —
ladder, node cap, consent (a person is still asked, and their approval recorded), the
guard's lease (budget and breaker count the repair), maintenance windows, RMA holds —
then, where an enforcing repair would cordon, the repair records the attempt it stood
for (outcome ``shadowed``: the rails of shadow-mode repairs count it as the action) and
ends ``shadowed`` saying what it would have done; no cordon, drain, machine action or
validation runs. Details and notes say "shadow"; the lease is released at the end.

Every long wait goes through :meth:`RepairWorkflow._wait`. The wait for idle backs its
polling off (``wait_for_idle.poll_s`` doubling up to ``poll_max_s``) and continues as new,
carrying the repair's state, once the run's history passes :data:`HISTORY_EVENTS_MAX`
events, so a *do not interrupt* wait of any length stays far below Temporal's limit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    TimeoutType,
    WorkflowAlreadyStartedError,
    is_cancelled_exception,
)
from temporalio.exceptions import (
    TimeoutError as TemporalTimeoutError,
)

with workflow.unsafe.imports_passed_through():
    from workflows.activity_api import (
        ACT,
        ERR_ACTION_FAILED,
        ERR_AUTH,
        ERR_CONFIGURATION,
        ERR_DRAIN_DEADLINE,
        ERR_UNKNOWN_NODE,
        ERR_UNSUPPORTED,
        PHASE_DETAIL,
        ActionResult,
        AttemptHistory,
        AttemptQuery,
        AttemptRecord,
        ClaimInput,
        ClaimResult,
        CordonInput,
        CordonResult,
        DrainInput,
        DrainResult,
        IdleStatus,
        MachineActionInput,
        MachineHold,
        MachineHoldQuery,
        MaintenanceCover,
        MaintenanceQuery,
        MigrateResult,
        NodeHealth,
        NodePolicy,
        NodeRef,
        Notification,
        RejoinInput,
        RejoinResult,
        RepairLiveness,
        RepairProbe,
        RepairRecord,
        TransitionRecord,
        detail_time,
        permanent,
    )
    from workflows.config import PolicyConfig
    from workflows.console import (
        guard_details,
        guard_summary,
        validation_details,
        validation_summary,
        waiting_details,
    )
    from workflows.evidence_step import capture_before
    from workflows.lifecycle import decision
    from workflows.lifecycle.decision import Approval, Decision
    from workflows.lifecycle.machine_action import DISRUPTIVE as MA_DISRUPTIVE
    from workflows.lifecycle.machine_action import PHASES as MA_PHASES
    from workflows.lifecycle.machine_action import ActivityFailed as MaFailed
    from workflows.lifecycle.machine_action import ActivityOk as MaOk
    from workflows.lifecycle.machine_action import BmcReadFailed as MaBmcReadFailed
    from workflows.lifecycle.machine_action import Cancel as MaCancel
    from workflows.lifecycle.machine_action import Event as MachineEvent
    from workflows.lifecycle.machine_action import Finish as MaFinish
    from workflows.lifecycle.machine_action import MachineActionState
    from workflows.lifecycle.machine_action import RecordAttempt as MaRecord
    from workflows.lifecycle.machine_action import RunActivity as MaRun
    from workflows.lifecycle.machine_action import SetDetails as MaDetails
    from workflows.lifecycle.machine_action import Start as MaStart
    from workflows.lifecycle.machine_action import StartTimer as MaTimer
    from workflows.lifecycle.machine_action import TimerFired as MaTimerFired
    from workflows.lifecycle.machine_action import WorkerRestart as MaWorkerRestart
    from workflows.lifecycle.machine_action import new_state as new_machine_action
    from workflows.lifecycle.machine_action import step as ma_step
    from workflows.lifecycle.repair import MAINTENANCE_RECHECK_S
    from workflows.lifecycle.trace import Call, Trace
    from workflows.local import execute_short, start_local
    from workflows.models import (
        AUTO_APPROVED,
        Action,
        Alert,
        ApproveSignal,
        CancelSignal,
        RejectSignal,
        RepairRequest,
        RepairStatus,
        RequesterKind,
        StageTransition,
        ValidationRequest,
    )
    from workflows.models import Stage as S
    from workflows.policy import (
        SHADOWED,
        ConsentDecision,
        consent_decision,
        evidence_current,
        is_shadow,
        rail_attempts,
        reset_targets,
        would_do,
    )
    from workflows.protocol import (
        BMC_TASK_QUEUE,
        GUARD_SIGNAL_ACQUIRE,
        GUARD_SIGNAL_RELEASE,
        GUARD_WORKFLOW,
        LEASE_RENEW_S,
        LEASE_RESEND_JITTER,
        LEASE_RESEND_S,
        NODE_SIGNAL_REPAIR_FINISHED,
        REPAIR_FAILED,
        REPAIR_QUERY_STATUS,
        REPAIR_SIGNAL_APPROVE,
        REPAIR_SIGNAL_ATTACH_ALERT,
        REPAIR_SIGNAL_CANCEL,
        REPAIR_SIGNAL_LEASE,
        REPAIR_SIGNAL_REJECT,
        REPAIR_TIMED_OUT,
        REPAIR_WORKFLOW,
        SA_ACTION,
        SA_MACHINE,
        SA_STAGE,
        SA_STATE,
        VALIDATION_WORKFLOW,
        GuardInput,
        LeaseRelease,
        LeaseReply,
        LeaseRequest,
        RepairFinished,
        fault_key,
        repair_identity_attributes,
        repair_state,
        workflow_id_guard,
        workflow_id_node,
        workflow_id_validation,
    )


#: Machine-side activity per action (run on the BMC task queue).
MACHINE_ACTIVITY: dict[Action, str] = {
    Action.reset_gpu: ACT.reset_gpu,
    Action.reboot: ACT.reboot_machine,
    Action.power_cycle: ACT.power_cycle_machine,
    Action.reprovision: ACT.reprovision_machine,
    Action.migrate: ACT.migrate_node,
    Action.remove: ACT.remove_machine,
}
#: Actions after which the host must come back with a new boot id.
REBOOTING: frozenset[Action] = decision.REBOOTING
#: Events in one run's history after which a long wait for idle continues as new: a fifth
#: of Temporal's 51,200-event hard limit, below its 10,240-event warning.
HISTORY_EVENTS_MAX = 10_000
_PERMANENT = [
    ERR_AUTH,
    ERR_UNKNOWN_NODE,
    ERR_UNSUPPORTED,
    ERR_ACTION_FAILED,
    ERR_DRAIN_DEADLINE,
    ERR_CONFIGURATION,
]
_SHORT = timedelta(seconds=60)
_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30), non_retryable_error_types=_PERMANENT)
#: A scheduler call that changes the node (cordon, drain): tries per batch on the server
#: (3: a stop waits for at most three tries, about 3 min when each hangs to its 60 s
#: limit, seconds when the scheduler refuses at once), then the workflow pauses
#: (stop-aware) 30 s doubling to 5 min: about a dozen batches an hour while a scheduler
#: stays down, a few hundred history events (:meth:`RepairWorkflow._act_stoppable`).
_BATCH_RETRY = RetryPolicy(maximum_attempts=3, maximum_interval=timedelta(seconds=30),
                           non_retryable_error_types=_PERMANENT)
_BATCH_PAUSE_S = 30.0
_BATCH_PAUSE_MAX_S = 300.0
#: Asking whether another repair still runs: a few tries, then assume it does (the safe
#: side: this repair ends instead of acting beside it).
_LIVENESS_RETRY = RetryPolicy(maximum_attempts=3, maximum_interval=timedelta(seconds=10))
#: Machine actions: one try per activity; the workflow retries transient failures itself
#: (:meth:`RepairWorkflow._machine_action`) so the bound is ``rails.action_retry_max_s``.
_MACHINE_ONCE = RetryPolicy(maximum_attempts=1, non_retryable_error_types=_PERMANENT)
_MACHINE_TIMEOUT = timedelta(minutes=30)
#: Bound on retrying one cleanup activity (uncordon, ledger, notification) before the
#: failure is noted and the ending goes on.
_CLEANUP_TOTAL = timedelta(minutes=30)
T = TypeVar("T")


class _NotRun(Exception):
    """Internal: the machine action could not run and touched nothing (``not_run``)."""


class _ActionFailed(Exception):
    """Internal: the machine action failed for good; ``touched``: it touched the machine;
    ``unsupported``: it cannot run with this configuration."""

    def __init__(self, detail: str, touched: bool, unsupported: bool = False) -> None:
        super().__init__(detail)
        self.touched = touched
        #: the last failure was ``ERR_UNSUPPORTED`` (the action cannot run with this
        #: configuration: no provision image, no spare machine, no BMC)
        self.unsupported = unsupported


_M = TypeVar("_M", bound=BaseModel)
#: Joins the last refused signal to the details (one refusal shown at a time).
_REFUSED = " — refused: "


def _named_by(raw: Any) -> str:
    """Who a signal payload that did not validate says it is from (``"unknown"``)."""
    by = raw.get("by") if isinstance(raw, dict) else None
    return by if isinstance(by, str) and by else "unknown"


class _Ended(Exception):
    """Internal: the repair reached a terminal stage (raised to unwind the lifecycle)."""

    def __init__(self, stage: S, by: str, reason: str) -> None:
        super().__init__(reason)
        self.stage, self.by, self.reason = stage, by, reason


class Carried(BaseModel):
    """State of a repair carried across continue-as-new (``RepairRequest.carried``).

    Only ``history_limit`` may be set by a caller (tests bound the history with it); the
    rest is written by the workflow itself when a long wait for idle continues as new.
    """

    history_limit: int | None = Field(None, ge=100)
    stage: S | None = None
    action: Action | None = None
    machine: str | None = None
    pool: str | None = None
    history: list[StageTransition] = Field(default_factory=list)
    alerts: list[Alert] = Field(default_factory=list)
    approved_by: str | None = None
    #: what the approval in force covers (one action at one rung, issue 26 item 3)
    approval: Approval | None = None
    rule: str | None = None
    lease: LeaseReply | None = None
    lease_requested: bool = False
    #: when the lease now requested was first asked for (the guard's I23 check)
    lease_requested_at: datetime | None = None
    cordoned_by_us: bool = False
    policy: PolicyConfig | None = None
    bmc_queue: str = BMC_TASK_QUEUE
    attempts: list[AttemptRecord] = Field(default_factory=list)
    critical: list[Alert] = Field(default_factory=list)
    idle_since: datetime | None = None
    idle_poll_s: float | None = None
    continued: int = 0
    #: a person's signal not yet acted on when the run continued as new (reproduction 6:
    #: never lost across the hand-over)
    approve: ApproveSignal | None = None
    reject: RejectSignal | None = None
    cancel: CancelSignal | None = None
    #: where the decision in force was decided from and why the node said a reset cannot
    #: run then: an approval after the hand-over is decided again from there, so the
    #: ladder step stays in the rule (docs/design.md §5)
    decided_from: Action | None = None
    decided_blocked: str | None = None
    #: the drain's absolute deadline once draining started (never restarted)
    drain_deadline: datetime | None = None


@workflow.defn(name=REPAIR_WORKFLOW)
class RepairWorkflow:
    """Lifecycle of one repair; see the module docstring for names and payloads."""

    @workflow.init
    def __init__(self, req: RepairRequest) -> None:
        # set from the input here so signals delivered with the start are not lost
        self._req: RepairRequest | None = req
        self._stage = S.recommended
        self._action = req.action
        self._machine: str | None = req.machine_id
        self._pool: str | None = req.node_pool
        self._history: list[StageTransition] = []
        self._alerts: list[Alert] = list(req.alerts)
        self._approved_by: str | None = None
        #: a person is asked for an approval now (``RepairState`` ``awaiting_approval``);
        #: False at that stage once approved, while the lease or a maintenance window is
        #: waited for (the stage is kept: docs/design.md §4.4 order)
        self._asking = False
        #: the last approve signal named its action (not filled in with the one shown)
        self._approve_named = False
        #: the approval in force and what it covers (:func:`decision.covers`)
        self._approval: Approval | None = None
        #: the last decision of :meth:`_decide` (ladder, gate, cap)
        self._decision: Decision | None = None
        self._rule: str | None = None
        self._detail = ""
        self._approve: ApproveSignal | None = None
        #: signals refused because their payload did not validate, not yet in the history
        self._input_errors: list[str] = []
        #: the action the last decision was decided from (the ladder starts there) and
        #: why the node said a reset cannot run when it was decided (a NotRun fallback)
        self._decided_from: Action | None = None
        self._decided_blocked: str | None = None
        self._reject: RejectSignal | None = None
        self._cancel: CancelSignal | None = None
        self._lease: LeaseReply | None = None
        self._lease_requested = False
        self._lease_requested_at: datetime | None = None
        self._last_renew: datetime | None = None
        self._cordoned_by_us = False
        self._policy = PolicyConfig()
        self._bmc_queue = BMC_TASK_QUEUE
        self._attempts: list[AttemptRecord] = []
        self._critical: list[Alert] = []
        #: the attempt history was read (empty or not); cleared to read it again
        self._history_read = False
        self._needs_human = False
        self._human_reason = ""
        self._history_limit = HISTORY_EVENTS_MAX
        self._continued = 0
        self._acted: list[Action] = []
        self._hold: str | None = None
        self._last_ticket: str | None = None
        self._done = "node back in service"
        #: shadow mode (issue 29 item 3): decide and record, never act
        self._shadow = False
        #: I18: the repair ended because its machine is held for RMA
        self._machine_held = False
        #: the workflow was cancelled from Temporal during a machine action, which
        #: brought the machine to a safe state first: it closes cancelled after cleanup
        self._temporal_cancelled = False
        #: when the machine action now running (or last run) started
        self._action_started: datetime | None = None
        #: an action that ran and touched the machine, its attempt not yet recorded
        #: (with the machine it ran on): whatever ends the repair records it (I22), as
        #: the repair machine's ``unrecorded`` does
        self._unrecorded: tuple[Action, str | None] | None = None
        #: the last action was verified: the node came back healthy and the fault did not
        #: recur (what follows is the rejoin only): an ending from here records the
        #: attempt succeeded and does not keep the node cordoned for the fault (I22)
        self._verified = False
        #: alert ids the last recurrence check after an action saw (None: no check yet);
        #: those attached later go to the node as ``unjudged_alert_ids``
        self._judged: set[str] | None = None
        #: the rung (``len(_acted)``) before which the RMA hold was last read (I18)
        self._hold_read_for = -1
        #: whether the machine action that last succeeded touched the machine (False:
        #: skipped on its first try, the host had rebooted by itself; I22)
        self._last_touched = True
        #: one line per evidence capture before an action (issue 31 item 3)
        self._captures: list[str] = []
        #: the drain's absolute deadline, set once when draining starts (carried): a retry
        #: of the drain never restarts it
        self._drain_deadline: datetime | None = None
        #: what the machine action's ``step`` commanded, checked against what runs
        #: (issue 26 item 5); the rest of the repair is not a machine yet
        self.lifecycle_trace = Trace(("activity", n) for n in MACHINE_ACTIVITY.values())
        #: attempt and transition writes of this run so far (their ``write_key``s): replay
        #: counts them again, so a workflow task re-run after a crash keys its local-
        #: activity writes as the lost run of it did (migration 0013)
        self._ledger_writes = 0

    # ---- signals / query -----------------------------------------------------
    @workflow.signal(name=REPAIR_SIGNAL_APPROVE)
    def approve(self, raw: Any = None) -> None:
        """``{"by": USER, "action": optional override}``; kept until the repair asks.
        Without ``action`` it approves the action the repair shows when it arrives (an
        approval covers one action: the ladder moving it to another asks again)."""
        sig = self._signal_input(ApproveSignal, raw, REPAIR_SIGNAL_APPROVE)
        if sig is None:
            return  # an approval that cannot be read approves nothing (said in the history)
        self._approve_named = sig.action not in (None, Action.none)
        if not self._approve_named:
            sig = sig.model_copy(update={"action": self._action})
        self._approve = sig

    @workflow.signal(name=REPAIR_SIGNAL_REJECT)
    def reject(self, raw: Any = None) -> None:
        """``{"by": USER, "reason": TEXT}``: end as ``rejected`` (only before acting). A
        payload that cannot be read still rejects (a person said stop), by whoever it
        names."""
        self._reject = self._signal_input(RejectSignal, raw, REPAIR_SIGNAL_REJECT) or \
            RejectSignal(by=_named_by(raw), reason="reject signal with an unreadable payload")

    @workflow.signal(name=REPAIR_SIGNAL_CANCEL)
    def cancel(self, raw: Any = None) -> None:
        """``{"by": USER, "reason": TEXT}``: end as ``cancelled`` at the next safe point. A
        payload that cannot be read still cancels (a person said stop: I19)."""
        self._cancel = self._signal_input(CancelSignal, raw, REPAIR_SIGNAL_CANCEL) or \
            CancelSignal(by=_named_by(raw), reason="cancel signal with an unreadable payload")

    def _signal_input(self, model: type[_M], raw: Any, name: str) -> _M | None:
        """``raw`` (the signal's JSON) as ``model``, or None when it does not validate:
        the error, naming the field and the value, is shown in the details at once and
        written to the history at the next wait (docs/design.md §6: bad input gets a
        clear error, never a silent drop)."""
        if isinstance(raw, model):
            return raw
        try:
            return model.model_validate(raw)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "payload"
            value = err.get("input")
            why = (f"{name} signal refused: {field}: {repr(value)[:200]}: {err['msg']} "
                   f"(payload {str(raw)[:200]})")
            self._input_errors.append(why)
            base = self._detail.split(_REFUSED)[0]  # the last refusal only
            self._detail = f"{base}{_REFUSED}{why}" if base else why
            workflow.set_current_details(self._detail)
            return None

    @workflow.signal(name=REPAIR_SIGNAL_ATTACH_ALERT)
    def attach_alert(self, alert: Alert) -> None:
        """An alert (or a clear) on this node during the repair: it joins this repair's evidence
        (docs/design.md §5 rails: one target per repair, no second repair on the node)."""
        if not alert.active:
            key = fault_key(alert)
            self._alerts = [
                a.model_copy(update={"active": False}) if fault_key(a) == key else a
                for a in self._alerts
            ]
        elif all(a.alert_id != alert.alert_id for a in self._alerts):
            self._alerts.append(alert)

    @workflow.signal(name=REPAIR_SIGNAL_LEASE)
    def lease(self, reply: LeaseReply) -> None:
        """The guard's answer to our ``acquire`` or renewal. A refused renewal means the
        lease lapsed and its slot is taken: :meth:`_ensure_lease` re-acquires before the
        next disruptive step."""
        held = self._lease
        if reply.granted and held is not None and held.granted and reply.reset_at is None:
            # a renewal keeps what the grant said about a breaker reset
            reply = reply.model_copy(update={"reset_at": held.reset_at})
        self._lease = reply

    @workflow.query(name=REPAIR_QUERY_STATUS)
    def status(self) -> RepairStatus:
        """Stage, action, evidence, who requested/approved, which rule decided, history."""
        assert self._req is not None
        return RepairStatus(
            repair_id=self._req.repair_id,
            cluster=self._req.cluster,
            node=self._req.node,
            machine_id=self._machine,
            stage=self._stage,
            action=self._action,
            requester=self._req.requester,
            approved_by=self._approved_by,
            decided_by_rule=self._rule,
            evidence=list(self._alerts),
            history=list(self._history),
            detail=self._detail,
            mode="shadow" if self._shadow else "enforce",
            evidence_captures=list(self._captures),
            state=repair_state(self._stage, self._asking),
        )

    # ---- run -------------------------------------------------------------------
    @workflow.run
    async def run(self, req: RepairRequest) -> RepairStatus:
        """Run the repair to a terminal stage and return its final status.

        Raises ``asyncio.CancelledError`` after the cleanup when the workflow itself was
        cancelled (Temporal UI / CLI), so Temporal records it as cancelled too; a repair
        that ended ``failed`` / ``timed_out`` fails the workflow with a non-retryable
        ``ApplicationError`` of type :data:`~workflows.protocol.REPAIR_FAILED` /
        ``REPAIR_TIMED_OUT`` whose first detail is the final status (after the cleanup),
        so the Temporal UI lists it as failed."""
        carried = Carried.model_validate(req.carried or {})
        self._history_limit = carried.history_limit or HISTORY_EVENTS_MAX
        cancelled = False
        try:
            if carried.stage is None and req.detector and req.request_id:
                claim = await self._short(
                    ACT.ledger_claim_request,
                    ClaimInput(
                        detector=req.detector,
                        request_id=req.request_id,
                        repair_id=req.repair_id,
                        cluster=req.cluster,
                        node=req.node,
                    ),
                    ClaimResult,
                )
                if claim.repair_id != req.repair_id:
                    # the same detector request already owns a repair (design.md §5 idempotency)
                    self._stage = S.cancelled
                    self._detail = (
                        f"duplicate of repair {claim.repair_id} "
                        f"(detector {req.detector}, request {req.request_id})"
                    )
                    workflow.set_current_details(self._detail)
                    return self.status()
            await self._lifecycle(req, carried)
            stage, by, reason = S.succeeded, "system", self._done
        except _Ended as end:
            stage, by, reason = end.stage, end.by, end.reason
        except (ActivityError, asyncio.CancelledError) as err:
            if is_cancelled_exception(err):
                cancelled = True
                stage, by = S.cancelled, "temporal"
                reason = f"workflow cancelled from Temporal (UI or CLI) at {self._stage.value}"
            else:
                assert isinstance(err, ActivityError)
                stage, by = S.failed, "system"
                reason = f"{err.activity_type} failed at stage {self._stage.value}: {_cause(err)}"
        # evidence that cleared once an action ran without a verified recovery resolves
        # nothing: the repair ends failed and the node stays cordoned
        stage, reason = decision.resolved_ending(
            stage, reason, [] if self._verified else self._acted)
        await self._finish(stage, by, reason)
        if cancelled or self._temporal_cancelled:
            raise asyncio.CancelledError(reason)
        if stage in (S.failed, S.timed_out):
            # shown as failed in Temporal (UI list, ExecutionStatus), with the final
            # status as the failure's detail; cleanup and ledger are done above
            final = self.status()
            why = final.history[-1].reason if final.history else reason
            raise permanent(
                REPAIR_FAILED if stage == S.failed else REPAIR_TIMED_OUT,
                f"repair {final.stage.value}: {why}",
                final,
            )
        return self.status()

    async def _lifecycle(self, req: RepairRequest, carried: Carried) -> None:
        if carried.stage is not None:
            self._restore(carried)
        else:
            await self._prepare(req)
        await self._wait_for_idle(carried)
        if not self._evidence_ok():
            # re-checked before draining (docs/design.md §5 rails); the cleanup uncordons
            raise _Ended(
                S.auto_resolved, "system", "every alert behind the repair cleared before draining"
            )
        await self._ensure_lease("drain")
        # I18: the machine may have been held for RMA (another repair removed it) while
        # this one waited for idle; a held machine is never drained or acted on
        await self._check_hold()
        self._hold_read_for = 0  # read right before the drain: it counts for the first rung
        await self._drain()
        await self._act_with_ladder()

    async def _prepare(self, req: RepairRequest) -> None:
        """From ``recommended`` through consent, lease and cordon."""
        # this node's slice of the policy (issue 30 item 2: never every node's)
        snap = await self._short(ACT.load_node_policy,
                                 NodeRef(cluster=req.cluster, node=req.node), NodePolicy)
        self._policy = snap.policy
        self._bmc_queue = snap.bmc_task_queue
        # Machine and pool from configuration and the ledger's bindings (load_node_policy);
        # the request's own only where those have none (docs/design.md §5: never what an agent
        # reported about itself).
        self._machine = snap.machines.get(req.node) or self._machine
        self._pool = snap.pools.get(req.node) or self._pool
        self._shadow = is_shadow(snap.mode_of(self._pool))
        workflow.upsert_search_attributes(
            [k.value_set(v) for k, v in repair_identity_attributes(req, self._machine)]
        )
        await self._upsert()
        await self._transition(S.recommended, req.requester.name, req.reason or "repair requested")
        if req.action not in MACHINE_ACTIVITY:
            # a request typed by hand (Temporal UI / CLI) naming no action to run: refused
            # before anything is touched, with the field and the value named
            raise _Ended(S.failed, "system",
                         f"action {req.action.value!r} is not an action a repair can run "
                         f"(RepairRequest.action: one of "
                         f"{', '.join(a.value for a in MACHINE_ACTIVITY)})")
        await self._check_hold()
        await self._decide(req.action, approver=None)
        consent = self._consent(self._action)
        needs_human = self._needs_human
        if consent.automatic and not needs_human:
            self._approved_by = (
                req.requester.name if consent.rule == "requested_by_user" else AUTO_APPROVED
            )
            self._approve_decision(self._approved_by)
            self._rule = f"{consent.rule}; {self._rule}"
            await self._upsert()
        else:
            why = self._human_reason if needs_human else consent.rule
            await self._await_approval(why)
        self._check_ended()
        await self._acquire_lease()
        self._check_evidence_before_cordon()
        while not await self._decision_holds() or await self._pause_for_maintenance():
            await self._acquire_lease()
            self._check_evidence_before_cordon()
        await self._check_hold()
        if self._shadow:
            await self._end_shadowed()
        await self._cordon()

    async def _end_shadowed(self) -> None:
        """Shadow mode, where an enforcing repair would cordon (every decision made, the
        lease held): record the attempt the repair stands for (outcome ``shadowed``, so
        the ladder, node cap and repeat-offender rule of shadow-mode repairs count it as
        the action) and end ``shadowed`` with what would have been done. Raises
        :class:`_Ended`; nothing is cordoned, drained or acted on."""
        assert self._req is not None
        plan = would_do(self._action, self._req.node, self._machine,
                        reset_targets(self._alerts) if self._action == Action.reset_gpu
                        else [], self._policy.wait_for_idle)
        await self._attempt(self._action, SHADOWED)
        raise _Ended(S.shadowed, "system", f"shadow mode: {plan}")

    async def _pause_for_maintenance(self) -> bool:
        """Issue 29: a repair that has not cordoned waits while a maintenance window
        covers its node (a planned rack reboot's false faults must not cordon anything),
        with the window named in its record and details, holding no lease; the windows
        are read again at least every :data:`MAINTENANCE_RECHECK_S` (a window ended early
        frees it). When none covers the node any more the caller re-acquires the lease
        and re-checks the evidence. An operator's own request does not wait (a person
        decided). Returns True when it waited; raises :class:`_Ended` on reject / cancel,
        or ``auto_resolved`` when the level evidence cleared meanwhile."""
        assert self._req is not None
        if self._req.requester.kind == RequesterKind.user:
            return False
        paused = False
        auto_resolvable = any(a.level for a in self._alerts)
        while True:
            cover = await self._short(
                ACT.ledger_maintenance_covering,
                MaintenanceQuery(cluster=self._req.cluster, node=self._req.node,
                                 pool=self._pool, at=workflow.now()),
                MaintenanceCover,
            )
            if cover.window_id is None or cover.ends_at is None:
                if paused:
                    await self._note("maintenance over: evidence checked again before "
                                     "cordoning")
                return paused
            if not paused:
                paused = True
                await self._note(
                    f"paused before cordoning: {self._req.node} is in maintenance window "
                    f"{cover.window_id} until {cover.ends_at.isoformat()} ({cover.reason}); "
                    "the evidence is checked again when it ends")
                await self._hand_back(S.recommended)
            self._detail = self._approved_prefix() + waiting_details(
                f"maintenance window {cover.window_id} on {self._req.node} to end "
                f"({cover.reason}; `autorepair maintenance end {cover.window_id}` ends it "
                "early)", cover.ends_at, self._stage.value)
            workflow.set_current_details(self._detail)
            left = (cover.ends_at - workflow.now()).total_seconds()
            await self._wait(lambda: (self._cancel is not None or self._reject is not None
                                      or (auto_resolvable and not self._evidence_ok())),
                             min(max(left, 1.0), MAINTENANCE_RECHECK_S))
            self._check_ended()
            if auto_resolvable and not self._evidence_ok():
                raise _Ended(S.auto_resolved, "system",
                             f"every alert behind the repair cleared during maintenance "
                             f"window {cover.window_id}")

    async def _check_hold(self) -> None:
        """I18: a machine held for RMA (removed, not returned by an operator since) is never
        cordoned, drained or acted on: the repair ends ``cancelled`` by ``system`` naming
        the hold (docs/design.md §5 rails). Asked when the repair starts and again right
        before the cordon. Raises :class:`_Ended`."""
        assert self._req is not None
        hold = await self._short(
            ACT.ledger_machine_held,
            MachineHoldQuery(cluster=self._req.cluster, machine_id=self._machine),
            MachineHold,
        )
        if hold.held:
            since = hold.since.isoformat() if hold.since is not None else "unknown"
            self._machine_held = True  # told to the node with the end (RepairFinished)
            raise _Ended(
                S.cancelled, "system",
                f"machine {hold.machine_id or self._machine} is held for RMA since {since} "
                f"(repair {hold.repair_id or 'none'}: {hold.reason or 'removed'}); no repair "
                "acts on it until an operator returns it (Ledger.return_machine)",
            )

    def _check_evidence_before_cordon(self) -> None:
        if not self._evidence_ok():
            # re-checked before cordoning (docs/design.md §5 rails): nothing was touched yet
            raise _Ended(
                S.auto_resolved, "system", "every alert behind the repair cleared before cordoning"
            )

    async def _decision_holds(self) -> bool:
        """With the lease just granted: does the decision still hold? Another repair of
        this node may have acted while this one waited (the guard queues repairs of one
        node behind each other), so the attempt history is read again and the ladder, the
        migrate gate and the per-node cap decide once more (docs/design.md §5 rails) on
        what the approval in force approved. Returns True to go on: the approval covers
        the decision made again (:func:`decision.covers`: the same action at the same rung
        under the same decision), or the consent policy allows the changed decision by
        itself (the rule and a note name what changed). Otherwise the lease is handed
        back while a person decides, and False asks for it again."""
        assert self._req is not None
        before, rule_before, approval = self._action, self._rule, self._approval
        known = {(a.repair_id, a.action, a.at) for a in self._attempts}
        self._history_read = False
        # from where the decision in force was decided from (the approval's fingerprint
        # was made there: the ladder from the action requested)
        await self._decide(self._decided_from or (approval.action if approval is not None
                                                  else self._req.action), approver=None,
                           reset_blocked=self._decided_blocked if self._decided_from else None)
        acted_meanwhile = any(
            (a.repair_id, a.action, a.at) not in known and a.repair_id != self._req.repair_id
            for a in self._attempts
        )
        d = self._decision
        assert d is not None
        if decision.covers(approval, d, automatic=False):
            # the approval given over this same decision stands (a person's beyond the
            # ladder too): who approved and which rule decided are unchanged
            self._rule, self._needs_human = rule_before, False
            return True
        consent = self._consent(self._action)
        if decision.covers(None, d, consent.automatic):
            self._rule = f"{consent.rule}; {self._rule}; was: {rule_before}"
            self._approve_decision(self._approved_by if self._approved_by in (
                AUTO_APPROVED, self._req.requester.name) else AUTO_APPROVED)
            await self._note(
                ("another repair acted on the node meanwhile: " if acted_meanwhile
                 else "the decision changed while the lease was queued: ")
                + f"{before.value} → {self._action.value} ({self._rule})"
            )
            return True
        if self._needs_human:
            why = self._human_reason
        elif self._action != before:
            why = f"ladder moved to {self._action.value} while the lease was queued"
        else:
            why = (
                f"the approval of {before.value} covered an earlier rung; the ladder now "
                f"counts another attempt ({self._rule})"
            )
        self._rule = f"{self._rule}; was: {rule_before}"
        await self._hand_back(S.awaiting_approval)
        self._approval = None  # an approval of the earlier decision does not cover this one
        # an approve sent since the approval in force (while the lease was queued, or
        # during the hand-back) is never dropped silently: one naming the action now
        # decided is applied as the repair asks; any other is answered with a note
        pending, self._approve = self._approve, None
        if pending is not None:
            if decision.names_decided(pending.action, self._approve_named, self._action):
                self._approve = pending
            else:
                await self._note(decision.not_applied_note(
                    pending.by, pending.action or before, before, self._action))
        await self._await_approval(
            ("another repair acted on the node meanwhile; " if acted_meanwhile
             else "the decision changed while the lease was queued; ") + why)
        self._check_ended()
        return False

    def _approved_label(self) -> str:
        """`` (approved by X)`` at ``awaiting_approval`` once approved (the stage is kept
        until the cordon: docs/design.md §4.4 order), else empty."""
        if self._stage == S.awaiting_approval and not self._asking and self._approved_by:
            return f" (approved by {self._approved_by})"
        return ""

    def _approved_prefix(self) -> str:
        """``approved by X, `` before what an approved repair at ``awaiting_approval``
        waits for (its lease, a maintenance window), else empty."""
        if self._approved_label():
            return f"approved by {self._approved_by}, not waiting for a person: "
        return ""

    def _consent(self, action: Action) -> ConsentDecision:
        """The consent policy's decision on ``action``
        (:func:`workflows.policy.consent_decision`); a detector's ``auto_approved_rule``
        on the request approves any action but ``remove``. An operator's own request
        approves the action they asked for at its first rung only: once an action ran
        (``_acted``), a later rung goes through the consent policy (as :meth:`_escalate`
        decides it)."""
        assert self._req is not None
        requested = self._req.action if not self._acted else Action.none
        consent = consent_decision(action, self._alerts, self._req.requester,
                                   self._policy.consent, requested=requested)
        if self._req.auto_approved_rule and action != Action.remove:
            consent = ConsentDecision(True, self._req.auto_approved_rule)
        return consent

    def _approve_decision(self, by: str) -> None:
        """Record that ``by`` approved the last decision: what the approval covers."""
        assert self._decision is not None
        self._approval = decision.approval_of(by, self._decision)

    def _evidence_ok(self) -> bool:
        """Whether the evidence still stands; after a breaker reset only evidence observed
        after the reset counts (docs/design.md §5 rails; ``LeaseReply.reset_at``)."""
        since = self._lease.reset_at if self._lease is not None else None
        return evidence_current(self._evidence(), since)

    def _evidence(self) -> list[Alert]:
        """The alerts whose currency keeps this repair going (docs/design.md §5 rule zero): those it
        was started with (the recommendation's faults, or what an operator cited, observed
        or not) and actionable alerts attached since. An observed-only alert attached
        during the repair (``node_unreachable`` of a node that went silent, a straggler
        score) is shown as evidence but never keeps the repair acting. A repair started
        without alerts (an operator's call) stays current: ``[]``."""
        assert self._req is not None
        cited = {a.alert_id for a in self._req.alerts}
        if not cited:
            return []
        return [a for a in self._alerts if a.alert_id in cited or a.actionable]

    # ---- waiting -------------------------------------------------------------------
    async def _wait(self, cond: Callable[[], bool], limit_s: float | None) -> bool:
        """Every long wait of the repair goes through here (approval, wait for idle, rejoin
        polling, action retry back-off), so a lease held meanwhile is renewed here: in
        chunks of at most the renewal interval (:meth:`_renew_lease`). Returns True when
        ``cond()`` became true, False after ``limit_s`` seconds (None: no bound)."""
        if not self._holding():
            if limit_s is None:
                await workflow.wait_condition(cond)
                return True
            try:
                await workflow.wait_condition(cond, timeout=timedelta(seconds=limit_s))
            except TimeoutError:
                return False
            return True
        start = workflow.now()
        while True:
            await self._renew_lease()
            chunk = self._renew_every()
            if limit_s is not None:
                left = limit_s - (workflow.now() - start).total_seconds()
                if left <= 0:
                    return False
                chunk = min(chunk, left)
            try:
                await workflow.wait_condition(cond, timeout=timedelta(seconds=chunk))
                return True
            except TimeoutError:
                continue

    async def _decide(
        self, requested: Action, approver: str | None, reset_blocked: str | None = None
    ) -> None:
        """Reset preconditions + ladder + migrate gate + per-node action cap on
        ``requested`` (recorded as the deciding rule); sets ``_needs_human`` and its reason.
        ``reset_blocked``: why the node said a reset cannot run."""
        assert self._req is not None
        now = workflow.now()
        rails = self._policy.rails
        if not self._history_read:
            days = max(self._policy.ladder.window_s, self._policy.migrate_gate.window_s)
            days = max(days, rails.max_actions_window_s, rails.repeat_offender.window_s)
            hist = await self._short(
                ACT.ledger_attempt_history,
                AttemptQuery(
                    cluster=self._req.cluster,
                    node=self._req.node,
                    machine_id=self._machine,
                    since=now - timedelta(seconds=days),
                ),
                AttemptHistory,
            )
            # shadowed attempts count for shadow-mode repairs only (workflows.policy.shadow)
            self._attempts = rail_attempts(hist.attempts, self._shadow)
            self._critical = list(hist.critical_alerts)
            self._history_read = True
        d = decision.decide(
            requested, self._policy, node=self._req.node, machine=self._machine,
            pool=self._pool, alerts=self._alerts, attempts=self._attempts, now=now,
            critical=self._critical, approver=approver, reset_blocked=reset_blocked)
        self._decision = d
        self._decided_from, self._decided_blocked = requested, reset_blocked
        self._set_action(d.action)
        self._rule = d.rule
        self._needs_human = bool(d.needs_human)
        self._human_reason = d.needs_human

    def _set_action(self, action: Action) -> None:
        self._action = action
        workflow.upsert_search_attributes([SA_ACTION.value_set(action.value)])

    async def _drop_approval(self) -> None:
        """Clear an approve sent before the question asked now: it covers no later one (one
        action at one rung). One that was pending is answered with a note
        (:func:`decision.stale_approval_note`): an approval never vanishes silently."""
        pending, self._approve = self._approve, None
        if pending is not None:
            await self._note(decision.stale_approval_note(
                pending.by, pending.action or self._action, self._action))

    async def _await_approval(self, why: str) -> None:
        """Wait for approve / reject / cancel (or the evidence clearing).

        An approval that arrived before this point is kept (operator intent is never
        dropped); the escalation path clears it first, since an approval of one action
        does not cover a heavier one."""
        if self._shadow:
            why = f"{why} (shadow mode: the approval is recorded; nothing will act)"
        # I18: the machine may be held for RMA while a person decides (another repair
        # removed it): the hold is read again before the next rung acts
        self._hold_read_for = -1
        self._asking = True
        await self._transition(S.awaiting_approval, "system", f"approval needed: {why}")
        await self._upsert()
        assert self._req is not None
        timeout_s = self._policy.consent.approval_timeout_s
        rid = self._req.repair_id
        # what it asks for now (the static Summary keeps the first action), why, and
        # what a person can do
        workflow.set_current_details(waiting_details(
            f"approval of {self._action.value} on {self._req.node} (`autorepair repairs "
            f"approve {rid}`, `approve {rid} --action ACTION` for another, `reject {rid}` "
            f"or `cancel {rid}`; or signal approve)",
            workflow.now() + timedelta(seconds=timeout_s) if timeout_s is not None else None,
            S.awaiting_approval.value) + f" — why: {' '.join(why.split())[:1000]}")
        auto_resolvable = any(a.level for a in self._alerts)

        def decided() -> bool:
            return (
                self._approve is not None
                or self._reject is not None
                or self._cancel is not None
                or (auto_resolvable and not self._evidence_ok())
            )

        deadline = self._policy.consent.approval_timeout_s
        asked_at = workflow.now()
        while True:
            left = (None if deadline is None
                    else deadline - (workflow.now() - asked_at).total_seconds())
            if left is not None and left <= 0:
                raise _Ended(
                    S.timed_out, "system", f"no approval within {deadline:g} s; evidence is stale"
                )
            await self._wait(lambda: decided() or bool(self._input_errors), left)
            # a signal whose payload could not be read is said in the history (the
            # person sees why nothing happened) and the wait goes on
            while self._input_errors:
                await self._note(self._input_errors.pop(0))
            if decided():
                break
        self._check_ended()
        if self._approve is None:
            raise _Ended(S.auto_resolved, "system", "alert cleared before approval")
        sig = self._approve
        self._approve = None  # consumed
        # ``none`` is no action to run: as no override (the API refuses it; a signal sent
        # by hand may carry it)
        asked = sig.action if sig.action not in (None, Action.none) else self._action
        # decided again from where the decision shown was decided from, so the rule
        # keeps every step that moved it (the ladder from the action requested); an
        # action the person chose instead is decided from itself
        same = asked == self._action and self._decided_from is not None
        await self._decide(self._decided_from if same and self._decided_from else asked,
                           approver=sig.by, reset_blocked=self._decided_blocked if same else None)
        assert self._decision is not None
        again = decision.approved_as_asked(asked, sig.by, self._decision,
                                           self._consent(self._action).automatic)
        if again is not None:
            # the ladder or the migrate gate made it another action than the one approved
            await self._await_approval(again)
            return
        self._approved_by = sig.by
        self._approve_decision(sig.by)
        self._rule = f"approved by {sig.by}; {self._rule}"
        # approved: nobody is asked any more, the stage stays (docs/design.md §4.4 order)
        # until the cordon; RepairState, details and the ledger row say so (no second
        # approval_needed notification: RepairRecord.approval_pending)
        self._asking = False
        workflow.upsert_search_attributes([SA_STATE.value_set(repair_state(self._stage,
                                                                          False))])
        self._detail = f"{self._stage.value}{self._approved_label()}: going on to the lease"
        workflow.set_current_details(self._detail)
        await self._upsert()

    def _check_ended(self) -> None:
        if self._reject is not None:
            raise _Ended(S.rejected, self._reject.by, self._reject.reason or "rejected")
        if self._cancel is not None:
            raise _Ended(S.cancelled, self._cancel.by, self._cancel.reason or "cancelled")

    # ---- lease -------------------------------------------------------------------
    def _lease_request(self, renew: bool = False) -> LeaseRequest:
        assert self._req is not None
        req = self._req
        return LeaseRequest(
            repair_id=req.repair_id,
            workflow_id=workflow.info().workflow_id,
            cluster=req.cluster,
            node=req.node,
            node_pool=self._pool,
            automatic=self._approved_by == AUTO_APPROVED,
            requester_kind=req.requester.kind,
            renew=renew,
            gpu_evidence=any(a.gpu for a in self._alerts),
            requested_at=self._lease_requested_at,
            fault_kinds=sorted({a.kind for a in self._alerts}),
        )

    def _holding(self) -> bool:
        """Whether we hold a granted lease and renew it. A grant while no request of ours
        is out (it came after we handed the lease back, an answer to a re-send that crossed
        the release) is not held."""
        return self._lease_requested and self._lease is not None and self._lease.granted

    def _renew_every(self) -> float:
        """Renewal interval, seconds: :data:`LEASE_RENEW_S`, at most half the lease TTL."""
        return min(LEASE_RENEW_S, self._policy.rails.lease_ttl_s / 2)

    async def _signal_guard(self, lreq: LeaseRequest) -> None:
        """Send ``lreq`` to ``guard/{cluster}``, starting the guard when it is not running
        (first use, or terminated). A failed second try is logged and the next re-send or
        renewal tries again."""
        gid = workflow_id_guard(lreq.cluster)
        try:
            await workflow.get_external_workflow_handle(gid).signal(GUARD_SIGNAL_ACQUIRE, lreq)
            return
        except FailureError:
            pass
        try:
            await workflow.start_child_workflow(
                GUARD_WORKFLOW,
                GuardInput(cluster=lreq.cluster),
                id=gid,
                task_queue=workflow.info().task_queue,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                static_summary=guard_summary(lreq.cluster),
                static_details=guard_details(lreq.cluster),
            )
        except WorkflowAlreadyStartedError:
            pass
        try:
            await workflow.get_external_workflow_handle(gid).signal(GUARD_SIGNAL_ACQUIRE, lreq)
        except FailureError:
            workflow.logger.warning("guard %s unreachable; the request is sent again later", gid)

    async def _acquire_lease(self) -> None:
        """Ask the cluster guard for a lease and wait for the grant (docs/design.md §5 rails)."""
        assert self._req is not None
        # when this repair first asked (kept across re-sends and across asking again
        # after a hand-back: a maintenance pause, a person deciding): the guard judges by
        # it whether the wait crossed a breaker reset — one its restart lost the queue
        # of, or one the repair waited through holding no lease (I23)
        if self._lease_requested_at is None:
            self._lease_requested_at = workflow.now()
        lreq = self._lease_request()
        self._detail = f"{self._approved_prefix()}waiting for a lease from the cluster guard"
        workflow.set_current_details(self._detail)
        await self._send_lease_request(lreq)
        self._lease_requested = True
        await self._wait_for_grant(lreq)
        reply = self._lease
        assert reply is not None
        if reply.reset_at is not None and not evidence_current(self._evidence(), reply.reset_at):
            raise _Ended(
                S.auto_resolved,
                "system",
                f"evidence predates {reply.reset_at.isoformat()} (a circuit breaker reset, "
                "or the release of a failure-domain hold that kept the repair waiting) and "
                "is no longer current",
            )

    async def _send_lease_request(self, lreq: LeaseRequest) -> None:
        """Send ``lreq`` (:meth:`_signal_guard`), forgetting the guard's previous answer
        first. The guard may answer before the send's own completion reaches this workflow
        (both then arrive in one workflow task, the answer's signal handled first), so the
        answer must not be cleared after the send."""
        self._lease = None
        await self._signal_guard(lreq)

    async def _wait_for_grant(self, lreq: LeaseRequest) -> None:
        """Wait for a granted ``lease`` reply to ``lreq`` (sent by
        :meth:`_send_lease_request`), re-sending it every :data:`LEASE_RESEND_S` plus up to
        :data:`LEASE_RESEND_JITTER` of it (a guard that was terminated or reset learns of
        us again). Ends the repair ``timed_out`` after ``rails.lease_wait_max_s`` with
        the guard's last reason, ``auto_resolved`` when the level evidence clears, and on
        reject/cancel."""
        auto_resolvable = any(a.level for a in self._alerts)
        limit = self._policy.rails.lease_wait_max_s
        start = workflow.now()
        last_reason = "no answer from the cluster guard"
        while True:
            resend_s = LEASE_RESEND_S * (1 + LEASE_RESEND_JITTER * workflow.random().random())
            waited = (workflow.now() - start).total_seconds()
            if waited >= limit:
                raise _Ended(
                    S.timed_out,
                    "system",
                    f"no lease within {limit:g} s (policy.rails.lease_wait_max_s): {last_reason}",
                )
            try:
                await workflow.wait_condition(
                    lambda: (
                        self._lease is not None
                        or self._reject is not None
                        or self._cancel is not None
                        or (auto_resolvable and not evidence_current(self._evidence()))
                    ),
                    timeout=timedelta(seconds=max(min(resend_s, limit - waited), 1.0)),
                )
            except TimeoutError:
                await self._signal_guard(lreq)
                continue
            self._check_ended()
            reply = self._lease
            if reply is None:
                raise _Ended(S.auto_resolved, "system", "alert cleared while waiting for lease")
            if reply.granted:
                self._last_renew = workflow.now()
                # recorded by the holder: a guard rebuilt from the ledger before this
                # repair's cordon counts it (I21; the budget holds across a restart)
                await self._upsert()
                return
            last_reason = reply.reason or "queued"
            self._detail = f"{self._approved_prefix()}lease queued: {last_reason}"
            workflow.set_current_details(self._detail)
            self._lease = None

    async def _renew_lease(self) -> None:
        """Renew our lease when due (every :meth:`_renew_every` seconds); called from
        :meth:`_wait`. The renewal carries the full request, so a guard that lost its
        state re-registers us. Does not wait for the answer: a refusal marks the lease
        lost and :meth:`_ensure_lease` re-acquires before the next step."""
        if not self._holding():
            return
        now = workflow.now()
        if (
            self._last_renew is not None
            and (now - self._last_renew).total_seconds() < self._renew_every()
        ):
            return
        self._last_renew = now
        await self._signal_guard(self._lease_request(renew=True))

    async def _ensure_lease(self, step: str) -> bool:
        """Before a disruptive ``step``: hold an unexpired lease, or re-acquire one (and
        wait for it) first — an expired lease is never silently reused (docs/design.md §5
        rails). Raises :class:`_Ended` ``auto_resolved`` when, re-acquired, the evidence is
        no longer current (after a breaker reset only what was received after it counts).
        Returns True when the lease was re-acquired (waited for), False when it was held."""
        if not self._lease_requested:
            return False
        lease = self._lease
        now = workflow.now()
        expires = lease.expires_at if lease is not None else None
        if lease is not None and lease.granted and (expires is None or now < expires):
            await self._renew_lease()
            return False
        if lease is not None and not lease.granted:
            why = lease.reason or "lease not renewed"
        elif expires is not None:
            why = f"lease expired at {expires.isoformat()}"
        else:
            why = "no lease"
        reset_at = lease.reset_at if lease is not None else None
        await self._note(f"lease not held before {step} ({why}); re-acquiring")
        lreq = self._lease_request(renew=True)
        await self._send_lease_request(lreq)
        await self._wait_for_grant(lreq)
        if reset_at is not None and self._lease is not None and self._lease.reset_at is None:
            self._lease = self._lease.model_copy(update={"reset_at": reset_at})
        if not self._evidence_ok():
            # a grant after a breaker reset counts only evidence received after it (I23),
            # as the first grant does (:meth:`_acquire_lease`); the cleanup uncordons
            raise _Ended(S.auto_resolved, "system",
                         f"evidence is no longer current when the lease came back before "
                         f"{step} (a breaker reset, or the alerts cleared meanwhile)")
        return True

    # ---- stages ------------------------------------------------------------------
    async def _cordon(self) -> None:
        assert self._req is not None
        await self._transition(S.cordoning, "system", f"cordon for {self._action.value}")
        # the cordon may be set before its answer comes back (a workflow cancelled from
        # Temporal drops the answer): until then the cleanup lifts it as ours — the
        # scheduler's rejoin lifts only this repair's own cordon (I1)
        self._cordoned_by_us = True
        try:
            res = await self._act_stoppable(
                ACT.cordon_node,
                CordonInput(
                    cluster=self._req.cluster,
                    node=self._req.node,
                    repair_id=self._req.repair_id,
                    reason=f"autorepair {self._req.repair_id}: {self._action.value}",
                ),
                CordonResult,
            )
        except ActivityError as err:
            if not is_cancelled_exception(err):
                self._cordoned_by_us = False  # refused for good (403, 404): nothing was set
            raise
        self._cordoned_by_us = res.cordoned_by_us
        # a cancel or reject that came while the cordon was out ends the repair when the
        # call returns, before the next step (I19; the repair machine's decision): the
        # record never shows it moving on to wait for idle after a person said stop
        self._check_cancel_before_act()
        if res.held_by_repair:
            await self._yield_to(res.held_by_repair)
        if res.by_other:
            # recorded: the repair goes on beside a cordon it does not own (and never
            # lifts it), which the ending's record must be read against
            await self._note(f"node already cordoned by someone else ({res.detail}); "
                             "the repair goes on beside that cordon and never lifts it")
            self._detail = f"node already cordoned by someone else: {res.detail}"

    async def _yield_to(self, holder: str) -> None:
        """The cordon found ``holder``, another repair, on the node. One repair acts on a
        node at a time, whichever path created it (docs/design.md §5 rails): while ``holder``
        runs (or its state cannot be read) this repair ends ``cancelled`` and leaves the
        other's cordon as it is. A cordon left by a repair that has ended (perhaps holding a
        machine for a person) is never adopted silently (I18): this repair hands its lease
        back and waits for a person in ``awaiting_approval`` naming the stale cordon; an
        approval re-acquires the lease and goes on without owning the cordon (never
        lifting it)."""
        assert self._req is not None
        try:
            live: RepairLiveness | None = await start_local(
                ACT.ledger_open_repair,
                RepairProbe(cluster=self._req.cluster, node=self._req.node, repair_id=holder),
                result_type=RepairLiveness,
                retry_policy=_LIVENESS_RETRY,
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            live = None
        if live is None or live.running:
            raise _Ended(
                S.cancelled,
                "system",
                f"{self._req.node} is held by repair {holder}: one repair acts on a node "
                "at a time",
            )
        # I18: never adopted silently. A person decides (the lease is handed back while
        # they do); an approval goes on beside the old cordon, never lifting it.
        why = (
            f"cordon left by repair {holder}, which has ended ({live.status or live.stage}); "
            "approve to go on (the cordon is kept as it is), or reject / cancel"
        )
        await self._hand_back(S.awaiting_approval)
        await self._drop_approval()  # an approval given before did not cover the stale cordon
        await self._await_approval(why)
        self._check_ended()
        await self._acquire_lease()
        self._check_evidence_before_cordon()

    async def _wait_for_idle(self, carried: Carried) -> None:
        """Poll ``check_idle`` until idle, the bound expires (recorded), a reject/cancel
        arrives or the evidence clears. The poll interval doubles from ``poll_s`` up to
        ``poll_max_s``; past :data:`HISTORY_EVENTS_MAX` events the wait continues as new."""
        assert self._req is not None
        wfi = self._policy.wait_for_idle
        bound = "do not interrupt" if wfi.do_not_interrupt else f"max {wfi.max_wait_s:g} s"
        if carried.idle_since is None:
            await self._transition(S.waiting_for_idle, "system", bound)
        start = carried.idle_since or workflow.now()
        poll = carried.idle_poll_s or wfi.poll_s
        ref = NodeRef(cluster=self._req.cluster, node=self._req.node, repair_id=self._req.repair_id)
        noted = ""
        while True:
            self._check_cancel_before_act()
            if not self._evidence_ok():
                return  # the caller ends the repair auto_resolved before draining
            idle = await self._read(ACT.check_idle, ref, IdleStatus)
            if idle.detail and idle.detail != noted:
                # what the check did beyond looking (a non-graceful-shutdown taint on a host
                # the BMC reports off) goes in the repair's record, once per change
                noted = idle.detail
                await self._note(f"idle check: {idle.detail}")
            if idle.idle:
                return
            waited = (workflow.now() - start).total_seconds()
            if not wfi.do_not_interrupt and waited >= wfi.max_wait_s:
                await self._note(
                    f"wait-for-idle expired after {waited:g} s (max {wfi.max_wait_s:g} s) with "
                    f"{', '.join(idle.running) or 'work'} still running; proceeding"
                )
                return
            self._detail = waiting_details(
                f"{self._req.node} to go idle ({', '.join(idle.running)} still running)",
                None if wfi.do_not_interrupt
                else start + timedelta(seconds=wfi.max_wait_s),
                S.waiting_for_idle.value)
            workflow.set_current_details(self._detail)
            if self._history_full():
                # a cancel or reject that came while the idle check was out is decided
                # here, not handed to the next run only (reproduction 6, I19)
                self._check_cancel_before_act()
                self._continue_as_new(start, poll)
            timeout = poll
            if not wfi.do_not_interrupt:
                timeout = min(timeout, max(wfi.max_wait_s - waited, 1.0))

            def stop() -> bool:
                return (
                    self._cancel is not None
                    or self._reject is not None
                    or not self._evidence_ok()
                )

            await self._wait(stop, timeout)
            poll = min(poll * 2, max(wfi.poll_max_s, wfi.poll_s))

    def _history_full(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._history_limit
        )

    def _continue_as_new(self, idle_since: datetime, poll_s: float) -> None:
        """Continue as new in ``waiting_for_idle``, carrying everything the rest of the
        repair needs (raises ``ContinueAsNewError``; the cleanup does not run)."""
        assert self._req is not None
        state = Carried(
            history_limit=self._history_limit,
            stage=self._stage,
            action=self._action,
            machine=self._machine,
            pool=self._pool,
            history=self._history,
            alerts=self._alerts,
            approved_by=self._approved_by,
            approval=self._approval,
            rule=self._rule,
            lease=self._lease,
            lease_requested=self._lease_requested,
            lease_requested_at=self._lease_requested_at,
            cordoned_by_us=self._cordoned_by_us,
            policy=self._policy,
            bmc_queue=self._bmc_queue,
            attempts=self._attempts,
            critical=self._critical,
            idle_since=idle_since,
            idle_poll_s=poll_s,
            continued=self._continued + 1,
            approve=self._approve,
            reject=self._reject,
            cancel=self._cancel,
            decided_from=self._decided_from,
            decided_blocked=self._decided_blocked,
            drain_deadline=self._drain_deadline,
        )
        workflow.continue_as_new(
            self._req.model_copy(update={"carried": state.model_dump(mode="json")})
        )

    def _restore(self, c: Carried) -> None:
        """The state a previous run carried over (see :meth:`_continue_as_new`)."""
        assert c.stage is not None and c.action is not None
        self._stage = c.stage
        self._action = c.action
        self._machine, self._pool = c.machine, c.pool
        self._history = list(c.history)
        # evidence attached meanwhile (a signal that raced the hand-over) is merged in
        known = {a.alert_id for a in c.alerts}
        self._alerts = list(c.alerts) + [a for a in self._alerts if a.alert_id not in known]
        self._approved_by, self._rule = c.approved_by, c.rule
        self._approval = c.approval
        self._lease = self._lease or c.lease
        self._lease_requested = c.lease_requested
        self._lease_requested_at = c.lease_requested_at
        self._cordoned_by_us = c.cordoned_by_us
        self._policy = c.policy or PolicyConfig()
        self._bmc_queue = c.bmc_queue
        self._attempts, self._critical = list(c.attempts), list(c.critical)
        self._history_read = True  # read before the cordon, carried since
        self._continued = c.continued
        # a signal delivered to this run before the restore wins over the carried one
        self._approve = self._approve or c.approve
        self._reject = self._reject or c.reject
        self._cancel = self._cancel or c.cancel
        self._decided_from, self._decided_blocked = c.decided_from, c.decided_blocked
        self._drain_deadline = c.drain_deadline
        self._detail = f"waiting for idle (continued as new {c.continued}x)"

    def _check_cancel_before_act(self) -> None:
        if self._cancel is not None or self._reject is not None:
            raise _Ended(
                S.cancelled if self._cancel else S.rejected,
                (self._cancel or self._reject).by,  # type: ignore[union-attr]
                (self._cancel or self._reject).reason or "stopped before acting",  # type: ignore[union-attr]
            )

    async def _drain(self) -> None:
        assert self._req is not None
        await self._transition(S.draining, "system", "")
        now = workflow.now()
        if self._drain_deadline is None:
            # absolute, set once: every try and batch of tries counts against it
            self._drain_deadline = decision.drain_deadline(
                now, self._policy.rails.drain_deadline_s)
        left = max(0.0, (self._drain_deadline - now).total_seconds())
        try:
            res = await self._act_stoppable(
                ACT.drain_node,
                DrainInput(
                    cluster=self._req.cluster,
                    node=self._req.node,
                    repair_id=self._req.repair_id,
                    deadline_s=left,
                    deadline_at=self._drain_deadline,
                ),
                DrainResult,
                limit=timedelta(seconds=left + 300),
                heartbeat=timedelta(seconds=self._policy.rails.heartbeat_timeout_s),
            )
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise
            remaining = _drain_deadline_passed(err)
            if remaining is None:
                raise _Ended(S.failed, "system", f"drain failed: {_cause(err)}") from err
            res = DrainResult(drained=False, remaining=remaining)
        # a cancel or reject that came while the drain ran is final (I19), whether or not
        # the drain finished: nothing was touched, the cleanup uncordons (the pure machine
        # decides a stop before the drain's answer the same way)
        if self._cancel is not None or self._reject is not None:
            await self._rejoin()
            self._check_cancel_before_act()
        if not res.drained:
            # the work would not leave by the deadline: the fault stands, so the node stays
            # cordoned for a person (the pure machine decides the same, decision.py)
            reason, self._hold = decision.drain_deadline_ending(
                res.remaining, self._policy.rails.drain_deadline_s)
            raise _Ended(S.failed, "system", reason)

    async def _act_with_ladder(self) -> None:
        """Run the action; on a definitive failure, or when the fault recurs after it,
        record the attempt and let the ladder (and the per-node cap) decide the next."""
        assert self._req is not None
        req = self._req
        while True:
            # a cancel or reject that came while the last rung ran, was verified or failed
            # stops here, before the next rung touches anything (I19)
            self._check_cancel_before_act()
            # what the fault left behind, before the action destroys it (bounded; a cancel
            # that came meanwhile stops here), then the evidence re-checked right before
            # the action (docs/design.md §5 rails): a fault that cleared during the capture
            # ends the repair auto_resolved, nothing touched
            await self._capture_evidence(self._action)
            if not self._evidence_ok():
                if not self._acted:
                    await self._rejoin()  # nothing ran: the node goes back as it was
                # once a rung ran, the ending is failed and the node stays cordoned
                # (decision.resolved_ending, in run())
                raise _Ended(
                    S.auto_resolved, "system", "every alert behind the repair cleared before acting"
                )
            action = self._action
            stage = S.migrating if action == Action.migrate else S.repairing
            await self._transition(
                stage, "system", f"{action.value} on {self._machine or req.node}"
            )
            ref = NodeRef(cluster=req.cluster, node=req.node, repair_id=req.repair_id)
            before = await self._read(ACT.node_health, ref, NodeHealth)
            faulty = self._machine
            minput = MachineActionInput(
                cluster=req.cluster,
                node=req.node,
                machine=self._machine or req.node,
                repair_id=req.repair_id,
                gpu=self._alerts[0].gpu if self._alerts else None,
                gpus=reset_targets(self._alerts),
                boot_id_before=before.boot_id,
                boot_time_before=before.boot_time,
            )
            if await self._ensure_lease(action.value):
                self._hold_read_for = -1  # re-acquired: the machine may be held meanwhile
            if self._hold_read_for != len(self._acted):
                # I18, before each rung: held for RMA meanwhile (a person asked, the node
                # rejoined after the last rung, the lease re-acquired), as the repair
                # machine reads it
                await self._check_hold()
            self._hold_read_for = len(self._acted)
            # a cancel or reject that came while the health read or the lease renewal was
            # out stops here: nothing is touched after a person said stop (I19)
            self._check_cancel_before_act()
            self._acted.append(action)
            self._action_started = workflow.now()
            try:
                new_machine = await self._machine_action(action, minput)
            except _NotRun as nr:
                # nothing was touched: not an attempt; the policy picks the fallback
                self._acted.pop()
                await self._note(f"{action.value} cannot run, nothing touched: {nr}")
                await self._decide(action, approver=None, reset_blocked=str(nr))
                await self._upsert()
                consent = consent_decision(
                    self._action, self._alerts, req.requester, self._policy.consent,
                    requested=req.action,
                )
                if not consent.automatic or self._needs_human:
                    await self._drop_approval()  # an approval of the last action does not cover it
                    await self._await_approval(
                        f"{action.value} cannot run; moves to {self._action.value}"
                    )
                else:
                    self._approve_decision(AUTO_APPROVED)
                continue
            except _ActionFailed as af:
                # the machine recorded the attempt when the action touched the machine (I22)
                if not af.touched and af.unsupported:
                    # e.g. no provision image, no spare machine: it cannot run with this
                    # configuration. Nothing was touched, so no attempt counts (I22) and
                    # the ladder has nothing to climb on; a person decides (another action
                    # with approve --action, or reject / cancel), and the ending must not
                    # say it ran
                    self._acted.pop()
                    why = f"{action.value} cannot run, nothing touched: {af}"
                    await self._note(why)
                    await self._drop_approval()  # an approval of this action does not cover another
                    await self._await_approval(f"{why}; a person decides what runs instead")
                    continue
                await self._note(f"{action.value} failed: {af}")
                if action == Action.migrate and af.touched:
                    await self._follow_binding(faulty)
                if not af.touched:
                    self._acted.pop()
                    raise _Ended(S.failed, "system", f"{action.value} could not run and "
                                 f"touched nothing: {af}") from None
                await self._escalate(action, f"{action.value} failed")
                continue
            if action == Action.remove:
                await self._attempt(action, "succeeded")
                ticket = self._last_ticket or "none"
                self._hold = f"machine removed for RMA (ticket {ticket}); it stays out"
                self._done = f"machine {faulty or req.node} removed for RMA"
                await self._revalidate(faulty, "removed for RMA", "hold")
                return
            # I22: an action the activity skipped on its first try (the host had already
            # rebooted by itself) touched nothing and is no attempt
            touched = self._last_touched
            self._unrecorded = (action, faulty) if touched else None
            if not touched:
                await self._note(f"{action.value} not sent: {self._detail}; no attempt "
                                 "recorded")
            if new_machine is not None:
                await self._moved_to(faulty, new_machine)
            acted_at = workflow.now()
            await self._transition(S.joining, "system", "waiting for the node to come back healthy")
            healthy = await self._wait_healthy(action, before, acted_at)
            recurred = self._recurrence(action, acted_at, before)
            # what this check judged: a report attached after it (while the node rejoins
            # and the repair closes) is handed to the node as unjudged (I20)
            self._judged = {a.alert_id for a in self._alerts}
            if recurred is not None:
                # success needs the fault not to come back after the action
                if touched:
                    await self._attempt(action, "failed", machine=faulty)
                else:
                    # skipped (the host had rebooted by itself) and the fault came back:
                    # no attempt is recorded (I22), but the ladder and the node cap of
                    # this repair count the rung, as the repair machine does: a host that
                    # crash-loops would otherwise be given the same skipped action
                    # without end
                    self._attempts.append(self._attempt_record(action, "failed", faulty))
                await self._note(
                    f"fault recurred after {action.value}: {recurred.summary} "
                    f"(alert {recurred.alert_id})"
                )
                await self._escalate(action, f"fault recurred after {action.value}")
                continue
            if not healthy:
                if touched:
                    await self._attempt(action, "failed", machine=faulty)
                self._hold = (
                    f"node not healthy within {self._policy.rails.rejoin_timeout_s:g} s after "
                    f"{action.value}; left cordoned for a human"
                )
                raise _Ended(
                    S.timed_out,
                    "system",
                    f"node not healthy within {self._policy.rails.rejoin_timeout_s:g} s "
                    "after the action; left cordoned for a human",
                )
            self._verified = True
            kept = await self._rejoin()
            if kept is not None:
                # healthy, but someone else's cordon keeps it out of service: the record
                # says so rather than "back in service"
                self._done = f"node healthy; left cordoned: {kept}"
            late = self._cancel or self._reject
            if late is not None:
                # the action ran and the node is back and verified: nothing is left to
                # stop, and the record says so rather than dropping the person's word
                await self._note(
                    f"{'cancel' if self._cancel is not None else 'reject'} by {late.by} "
                    f"came after {action.value} succeeded and the node rejoined; nothing "
                    f"left to stop ({late.reason or 'no reason given'})")
            if touched:
                await self._attempt(action, "succeeded", machine=faulty)
            await self._transition(S.running, "system", self._done)
            return

    async def _capture_evidence(self, action: Action) -> None:
        """What the fault left behind, captured before ``action`` destroys it
        (:mod:`workflows.evidence_step`, ``policy.evidence_capture``): recorded in the
        ledger, noted in the history and status; a failure is a note, never the repair's.
        A cancel that came meanwhile stops the repair before the action (I19)."""
        assert self._req is not None
        req = self._req
        attempt = 1 + self._acted.count(action)
        capture = asyncio.ensure_future(capture_before(
            self._policy.evidence_capture, cluster=req.cluster, node=req.node,
            machine_id=self._machine, repair_id=req.repair_id, action=action,
            attempt=attempt, task_queue=self._bmc_queue))
        # the capture only reads (the node's logs, the BMC's event log) and may run for
        # up to ``evidence_capture.timeout_s`` (an hour at most): a cancel or reject that
        # comes meanwhile abandons it and stops the repair at once (I19)
        try:
            await workflow.wait_condition(
                lambda: capture.done() or self._cancel is not None or self._reject is not None)
        except asyncio.CancelledError:
            capture.cancel()  # the workflow itself was cancelled: the capture goes too
            raise
        if not capture.done():
            capture.cancel()
            with contextlib.suppress(asyncio.CancelledError, ActivityError):
                await capture
            await self._note(f"evidence capture before {action.value} abandoned: the "
                             "repair was stopped")
            self._check_cancel_before_act()
        got = capture.result()
        if got is None:
            return
        cap, unrecorded = got
        line = f"before {action.value} (attempt {attempt}): {cap.summary()}"
        self._captures.append(line)
        await self._note(line)
        if unrecorded is not None:
            await self._note(unrecorded)
        self._check_cancel_before_act()

    async def _escalate(self, action: Action, why: str) -> None:
        """After ``action`` failed or did not hold: ladder (and per-node cap) decide the
        next action; a person approves it where the consent policy or the cap asks."""
        assert self._req is not None
        rule_before = self._rule
        await self._decide(action, approver=None)
        # the recorded rule names each step that changed the decision
        self._rule = f"{self._rule}; after {why} (was: {rule_before})"
        if self._needs_human or self._action == Action.remove:
            await self._drop_approval()  # an approval of the last action does not cover the next
            await self._await_approval(f"{why}; {self._human_reason}")
            return
        # an operator's own request approved the first rung of what they asked for; a
        # later rung (another attempt of it included) goes through the consent policy
        consent = consent_decision(
            self._action, self._alerts, self._req.requester, self._policy.consent,
            requested=Action.none,
        )
        if not consent.automatic:
            # an approval covers one action at one rung: the next attempt, of the same
            # action or another, is asked for again
            await self._drop_approval()
            step = (f"ladder escalates to {self._action.value}" if self._action != action
                    else f"another attempt of {action.value} (next rung)")
            await self._await_approval(f"{why}; {step}")
        else:
            self._approve_decision(AUTO_APPROVED)
            self._rule = f"{consent.rule}; {self._rule}"
            # the ledger row names the rung that runs now and the rule that decided it
            # (``repairs show`` must agree with the Temporal UI's RepairAction)
            await self._upsert()

    def _recurrence(self, action: Action, acted_at: datetime,
                    before: NodeHealth) -> Alert | None:
        """An active alert of the same fault (kind and code of the repair's evidence)
        received by the control plane at or after the action completed (not a late
        report of the boot before it), or after the action started from the boot it
        brought (:func:`decision.recurrence`; I17: ingest's ``received_at`` judges,
        never an agent's clock)."""
        return decision.recurrence(self._alerts, acted_at, before.boot_id,
                                   self._action_started, rebooting=action in REBOOTING)

    async def _machine_action(self, action: Action, minput: MachineActionInput) -> str | None:
        """Run ``action`` on the BMC queue through the pure machine
        (:mod:`workflows.lifecycle.machine_action`): Temporal's outcomes become events,
        ``step`` decides, and its commands are executed here, nothing else. Returns the
        new machine of a migrate.

        A transient failure is retried with back-off for up to
        ``rails.action_retry_max_s``, each try resuming from the phase the last reached
        (I16). Raises :class:`_NotRun` (nothing touched), :class:`_ActionFailed` (the
        attempt failed; recorded by the machine when it touched the machine, I22) or
        :class:`_Ended` ``cancelled`` (a cancel or reject during the action: the machine
        was brought to a safe power state first, I19)."""
        assert self._req is not None
        name = MACHINE_ACTIVITY[action]
        rtype: type[Any] = MigrateResult if action == Action.migrate else ActionResult
        hb = timedelta(seconds=self._policy.rails.heartbeat_timeout_s)
        key = f"{self._req.repair_id}/{action.value}/{len(self._acted)}"
        m = new_machine_action(action, key, self._policy.rails.action_retry_max_s)
        events: list[MachineEvent] = [MaStart()]
        res: Any = None
        unsupported = False
        while events:
            m, cmds = ma_step(m, events.pop(0), workflow.now())
            self.lifecycle_trace.commanded(c for cmd in cmds for c in machine_calls(cmd))
            for cmd in cmds:
                if isinstance(cmd, MaRun):
                    if cmd.purpose == "make_safe":
                        await self._note(f"{action.value} cancelled after {m.phase}: "
                                         "bringing the machine to a safe power state")
                    run_input = minput.model_copy(update={
                        "resume_phase": cmd.resume_phase, "idempotency_key": cmd.key,
                        "make_safe": cmd.purpose == "make_safe", "sent_at": cmd.sent_at})
                    try:
                        res = await self._through_cancel(workflow.start_activity(
                            name,
                            run_input,
                            result_type=rtype,
                            task_queue=self._bmc_queue,
                            start_to_close_timeout=_MACHINE_TIMEOUT,
                            heartbeat_timeout=hb,
                            retry_policy=_MACHINE_ONCE,
                        ))
                        outcome: MachineEvent = _ok_event(action, res)
                    except ActivityError as err:
                        if is_cancelled_exception(err):
                            raise
                        outcome = _failure_event(action, err, m.phase)
                        unsupported = _untouched(err)
                    # a cancel or reject that came while the call was out is decided first
                    events += [*self._stop_event(m), outcome]
                elif isinstance(cmd, MaTimer):
                    # the back-off ends early for a cancel or reject the machine has not
                    # been told of yet (one it knows of waits the back-off out)
                    try:
                        await self._wait(self._untold_stop(m.cancel is not None), cmd.seconds)
                    except asyncio.CancelledError:
                        self._cancelled_from_temporal()
                    stop = self._stop_event(m)
                    if not stop and not m.touched and not m.phase_uncertain:
                        # the retry that follows has touched nothing yet: the lease may
                        # have lapsed meanwhile (a refused renewal) and is never reused;
                        # re-acquired, the hold is read again (I18). Done before the
                        # machine hears the timer, so a stop meanwhile leaves no retry
                        # commanded. A retry after the command was sent finishes under
                        # the lease it started with (ending half-way could leave a host off).
                        # A cancel from Temporal while it waits for the lease is the cancel
                        # signal's: nothing touched, the cleanup uncordons (I22)
                        await self._through_cancel(self._retry_under_lease(action))
                        stop = self._stop_event(m)
                    events += stop or [MaTimerFired()]
                elif isinstance(cmd, MaRecord):
                    await self._attempt(action, cmd.outcome)
                elif isinstance(cmd, MaDetails):
                    self._detail = cmd.text
                    workflow.set_current_details(self._detail)
                elif isinstance(cmd, MaFinish):
                    return await self._machine_finished(action, cmd, res, unsupported)
        raise AssertionError("the machine action ended without finishing")  # pragma: no cover

    async def _retry_under_lease(self, action: Action) -> None:
        """Before a machine action's retry that touched nothing: hold the lease (re-
        acquire it when it lapsed, :meth:`_ensure_lease`) and, re-acquired, read the RMA
        hold again. Raises :class:`_Ended` (held, evidence no longer current, a stop
        while queued); the attempt is then not counted (nothing was touched)."""
        try:
            if await self._ensure_lease(f"retrying {action.value}"):
                await self._check_hold()
            self._check_cancel_before_act()
        except _Ended:
            self._acted.pop()  # nothing touched: no attempt, the cleanup uncordons
            raise

    async def _through_cancel(self, call: Awaitable[T]) -> T:
        """Await a call that must not be abandoned half-way (a machine action's activity,
        a cordon or drain batch) to its end even when the workflow is cancelled from
        Temporal (UI or CLI) meanwhile: that cancel is taken as the cancel signal's
        (:meth:`_cancelled_from_temporal`) and decided once the call returns (a power
        cycle that sent ForceOff sends On; I19; a cordon that lands is lifted by the
        cleanup). ``workflow.wait`` never cancels what it waits for."""
        task = asyncio.ensure_future(call)
        while not task.done():
            try:
                await workflow.wait([task])
            except asyncio.CancelledError:
                self._cancelled_from_temporal()
        return task.result()

    def _cancelled_from_temporal(self) -> None:
        """The workflow was cancelled from Temporal while a call that must not be
        abandoned was out (:meth:`_through_cancel`): a cancel
        by ``temporal`` (unless a person's stop came first), and the workflow closes
        cancelled once the machine is safe and the cleanup ran."""
        self._temporal_cancelled = True
        if self._cancel is None and self._reject is None:
            self._cancel = CancelSignal(
                by="temporal",
                reason=f"workflow cancelled from Temporal (UI or CLI) at {self._stage.value}")

    def _untold_stop(self, told: bool) -> Callable[[], bool]:
        """Condition: a cancel or reject arrived that the machine was not told of yet."""
        return lambda: not told and (self._cancel or self._reject) is not None

    def _stop_event(self, m: MachineActionState) -> list[MachineEvent]:
        """A pending cancel or reject as the machine's ``Cancel`` (once)."""
        stop = self._cancel or self._reject
        if stop is None or m.cancel is not None:
            return []
        return [MaCancel(by=stop.by, reason=stop.reason or "")]

    async def _machine_finished(
        self, action: Action, fin: MaFinish, res: Any, unsupported: bool = False
    ) -> str | None:
        if fin.outcome == "not_run":
            raise _NotRun(fin.detail)
        if fin.outcome == "failed":
            raise _ActionFailed(fin.detail, fin.touched, unsupported)
        if fin.outcome == "cancelled":
            stop = self._cancel or self._reject
            assert stop is not None
            stage = S.cancelled if self._cancel is not None else S.rejected
            if fin.touched:
                self._hold = f"{action.value} was cancelled after it touched the machine " \
                    f"({fin.detail}); left cordoned for a human"
                if action == Action.migrate:
                    await self._follow_binding(self._machine)
            else:
                self._acted.pop()  # nothing touched: the cleanup uncordons
            raise _Ended(stage, stop.by, f"{stop.reason or stage.value}: {fin.detail}")
        self._last_touched = fin.touched
        if isinstance(res, MigrateResult):
            return res.new_machine
        assert isinstance(res, ActionResult)
        self._detail = res.detail or res.skipped_reason
        self._last_ticket = res.ticket_id
        return None

    async def _moved_to(self, faulty: str | None, new_machine: str) -> None:
        """The node now runs on ``new_machine`` (a migrate bound it): the repair follows
        it (search attribute, later rungs, hold reads) and ``faulty``, the machine it
        left for good, goes to re-validation whatever follows (a recurrence, a node that
        does not come back, a failed bring-up)."""
        self._machine = new_machine
        workflow.upsert_search_attributes([SA_MACHINE.value_set(new_machine)])
        if faulty and faulty != new_machine:
            await self._revalidate(faulty, "node migrated off this machine", "spare")

    async def _follow_binding(self, faulty: str | None) -> None:
        """After a migrate that touched the machine but did not finish (it failed or was
        cancelled after binding the spare, e.g. the new machine's bring-up failed): read
        the node's binding again (``load_node_policy``: the ledger's bindings) and, when
        the node was bound to another machine, follow it (:meth:`_moved_to`). An
        unreadable binding is logged and leaves the repair's machine as it was."""
        assert self._req is not None
        req = self._req

        async def read() -> None:
            snap = await self._short(ACT.load_node_policy,
                                     NodeRef(cluster=req.cluster, node=req.node), NodePolicy)
            bound = snap.machines.get(req.node)
            if bound and bound != faulty:
                await self._note(f"migrate bound node {req.node} to {bound} before it "
                                 f"failed; {faulty or 'the old machine'} is left for "
                                 "re-validation")
                await self._moved_to(faulty, bound)

        await self._safely("reading the node's binding after a migrate", read)

    async def _wait_healthy(
        self, action: Action, before: NodeHealth, acted_at: datetime | None = None
    ) -> bool:
        assert self._req is not None
        ref = NodeRef(cluster=self._req.cluster, node=self._req.node, repair_id=self._req.repair_id)
        limit = self._policy.rails.rejoin_timeout_s
        start = workflow.now()
        while True:
            h = await self._read(ACT.node_health, ref, NodeHealth)
            # unknown (no identity before or now) → judged on readiness alone
            rebooted = (action not in REBOOTING
                        or h.rebooted_since(before.boot_id, before.boot_time) is not False)
            if h.ready and rebooted:
                return True
            waited = (workflow.now() - start).total_seconds()
            if waited >= limit:
                return False
            poll = self._policy.rails.rejoin_poll_s

            def recurred_or_stop() -> bool:
                return (
                    self._cancel is not None
                    or self._reject is not None
                    or (acted_at is not None
                        and self._recurrence(action, acted_at, before) is not None)
                )

            if await self._wait(recurred_or_stop, min(poll, max(limit - waited, 1.0))):
                # a person's stop ends the repair here, in the wait (I19): the action ran
                # and the node is not verified, so it stays cordoned (left_cordoned)
                self._check_cancel_before_act()
                return False

    async def _rejoin(self) -> str | None:
        """Lift this repair's cordon; returns why the node stays cordoned (someone
        else's cordon, kept as it is), or None when it is schedulable."""
        assert self._req is not None
        res = await self._act(
            ACT.rejoin_node,
            RejoinInput(
                cluster=self._req.cluster, node=self._req.node, repair_id=self._req.repair_id
            ),
            RejoinResult,
        )
        self._cordoned_by_us = False
        if not res.uncordoned:
            kept = res.kept_reason or "not cordoned by us"
            await self._note(f"node left cordoned: {kept}")
            return kept
        return None

    async def _revalidate(self, machine: str | None, reason: str, return_to: str = "pool") -> None:
        """Start ``ValidationWorkflow`` on the machine the node left (abandoned child).

        ``return_to``: where a machine that passes goes — ``spare`` after a migrate (the
        hot-spare pool), ``hold`` after a remove (it stays out whatever the verdict),
        ``pool`` otherwise."""
        assert self._req is not None
        if not machine:
            return
        try:
            vreq = ValidationRequest(
                cluster=self._req.cluster,
                machine=machine,
                node=self._req.node,
                reason=reason,
                repair_id=self._req.repair_id,
                requested_by="autorepair",
                return_to=return_to,
            )
            await workflow.start_child_workflow(
                VALIDATION_WORKFLOW,
                vreq,
                id=workflow_id_validation(machine, self._req.repair_id),
                task_queue=workflow.info().task_queue,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                static_summary=validation_summary(vreq),
                static_details=validation_details(vreq),
            )
            await self._note(f"re-validation of {machine} started")
        except WorkflowAlreadyStartedError:
            await self._note(f"re-validation of {machine} already running")

    # ---- records -------------------------------------------------------------------
    def _attempt_record(self, action: Action, outcome: str,
                        machine: str | None = None) -> AttemptRecord:
        """The attempt of ``action`` as the ladder and the node cap count it."""
        assert self._req is not None
        first = self._alerts[0] if self._alerts else None
        return AttemptRecord(
            repair_id=self._req.repair_id,
            cluster=self._req.cluster,
            node=self._req.node,
            machine_id=machine or self._machine,
            action=action,
            alert_kind=first.kind if first else "manual",
            code=first.code if first else None,
            outcome=outcome,
            at=workflow.now(),
        )

    async def _attempt(self, action: Action, outcome: str, machine: str | None = None) -> None:
        """Record an executed action for the ladder and the per-node cap, against
        ``machine`` (the machine that had the fault; default the current one)."""
        rec = self._attempt_record(action, outcome, machine).model_copy(
            update={"write_key": self._write_key()})
        self._attempts.append(rec)
        if self._unrecorded is not None and self._unrecorded[0] == action:
            self._unrecorded = None
        await self._short0(ACT.ledger_record_attempt, rec)

    async def _transition(self, stage: S, by: str, reason: str) -> None:
        assert self._req is not None
        now = workflow.now()
        self._stage = stage
        self._history.append(StageTransition(stage=stage, at=now, by=by, reason=reason))
        workflow.upsert_search_attributes(
            [
                SA_STAGE.value_set(stage.value),
                SA_STATE.value_set(repair_state(stage, self._asking)),
                SA_ACTION.value_set(self._action.value),
            ]
        )
        label = f"{stage.value}{self._approved_label()}"
        self._detail = f"{label}: {reason}" if reason else label
        if self._shadow:
            self._detail = f"[shadow] {self._detail}"
        workflow.set_current_details(
            f"{self._detail} (action {self._action.value}, node {self._req.node})"
        )
        await self._short0(
            ACT.ledger_record_transition,
            TransitionRecord(
                repair_id=self._req.repair_id, stage=stage, at=now, by=by, reason=reason,
                write_key=self._write_key(), approval_pending=self._asking,
            ),
        )

    def _write_key(self) -> str:
        """The next attempt or transition write's ``write_key``: ``"<run id>/<n>"``. A
        workflow task that a worker crash cut short after its local activity wrote is run
        again with a later ``workflow.now()``; counted in replay order, its writes get the
        same keys and replace the lost run's rows (``Ledger.record_attempt`` /
        ``record_transition``) instead of adding a second attempt or transition."""
        self._ledger_writes += 1
        return f"{workflow.info().run_id}/{self._ledger_writes}"

    async def _note(self, text: str) -> None:
        """Record a note as a transition to the current stage (visible in the ledger)."""
        await self._transition(self._stage, "system", text)

    async def _upsert(self) -> None:
        assert self._req is not None
        r = self._req
        await self._short0(
            ACT.ledger_upsert_repair,
            RepairRecord(
                repair_id=r.repair_id,
                cluster=r.cluster,
                node=r.node,
                machine_id=self._machine,
                action=self._action,
                stage=self._stage,
                requester=r.requester,
                reason=r.reason,
                approved_by=self._approved_by,
                decided_by_rule=self._rule,
                detector=r.detector,
                request_id=r.request_id,
                alert_ids=[a.alert_id for a in self._alerts],
                workflow_id=workflow.info().workflow_id,
                updated_at=workflow.now(),
                lease_held=self._holding(),
                approval_pending=self._asking,
                mode="shadow" if self._shadow else "enforce",
                node_pool=self._pool,
            ),
        )

    # ---- ending ------------------------------------------------------------------
    async def _finish(self, stage: S, by: str, reason: str) -> None:
        """Clean up whatever way the repair ended (see the module docstring): uncordon
        unless held, terminal ledger row with the cause, lease released, NodeWorkflow
        told, a critical notification for failures and held nodes."""
        assert self._req is not None
        req = self._req
        held: str | None = None
        if self._unrecorded is not None:
            # I22: the action touched the machine; a later step ended the repair first
            ran, on = self._unrecorded
            # verified (healthy, no recurrence): a stop or a failed uncordon after it does
            # not make the action fail
            outcome = "succeeded" if stage == S.succeeded or self._verified else "failed"
            await self._safely("ledger attempt", lambda: self._attempt(ran, outcome, on))
        if self._cordoned_by_us:
            # a verified recovery leaves no fault standing: the cleanup uncordons (and
            # says so when that fails)
            held = decision.left_cordoned(self._hold, [] if self._verified else self._acted,
                                          stage)
            if held is None:
                held = await self._cleanup_uncordon()
            if held is not None:
                reason = f"{reason}; node left cordoned: {held}"
        if not self._history:
            await self._safely("ledger upsert", self._upsert)
            await self._safely(
                "ledger transition",
                lambda: self._transition(S.recommended, req.requester.name, req.reason),
            )
        await self._safely("ledger transition", lambda: self._transition(stage, by, reason))
        await self._safely("ledger upsert", self._upsert)
        await self._release_lease(stage)
        try:
            await workflow.get_external_workflow_handle(
                workflow_id_node(req.cluster, req.node)
            ).signal(
                NODE_SIGNAL_REPAIR_FINISHED,
                RepairFinished(
                    repair_id=req.repair_id,
                    stage=stage,
                    at=workflow.now(),
                    alert_ids=[a.alert_id for a in self._alerts],
                    actions=list(self._acted),
                    machine_held=self._machine_held,
                    unjudged_alert_ids=[] if self._judged is None else [
                        a.alert_id for a in self._alerts
                        if a.active and a.alert_id not in self._judged],
                ),
            )
        except FailureError:
            pass  # repair not driven by a NodeWorkflow (operator / detector request)
        except asyncio.CancelledError:
            pass  # a workflow cancellation interrupts the signal only; the ending goes on
        if stage in (S.failed, S.timed_out) or held is not None:
            subject = f"repair {req.repair_id} {stage.value}"
            if held is not None:
                subject += f": node {req.node} left cordoned"
            severity = "critical"
            if self._shadow:
                # shadow mode touched nothing and never will: said as such, no page
                subject = f"shadow: {subject} (nothing was done: shadow mode)"
                severity = "warning"
            await self._safely(
                "notification",
                lambda: self._act0(
                    ACT.notify,
                    Notification(
                        cluster=req.cluster,
                        node=req.node,
                        repair_id=req.repair_id,
                        subject=subject,
                        body="\n".join([reason, *self._captures]),
                        severity=severity,
                    ),
                ),
            )

    async def _cleanup_uncordon(self) -> str | None:
        """Uncordon the node we cordoned; returns why it stays cordoned, or None."""
        assert self._req is not None
        rin = RejoinInput(
            cluster=self._req.cluster, node=self._req.node, repair_id=self._req.repair_id
        )
        err: BaseException | None = None
        for _ in range(2):  # a workflow cancellation interrupts at most one try
            try:
                res = await workflow.execute_activity(
                    ACT.rejoin_node,
                    rin,
                    result_type=RejoinResult,
                    start_to_close_timeout=_SHORT,
                    schedule_to_close_timeout=_CLEANUP_TOTAL,
                    retry_policy=_RETRY,
                )
            except (ActivityError, asyncio.CancelledError) as e:
                err = e
                if is_cancelled_exception(e):
                    continue
                break
            self._cordoned_by_us = False
            if res.uncordoned:
                return None
            await self._safely("ledger transition", _bind(self._note, res.kept_reason))
            return None
        cause = _cause(err) if err is not None else "cancelled"
        return f"uncordon failed ({cause}); a human must uncordon it"

    async def _safely(self, what: str, step: Callable[[], Awaitable[Any]]) -> None:
        """Run one cleanup step; a failure after its retries is logged and the ending
        goes on (a workflow cancellation arriving meanwhile interrupts one try only)."""
        for _ in range(2):
            try:
                await step()
                return
            except (ActivityError, asyncio.CancelledError) as err:
                if is_cancelled_exception(err):
                    continue
                workflow.logger.warning("cleanup step %s failed: %s", what, _cause(err))
                return

    async def _hand_back(self, stage: S) -> None:
        """Hand the lease back mid-repair (a person decides, a maintenance window) and
        record in the ledger that this repair holds none, so a guard rebuilt meanwhile
        does not count it (:attr:`RepairRecord.lease_held`)."""
        await self._release_lease(stage)
        self._lease, self._lease_requested = None, False
        await self._upsert()

    async def _release_lease(self, stage: S) -> None:
        """Hand the lease back to the cluster guard (if one was requested)."""
        assert self._req is not None
        req = self._req
        if self._lease_requested:
            try:
                await workflow.get_external_workflow_handle(workflow_id_guard(req.cluster)).signal(
                    GUARD_SIGNAL_RELEASE, LeaseRelease(repair_id=req.repair_id, outcome=stage.value)
                )
            except FailureError:
                pass
            except asyncio.CancelledError:
                pass  # a workflow cancellation interrupts the signal only

    async def _act(
        self,
        name: str,
        arg: object,
        result_type: type[T],
        limit: timedelta = _SHORT,
        heartbeat: timedelta | None = None,
    ) -> T:
        """Run activity ``name`` on the main task queue and return its typed result."""
        result: T = await workflow.execute_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=limit,
            heartbeat_timeout=heartbeat,
            retry_policy=_RETRY,
        )
        return result

    async def _act_stoppable(
        self,
        name: str,
        arg: object,
        result_type: type[T],
        limit: timedelta = _SHORT,
        heartbeat: timedelta | None = None,
    ) -> T:
        """A scheduler call that changes the node (cordon, drain) as :meth:`_act`, whose
        retries a person's cancel or reject ends (I19: a stop is never held up for as
        long as the scheduler is down). The server retries it in batches of
        :data:`_BATCH_RETRY` tries; between batches the workflow waits
        :data:`_BATCH_PAUSE_S` (doubling to :data:`_BATCH_PAUSE_MAX_S`), and a stop
        that came meanwhile ends the repair (:class:`_Ended`) before the next batch.
        A try in flight is never abandoned (its change could land after the cleanup):
        a stop waits for the batch out, at most ``_BATCH_RETRY.maximum_attempts`` tries;
        a cancel from the Temporal UI or CLI too (:meth:`_through_cancel`: taken as the
        cancel signal's, decided once the batch returns), so the cleanup's uncordon never
        runs before a cordon still on its way."""
        pause = _BATCH_PAUSE_S
        while True:
            self._check_cancel_before_act()
            try:
                result: T = await self._through_cancel(workflow.execute_activity(
                    name, arg, result_type=result_type, start_to_close_timeout=limit,
                    heartbeat_timeout=heartbeat, retry_policy=_BATCH_RETRY))
                return result
            except ActivityError as err:
                if is_cancelled_exception(err) or not _transient(err):
                    raise
                workflow.logger.warning("%s: %s; trying again in %g s", name, _cause(err),
                                        pause)
            await self._wait(lambda: self._cancel is not None or self._reject is not None,
                             pause)
            pause = min(pause * 2, _BATCH_PAUSE_MAX_S)

    async def _read(self, name: str, arg: object, result_type: type[T]) -> T:
        """A read-only scheduler call (idle check, node health) as :meth:`_act`, which a
        person's cancel or reject interrupts (I19: a stop is never held up by a call
        that retries for as long as the scheduler is down): the call is abandoned and
        :class:`_Ended` raised. A stop that came before the call stops it unasked."""
        self._check_cancel_before_act()
        # abandoned, not cancelled on the server: the read decides nothing once a stop
        # came, and a cancel request racing the read's completion is what the
        # time-skipping test server wedges on (as with timers, sdk-java#3088)
        handle = workflow.start_activity(
            name, arg, result_type=result_type, start_to_close_timeout=_SHORT,
            retry_policy=_RETRY, cancellation_type=workflow.ActivityCancellationType.ABANDON)
        await workflow.wait_condition(
            lambda: handle.done() or self._cancel is not None or self._reject is not None)
        if not handle.done():
            handle.cancel()
            try:
                await handle
            except (ActivityError, asyncio.CancelledError):
                pass  # the read was cancelled (or answered as it was): it decides nothing
            self._check_cancel_before_act()
        result: T = await handle
        return result

    async def _act0(self, name: str, arg: object) -> None:
        """Run an activity whose result is ignored (notifications)."""
        await workflow.execute_activity(
            name, arg, start_to_close_timeout=_SHORT, retry_policy=_RETRY
        )

    async def _short(self, name: str, arg: object, result_type: type[T]) -> T:
        """Run a short idempotent ledger or policy call as a local activity, with the
        retry policy of :meth:`_act` (retried without end: past the local bound it goes
        on as the regular activity, :func:`workflows.local.execute_short`); returns its
        typed result."""
        result: T = await execute_short(name, arg, result_type=result_type,
                                        retry_policy=_RETRY, attempt_timeout=_SHORT)
        return result

    async def _short0(self, name: str, arg: object) -> None:
        """:meth:`_short` for a ledger write whose result is ignored."""
        await execute_short(name, arg, retry_policy=_RETRY, attempt_timeout=_SHORT)


def machine_calls(cmd: object) -> tuple[Call, ...]:
    """The outbound calls :meth:`RepairWorkflow._machine_action` makes for a machine
    action command (the fidelity check's expectation, :mod:`workflows.lifecycle.trace`):
    a run is the action's activity with the command's resume phase, idempotency key and
    ``sent_at`` (when the attempt's restart request went out, UTC, or ``None``: every
    action's input is a :class:`MachineActionInput`, which carries it, so a shell that
    dropped or moved it would fail the check); the attempt record, timers and details are
    not governed yet: ``()``."""
    if isinstance(cmd, MaRun):
        return (Call("activity", MACHINE_ACTIVITY[cmd.action], (
            ("resume_phase", cmd.resume_phase), ("idempotency_key", cmd.key),
            ("sent_at", cmd.sent_at))),)
    return ()


def _bind(note: Callable[[str], Awaitable[None]], kept: str) -> Callable[[], Awaitable[None]]:
    """A cleanup step noting that the node stays cordoned (someone else's cordon)."""
    return lambda: note(f"node left cordoned: {kept or 'not cordoned by us'}")


def _transient(err: ActivityError) -> bool:
    """A failure a retry may fix: a timeout, or a retryable (non-permanent) error."""
    cause = err.cause
    if isinstance(cause, TemporalTimeoutError):
        return True
    if isinstance(cause, ApplicationError):
        return not cause.non_retryable and cause.type not in _PERMANENT
    return False


def _untouched(err: ActivityError) -> bool:
    """A permanent failure raised before the action touched anything: the action cannot
    be done with this configuration (``ERR_UNSUPPORTED``: no provision image, no spare
    machine, no BMC)."""
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type == ERR_UNSUPPORTED


def _drain_deadline_passed(err: ActivityError) -> list[str] | None:
    """What still runs when the drain failed with ``ERR_DRAIN_DEADLINE`` (the scheduler's
    ``DrainResult`` in the failure's details; empty when it listed none); None for any
    other failure."""
    cause = err.cause
    if not isinstance(cause, ApplicationError) or cause.type != ERR_DRAIN_DEADLINE:
        return None
    for d in reversed(list(cause.details)):
        if isinstance(d, dict) and isinstance(d.get("remaining"), list):
            return [str(r) for r in d["remaining"]]
    return []


def _cause(err: BaseException) -> str:
    cause = err.__cause__
    return str(cause) if cause is not None else str(err)


#: Machine activities that report the phase they reached (activities/power.py); the
#: others report none, and a permanent failure of theirs is taken to have touched the
#: machine (the safe side for the ladder), a transient one to have reached nothing new.
PHASED_ACTIVITIES = frozenset({Action.power_cycle, Action.reboot})


def _ok_event(action: Action, res: Any) -> MachineEvent:
    final = MA_PHASES[action][-1]
    if isinstance(res, ActionResult):
        if res.not_run:
            return MaOk(phase=MA_PHASES[action][0], not_run=res.not_run, detail=res.detail)
        return MaOk(phase=final, detail=res.detail or res.skipped_reason,
                    skipped=bool(res.skipped_reason), nothing_landed=res.nothing_landed)
    return MaOk(phase=final)


def _reported_details(err: ActivityError) -> Sequence[Any]:
    """The failure's details, else the last heartbeat's (a timeout)."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        return cause.details
    if isinstance(cause, TemporalTimeoutError):
        return cause.last_heartbeat_details
    return ()


def _reported_phase(action: Action, err: ActivityError) -> str | None:
    """The phase in the failure's details, else in the last heartbeat (a timeout)."""
    details = _reported_details(err)
    for d in reversed(list(details)):
        if isinstance(d, dict) and d.get(PHASE_DETAIL) in MA_PHASES[action]:
            return str(d[PHASE_DETAIL])
    return None


def _failure_event(action: Action, err: ActivityError, current: str) -> MachineEvent:
    """An activity failure as the machine's event, with the phase it reached and when
    the attempt's restart request went out (``sent_at``, when reported)."""
    phase = _reported_phase(action, err)
    sent_at = detail_time(_reported_details(err))
    cause = err.cause
    if isinstance(cause, TemporalTimeoutError):
        if phase is None and action not in PHASED_ACTIVITIES:
            # an activity that reports no phase cannot say how far it got before it timed
            # out or its worker died: count it as touched and never send it again (I16,
            # I22), rather than retry it and, once the bound is spent, uncordon a node
            # that may be half reprovisioned
            return MaFailed(outcome="permanent", phase=MA_DISRUPTIVE[action],
                            message=f"{_cause(err)} (no phase reported: counted as touched)")
        p = phase or current
        if cause.type == TimeoutType.HEARTBEAT:
            # the worker running it died (or hung)
            return MaWorkerRestart(phase=p, sent_at=sent_at)
        return MaFailed(outcome="timed_out", phase=p, message=_cause(err), sent_at=sent_at)
    if not _transient(err):
        if phase is None and _untouched(err):
            phase = current  # ERR_UNSUPPORTED is raised before anything is touched
        elif phase is None:
            phase = current if action in PHASED_ACTIVITIES else MA_DISRUPTIVE[action]
        return MaFailed(outcome="permanent", phase=phase, message=_cause(err),
                        sent_at=sent_at)
    if isinstance(cause, ApplicationError) and cause.type == "BmcUnavailable":
        return MaBmcReadFailed(phase=phase or current, message=_cause(err), sent_at=sent_at)
    return MaFailed(outcome="transient", phase=phase or current, message=_cause(err),
                    sent_at=sent_at)
