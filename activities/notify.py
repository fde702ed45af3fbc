"""The ``notify`` activity: a workflow's notification, handed to the :class:`Notifier`.

Workflows notify about diagnostics (``NodeWorkflow``), failed repairs
(``RepairWorkflow``) and cluster alerts such as a tripped breaker (``ClusterGuardWorkflow``).
A notification that names a repair is completed from the ledger (action, stage, the
alerts behind it as evidence, the Temporal UI's detail line) so every channel shows the
same facts as ``autorepair repairs show``.

Delivery is best effort (:mod:`activities.notifications.dispatch`): this activity only
queues, so it returns at once, never raises, and never blocks or fails the workflow —
a dead webhook costs log lines, not repairs.
"""

from __future__ import annotations

import logging

from temporalio import activity

from activities.ledger import Ledger
from activities.notifications import Notifier
from activities.notifications.event import (
    NotificationEvent,
    event_of,
    plain_event,
    repair_event,
)
from workflows.activity_api import ACT, Notification
from workflows.config import NotificationsConfig

log = logging.getLogger("autorepair.notify")


class NotifyActivities:
    """``notify`` over one :class:`Notifier` (default: built from ``config``);
    ``ledger``: completes repair notifications from the ledger (None: sent as they are)."""

    def __init__(self, config: NotificationsConfig, *, notifier: Notifier | None = None,
                 ledger: Ledger | None = None) -> None:
        self.config = config
        self.notifier = notifier or Notifier(config)
        self.ledger = ledger

    async def event_for(self, n: Notification) -> NotificationEvent:
        """``n`` as a :class:`NotificationEvent`, with the ledger's facts when it names a
        known repair. Never raises (a ledger error leaves the notification as it is)."""
        if n.repair_id is None or self.ledger is None:
            return plain_event(n)
        try:
            row = await self.ledger.get_repair(n.repair_id)
            if row is None:
                return plain_event(n)
            alerts = await self.ledger.get_alerts(list(row.get("alert_ids") or []))
        except Exception as exc:
            log.warning("event=notification_ledger_error repair=%s error=%s", n.repair_id,
                        type(exc).__name__)
            return plain_event(n)
        stage = str(row["stage"])
        ev = repair_event(event_of(n), row, stage, n.body, alerts, subject=n.subject,
                          body=n.body)
        return ev.model_copy(update={"severity": n.severity})

    @activity.defn(name=ACT.notify)
    async def notify(self, n: Notification) -> bool:
        """Queue ``n`` for every channel that takes it; True when at least one does.
        Never raises."""
        return self.notifier.publish(await self.event_for(n)) > 0
