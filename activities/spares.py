"""Hot-spare pool per cluster, in the ledger (table ``spare_machines``, migration 0002).

Machines that pass validation after a migrate join the pool (:meth:`SparePool.add`);
a migration draws from it first (:meth:`SparePool.take`, oldest spare first, safe under
concurrent takers: ``FOR UPDATE SKIP LOCKED``). Machines listed in
``ClusterConfig.spares`` seed the pool (:meth:`SparePool.seed`). The pool size is
exported as the Prometheus gauge ``autorepair_spare_pool_size{cluster_id}``.

All methods are idempotent; database errors propagate (retryable in activities).
"""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg
from prometheus_client import REGISTRY, CollectorRegistry, Gauge

#: Gauge name (DESIGN §4.5 naming: ``autorepair_`` prefix, ``cluster_id`` label).
SPARE_POOL_METRIC = "autorepair_spare_pool_size"


def _gauge(registry: CollectorRegistry) -> Gauge:
    existing = getattr(registry, "_names_to_collectors", {}).get(SPARE_POOL_METRIC)
    if isinstance(existing, Gauge):
        return existing
    return Gauge(
        SPARE_POOL_METRIC, "Machines in the cluster's hot-spare pool", ["cluster_id"],
        registry=registry,
    )


class SparePool:
    """The spare pool over one asyncpg pool (schema migrated by ``activities.ledger``)."""

    def __init__(self, pool: asyncpg.Pool, registry: CollectorRegistry = REGISTRY) -> None:
        self.pool = pool
        self.gauge = _gauge(registry)

    async def _export(self, cluster: str, conn: asyncpg.Connection | asyncpg.Pool) -> int:
        n = int(await conn.fetchval(
            "SELECT count(*) FROM spare_machines WHERE cluster = $1", cluster) or 0)
        self.gauge.labels(cluster_id=cluster).set(n)
        return n

    async def add(self, cluster: str, machine: str, run_id: str | None = None) -> bool:
        """Put ``machine`` in ``cluster``'s pool; True when it was not there yet."""
        status = await self.pool.execute(
            """INSERT INTO spare_machines (cluster, machine, run_id) VALUES ($1, $2, $3)
               ON CONFLICT (cluster, machine) DO NOTHING""",
            cluster, machine, run_id,
        )
        await self._export(cluster, self.pool)
        return status.endswith(" 1")

    async def seed(self, cluster: str, machines: Iterable[str]) -> int:
        """Add every machine of ``machines`` (config ``spares``); returns the pool size."""
        for m in machines:
            await self.add(cluster, m, run_id=None)
        return await self._export(cluster, self.pool)

    async def remove(self, cluster: str, machine: str) -> bool:
        """Take ``machine`` out of the pool (e.g. it failed validation); True if it was in."""
        status = await self.pool.execute(
            "DELETE FROM spare_machines WHERE cluster = $1 AND machine = $2", cluster, machine
        )
        await self._export(cluster, self.pool)
        return status.endswith(" 1")

    async def take(self, cluster: str, exclude: Iterable[str] = ()) -> str | None:
        """Remove and return the oldest spare of ``cluster`` (not in ``exclude``), or None.

        Two concurrent takers never get the same machine.
        """
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                """SELECT machine FROM spare_machines
                   WHERE cluster = $1 AND NOT (machine = ANY($2::text[]))
                   ORDER BY added_at, machine LIMIT 1 FOR UPDATE SKIP LOCKED""",
                cluster, list(exclude),
            )
            if row is None:
                await self._export(cluster, conn)
                return None
            await conn.execute(
                "DELETE FROM spare_machines WHERE cluster = $1 AND machine = $2",
                cluster, row["machine"],
            )
            await self._export(cluster, conn)
            return str(row["machine"])

    async def list(self, cluster: str) -> list[str]:
        """Spares of ``cluster``, oldest first."""
        rows = await self.pool.fetch(
            "SELECT machine FROM spare_machines WHERE cluster = $1 ORDER BY added_at, machine",
            cluster,
        )
        return [str(r["machine"]) for r in rows]

    async def size(self, cluster: str) -> int:
        """Pool size of ``cluster`` (also refreshes the gauge)."""
        return await self._export(cluster, self.pool)
