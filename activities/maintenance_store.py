"""Operator maintenance windows in the ledger (issue 29 item 1; table
``maintenance_windows``, migration 0010). Windows from the schedulers (Slurm ``MAINT``
reservations, the Kubernetes annotation) are read where they live, never stored here."""

from __future__ import annotations

import builtins
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from pydantic import ValidationError

from workflows.maintenance import MaintenanceWindow, Scope


class WindowError(ValueError):
    """A window that cannot be opened or ended: ``field`` names what is wrong,
    ``status`` the HTTP status the API answers with (422 bad input, 404 unknown)."""

    def __init__(self, field: str, message: str, status: int = 422) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.status = field, message, status


def _window(r: asyncpg.Record) -> MaintenanceWindow:
    return MaintenanceWindow(
        window_id=r["window_id"], cluster=r["cluster"], scope=r["scope"], pool=r["pool"],
        nodes=list(r["nodes"]), reason=r["reason"], created_by=r["created_by"],
        source=r["source"], starts_at=r["starts_at"], ends_at=r["ends_at"],
        ended_at=r["ended_at"], ended_by=r["ended_by"])


class MaintenanceStore:
    """Open, list and end operator windows. ``max_s``: the longest window
    (``policy.maintenance.max_s``)."""

    def __init__(self, pool: asyncpg.Pool, max_s: float = 24 * 3600.0) -> None:
        self.pool = pool
        self.max_s = max_s

    async def start(self, *, cluster: str, scope: Scope, duration_s: float, reason: str,
                    created_by: str, pool: str | None = None, nodes: list[str] | None = None,
                    now: datetime | None = None) -> MaintenanceWindow:
        """Open a window from ``now`` (the control plane's clock) for ``duration_s``
        seconds. Raises :class:`WindowError` naming the field: a duration that is not
        positive or exceeds ``max_s``, an empty reason, a scope without its pool/nodes."""
        if not duration_s > 0:
            raise WindowError("for", f"the duration must be positive (got {duration_s:g} s)")
        if duration_s > self.max_s:
            raise WindowError("for", f"{duration_s:g} s exceeds policy.maintenance.max_s "
                              f"({self.max_s:g} s)")
        if not reason.strip():
            raise WindowError("reason", "a window records why (got '')")
        start = now or datetime.now(UTC)
        try:
            w = MaintenanceWindow(
                window_id=f"mw-{secrets.token_hex(6)}", cluster=cluster, scope=scope,
                pool=pool, nodes=nodes or [], reason=reason.strip(), created_by=created_by,
                starts_at=start, ends_at=start + timedelta(seconds=duration_s))
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first.get("loc", ())) or "window"
            raise WindowError(loc, str(first.get("msg", e))) from e
        await self.pool.execute(
            """INSERT INTO maintenance_windows (window_id, cluster, scope, pool, nodes, reason,
                   created_by, source, starts_at, ends_at)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)""",
            w.window_id, w.cluster, w.scope, w.pool, w.nodes, w.reason, w.created_by,
            w.source, w.starts_at, w.ends_at)
        return w

    async def list(self, cluster: str | None = None, *, active_at: datetime | None = None,
                   limit: int = 200, grace_s: float = 0.0) -> list[MaintenanceWindow]:
        """Windows newest first; ``active_at``: only those in force then, or — with
        ``grace_s`` > 0 (seconds, ``policy.maintenance.grace_s``) — begun by then and
        ended less than ``grace_s`` before it (their grace period still runs)."""
        rows = await self.pool.fetch(
            """SELECT * FROM maintenance_windows
                WHERE ($1::text IS NULL OR cluster = $1)
                  AND ($2::timestamptz IS NULL OR (starts_at <= $2
                       AND LEAST(ends_at, COALESCE(ended_at, ends_at))
                           > $2 - make_interval(secs => $4)))
                ORDER BY starts_at DESC, window_id LIMIT $3""",
            cluster, active_at, limit, float(grace_s))
        return [_window(r) for r in rows]

    async def overlapping(self, since: datetime, until: datetime, cluster: str | None = None,
                          *, limit: int = 10_000) -> builtins.list[MaintenanceWindow]:
        """Windows in force at some time of ``[since, until)`` (begun before ``until``,
        ended after ``since``), oldest first, at most ``limit`` (the what-if replay's
        windows)."""
        rows = await self.pool.fetch(
            """SELECT * FROM maintenance_windows
                WHERE ($1::text IS NULL OR cluster = $1)
                  AND starts_at < $3
                  AND LEAST(ends_at, COALESCE(ended_at, ends_at)) > $2
                ORDER BY starts_at, window_id LIMIT $4""",
            cluster, since, until, limit)
        return [_window(r) for r in rows]

    async def get(self, window_id: str) -> MaintenanceWindow | None:
        r = await self.pool.fetchrow(
            "SELECT * FROM maintenance_windows WHERE window_id = $1", window_id)
        return _window(r) if r is not None else None

    async def end(self, window_id: str, by: str, now: datetime | None = None
                  ) -> tuple[MaintenanceWindow, bool]:
        """End a window now; returns it and whether this call ended it (False: it had
        already ended — idempotent). Raises :class:`WindowError` (404) for an unknown id."""
        at = now or datetime.now(UTC)
        r = await self.pool.fetchrow(
            """UPDATE maintenance_windows SET ended_at = $2, ended_by = $3
                WHERE window_id = $1 AND ended_at IS NULL AND ends_at > $2 RETURNING *""",
            window_id, at, by)
        if r is not None:
            return _window(r), True
        w = await self.get(window_id)
        if w is None:
            raise WindowError("window_id", "no such maintenance window", status=404)
        return w, False


    async def sync(self, cluster: str, source: str, windows: Sequence[MaintenanceWindow],
                   now: datetime | None = None) -> tuple[int, int]:
        """Make the ledger's windows of ``cluster`` from ``source`` (``slurm``,
        ``kubernetes``) the scheduler's current ``windows``: each is inserted or updated
        (nodes, times, reason; reopened when it comes back), and every open one of that
        source no longer listed ends ``now``. One transaction; idempotent. Returns
        (windows written, windows ended)."""
        at = now or datetime.now(UTC)
        ids = [w.window_id for w in windows]
        async with self.pool.acquire() as conn, conn.transaction():
            for w in windows:
                if w.cluster != cluster or w.source != source:
                    raise WindowError("source", f"window {w.window_id!r} is not one of "
                                      f"{source} on {cluster}")
                await conn.execute(
                    """INSERT INTO maintenance_windows (window_id, cluster, scope, pool, nodes,
                           reason, created_by, source, starts_at, ends_at)
                       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                       ON CONFLICT (window_id) DO UPDATE SET scope = EXCLUDED.scope,
                           pool = EXCLUDED.pool, nodes = EXCLUDED.nodes,
                           reason = EXCLUDED.reason, starts_at = EXCLUDED.starts_at,
                           ends_at = EXCLUDED.ends_at, ended_at = NULL, ended_by = NULL""",
                    w.window_id, w.cluster, w.scope, w.pool, w.nodes, w.reason, w.created_by,
                    w.source, w.starts_at, w.ends_at)
            status = await conn.execute(
                """UPDATE maintenance_windows SET ended_at = $4, ended_by = $3
                    WHERE cluster = $1 AND source = $3 AND ended_at IS NULL
                      AND ends_at > $4 AND NOT (window_id = ANY($2::text[]))""",
                cluster, ids, source, at)
        return len(windows), int(status.split()[-1])


def window_view(w: MaintenanceWindow, now: datetime) -> dict[str, Any]:
    """The API's and CLI's JSON of a window, with ``state`` (scheduled / open / ended)."""
    state = "open" if w.open_at(now) else ("scheduled" if now < w.starts_at else "ended")
    return {**w.model_dump(mode="json"), "state": state}
