"""The one shape of a notification, and how each source fills it.

Strings are the system's own, never reworded: ``summary`` / ``description`` are the
alert's (``workflows.alerts``), ``subject`` is ``repair {id} {stage}`` for repair events
(the workflow's own failure subject), ``detail`` is what the Temporal UI shows as the
repair's current details (``{stage}: {reason} (action {action}, node {node})``, set by
``RepairWorkflow`` on every transition).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from workflows.activity_api import Notification
from workflows.config import NotifyEvent
from workflows.models import TERMINAL_STAGES, Alert, Stage
from workflows.protocol import workflow_id_repair

EVIDENCE_MAX = 5
"""Alerts quoted as evidence in one notification (the first ones of the repair)."""
EVIDENCE_TEXT_MAX = 2000
"""Characters of one alert's raw evidence text kept in a notification."""


#: Terminal stages whose notification the workflow sends itself (``RepairWorkflow`` sends
#: the failure), so the ledger's row write does not.
WORKFLOW_NOTIFIED = frozenset({Stage.failed, Stage.timed_out})


def row_event(stage: Stage, approval_pending: bool | None) -> NotifyEvent | None:
    """The event a repair row written at ``stage`` notifies (``ledger_upsert_repair``), or
    None. ``repair_finished`` at a terminal stage the workflow does not notify itself
    (:data:`WORKFLOW_NOTIFIED`); ``approval_needed`` at ``awaiting_approval`` only while a
    person is asked (``approval_pending`` not False: a repair approved and waiting for
    its lease or a maintenance window keeps the stage, and a note it records there must
    not ask the approvers again; None, a writer from before the field, still notifies)."""
    if stage in TERMINAL_STAGES:
        return None if stage in WORKFLOW_NOTIFIED else NotifyEvent.repair_finished
    if stage == Stage.awaiting_approval and approval_pending is not False:
        return NotifyEvent.approval_needed
    return None


def row_subject(repair_id: str, stage: Stage, action: str, node: str,
                mode: str | None) -> str | None:
    """The subject of a repair row's notification when it is not the default
    ``repair {id} {stage}`` (None): a shadowed ending names the action not taken; any
    other notification of a shadow-mode repair (``mode`` ``shadow``, migration 0018:
    rejected, cancelled, auto-resolved, approval needed) starts ``shadow:`` and says
    nothing was done, as the workflow's own shadow failure subjects do."""
    if stage == Stage.shadowed:
        return f"shadow: repair {repair_id} would {action} {node} (nothing was done)"
    if mode == "shadow":
        return f"shadow: repair {repair_id} {stage.value} (nothing was done: shadow mode)"
    return None


class EvidenceItem(BaseModel):
    """One alert behind a notification."""

    alert_id: str
    kind: str
    code: int | None = None
    gpu: str | None = None
    severity: str
    summary: str
    evidence_text: str = ""


class NotificationEvent(BaseModel):
    """What every channel renders. ``severity``: info | warning | critical.
    ``dedup_key``: the repair id for repair events (PagerDuty ``dedup_key``), else a
    stable key of the event. ``hints``: commands a person can run next."""

    event: NotifyEvent
    cluster: str
    node: str | None = None
    repair_id: str | None = None
    workflow_id: str | None = None
    severity: str = "info"
    subject: str
    body: str = ""
    summary: str = ""
    description: str = ""
    detail: str = ""
    action: str | None = None
    stage: str | None = None
    evidence: list[EvidenceItem] = Field(default_factory=list)
    #: One line per evidence capture made before the repair's disruptive actions
    #: (``workflows.evidence.EvidenceCapture.summary``, from the ledger's repair row).
    captures: list[str] = Field(default_factory=list)
    hints: list[str] = Field(default_factory=list)
    dedup_key: str
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    def idempotency_key(self) -> str:
        """Stable key of this notification (sha256 of event, cluster, node, repair,
        subject, body): the ``Idempotency-Key`` header of the generic webhook."""
        raw = "\x1f".join((self.event.value, self.cluster, self.node or "",
                           self.repair_id or "", self.subject, self.body))
        return hashlib.sha256(raw.encode()).hexdigest()[:32]


def evidence_items(alerts: list[Alert]) -> list[EvidenceItem]:
    """The first :data:`EVIDENCE_MAX` alerts as evidence items (raw text cut)."""
    return [
        EvidenceItem(alert_id=a.alert_id, kind=a.kind, code=a.code, gpu=a.gpu,
                     severity=a.severity.value, summary=a.summary,
                     evidence_text=a.evidence_text[:EVIDENCE_TEXT_MAX])
        for a in alerts[:EVIDENCE_MAX]
    ]


def _severity(alerts: list[Alert], default: str) -> str:
    order = {"info": 0, "warning": 1, "critical": 2}
    best = default
    for a in alerts:
        if order.get(a.severity.value, 0) > order.get(best, 0):
            best = a.severity.value
    return best


def _hints(event: NotifyEvent, repair_id: str, workflow_id: str) -> list[str]:
    if event == NotifyEvent.approval_needed:
        return [f"autorepair repairs approve {repair_id}",
                f"autorepair repairs reject {repair_id} --reason TEXT",
                f'Temporal UI: signal "approve" {{"by": "NAME"}} to {workflow_id}']
    if event == NotifyEvent.repair_started:
        return [f"autorepair repairs cancel {repair_id} --reason TEXT"]
    return [f"autorepair repairs show {repair_id}"]


#: Severity of each repair event when its alerts say nothing heavier.
_EVENT_SEVERITY = {
    NotifyEvent.approval_needed: "warning",
    NotifyEvent.repair_started: "info",
    NotifyEvent.repair_finished: "info",
    NotifyEvent.repair_failed: "critical",
}


def repair_event(
    event: NotifyEvent, repair: dict[str, Any], stage: str, reason: str,
    alerts: list[Alert], *, subject: str | None = None, body: str | None = None,
) -> NotificationEvent:
    """A repair event from its ledger row (``repair_id``, ``cluster``, ``node``,
    ``action``, ``reason``, ``workflow_id``, ``evidence``: the captures of
    ``Ledger.get_repair``, as summary lines), the transition's ``stage`` and ``reason``
    and the repair's alerts (oldest first). Failures are critical; other events take the
    heaviest alert severity (at least their own)."""
    rid = str(repair["repair_id"])
    node = str(repair["node"])
    action = str(repair["action"])
    wf = repair.get("workflow_id") or workflow_id_repair(str(repair["cluster"]), node, rid)
    first = alerts[0] if alerts else None
    sev = _EVENT_SEVERITY.get(event, "info")
    if event != NotifyEvent.repair_failed and event != NotifyEvent.repair_finished:
        sev = _severity(alerts, sev)
    return NotificationEvent(
        event=event, cluster=str(repair["cluster"]), node=node, repair_id=rid,
        workflow_id=wf, severity=sev,
        subject=subject or f"repair {rid} {stage}",
        body=reason if body is None else body,
        summary=first.summary if first else (repair.get("reason") or f"repair {rid}"),
        description=first.description if first else "",
        detail=f"{stage}: {reason} (action {action}, node {node})" if reason
        else f"{stage} (action {action}, node {node})",
        action=action, stage=stage, evidence=evidence_items(alerts),
        captures=[str(c["summary"]) for c in repair.get("evidence") or [] if c.get("summary")],
        hints=_hints(event, rid, wf), dedup_key=rid,
    )


def event_of(n: Notification) -> NotifyEvent:
    """The event of a workflow's notification: its ``event`` field, else (notifications
    of workflows recorded before the field existed) ``repair_failed`` when it names a
    repair, ``diagnostic_recommended`` when it names a node, ``cluster_alert`` otherwise."""
    if n.event:
        try:
            return NotifyEvent(n.event)
        except ValueError:
            pass
    if n.repair_id:
        return NotifyEvent.repair_failed
    if n.node:
        return NotifyEvent.diagnostic_recommended
    return NotifyEvent.cluster_alert


def plain_event(n: Notification) -> NotificationEvent:
    """A workflow's notification as it is (no ledger facts)."""
    ev = event_of(n)
    key = n.repair_id or n.dedup_key or hashlib.sha256(
        "\x1f".join((ev.value, n.cluster, n.node or "", n.subject)).encode()).hexdigest()[:32]
    return NotificationEvent(
        event=ev, cluster=n.cluster, node=n.node, repair_id=n.repair_id,
        severity=n.severity, subject=n.subject, body=n.body, summary=n.subject,
        description=n.body, dedup_key=key,
    )
