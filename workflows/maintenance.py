"""Planned maintenance windows (issue 29 item 1): what a window is and whom it covers.

A window belongs to one cluster and covers all its nodes, one node pool, or a list of
nodes, from ``starts_at`` until ``ends_at`` (or until an operator ends it earlier,
``ended_at``). Windows come from operators (``autorepair maintenance start``, the API),
from Slurm reservations with ``Flags=MAINT`` and from the Kubernetes node annotation
``autorepair.io/maintenance`` (whose writer is as untrusted as any annotation: a window
only pauses repair, it never starts one).

Pure: the ledger stores windows; the delivery path (``ingest.maintenance_marks``) asks
:func:`covering` with the control plane's clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from workflows.names import NAME_PATTERN

#: The Kubernetes node annotation that opens a window on that node (value: the reason).
MAINTENANCE_ANNOTATION = "autorepair.io/maintenance"
#: Alert evidence key set on an alert of a node inside a window (observed, not acted on).
IN_MAINTENANCE = "in_maintenance"
#: Alert evidence key beside ``in_maintenance``: the covering window's reason.
MAINTENANCE_REASON = "maintenance_reason"
#: Alert evidence key beside ``in_maintenance``: the window's end as scheduled when the
#: alert was received (ISO 8601, UTC). A level fault raised inside a window is judged
#: again ``grace_s`` after it (a GPU that did not come back from a planned reboot is
#: still repaired).
MAINTENANCE_UNTIL = "maintenance_until"

#: Alert evidence key set on an alert of a node a window covered, received within the
#: grace period after it ended: the grace end (ISO 8601, UTC).
IN_GRACE = "in_grace"
#: Alert evidence key beside ``in_grace``: the id of the window whose grace it is.
MAINTENANCE_WINDOW = "maintenance_window"

Scope = Literal["all", "pool", "nodes"]
Source = Literal["operator", "slurm", "kubernetes"]


class MaintenanceWindow(BaseModel):
    """One window. ``scope`` ``all`` (every node of ``cluster``), ``pool`` (``pool``) or
    ``nodes`` (``nodes``, each once, in the order first given); times are the control
    plane's (UTC); ``ended_at``: ended early by ``ended_by``. ``window_id``: ``mw-`` + 12
    hex digits for operator windows, ``slurm:RESERVATION`` / ``k8s:NODE`` for scheduler
    ones."""

    window_id: str = Field(min_length=1, max_length=300)
    cluster: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN)
    scope: Scope
    pool: str | None = Field(None, max_length=253, pattern=NAME_PATTERN)
    nodes: list[str] = Field(default_factory=list, max_length=10_000)
    reason: str = Field(min_length=1, max_length=1000)
    created_by: str = Field(min_length=1, max_length=256)
    source: Source = "operator"
    starts_at: datetime
    ends_at: datetime
    ended_at: datetime | None = None
    ended_by: str | None = None

    @field_validator("nodes")
    @classmethod
    def _each_node_once(cls, v: list[str]) -> list[str]:
        """Each node once, first occurrence first, whatever the source: a Slurm
        reservation's hostlist may repeat a node (``gpu-[01-02],gpu-01``) and a row stored
        before this rule may hold a repeat; an operator's ``--nodes`` is cut the same way
        (``MaintenanceCreate``)."""
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _shape(self) -> MaintenanceWindow:
        if self.ends_at <= self.starts_at:
            raise ValueError(f"ends_at: {self.ends_at.isoformat()} is not after starts_at "
                             f"{self.starts_at.isoformat()}")
        if self.scope == "pool" and not self.pool:
            raise ValueError("pool: a window of scope 'pool' names its pool")
        if self.scope == "nodes" and not self.nodes:
            raise ValueError("nodes: a window of scope 'nodes' names at least one node")
        if self.scope != "nodes" and self.nodes:
            raise ValueError(f"nodes: only a window of scope 'nodes' lists nodes (scope "
                             f"{self.scope!r})")
        for n in self.nodes:
            if not re.match(NAME_PATTERN, n) or len(n) > 253:
                raise ValueError(f"nodes: {n!r} is not a node name")
        return self

    def end(self) -> datetime:
        """When the window ends (or ended): the earlier of ``ended_at`` and ``ends_at``."""
        return min(self.ends_at, self.ended_at) if self.ended_at else self.ends_at

    def covers(self, node: str, pool: str | None) -> bool:
        """Whether the window's scope takes in ``node`` (in ``pool``)."""
        if self.scope == "all":
            return True
        if self.scope == "pool":
            return pool is not None and pool == self.pool
        return node in self.nodes

    def open_at(self, now: datetime) -> bool:
        """Whether the window is in force at ``now``."""
        return self.starts_at <= now < self.end()


def covering(windows: Iterable[MaintenanceWindow], cluster: str, node: str,
             pool: str | None, now: datetime) -> list[MaintenanceWindow]:
    """The windows of ``cluster`` in force at ``now`` that cover ``node``, soonest end
    first."""
    hit = [w for w in windows
           if w.cluster == cluster and w.covers(node, pool) and w.open_at(now)]
    return sorted(hit, key=lambda w: (w.end(), w.window_id))


def covering_last(windows: Iterable[MaintenanceWindow], cluster: str, node: str,
                  pool: str | None, now: datetime) -> MaintenanceWindow | None:
    """The window of :func:`covering` that ends last (a tie: the first by window id),
    the one a repair waits out before its cordon; ``None`` when none covers the node."""
    hit = covering(windows, cluster, node, pool, now)
    return max(hit, key=lambda w: w.end()) if hit else None


def in_grace(windows: Iterable[MaintenanceWindow], cluster: str, node: str,
             pool: str | None, now: datetime, grace_s: float
             ) -> tuple[MaintenanceWindow, datetime] | None:
    """The window of ``cluster`` covering ``node`` that ended at most ``grace_s`` seconds
    before ``now`` (its grace period, ``policy.maintenance.grace_s``, still runs), with
    its grace end (window end + ``grace_s``); the latest grace end when several did;
    ``None`` when none did (or ``grace_s`` is 0)."""
    if grace_s <= 0:
        return None
    hit = [(w, w.end() + timedelta(seconds=grace_s)) for w in windows
           if w.cluster == cluster and w.covers(node, pool) and w.starts_at <= now
           and w.end() <= now < w.end() + timedelta(seconds=grace_s)]
    if not hit:
        return None
    return max(hit, key=lambda wg: (wg[1], wg[0].window_id))
