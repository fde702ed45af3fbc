"""Temporal activities over the ledger (names ``ACT.ledger_*`` in workflows.activity_api).

Each activity is a thin, idempotent call into :class:`activities.ledger.Ledger`;
database errors propagate as retryable failures.

The repair records also drive what follows from them, so no workflow needs a hook:

- a repair's terminal transition and its final ``upsert_repair`` record its downtime and
  cost (:func:`activities.ledger_reports.record_downtime`; the last call wins, so the
  row carries the repair's final action);
- notifications (:class:`~activities.notifications.Notifier`): ``approval_needed`` when
  the repair row is written at ``awaiting_approval`` while a person is asked (after the
  ladder's decision, so the action is the one awaiting approval; not for an approved
  repair waiting there for its lease or a maintenance window:
  :func:`~activities.notifications.event.row_event`), ``repair_started`` at ``cordoning``,
  ``repair_finished`` at a terminal ``succeeded`` / ``auto_resolved`` / ``cancelled`` /
  ``rejected`` / ``shadowed`` row (a shadowed one's subject starts ``shadow:`` and names
  the action not taken; any other of a shadow-mode repair starts ``shadow:`` too:
  :func:`~activities.notifications.event.row_subject`; ``failed`` / ``timed_out`` are
  notified by the workflow itself), and
  ``validation_failed`` with a failed verdict. Each transition is notified once across
  retries and workers (:meth:`Ledger.claim_notice`); a notification problem is logged,
  never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.ledger import Ledger
from activities.ledger_reports import record_downtime
from activities.maintenance_store import MaintenanceStore
from activities.notifications import NotificationEvent, Notifier
from activities.notifications.event import repair_event, row_event, row_subject
from workflows.activity_api import (
    ACT,
    ERR_UNKNOWN_NODE,
    AttemptHistory,
    AttemptQuery,
    AttemptRecord,
    ClaimInput,
    ClaimResult,
    GuardLedgerState,
    GuardStateQuery,
    MachineHold,
    MachineHoldQuery,
    MaintenanceCover,
    MaintenanceQuery,
    RepairLiveness,
    RepairProbe,
    RepairRecord,
    TicketInput,
    TicketResult,
    TransitionRecord,
    VerdictRecord,
    permanent,
)
from workflows.config import NotifyEvent, ProvidersConfig
from workflows.evidence import EvidenceRecord
from workflows.maintenance import covering_last
from workflows.models import TERMINAL_STAGES, Action, Alert, Stage, Verdict
from workflows.protocol import workflow_id_repair
from workflows.providers import ProviderResolver

log = logging.getLogger("autorepair.ledger")

class LedgerActivities:
    """Bound methods are the ledger activities; register ``.all()`` on a worker.

    ``providers``: provider rules for alert stamping and repair cost (default: none, so
    only GPUs per node = 8). ``notifier``: where repair and validation events go (None:
    not notified)."""

    def __init__(self, pool: asyncpg.Pool, *, providers: ProvidersConfig | None = None,
                 notifier: Notifier | None = None) -> None:
        self.resolver = ProviderResolver(providers or ProvidersConfig())
        self.ledger = Ledger(pool, providers=self.resolver)
        self.notifier = notifier

    @activity.defn(name=ACT.ledger_record_alert)
    async def record_alert(self, alert: Alert) -> bool:
        """Record an alert; True when it was new."""
        return await self.ledger.record_alert(alert)

    @activity.defn(name=ACT.ledger_upsert_repair)
    async def upsert_repair(self, rec: RepairRecord) -> None:
        await self.ledger.upsert_repair(rec)
        if rec.stage in TERMINAL_STAGES:
            await record_downtime(self.ledger, rec.repair_id, self.resolver)
        event = row_event(rec.stage, rec.approval_pending)
        if event is not None:
            await self._notice(rec.repair_id, rec.stage, event)

    @activity.defn(name=ACT.ledger_record_transition)
    async def record_transition(self, t: TransitionRecord) -> None:
        await self.ledger.record_transition(t)
        if t.stage in TERMINAL_STAGES:
            await record_downtime(self.ledger, t.repair_id, self.resolver)
        elif t.stage == Stage.cordoning:
            await self._notice(t.repair_id, t.stage, NotifyEvent.repair_started)

    async def _notice(self, repair_id: str, stage: Stage, event: NotifyEvent) -> None:
        """Notify ``event`` for the newest ``stage`` transition of the repair, once."""
        if self.notifier is None:
            return
        try:
            claimed = await self.ledger.claim_notice(repair_id, stage.value)
            if claimed is None:
                return
            row = await self.ledger.get_repair(repair_id)
            if row is None:
                return
            alerts = await self.ledger.get_alerts(list(row.get("alert_ids") or []))
            subject = row_subject(repair_id, stage, str(row["action"]), str(row["node"]),
                                  row.get("mode"))
            self.notifier.publish(repair_event(event, row, stage.value, claimed["reason"],
                                               alerts, subject=subject))
        except Exception as exc:
            log.warning("event=notification_error repair=%s kind=%s error=%s", repair_id,
                        event.value, type(exc).__name__)

    @activity.defn(name=ACT.ledger_record_attempt)
    async def record_attempt(self, a: AttemptRecord) -> None:
        await self.ledger.record_attempt(a)

    @activity.defn(name=ACT.ledger_attempt_history)
    async def attempt_history(self, q: AttemptQuery) -> AttemptHistory:
        return await self.ledger.attempt_history(q)

    @activity.defn(name=ACT.ledger_claim_request)
    async def claim_request(self, c: ClaimInput) -> ClaimResult:
        return await self.ledger.claim_request(c)

    @activity.defn(name=ACT.ledger_record_verdict)
    async def record_verdict(self, v: VerdictRecord) -> None:
        """Record a verdict; a failed one is notified (``validation_failed``) the first
        time it is recorded."""
        known = await self.ledger.latest_verdict(v.machine)
        await self.ledger.record_verdict(v)
        if (v.verdict == Verdict.failed and self.notifier is not None
                and (known is None or known["run_id"] != v.run_id)):
            r = v.result
            ticket = r.ticket_id or "-"
            self.notifier.publish(NotificationEvent(
                event=NotifyEvent.validation_failed, cluster=v.cluster, node=v.machine,
                severity="critical",
                subject=f"{v.machine}: validation failed — {r.reason}",
                body=f"hardware ticket {ticket}; run {v.run_id}",
                summary=f"{v.machine}: validation failed — {r.reason}",
                description="; ".join(f"{c.name}: {c.outcome.value} {c.detail}".strip()
                                      for c in r.checks if c.outcome.value != "passed")[:4000],
                dedup_key=f"validation/{v.machine}/{v.run_id}",
                hints=[f"autorepair validate {v.machine}"],
            ))

    @activity.defn(name=ACT.ledger_open_ticket)
    async def open_ticket(self, t: TicketInput) -> TicketResult:
        return await self.ledger.open_ticket(t)

    @activity.defn(name=ACT.ledger_guard_state)
    async def guard_state(self, q: GuardStateQuery) -> GuardLedgerState:
        """Leases, automatic starts and breaker state a fresh cluster guard rebuilds."""
        return await self.ledger.guard_state(q)

    @activity.defn(name=ACT.ledger_open_repair)
    async def open_repair(self, probe: RepairProbe) -> RepairLiveness:
        """The node's open repair (or ``probe.repair_id``) from the ledger, and whether
        its workflow still runs (Temporal's describe through the worker's client: a
        terminated workflow never writes its end to the ledger)."""
        row = await self.ledger.open_repair(probe.cluster, probe.node, probe.repair_id)
        last: dict[str, Any] = {}
        if probe.repair_id is None:
            ended = await self.ledger.last_ended_repair(probe.cluster, probe.node)
            if ended is not None:
                last = {"last_repair_id": str(ended["repair_id"]),
                        "last_stage": str(ended["stage"]),
                        "last_ended_at": ended["ended_at"],
                        "last_actions": [Action(a) for a in ended["actions"] or []
                                         if a in {x.value for x in Action}],
                        "last_alert_ids": list(ended["alert_ids"] or [])}
        if row is None and probe.repair_id is None:
            return RepairLiveness(**last)
        repair_id = probe.repair_id or (str(row["repair_id"]) if row is not None else "")
        wid = (row or {}).get("workflow_id") or workflow_id_repair(
            probe.cluster, probe.node, str(repair_id)
        )
        try:
            desc = await activity.client().get_workflow_handle(wid).describe()
            status = desc.status.name.lower() if desc.status is not None else "unknown"
            running = desc.status == WorkflowExecutionStatus.RUNNING
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            status, running = "not_found", False
        return RepairLiveness(
            repair_id=repair_id,
            workflow_id=wid,
            stage=str((row or {}).get("stage") or ""),
            running=running,
            status=status,
            **last,
        )

    @activity.defn(name=ACT.ledger_machine_held)
    async def machine_held(self, q: MachineHoldQuery) -> MachineHold:
        """Whether ``q.machine_id`` is held for RMA (issue 26 I18); see
        :meth:`Ledger.machine_hold`."""
        hold = await self.ledger.machine_hold(q.cluster, q.machine_id)
        if hold is None:
            return MachineHold(machine_id=q.machine_id)
        return MachineHold(held=True, machine_id=q.machine_id, since=hold["since"],
                           repair_id=hold["repair_id"], reason=hold["reason"])

    @activity.defn(name=ACT.ledger_record_evidence)
    async def record_evidence(self, e: EvidenceRecord) -> bool:
        """Store a repair's evidence capture (``Ledger.record_evidence``: idempotent on
        repair id, action and attempt; True when recorded now). An unknown repair is a
        non-retryable ``ERR_UNKNOWN_NODE``."""
        try:
            return await self.ledger.record_evidence(e)
        except KeyError as err:
            raise permanent(ERR_UNKNOWN_NODE, str(err)) from None

    @activity.defn(name=ACT.ledger_maintenance_covering)
    async def maintenance_covering(self, q: MaintenanceQuery) -> MaintenanceCover:
        """The maintenance window in force at ``q.at`` (else now) that covers ``q.node``
        and ends last (issue 29: a repair that has not cordoned waits for it to end)."""
        now = q.at or datetime.now(UTC)
        windows = await MaintenanceStore(self.ledger.pool).list(q.cluster, active_at=now,
                                                                limit=10_000)
        w = covering_last(windows, q.cluster, q.node, q.pool, now)
        if w is None:
            return MaintenanceCover()
        return MaintenanceCover(window_id=w.window_id, ends_at=w.end(), reason=w.reason)

    def all(self) -> list[Callable[..., Any]]:
        """Every ledger activity, for ``Worker(activities=...)``."""
        return [
            self.record_alert,
            self.upsert_repair,
            self.record_transition,
            self.record_attempt,
            self.attempt_history,
            self.claim_request,
            self.record_verdict,
            self.open_ticket,
            self.guard_state,
            self.machine_held,
            self.maintenance_covering,
            self.open_repair,
            self.record_evidence,
        ]
