"""Notifications people read: events, per-channel payloads and best-effort delivery.

- :mod:`.event`: :class:`NotificationEvent`, one shape for every source (workflow
  ``notify`` calls, repair stage records, failed validations);
- :mod:`.channels`: the payload of each channel type (generic JSON webhook, Slack-compatible
  incoming webhook, PagerDuty Events API v2);
- :mod:`.dispatch`: :class:`Notifier`, per-channel filters, a bounded set of background
  deliveries with retries; publishing never waits and never raises.
"""

from activities.notifications.dispatch import Notifier
from activities.notifications.event import NotificationEvent

__all__ = ["NotificationEvent", "Notifier"]
