"""``NodeWorkflow`` (id ``node/{cluster}/{node}``): the node entity.

One per node, started by the ingest service with update-with-start
(:data:`~workflows.protocol.NODE_UPDATE_DELIVER_ALERT` ``deliver_alert``, input
:class:`~workflows.models.NodeInput`). It de-duplicates alerts by ``alert_id`` (keys
survive continue-as-new), records every alert in the ledger, decides each one with the
worker's catalogue (operator overrides and count-in-window thresholds included; ingest
only annotates), tracks persistence per fault from its first observation, the cooldown
after a repair and the in-flight repair, and turns an actionable fault that outlives its
persistence window into a ``RepairWorkflow`` child (parent close policy ABANDON). Alerts
arriving during a repair attach to it (no second repair starts; the cooldown follows its
end, DESIGN §5 rails); a fault that clears before a repair starts auto-resolves the
recommendation.

Interface: update ``deliver_alert`` (Alert → AlertDelivery), signal ``repair_finished``
(RepairFinished, from the repair), query ``status`` → NodeStatus.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, Field

    from workflows.activity_api import ACT, Notification, PolicySnapshot
    from workflows.catalogue.vocabulary import count_window_s
    from workflows.config import PolicyConfig
    from workflows.console import repair_details, repair_summary
    from workflows.models import (
        ACTION_WEIGHT,
        Action,
        Alert,
        AlertDelivery,
        AlertOutcome,
        NodeInput,
        RepairRequest,
        Requester,
        RequesterKind,
    )
    from workflows.policy import (
        cooldown_until,
        count_in_window,
        decide_node_action,
        in_cooldown,
        persistence_for,
        repeat_key,
    )
    from workflows.protocol import (
        NODE_QUERY_STATUS,
        NODE_SIGNAL_REPAIR_FINISHED,
        NODE_UPDATE_DELIVER_ALERT,
        NODE_WORKFLOW,
        REPAIR_SIGNAL_ATTACH_ALERT,
        REPAIR_WORKFLOW,
        NodeStatus,
        RepairFinished,
        fault_key,
        workflow_id_repair,
    )

#: History length after which the node continues as new (Temporal's suggestion also
#: triggers it); overridable through ``NodeInput.carried["history_limit"]``.
DEFAULT_HISTORY_LIMIT = 10_000
#: How long de-duplication keys are kept, seconds (8 days: beyond the 7-day ladder window).
DEDUP_TTL_S = 8 * 86400.0
#: Most de-duplication keys kept (oldest dropped first).
DEDUP_MAX = 20_000
#: Re-read the policy (``load_policy``) at most this often, seconds.
POLICY_REFRESH_S = 300.0
_ACT_TIMEOUT = timedelta(seconds=30)
_ACT_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30))


class ActiveFault(BaseModel):
    """An actionable fault on the node: latest alert, decided action, first observation."""

    alert: Alert
    action: Action
    rule: str
    first_seen: datetime


class NodeCarried(BaseModel):
    """State carried across continue-as-new (``NodeInput.carried``)."""

    seen: dict[str, datetime] = Field(default_factory=dict)
    active: dict[str, ActiveFault] = Field(default_factory=dict)
    occurrences: dict[str, list[datetime]] = Field(default_factory=dict)
    repair_id: str | None = None
    repair_alert_ids: list[str] = Field(default_factory=list)
    cooldown_until: datetime | None = None
    recommendations: int = 0
    diagnostics: list[str] = Field(default_factory=list)
    #: Last diagnostic recommendation per fault (``repeat_key``): one recommendation per
    #: fault and window, whichever source reports it (agent and ingest both see stragglers).
    diagnosed: dict[str, datetime] = Field(default_factory=dict)
    history_limit: int = DEFAULT_HISTORY_LIMIT


@workflow.defn(name=NODE_WORKFLOW)
class NodeWorkflow:
    """Node entity; see the module docstring for its interface."""

    @workflow.init
    def __init__(self, inp: NodeInput) -> None:
        # State is restored here, not in run(): an update delivered with the start (or
        # buffered across continue-as-new) runs before run() begins.
        self._inp: NodeInput | None = inp
        self._s = NodeCarried.model_validate(inp.carried) if inp.carried else NodeCarried()
        self._dirty = False
        self._lock = asyncio.Lock()
        self._snapshot: PolicySnapshot | None = None
        self._loaded_at: datetime | None = None

    # ---- update / signal / query -------------------------------------------------
    @workflow.update(name=NODE_UPDATE_DELIVER_ALERT)
    async def deliver_alert(self, alert: Alert) -> AlertDelivery:
        """Take one alert (raise or clear); idempotent by ``alert_id``.

        Returns ``deduplicated`` (seen before), ``ignored`` (not actionable, with the
        catalogue's reason), ``cleared`` (a clear; auto-resolves a pending
        recommendation), ``attached`` (a repair is in flight: the alert joins it),
        ``recommended`` (a repair was started or a diagnostic run recommended) or ``new``
        (actionable, waiting for its persistence window or the cooldown).
        """
        s = self._s
        if alert.alert_id in s.seen:
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.deduplicated,
                reason="alert id already delivered",
                repair_id=s.repair_id,
            )
        now = workflow.now()
        s.seen[alert.alert_id] = now
        self._prune_seen(now)
        await workflow.execute_activity(
            ACT.ledger_record_alert,
            alert,
            result_type=bool,
            start_to_close_timeout=_ACT_TIMEOUT,
            retry_policy=_ACT_RETRY,
        )
        key = fault_key(alert)
        if not alert.active:
            return await self._on_clear(alert, key)
        occ_key = f"{alert.kind}:{alert.code}"
        rep_key = "repeat:" + repeat_key(alert)
        policy = (await self._policy()).policy
        cat = policy.catalogue
        for k in (occ_key, rep_key):
            times = [t for t in s.occurrences.get(k, []) if now - t <= timedelta(days=8)]
            times.append(now)
            s.occurrences[k] = times[-1000:]
        window = count_window_s(alert.kind, alert.code, cat)
        dec = decide_node_action(
            alert,
            cat,
            occurrences_in_window=count_in_window(s.occurrences[occ_key], now, window),
            repeats_same_gpu=count_in_window(
                s.occurrences[rep_key], now, cat.app_xid_repeat_window_s
            ),
        )
        if dec.actionable:
            sev = dec.severity or alert.severity
            if (alert.action, alert.actionable, alert.severity) != (dec.action, True, sev):
                # The worker's catalogue decided (ingest only annotated): the repair sees
                # the action and severity that were decided, not the annotation.
                alert = alert.model_copy(
                    update={"action": dec.action, "actionable": True, "severity": sev}
                )
            prev = s.active.get(key)
            s.active[key] = ActiveFault(
                alert=alert,
                action=dec.action,
                rule=dec.rule,
                first_seen=prev.first_seen if prev else now,
            )
            self._dirty = True
        if s.repair_id is not None:
            await self._attach(alert)
            if dec.actionable:
                s.repair_alert_ids.append(alert.alert_id)
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.attached,
                reason=f"repair {s.repair_id} in flight; {dec.reason}",
                repair_id=s.repair_id,
            )
        if dec.diagnostic:
            diag_key = repeat_key(alert)
            last = s.diagnosed.get(diag_key)
            if last is not None and (now - last).total_seconds() < cat.app_xid_repeat_window_s:
                return AlertDelivery(
                    alert_id=alert.alert_id,
                    outcome=AlertOutcome.ignored,
                    reason=f"diagnostic validation already recommended at {last.isoformat()}",
                )
            s.diagnosed[diag_key] = now
            s.diagnostics.append(alert.alert_id)
            await workflow.execute_activity(
                ACT.notify,
                Notification(
                    cluster=alert.cluster,
                    node=alert.node,
                    subject=f"diagnostic validation recommended for {alert.node}",
                    body=dec.reason,
                    severity="warning",
                    event="diagnostic_recommended",
                ),
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_ACT_RETRY,
            )
            return AlertDelivery(
                alert_id=alert.alert_id, outcome=AlertOutcome.recommended, reason=dec.reason
            )
        if not dec.actionable:
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.ignored,
                reason=f"{dec.rule}: {dec.reason}",
            )
        async with self._lock:
            await self._evaluate()
        if s.repair_id is not None and alert.alert_id in s.repair_alert_ids:
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.recommended,
                reason=f"{dec.action.value} recommended ({dec.rule})",
                repair_id=s.repair_id,
            )
        return AlertDelivery(
            alert_id=alert.alert_id,
            outcome=AlertOutcome.new,
            reason=self._waiting_reason(key, policy),
        )

    @workflow.signal(name=NODE_SIGNAL_REPAIR_FINISHED)
    def repair_finished(self, msg: RepairFinished) -> None:
        """The in-flight repair ended: start the cooldown, drop the event faults it used."""
        s = self._s
        if msg.repair_id != s.repair_id:
            return
        rails = self._snapshot.policy.rails if self._snapshot else PolicyConfig().rails
        s.cooldown_until = cooldown_until(msg.at, rails)
        used = set(msg.alert_ids) | set(s.repair_alert_ids)
        s.active = {
            k: f for k, f in s.active.items() if f.alert.level or f.alert.alert_id not in used
        }
        s.repair_id = None
        s.repair_alert_ids = []
        self._dirty = True

    @workflow.query(name=NODE_QUERY_STATUS)
    def status(self) -> NodeStatus:
        """Degraded state, active faults with first observation, repair, cooldown."""
        assert self._inp is not None
        s = self._s
        return NodeStatus(
            cluster=self._inp.cluster,
            node=self._inp.node,
            degraded=bool(s.active) or s.repair_id is not None,
            active_alerts=[f.alert for f in s.active.values()],
            first_seen={k: f.first_seen for k, f in s.active.items()},
            repair_id=s.repair_id,
            cooldown_until=s.cooldown_until,
            seen_alert_ids=len(s.seen),
            recommendations=s.recommendations,
            diagnostics=list(s.diagnostics),
        )

    # ---- main loop ---------------------------------------------------------------
    @workflow.run
    async def run(self, inp: NodeInput) -> None:
        """Run for the node's lifetime, continuing as new when the history grows."""
        workflow.set_current_details(f"node {inp.node} of {inp.cluster}")
        while True:
            timeout = self._next_deadline()
            try:
                await workflow.wait_condition(
                    lambda: self._dirty or self._history_full(), timeout=timeout
                )
            except TimeoutError:
                pass
            self._dirty = False
            async with self._lock:
                await self._evaluate()
            if self._history_full():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    NodeInput(
                        cluster=inp.cluster,
                        node=inp.node,
                        machine_id=inp.machine_id,
                        node_pool=inp.node_pool,
                        carried=self._s.model_dump(mode="json"),
                    )
                )

    # ---- helpers -------------------------------------------------------------------
    def _history_full(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > self._s.history_limit
        )

    async def _policy(self) -> PolicySnapshot:
        assert self._inp is not None
        now = workflow.now()
        if (
            self._snapshot is None
            or self._loaded_at is None
            or (now - self._loaded_at).total_seconds() >= POLICY_REFRESH_S
        ):
            self._snapshot = await workflow.execute_activity(
                ACT.load_policy,
                self._inp.cluster,
                result_type=PolicySnapshot,
                start_to_close_timeout=_ACT_TIMEOUT,
                retry_policy=_ACT_RETRY,
            )
            self._loaded_at = now
        return self._snapshot

    def _prune_seen(self, now: datetime) -> None:
        s = self._s
        horizon = now - timedelta(seconds=DEDUP_TTL_S)
        if len(s.seen) > DEDUP_MAX or any(t < horizon for t in list(s.seen.values())[:1]):
            kept = sorted(((t, k) for k, t in s.seen.items() if t >= horizon))[-DEDUP_MAX:]
            s.seen = {k: t for t, k in kept}

    async def _on_clear(self, alert: Alert, key: str) -> AlertDelivery:
        s = self._s
        removed = s.active.pop(key, None)
        self._dirty = True
        if s.repair_id is not None:
            await self._attach(alert)
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.cleared,
                reason=f"clear attached to repair {s.repair_id}",
                repair_id=s.repair_id,
            )
        if removed is not None:
            return AlertDelivery(
                alert_id=alert.alert_id,
                outcome=AlertOutcome.cleared,
                reason="fault cleared before action: recommendation auto-resolved",
            )
        return AlertDelivery(
            alert_id=alert.alert_id, outcome=AlertOutcome.cleared, reason="no active fault to clear"
        )

    async def _attach(self, alert: Alert) -> None:
        assert self._inp is not None and self._s.repair_id is not None
        wid = workflow_id_repair(self._inp.cluster, self._inp.node, self._s.repair_id)
        try:
            await workflow.get_external_workflow_handle(wid).signal(
                REPAIR_SIGNAL_ATTACH_ALERT, alert
            )
        except FailureError:
            # the repair already closed; its repair_finished signal is on the way
            workflow.logger.info("repair gone; alert %s not attached", alert.alert_id)

    def _waiting_reason(self, key: str, policy: PolicyConfig) -> str:
        now = workflow.now()
        s = self._s
        if in_cooldown(s.cooldown_until, now):
            assert s.cooldown_until is not None
            return f"in cooldown until {s.cooldown_until.isoformat()}"
        f = s.active.get(key)
        if f is None:
            return "not active"
        due = f.first_seen + timedelta(seconds=persistence_for(f.alert, policy.rails))
        return f"waiting for persistence until {due.isoformat()}"

    def _next_deadline(self) -> timedelta | None:
        s = self._s
        if s.repair_id is not None or not s.active:
            return None
        now = workflow.now()
        rails = self._snapshot.policy.rails if self._snapshot else PolicyConfig().rails
        times = [
            f.first_seen + timedelta(seconds=persistence_for(f.alert, rails))
            for f in s.active.values()
        ]
        if s.cooldown_until is not None and s.cooldown_until > now:
            times.append(s.cooldown_until)
        future = [t for t in times if t > now]
        if not future:
            return timedelta(seconds=1) if in_cooldown(s.cooldown_until, now) else None
        return max(min(future) - now, timedelta(milliseconds=1))

    async def _evaluate(self) -> None:
        """Start a repair for the faults that outlived their persistence window."""
        assert self._inp is not None
        s = self._s
        if s.repair_id is not None or not s.active:
            return
        now = workflow.now()
        if in_cooldown(s.cooldown_until, now):
            return
        snap = await self._policy()
        rails = snap.policy.rails
        due = [
            f
            for f in s.active.values()
            if now >= f.first_seen + timedelta(seconds=persistence_for(f.alert, rails))
        ]
        if not due:
            return
        due.sort(key=lambda f: -ACTION_WEIGHT[f.action])
        action = due[0].action
        repair_id = workflow.uuid4().hex[:16]
        inp = self._inp
        req = RepairRequest(
            repair_id=repair_id,
            cluster=inp.cluster,
            node=inp.node,
            machine_id=inp.machine_id or snap.machines.get(inp.node),
            node_pool=inp.node_pool or snap.pools.get(inp.node),
            action=action,
            requester=Requester(kind=RequesterKind.system, name="autorepair"),
            reason="; ".join(f"{f.alert.summary} ({f.rule})" for f in due),
            alerts=[f.alert for f in due],
        )
        s.repair_id = repair_id
        s.repair_alert_ids = [f.alert.alert_id for f in due]
        s.recommendations += 1
        await workflow.start_child_workflow(
            REPAIR_WORKFLOW,
            req,
            id=workflow_id_repair(inp.cluster, inp.node, repair_id),
            task_queue=workflow.info().task_queue,
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            static_summary=repair_summary(req),
            static_details=repair_details(req),
        )
        workflow.set_current_details(f"repair {repair_id} ({action.value}) in flight")

