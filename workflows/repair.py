"""``RepairWorkflow`` (id ``repair/{cluster}/{node}/{repair_id}``): one repair of one node.

Stages (DESIGN §4.4): ``recommended → awaiting_approval → cordoning → waiting_for_idle →
draining → repairing | migrating → joining → running`` and terminal ``succeeded``,
``failed``, ``rejected``, ``cancelled``, ``auto_resolved``, ``timed_out``. Every transition
is recorded in the ledger (``ledger_record_transition``), in the ``RepairStage`` /
``RepairState`` search attributes and in ``workflow.set_current_details``.

``RepairState`` is the terminal stage name once ended, ``awaiting_approval`` while waiting
for a person, and ``in_progress`` otherwise.

Signals (JSON a person can type in the Temporal UI): ``approve`` ``{"by": "alice",
"action": "reprovision"}`` (action optional; ladder and migrate gate still apply),
``reject`` ``{"by", "reason"}``, ``cancel`` ``{"by", "reason"}``; internal signals
``attach_alert`` (:class:`Alert`, from the NodeWorkflow) and ``lease``
(:class:`LeaseReply`, from the guard). Query ``status`` → :class:`RepairStatus`.
Returns the final :class:`RepairStatus`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from workflows.activity_api import (
        ACT,
        ERR_ACTION_FAILED,
        ERR_AUTH,
        ERR_DRAIN_DEADLINE,
        ERR_UNKNOWN_NODE,
        ERR_UNSUPPORTED,
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
        MigrateResult,
        NodeHealth,
        NodeRef,
        Notification,
        PolicySnapshot,
        RejoinInput,
        RejoinResult,
        RepairRecord,
        TransitionRecord,
    )
    from workflows.config import PolicyConfig
    from workflows.models import (
        AUTO_APPROVED,
        Action,
        Alert,
        ApproveSignal,
        CancelSignal,
        RejectSignal,
        RepairRequest,
        RepairStatus,
        StageTransition,
        ValidationRequest,
    )
    from workflows.models import Stage as S
    from workflows.policy import (
        choose_action,
        consent_decision,
        evidence_current,
        reset_targets,
    )
    from workflows.protocol import (
        BMC_TASK_QUEUE,
        GUARD_SIGNAL_ACQUIRE,
        GUARD_SIGNAL_RELEASE,
        GUARD_WORKFLOW,
        NODE_SIGNAL_REPAIR_FINISHED,
        REPAIR_QUERY_STATUS,
        REPAIR_SIGNAL_APPROVE,
        REPAIR_SIGNAL_ATTACH_ALERT,
        REPAIR_SIGNAL_CANCEL,
        REPAIR_SIGNAL_LEASE,
        REPAIR_SIGNAL_REJECT,
        REPAIR_WORKFLOW,
        SA_ACTION,
        SA_ALERT_KIND,
        SA_CLUSTER,
        SA_MACHINE,
        SA_NODE,
        SA_REQUESTER,
        SA_STAGE,
        SA_STATE,
        VALIDATION_WORKFLOW,
        GuardInput,
        LeaseRelease,
        LeaseReply,
        LeaseRequest,
        RepairFinished,
        fault_key,
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
REBOOTING: frozenset[Action] = frozenset(
    {Action.reboot, Action.power_cycle, Action.reprovision, Action.migrate}
)
#: ``workflow.patched`` id of the approval deadline (added after the first release).
PATCH_APPROVAL_DEADLINE = "approval-deadline"
_PERMANENT = [ERR_AUTH, ERR_UNKNOWN_NODE, ERR_UNSUPPORTED, ERR_ACTION_FAILED, ERR_DRAIN_DEADLINE]
_SHORT = timedelta(seconds=60)
_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30), non_retryable_error_types=_PERMANENT)
#: Machine actions: 3 tries, then the failure is an attempt for the ladder.
_MACHINE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=10),
    maximum_interval=timedelta(minutes=2),
    maximum_attempts=3,
    non_retryable_error_types=_PERMANENT,
)
_MACHINE_TIMEOUT = timedelta(minutes=30)
T = TypeVar("T")


class _NotRun(Exception):
    """Internal: the machine action could not run and touched nothing (``not_run``)."""


class _Ended(Exception):
    """Internal: the repair reached a terminal stage (raised to unwind the lifecycle)."""

    def __init__(self, stage: S, by: str, reason: str) -> None:
        super().__init__(reason)
        self.stage, self.by, self.reason = stage, by, reason


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
        self._rule: str | None = None
        self._detail = ""
        self._approve: ApproveSignal | None = None
        self._reject: RejectSignal | None = None
        self._cancel: CancelSignal | None = None
        self._lease: LeaseReply | None = None
        self._lease_requested = False
        self._cordoned_by_us = False
        self._policy = PolicyConfig()
        self._bmc_queue = BMC_TASK_QUEUE
        self._attempts: list[AttemptRecord] = []
        self._critical: list[Alert] = []
        self._needs_human = False

    # ---- signals / query -----------------------------------------------------
    @workflow.signal(name=REPAIR_SIGNAL_APPROVE)
    def approve(self, sig: ApproveSignal) -> None:
        """``{"by": USER, "action": optional override}``."""
        self._approve = sig

    @workflow.signal(name=REPAIR_SIGNAL_REJECT)
    def reject(self, sig: RejectSignal) -> None:
        """``{"by": USER, "reason": TEXT}``: end as ``rejected`` (only before acting)."""
        self._reject = sig

    @workflow.signal(name=REPAIR_SIGNAL_CANCEL)
    def cancel(self, sig: CancelSignal) -> None:
        """``{"by": USER, "reason": TEXT}``: end as ``cancelled`` at the next safe point."""
        self._cancel = sig

    @workflow.signal(name=REPAIR_SIGNAL_ATTACH_ALERT)
    def attach_alert(self, alert: Alert) -> None:
        """An alert (or a clear) on this node during the repair: it joins this repair's evidence
        (DESIGN §5 rails: one target per repair, no second repair on the node)."""
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
        """The guard's answer to our ``acquire``."""
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
        )

    # ---- run -------------------------------------------------------------------
    @workflow.run
    async def run(self, req: RepairRequest) -> RepairStatus:
        """Run the repair to a terminal stage and return its final status."""
        if req.detector and req.request_id:
            claim = await self._act(
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
                # the same detector request already owns a repair (DESIGN §5 idempotency)
                self._stage = S.cancelled
                self._detail = (
                    f"duplicate of repair {claim.repair_id} "
                    f"(detector {req.detector}, request {req.request_id})"
                )
                workflow.set_current_details(self._detail)
                return self.status()
        try:
            await self._lifecycle(req)
            stage, by, reason = S.succeeded, "system", "node back in service"
        except _Ended as end:
            stage, by, reason = end.stage, end.by, end.reason
        await self._finish(stage, by, reason)
        return self.status()

    async def _lifecycle(self, req: RepairRequest) -> None:
        snap = await self._act(ACT.load_policy, req.cluster, PolicySnapshot)
        self._policy = snap.policy
        self._bmc_queue = snap.bmc_task_queue
        self._machine = self._machine or snap.machines.get(req.node)
        self._pool = self._pool or snap.pools.get(req.node)
        first = self._alerts[0] if self._alerts else None
        workflow.upsert_search_attributes(
            [
                SA_NODE.value_set(req.node),
                SA_CLUSTER.value_set(req.cluster),
                SA_REQUESTER.value_set(f"{req.requester.kind.value}:{req.requester.name}"),
                SA_ALERT_KIND.value_set(first.kind if first else "manual"),
            ]
            + ([SA_MACHINE.value_set(self._machine)] if self._machine else [])
        )
        await self._upsert()
        await self._transition(S.recommended, req.requester.name, req.reason or "repair requested")
        await self._decide(req.action, approver=None)
        consent = consent_decision(self._action, self._alerts, req.requester, self._policy.consent)
        if req.auto_approved_rule and self._action != Action.remove:
            consent = type(consent)(True, req.auto_approved_rule)
        needs_human = self._needs_human
        if consent.automatic and not needs_human:
            self._approved_by = (
                req.requester.name if consent.rule == "requested_by_user" else AUTO_APPROVED
            )
            self._rule = f"{consent.rule}; {self._rule}"
            await self._upsert()
        else:
            why = "ladder exhausted: a human must decide" if needs_human else consent.rule
            await self._await_approval(why)
        self._check_ended()
        await self._acquire_lease()
        await self._cordon()
        await self._wait_for_idle()
        await self._drain()
        if not evidence_current(self._alerts):
            await self._rejoin()
            raise _Ended(
                S.auto_resolved, "system", "every alert behind the repair cleared before acting"
            )
        await self._act_with_ladder()

    # ---- decisions -----------------------------------------------------------------
    async def _decide(
        self, requested: Action, approver: str | None, reset_blocked: str | None = None
    ) -> None:
        """Reset preconditions + ladder + migrate gate on ``requested`` (recorded as the
        deciding rule); ``reset_blocked``: why the node said a reset cannot run."""
        assert self._req is not None
        now = workflow.now()
        if not self._attempts and not self._critical:
            days = max(self._policy.ladder.window_s, self._policy.migrate_gate.window_s)
            hist = await self._act(
                ACT.ledger_attempt_history,
                AttemptQuery(
                    cluster=self._req.cluster,
                    node=self._req.node,
                    machine_id=self._machine,
                    since=now - timedelta(seconds=days),
                ),
                AttemptHistory,
            )
            self._attempts = list(hist.attempts)
            self._critical = list(hist.critical_alerts)
        dec = choose_action(
            requested,
            self._alerts,
            self._attempts,
            self._critical,
            self._machine,
            now,
            self._policy.ladder,
            self._policy.migrate_gate,
            reset=self._policy.reset_gpu,
            pool=self._pool,
            reset_blocked=reset_blocked,
        )
        action = dec.action
        rule = dec.rule
        if approver is not None and dec.needs_human:
            rule = f"{rule}; approved by {approver} beyond the ladder"
        self._set_action(action)
        self._rule = rule
        self._needs_human = dec.needs_human and approver is None

    def _set_action(self, action: Action) -> None:
        self._action = action
        workflow.upsert_search_attributes([SA_ACTION.value_set(action.value)])

    async def _await_approval(self, why: str) -> None:
        """Wait for approve / reject / cancel (or the evidence clearing)."""
        self._approve = None
        await self._transition(S.awaiting_approval, "system", f"approval needed: {why}")
        await self._upsert()
        auto_resolvable = any(a.level for a in self._alerts)

        def decided() -> bool:
            return (
                self._approve is not None
                or self._reject is not None
                or self._cancel is not None
                or (auto_resolvable and not evidence_current(self._alerts))
            )

        deadline = self._policy.consent.approval_timeout_s
        # Histories recorded before the approval deadline existed replay without it.
        if deadline is not None and workflow.patched(PATCH_APPROVAL_DEADLINE):
            try:
                await workflow.wait_condition(decided, timeout=timedelta(seconds=deadline))
            except TimeoutError:
                raise _Ended(
                    S.timed_out, "system", f"no approval within {deadline:g} s; evidence is stale"
                ) from None
        else:
            await workflow.wait_condition(decided)
        self._check_ended()
        if self._approve is None:
            raise _Ended(S.auto_resolved, "system", "alert cleared before approval")
        sig = self._approve
        self._approved_by = sig.by
        await self._decide(sig.action or self._action, approver=sig.by)
        self._rule = f"approved by {sig.by}; {self._rule}"
        await self._upsert()

    def _check_ended(self) -> None:
        if self._reject is not None:
            raise _Ended(S.rejected, self._reject.by, self._reject.reason or "rejected")
        if self._cancel is not None:
            raise _Ended(S.cancelled, self._cancel.by, self._cancel.reason or "cancelled")

    # ---- lease -------------------------------------------------------------------
    async def _acquire_lease(self) -> None:
        assert self._req is not None
        req = self._req
        auto = self._approved_by == AUTO_APPROVED
        lreq = LeaseRequest(
            repair_id=req.repair_id,
            workflow_id=workflow.info().workflow_id,
            cluster=req.cluster,
            node=req.node,
            node_pool=self._pool,
            automatic=auto,
            requester_kind=req.requester.kind,
        )
        self._detail = "waiting for a lease from the cluster guard"
        workflow.set_current_details(self._detail)
        gid = workflow_id_guard(req.cluster)
        try:
            await workflow.get_external_workflow_handle(gid).signal(GUARD_SIGNAL_ACQUIRE, lreq)
        except FailureError:
            try:
                await workflow.start_child_workflow(
                    GUARD_WORKFLOW,
                    GuardInput(cluster=req.cluster),
                    id=gid,
                    task_queue=workflow.info().task_queue,
                    parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                )
            except WorkflowAlreadyStartedError:
                pass
            await workflow.get_external_workflow_handle(gid).signal(GUARD_SIGNAL_ACQUIRE, lreq)
        self._lease_requested = True
        auto_resolvable = any(a.level for a in self._alerts)
        while True:
            await workflow.wait_condition(
                lambda: (
                    self._lease is not None
                    or self._reject is not None
                    or self._cancel is not None
                    or (auto_resolvable and not evidence_current(self._alerts))
                )
            )
            self._check_ended()
            if self._lease is None:
                raise _Ended(S.auto_resolved, "system", "alert cleared while waiting for lease")
            reply = self._lease
            if reply.granted:
                break
            self._detail = f"lease queued: {reply.reason}"
            workflow.set_current_details(self._detail)
            self._lease = None
        if reply.reset_at is not None and not evidence_current(self._alerts, reply.reset_at):
            raise _Ended(
                S.auto_resolved,
                "system",
                "evidence predates the circuit breaker reset and is no longer current",
            )

    # ---- stages ------------------------------------------------------------------
    async def _cordon(self) -> None:
        assert self._req is not None
        await self._transition(S.cordoning, "system", f"cordon for {self._action.value}")
        res = await self._act(
            ACT.cordon_node,
            CordonInput(
                cluster=self._req.cluster,
                node=self._req.node,
                repair_id=self._req.repair_id,
                reason=f"autorepair {self._req.repair_id}: {self._action.value}",
            ),
            CordonResult,
        )
        self._cordoned_by_us = res.cordoned_by_us
        if res.by_other:
            self._detail = f"node already cordoned by someone else: {res.detail}"

    async def _wait_for_idle(self) -> None:
        assert self._req is not None
        wfi = self._policy.wait_for_idle
        bound = "do not interrupt" if wfi.do_not_interrupt else f"max {wfi.max_wait_s:g} s"
        await self._transition(S.waiting_for_idle, "system", bound)
        start = workflow.now()
        ref = NodeRef(cluster=self._req.cluster, node=self._req.node, repair_id=self._req.repair_id)
        while True:
            self._check_cancel_before_act()
            idle = await self._act(ACT.check_idle, ref, IdleStatus)
            if idle.idle:
                return
            waited = (workflow.now() - start).total_seconds()
            if not wfi.do_not_interrupt and waited >= wfi.max_wait_s:
                await self._note(
                    f"wait-for-idle expired after {waited:g} s (max {wfi.max_wait_s:g} s) with "
                    f"{', '.join(idle.running) or 'work'} still running; proceeding"
                )
                return
            self._detail = f"waiting for idle ({bound}): running {', '.join(idle.running)}"
            workflow.set_current_details(self._detail)
            timeout = wfi.poll_s
            if not wfi.do_not_interrupt:
                timeout = min(timeout, max(wfi.max_wait_s - waited, 1.0))
            try:
                await workflow.wait_condition(
                    lambda: self._cancel is not None or self._reject is not None,
                    timeout=timedelta(seconds=timeout),
                )
            except TimeoutError:
                pass

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
        deadline = self._policy.rails.drain_deadline_s
        try:
            res = await self._act(
                ACT.drain_node,
                DrainInput(
                    cluster=self._req.cluster,
                    node=self._req.node,
                    repair_id=self._req.repair_id,
                    deadline_s=deadline,
                ),
                DrainResult,
                limit=timedelta(seconds=deadline + 300),
                heartbeat=timedelta(seconds=self._policy.rails.heartbeat_timeout_s),
            )
        except ActivityError as err:
            raise _Ended(S.failed, "system", f"drain failed: {_cause(err)}") from err
        if not res.drained:
            raise _Ended(
                S.failed, "system", f"drain incomplete, still running: {', '.join(res.remaining)}"
            )
        # cancel is still honoured after draining: nothing irreversible happened yet
        if self._cancel is not None or self._reject is not None:
            await self._rejoin()
            self._check_cancel_before_act()

    async def _act_with_ladder(self) -> None:
        """Run the action; on failure record the attempt and let the ladder decide."""
        assert self._req is not None
        req = self._req
        while True:
            action = self._action
            stage = S.migrating if action == Action.migrate else S.repairing
            await self._transition(
                stage, "system", f"{action.value} on {self._machine or req.node}"
            )
            ref = NodeRef(cluster=req.cluster, node=req.node, repair_id=req.repair_id)
            before = await self._act(ACT.node_health, ref, NodeHealth)
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
            try:
                new_machine = await self._machine_action(action, minput)
            except _NotRun as nr:
                # nothing was touched: not an attempt; the policy picks the fallback
                await self._note(f"{action.value} cannot run, nothing touched: {nr}")
                await self._decide(action, approver=None, reset_blocked=str(nr))
                await self._upsert()
                consent = consent_decision(
                    self._action, self._alerts, req.requester, self._policy.consent
                )
                if not consent.automatic:
                    await self._await_approval(
                        f"{action.value} cannot run; moves to {self._action.value}"
                    )
                continue
            except ActivityError as err:
                await self._attempt(action, "failed")
                await self._note(f"{action.value} failed: {_cause(err)}")
                await self._decide(action, approver=None)
                if self._needs_human or self._action == Action.remove:
                    await self._await_approval(
                        f"{action.value} failed; ladder exhausted, a human must decide"
                    )
                elif self._action != action:
                    consent = consent_decision(
                        self._action, self._alerts, req.requester, self._policy.consent
                    )
                    if not consent.automatic:
                        await self._await_approval(
                            f"{action.value} failed; ladder escalates to {self._action.value}"
                        )
                continue
            break
        old_machine = self._machine
        if action == Action.remove:
            await self._attempt(action, "succeeded")
            await self._revalidate(old_machine, "removed for RMA")
            return
        if new_machine is not None:
            self._machine = new_machine
            workflow.upsert_search_attributes([SA_MACHINE.value_set(new_machine)])
        await self._transition(S.joining, "system", "waiting for the node to come back healthy")
        if not await self._wait_healthy(action, before):
            await self._attempt(action, "failed")
            raise _Ended(
                S.timed_out,
                "system",
                f"node not healthy within {self._policy.rails.rejoin_timeout_s:g} s "
                "after the action; left cordoned for a human",
            )
        await self._rejoin()
        await self._attempt(action, "succeeded")
        if action == Action.migrate and old_machine:
            await self._revalidate(old_machine, "node migrated off this machine", "spare")
        await self._transition(S.running, "system", "node back in service")

    async def _machine_action(self, action: Action, minput: MachineActionInput) -> str | None:
        name = MACHINE_ACTIVITY[action]
        if action == Action.migrate:
            res = await workflow.execute_activity(
                name,
                minput,
                result_type=MigrateResult,
                task_queue=self._bmc_queue,
                start_to_close_timeout=_MACHINE_TIMEOUT,
                heartbeat_timeout=timedelta(seconds=self._policy.rails.heartbeat_timeout_s),
                retry_policy=_MACHINE_RETRY,
            )
            return res.new_machine
        done = await workflow.execute_activity(
            name,
            minput,
            result_type=ActionResult,
            task_queue=self._bmc_queue,
            start_to_close_timeout=_MACHINE_TIMEOUT,
            heartbeat_timeout=timedelta(seconds=self._policy.rails.heartbeat_timeout_s),
            retry_policy=_MACHINE_RETRY,
        )
        if done.not_run:
            raise _NotRun(done.not_run)
        self._detail = done.detail or done.skipped_reason
        return None

    async def _wait_healthy(self, action: Action, before: NodeHealth) -> bool:
        assert self._req is not None
        ref = NodeRef(cluster=self._req.cluster, node=self._req.node, repair_id=self._req.repair_id)
        limit = self._policy.rails.rejoin_timeout_s
        start = workflow.now()
        while True:
            h = await self._act(ACT.node_health, ref, NodeHealth)
            rebooted = (
                action not in REBOOTING or before.boot_id is None or h.boot_id != before.boot_id
            )
            if h.ready and rebooted:
                return True
            waited = (workflow.now() - start).total_seconds()
            if waited >= limit:
                return False
            poll = self._policy.rails.rejoin_poll_s
            await workflow.sleep(min(poll, max(limit - waited, 1.0)))

    async def _rejoin(self) -> None:
        assert self._req is not None
        res = await self._act(
            ACT.rejoin_node,
            RejoinInput(
                cluster=self._req.cluster, node=self._req.node, repair_id=self._req.repair_id
            ),
            RejoinResult,
        )
        if not res.uncordoned:
            await self._note(f"node left cordoned: {res.kept_reason or 'not cordoned by us'}")

    async def _revalidate(self, machine: str | None, reason: str, return_to: str = "pool") -> None:
        """Start ``ValidationWorkflow`` on the machine the node left (abandoned child).

        ``return_to``: where a machine that passes goes — ``spare`` after a migrate (the
        hot-spare pool), ``pool`` otherwise."""
        assert self._req is not None
        if not machine:
            return
        try:
            await workflow.start_child_workflow(
                VALIDATION_WORKFLOW,
                ValidationRequest(
                    cluster=self._req.cluster,
                    machine=machine,
                    node=self._req.node,
                    reason=reason,
                    repair_id=self._req.repair_id,
                    requested_by="autorepair",
                    return_to=return_to,
                ),
                id=workflow_id_validation(machine, self._req.repair_id),
                task_queue=workflow.info().task_queue,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            )
            await self._note(f"re-validation of {machine} started")
        except WorkflowAlreadyStartedError:
            await self._note(f"re-validation of {machine} already running")

    # ---- records -------------------------------------------------------------------
    async def _attempt(self, action: Action, outcome: str) -> None:
        assert self._req is not None
        first = self._alerts[0] if self._alerts else None
        rec = AttemptRecord(
            repair_id=self._req.repair_id,
            cluster=self._req.cluster,
            node=self._req.node,
            machine_id=self._machine,
            action=action,
            alert_kind=first.kind if first else "manual",
            code=first.code if first else None,
            outcome=outcome,
            at=workflow.now(),
        )
        self._attempts.append(rec)
        await self._act0(ACT.ledger_record_attempt, rec)

    async def _transition(self, stage: S, by: str, reason: str) -> None:
        assert self._req is not None
        now = workflow.now()
        self._stage = stage
        self._history.append(StageTransition(stage=stage, at=now, by=by, reason=reason))
        workflow.upsert_search_attributes(
            [
                SA_STAGE.value_set(stage.value),
                SA_STATE.value_set(repair_state(stage)),
                SA_ACTION.value_set(self._action.value),
            ]
        )
        self._detail = f"{stage.value}: {reason}" if reason else stage.value
        workflow.set_current_details(
            f"{self._detail} (action {self._action.value}, node {self._req.node})"
        )
        await self._act0(
            ACT.ledger_record_transition,
            TransitionRecord(
                repair_id=self._req.repair_id, stage=stage, at=now, by=by, reason=reason
            ),
        )

    async def _note(self, text: str) -> None:
        """Record a note as a transition to the current stage (visible in the ledger)."""
        await self._transition(self._stage, "system", text)

    async def _upsert(self) -> None:
        assert self._req is not None
        r = self._req
        await self._act0(
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
            ),
        )

    async def _finish(self, stage: S, by: str, reason: str) -> None:
        assert self._req is not None
        req = self._req
        if not self._history:
            await self._upsert()
            await self._transition(S.recommended, req.requester.name, req.reason)
        await self._transition(stage, by, reason)
        await self._upsert()
        if self._lease_requested:
            try:
                await workflow.get_external_workflow_handle(workflow_id_guard(req.cluster)).signal(
                    GUARD_SIGNAL_RELEASE, LeaseRelease(repair_id=req.repair_id, outcome=stage.value)
                )
            except FailureError:
                pass
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
                ),
            )
        except FailureError:
            pass  # repair not driven by a NodeWorkflow (operator / detector request)
        if stage in (S.failed, S.timed_out):
            await self._act0(
                ACT.notify,
                Notification(
                    cluster=req.cluster,
                    node=req.node,
                    repair_id=req.repair_id,
                    subject=f"repair {req.repair_id} {stage.value}",
                    body=reason,
                    severity="critical",
                ),
            )

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

    async def _act0(self, name: str, arg: object) -> None:
        """Run an activity whose result is ignored (ledger writes, notifications)."""
        await workflow.execute_activity(
            name, arg, start_to_close_timeout=_SHORT, retry_policy=_RETRY
        )


def _cause(err: BaseException) -> str:
    cause = err.__cause__
    return str(cause) if cause is not None else str(err)
