"""Marks the alerts of nodes inside a planned maintenance window (issue 29 item 1) on the
one path every alert takes to its node entity (``ingest.handoff.TemporalAlertSink``:
ingest's receivers, the Slurm and Kubernetes watchers, dead-letter replays).

An alert of a node a window covers — judged on when the control plane received it
(``Alert.received_at``, else now), never the sender's clock — becomes an observation:
``actionable`` false, action ``none``, ``evidence["in_maintenance"]`` the window id and
``evidence["maintenance_reason"]`` its reason. ``NodeWorkflow`` treats that mark as final
(``workflows.policy.node_action.decide_node_action``): no recommendation, repair or
notification. A sender cannot set the mark itself: the keys are removed from every alert
no window covers.

After a window ends, for ``grace_s`` seconds (``policy.maintenance.grace_s``), an alert
of a node it covered stays actionable but is marked ``evidence["in_grace"]`` (the grace
end, ISO 8601 UTC) with ``evidence["maintenance_window"]`` (the window id): the node
machine (``workflows.lifecycle.node``) holds such a fault and recommends it only when it
persists (a level fault still raised) or recurs (an event fault reported again) past
that end. Several windows: the latest grace end.

Windows are read from the ledger (``activities.maintenance_store.MaintenanceStore``) at
most every ``refresh_s`` seconds; a failed read keeps the last view (logged), so a
ledger outage never blocks delivery. Before the first successful read no alert is marked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from workflows.maintenance import (
    IN_GRACE,
    IN_MAINTENANCE,
    MAINTENANCE_REASON,
    MAINTENANCE_UNTIL,
    MAINTENANCE_WINDOW,
    MaintenanceWindow,
    covering,
    in_grace,
)
from workflows.models import Action, Alert

log = logging.getLogger("autorepair.maintenance")

#: Default seconds between ledger reads of the windows (10 s: an operator's new window
#: takes effect within one push interval of the agents, docs/design.md §5).
REFRESH_S = 10.0
#: Default grace period after a window, seconds (``policy.maintenance.grace_s``'s default).
GRACE_S = 900.0
#: ``evidence`` keys only this module sets (a sender's are removed).
MARK_KEYS = (IN_MAINTENANCE, MAINTENANCE_REASON, MAINTENANCE_UNTIL, IN_GRACE,
             MAINTENANCE_WINDOW)


class MaintenanceMarks:
    """``load``: returns the windows in force or ended within ``grace_s`` (one ledger
    read); ``refresh_s``: the read period; ``timeout_s``: bound on one read; ``grace_s``:
    the grace period after a window, seconds (0: none). Raises ``ValueError`` naming
    ``refresh_s`` or ``grace_s`` when out of range."""

    def __init__(self, load: Callable[[], Awaitable[list[MaintenanceWindow]]],
                 refresh_s: float = REFRESH_S, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 grace_s: float = GRACE_S) -> None:
        if not refresh_s > 0:
            raise ValueError(f"refresh_s: must be > 0, got {refresh_s!r}")
        if not grace_s >= 0:
            raise ValueError(f"grace_s: must be >= 0, got {grace_s!r}")
        self.grace_s = grace_s
        self._load = load
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._windows: list[MaintenanceWindow] = []
        self._read_at: float | None = None
        self._lock = asyncio.Lock()
        self.marked = 0

    async def refresh(self, force: bool = False) -> None:
        """Read the windows when the last read is older than ``refresh_s`` (or ``force``)."""
        now = self._clock()
        if not force and self._read_at is not None and now - self._read_at < self.refresh_s:
            return
        async with self._lock:
            if not force and self._read_at is not None and \
                    self._clock() - self._read_at < self.refresh_s:
                return
            try:
                self._windows = await asyncio.wait_for(self._load(), self.timeout_s)
            except Exception as e:  # a ledger outage never blocks delivery
                log.warning("event=maintenance_windows_unreadable error=%s "
                            "(the last view is kept)", type(e).__name__)
            finally:
                self._read_at = self._clock()

    async def mark(self, alert: Alert) -> Alert:
        """``alert`` as delivered: marked when a window covers its node (see module)."""
        await self.refresh()
        return self.mark_with(alert, self._windows)

    def mark_with(self, alert: Alert, windows: list[MaintenanceWindow]) -> Alert:
        """Pure half of :meth:`mark` over ``windows``."""
        evidence = {k: v for k, v in alert.evidence.items() if k not in MARK_KEYS}
        at = alert.received_at or datetime.now(UTC)
        hit = covering(windows, alert.cluster, alert.node, alert.node_pool, at) \
            if alert.active else []
        if not hit:
            grace = in_grace(windows, alert.cluster, alert.node, alert.node_pool, at,
                             self.grace_s) if alert.active else None
            if grace is not None:
                g, end = grace
                return alert.model_copy(update={"evidence": {
                    **evidence, IN_GRACE: end.isoformat(), MAINTENANCE_WINDOW: g.window_id}})
            if len(evidence) == len(alert.evidence):
                return alert
            return alert.model_copy(update={"evidence": evidence})
        w = hit[0]
        self.marked += 1
        return alert.model_copy(update={
            "actionable": False, "action": Action.none,
            "evidence": {**evidence, IN_MAINTENANCE: w.window_id,
                         MAINTENANCE_REASON: w.reason[:200],
                         MAINTENANCE_UNTIL: max(x.end() for x in hit).isoformat()},
        })
