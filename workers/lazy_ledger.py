"""The ledger as ingest and the watchers use it: connected on first use, optional.

:class:`LazyLedger` opens one small asyncpg pool to ``ledger.dsn`` when first needed and
serves what those processes ask of the ledger:

- the dead-letter table (:meth:`record`: it is an ``ingest.handoff.DeadLetterStore``);
- the ingest's outbox (:meth:`accept_alerts`, :meth:`mark_handed_off`,
  :meth:`pending_handoff`: it is an ``ingest.handoff.AlertOutbox``): accepted alerts are
  recorded in ``alerts`` before the push is answered, stamped with the node's provider
  facts as the workflows' own record would be;
- the newest edge of each level fault a watcher raised (:meth:`last_level_edges`): it
  re-opens the faults left open before a restart, so it can send their clears when the
  condition ended while it was down, and stamps the next raise of a cleared fault after
  its clear; ingest's ``node_unreachable`` check reads the open ones alone
  (:meth:`open_level_alerts`).

The first connection applies pending migrations (:func:`activities.ledger.migrate`, under
its advisory lock), so an ingest upgraded before the worker still finds the outbox columns.
With ``ledger.dsn`` empty every call raises ``RuntimeError`` naming the field; callers
treat that as "no ledger" (the dead letter is then only logged, reconciliation skipped).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import UTC, datetime

import asyncpg

from activities.ledger import Ledger, connect, migrate
from activities.maintenance_store import MaintenanceStore
from ingest.maintenance_marks import GRACE_S, MaintenanceMarks
from workflows.config import AutorepairConfig
from workflows.maintenance import MaintenanceWindow
from workflows.models import Alert
from workflows.providers import ProviderResolver


def maintenance_marks(get: Callable[[], Awaitable[Ledger]],
                      grace_s: float = GRACE_S) -> MaintenanceMarks:
    """Marks of the alerts of nodes inside a maintenance window or its grace period
    (``grace_s`` seconds, ``policy.maintenance.grace_s``), reading the windows in force or
    ended within ``grace_s`` from the ledger ``get`` returns
    (:mod:`ingest.maintenance_marks`; issue 29)."""

    async def load() -> list[MaintenanceWindow]:
        ledger = await get()
        return await MaintenanceStore(ledger.pool).list(active_at=datetime.now(UTC),
                                                        limit=10_000, grace_s=grace_s)

    return MaintenanceMarks(load, grace_s=grace_s)


class LazyLedger:
    """Connects to ``config.ledger.dsn`` on first use (see module docstring).

    ``max_size``: connections in the pool (4: pushes carrying alerts write concurrently;
    one write takes a millisecond or two)."""

    def __init__(self, config: AutorepairConfig, *, max_size: int = 4) -> None:
        self.config = config
        self.max_size = max_size
        self._ledger: Ledger | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Ledger:
        """The ledger, connecting once. Raises ``RuntimeError`` naming ``ledger.dsn`` when
        it is empty or PostgreSQL is unreachable (a later call tries again)."""
        if self._ledger is not None:
            return self._ledger
        async with self._lock:
            if self._ledger is None:
                if not self.config.ledger.dsn:
                    raise RuntimeError("ledger.dsn: empty; no ledger configured")
                try:
                    pool = await connect(self.config.ledger.dsn, min_size=1,
                                         max_size=self.max_size)
                except (OSError, asyncpg.PostgresError) as e:
                    raise RuntimeError(f"ledger.dsn: cannot reach PostgreSQL: {e}") from e
                try:
                    # the outbox needs the current schema whichever process starts first
                    # (serialised with the worker's by an advisory lock)
                    await migrate(pool)
                except BaseException:
                    await pool.close()
                    raise
                self._ledger = Ledger(pool, providers=ProviderResolver(
                    self.config.providers))
        return self._ledger

    async def sync_maintenance(self, cluster: str, source: str,
                               windows: list[MaintenanceWindow], now: datetime) -> None:
        """A scheduler's maintenance windows into the ledger
        (:meth:`MaintenanceStore.sync`)."""
        ledger = await self.get()
        await MaintenanceStore(ledger.pool).sync(cluster, source, windows, now)

    def maintenance_marks(self) -> MaintenanceMarks:
        """:func:`maintenance_marks` on this ledger (connecting on first use)."""
        return maintenance_marks(self.get, self.config.policy.maintenance.grace_s)

    async def record(self, alert: Alert, reason: str, error: str, attempts: int) -> None:
        """``DeadLetterStore.record``: a row in ``dead_letters``."""
        await (await self.get()).record_dead_letter(alert, reason, error, attempts)

    async def accept_alerts(self, alerts: Sequence[Alert]) -> set[str]:
        """``AlertOutbox.accept_alerts``: :meth:`Ledger.accept_alerts` (one round trip)."""
        return await (await self.get()).accept_alerts(alerts)

    async def mark_handed_off(self, alert_ids: Sequence[str]) -> int:
        """``AlertOutbox.mark_handed_off``: :meth:`Ledger.mark_handed_off`."""
        return await (await self.get()).mark_handed_off(alert_ids)

    async def pending_handoff(self, older_than_s: float = 0.0, limit: int = 1000
                              ) -> list[Alert]:
        """``AlertOutbox.pending_handoff``: :meth:`Ledger.pending_handoff`."""
        return await (await self.get()).pending_handoff(older_than_s, limit)

    async def open_level_alerts(self, cluster: str, source: str) -> list[Alert]:
        """``Ledger.open_level_alerts``: level faults of ``source`` still open."""
        return await (await self.get()).open_level_alerts(cluster, source)

    async def last_level_edges(self, cluster: str, source: str) -> list[Alert]:
        """``Ledger.last_level_edges``: the newest edge of each level fault of ``source``."""
        return await (await self.get()).last_level_edges(cluster, source)

    async def node_bound_alert(self, cluster: str, node: str, kinds: Collection[str],
                               since: datetime) -> str | None:
        """``Ledger.node_bound_alert``: the node agent's own report confirming a condition."""
        return await (await self.get()).node_bound_alert(cluster, node, kinds, since)

    async def machine_bindings(self) -> dict[str, dict[str, str]]:
        """``BindingsSource`` of ingest: ``{cluster: {node: machine}}`` of every configured
        cluster from the ledger's ``node_bindings`` (written by migrations,
        ``activities.spares.MachineBindings``); a configured cluster without a binding
        maps to ``{}``."""
        rows = await (await self.get()).pool.fetch(
            "SELECT cluster, node, machine FROM node_bindings WHERE cluster = ANY($1::text[])",
            [c.name for c in self.config.clusters])
        out: dict[str, dict[str, str]] = {c.name: {} for c in self.config.clusters}
        for r in rows:
            out[str(r["cluster"])][str(r["node"])] = str(r["machine"])
        return out

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        if self._ledger is not None:
            await self._ledger.pool.close()
            self._ledger = None
