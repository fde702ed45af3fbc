"""The body each channel type receives for one :class:`NotificationEvent` (pure).

URLs are shown only through :func:`activities.secrets.redact_url` (scheme and host).

- ``webhook``: the event as JSON (``event``, ``cluster``, ``node``, ``repair_id``,
  ``severity``, ``subject``, ``body``, ``summary``, ``description``, ``detail``,
  ``action``, ``stage``, ``evidence``, ``hints``, ``dedup_key``, ``at``); the
  ``subject`` / ``body`` / ``severity`` keys of the first release are kept.
- ``slack``: a Slack incoming-webhook message: ``text`` (the fallback shown in
  notifications) and Block Kit ``blocks`` — header (the alert summary), the subject and
  description, fields (cluster, node, action, stage, severity, repair), the evidence, and
  a context line with the approve / reject commands. Limits from Slack's Block Kit
  reference: header text 150 characters, section text 3,000, field text 2,000, 10 fields.
- ``pagerduty``: a PagerDuty Events API v2 event: ``trigger`` (approval needed, failed,
  breaker, validation, diagnostics), ``acknowledge`` (repair started), ``resolve``
  (repair finished), ``dedup_key`` = the repair id; payload ``summary`` at most 1,024
  characters, ``severity`` one of critical / error / warning / info (PagerDuty's list).
"""

from __future__ import annotations

from typing import Any

from activities.notifications.event import NotificationEvent
from workflows.config import NotifyEvent

PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
"""PagerDuty Events API v2 endpoint (PagerDuty developer docs, "Send an Alert Event")."""
SLACK_HEADER_MAX = 150
SLACK_TEXT_MAX = 3000
SLACK_FIELD_MAX = 2000
PAGERDUTY_SUMMARY_MAX = 1024


def webhook_body(ev: NotificationEvent) -> dict[str, Any]:
    """Generic JSON webhook body: the event itself."""
    return ev.model_dump(mode="json")


def _esc(text: str) -> str:
    """Slack mrkdwn escaping of ``&``, ``<``, ``>`` (Slack "Formatting text" guide)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def slack_body(ev: NotificationEvent) -> dict[str, Any]:
    """Slack incoming-webhook message for ``ev`` (see the module docstring)."""
    title = ev.summary or ev.subject
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "emoji": False,
                                    "text": _cut(title, SLACK_HEADER_MAX)}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut(
            f"*{_esc(ev.subject)}*" + (f"\n{_esc(ev.description)}" if ev.description else "")
            + (f"\n_{_esc(ev.detail)}_" if ev.detail else ""), SLACK_TEXT_MAX)}},
    ]
    fields = [("Cluster", ev.cluster), ("Node", ev.node), ("Action", ev.action),
              ("Stage", ev.stage), ("Severity", ev.severity), ("Repair", ev.repair_id)]
    blocks.append({"type": "section", "fields": [
        {"type": "mrkdwn", "text": _cut(f"*{k}*\n{_esc(str(v))}", SLACK_FIELD_MAX)}
        for k, v in fields if v][:10]})
    if ev.evidence:
        lines = []
        for e in ev.evidence:
            code = f" {e.code}" if e.code is not None else ""
            lines.append(f"• *{_esc(e.kind)}{code}* ({e.severity}): {_esc(e.summary)}")
            if e.evidence_text:
                lines.append(f"```{_esc(e.evidence_text[:500])}```")
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _cut(
            "*Evidence*\n" + "\n".join(lines), SLACK_TEXT_MAX)}})
    elif ev.body and ev.body != ev.description:
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                   "text": _cut(_esc(ev.body), SLACK_TEXT_MAX)}})
    if ev.captures:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _cut(
            "*Captured before acting*\n" + "\n".join(f"• {_esc(c)}" for c in ev.captures),
            SLACK_TEXT_MAX)}})
    if ev.hints:
        blocks.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": _cut(_esc(h if h.startswith("Temporal") else f"`{h}`"),
                                            SLACK_FIELD_MAX)}
            for h in ev.hints[:10]]})
    return {"text": _cut(f"{ev.subject}: {title}", SLACK_TEXT_MAX), "blocks": blocks}


#: PagerDuty event action of each event.
PAGERDUTY_ACTION: dict[NotifyEvent, str] = {
    NotifyEvent.approval_needed: "trigger",
    NotifyEvent.repair_started: "acknowledge",
    NotifyEvent.repair_finished: "resolve",
    NotifyEvent.repair_failed: "trigger",
    NotifyEvent.breaker_tripped: "trigger",
    NotifyEvent.validation_failed: "trigger",
    NotifyEvent.diagnostic_recommended: "trigger",
    NotifyEvent.cluster_alert: "trigger",
}


def pagerduty_body(ev: NotificationEvent, routing_key: str) -> dict[str, Any]:
    """PagerDuty Events API v2 event for ``ev`` (see the module docstring)."""
    action = PAGERDUTY_ACTION[ev.event]
    body: dict[str, Any] = {"routing_key": routing_key, "event_action": action,
                            "dedup_key": ev.dedup_key}
    if action != "trigger":
        return body
    body["client"] = "autorepair"
    body["payload"] = {
        "summary": _cut(ev.summary or ev.subject, PAGERDUTY_SUMMARY_MAX),
        "source": ev.node if ev.node and ev.node != "*" else ev.cluster,
        "severity": ev.severity if ev.severity in ("critical", "warning", "info") else "error",
        "component": ev.node or ev.cluster,
        "group": ev.cluster,
        "class": ev.evidence[0].kind if ev.evidence else ev.event.value,
        "timestamp": ev.at.isoformat(),
        "custom_details": {
            "event": ev.event.value, "subject": ev.subject, "description": ev.description,
            "detail": ev.detail, "action": ev.action, "stage": ev.stage,
            "repair_id": ev.repair_id, "workflow_id": ev.workflow_id,
            "evidence": [e.model_dump() for e in ev.evidence], "captures": ev.captures,
            "hints": ev.hints,
        },
    }
    return body
