"""The ``notify`` activity: tell people about diagnostics, failed repairs and the breaker.

Every notification is logged as one structured event line. When
``notifications.webhook_url`` is set it is also POSTed there as JSON (a chat or paging
bridge); the subject and body are the workflow's own strings, untouched. The repair id
is sent as ``Idempotency-Key`` so a retried activity does not page twice at a receiver
that honours it.

Errors: a 4xx answer (except 408/429) raises non-retryable ``ActionFailed`` naming the
webhook's scheme and host (never its path or query: the credential of most chat and paging
webhooks, which would otherwise reach the workflow history) and the status; network errors
and 5xx raise ``RuntimeError`` the same way and are retried by Temporal.
"""

from __future__ import annotations

import hashlib
import logging

import httpx
from temporalio import activity

from activities.secrets import redact_url
from workflows.activity_api import ACT, ERR_ACTION_FAILED, Notification, permanent
from workflows.config import NotificationsConfig

log = logging.getLogger("autorepair.notify")


def idempotency_key(n: Notification) -> str:
    """Stable key of one notification (sha256 of cluster, node, repair, subject)."""
    raw = "\x1f".join((n.cluster, n.node or "", n.repair_id or "", n.subject))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class NotifyActivities:
    """Holds the notification settings; ``notify`` is the activity."""

    def __init__(self, config: NotificationsConfig) -> None:
        self.config = config

    @activity.defn(name=ACT.notify)
    async def notify(self, n: Notification) -> bool:
        """Log ``n`` and deliver it to the webhook when configured; True when delivered
        to a webhook, False when only logged."""
        log.log(
            logging.WARNING if n.severity in ("warning", "critical") else logging.INFO,
            "event=notification cluster=%s node=%s repair=%s severity=%s subject=%r",
            n.cluster, n.node or "-", n.repair_id or "-", n.severity, n.subject,
        )
        url = self.config.webhook_url
        if not url:
            return False
        try:
            async with httpx.AsyncClient(timeout=self.config.timeout_s) as http:
                r = await http.post(
                    url,
                    json=n.model_dump(mode="json"),
                    headers={"Idempotency-Key": idempotency_key(n)},
                )
        except httpx.HTTPError as exc:
            raise RuntimeError(
                f"notifications.webhook_url {redact_url(url)}: {type(exc).__name__}") from None
        if r.status_code >= 400:
            msg = f"notifications.webhook_url {redact_url(url)}: HTTP {r.status_code}"
            if r.status_code < 500 and r.status_code not in (408, 429):
                raise permanent(ERR_ACTION_FAILED, msg)
            raise RuntimeError(msg)
        return True
