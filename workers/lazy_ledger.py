"""The ledger as ingest and the watchers use it: connected on first use, optional.

:class:`LazyLedger` opens one small asyncpg pool to ``ledger.dsn`` when first needed and
serves the two things those processes ask of the ledger:

- the dead-letter table (:meth:`record`: it is an ``ingest.handoff.DeadLetterStore``);
- the level faults a watcher left open before a restart (:meth:`open_level_alerts`), so
  it can send their clears when the condition ended while it was down.

With ``ledger.dsn`` empty every call raises ``RuntimeError`` naming the field; callers
treat that as "no ledger" (the dead letter is then only logged, reconciliation skipped).
"""

from __future__ import annotations

import asyncio

import asyncpg

from activities.ledger import Ledger, connect
from workflows.config import AutorepairConfig
from workflows.models import Alert


class LazyLedger:
    """Connects to ``config.ledger.dsn`` on first use (see module docstring)."""

    def __init__(self, config: AutorepairConfig, *, max_size: int = 2) -> None:
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
                self._ledger = Ledger(pool)
        return self._ledger

    async def record(self, alert: Alert, reason: str, error: str, attempts: int) -> None:
        """``DeadLetterStore.record``: a row in ``dead_letters``."""
        await (await self.get()).record_dead_letter(alert, reason, error, attempts)

    async def open_level_alerts(self, cluster: str, source: str) -> list[Alert]:
        """``Ledger.open_level_alerts``: level faults of ``source`` still open."""
        return await (await self.get()).open_level_alerts(cluster, source)

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        if self._ledger is not None:
            await self._ledger.pool.close()
            self._ledger = None
