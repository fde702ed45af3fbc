"""Hot-spare pool per cluster, in the ledger (table ``spare_machines``, migration 0002).

Machines that pass validation after a migrate join the pool (:meth:`SparePool.add`);
a migration draws from it first (:meth:`SparePool.take`, oldest spare first, safe under
concurrent takers: ``FOR UPDATE SKIP LOCKED``). Machines listed in
``ClusterConfig.spares`` seed the pool (:meth:`SparePool.seed`). The pool size is
exported as the Prometheus gauge ``autorepair_spare_pool_size{cluster_id}``.

:class:`MachineBindings` (migration 0003) records which machine runs each node identity
after a migrate, each migrate/remove move by repair id, and machines removed from the
pool; its ``migrate`` draws from this pool (seeding it from ``ClusterConfig.spares`` when
empty) in the same transaction as the binding.

All methods are idempotent; database errors propagate (retryable in activities).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg
from prometheus_client import REGISTRY, CollectorRegistry, Gauge

#: Gauge name (docs/design.md §4.5 naming: ``autorepair_`` prefix, ``cluster_id`` label).
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
        self._export_lock = asyncio.Lock()

    async def _export(self, cluster: str, conn: asyncpg.Connection | None = None) -> int:
        """Read the pool size and set the gauge (serialised).

        Without ``conn`` the committed size is read: called after a change committed, the
        last export then sees every earlier commit. With ``conn`` (a caller inside its own
        transaction) the size as that transaction sees it is exported.
        """
        async with self._export_lock:
            src: asyncpg.Connection | asyncpg.Pool = conn if conn is not None else self.pool
            n = int(await src.fetchval(
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
        await self._export(cluster)
        return status.endswith(" 1")

    async def seed(self, cluster: str, machines: Iterable[str]) -> int:
        """Add every machine of ``machines`` (config ``spares``); returns the pool size."""
        for m in machines:
            await self.add(cluster, m, run_id=None)
        return await self._export(cluster)

    async def remove(self, cluster: str, machine: str) -> bool:
        """Take ``machine`` out of the pool (e.g. it failed validation); True if it was in."""
        status = await self.pool.execute(
            "DELETE FROM spare_machines WHERE cluster = $1 AND machine = $2", cluster, machine
        )
        await self._export(cluster)
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
            if row is not None:
                await conn.execute(
                    "DELETE FROM spare_machines WHERE cluster = $1 AND machine = $2",
                    cluster, row["machine"],
                )
        await self._export(cluster)
        return None if row is None else str(row["machine"])

    async def list(self, cluster: str) -> list[str]:
        """Spares of ``cluster``, oldest first."""
        rows = await self.pool.fetch(
            "SELECT machine FROM spare_machines WHERE cluster = $1 ORDER BY added_at, machine",
            cluster,
        )
        return [str(r["machine"]) for r in rows]

    async def size(self, cluster: str) -> int:
        """Pool size of ``cluster`` (also refreshes the gauge)."""
        return await self._export(cluster)


# --------------------------------------------------------------------------------------
# Node → machine bindings, machine moves and removed machines (migration 0003)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineMove:
    """One migrate/remove of a repair, as recorded in ``machine_moves``.

    ``created`` is False when the row already existed (a retried activity found its own
    work by repair id).
    """

    repair_id: str
    kind: str
    cluster: str
    node: str
    old_machine: str
    new_machine: str | None
    ticket_id: str | None
    created: bool


def _move(row: asyncpg.Record, created: bool) -> MachineMove:
    return MachineMove(
        repair_id=row["repair_id"], kind=row["kind"], cluster=row["cluster"], node=row["node"],
        old_machine=row["old_machine"], new_machine=row["new_machine"],
        ticket_id=row["ticket_id"], created=created,
    )


class MachineBindings:
    """Which machine runs each node identity, and the migrate/remove moves that changed it.

    Tables (``activities/migrations/0003_machine_bindings.sql``): ``node_bindings``
    (cluster, node → machine; a node without a row runs on its configured machine),
    ``machine_moves`` (one row per repair id and kind: the idempotency record), and
    ``removed_machines`` (out of the pool: never drawn or re-seeded as spares).
    Spares come from :class:`SparePool`'s ``spare_machines`` table. Every write runs in one
    transaction under a per-cluster advisory lock, so a crash never loses a spare and
    two racing migrations never get the same machine. Database errors propagate.
    """

    def __init__(self, pool: asyncpg.Pool, registry: CollectorRegistry = REGISTRY) -> None:
        self.pool = pool
        self.spares = SparePool(pool, registry)

    @staticmethod
    async def _lock(conn: asyncpg.Connection, cluster: str) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"bindings/{cluster}")

    async def machine_of(self, cluster: str, node: str) -> str | None:
        """The machine bound to ``node`` by a migrate, or None (configured machine)."""
        val = await self.pool.fetchval(
            "SELECT machine FROM node_bindings WHERE cluster = $1 AND node = $2", cluster, node
        )
        return str(val) if val is not None else None

    async def node_of(self, cluster: str, machine: str) -> str | None:
        """The node identity ``machine`` serves after a migrate, or None."""
        val = await self.pool.fetchval(
            "SELECT node FROM node_bindings WHERE cluster = $1 AND machine = $2", cluster, machine
        )
        return str(val) if val is not None else None

    async def bindings(self, cluster: str) -> dict[str, str]:
        """Every recorded binding of ``cluster``: node → machine."""
        rows = await self.pool.fetch(
            "SELECT node, machine FROM node_bindings WHERE cluster = $1 ORDER BY node", cluster
        )
        return {str(r["node"]): str(r["machine"]) for r in rows}

    async def removed(self, cluster: str) -> list[str]:
        """Machines of ``cluster`` taken out of the pool, oldest removal first."""
        rows = await self.pool.fetch(
            "SELECT machine FROM removed_machines WHERE cluster = $1 ORDER BY removed_at, machine",
            cluster,
        )
        return [str(r["machine"]) for r in rows]

    async def move(self, repair_id: str, kind: str) -> MachineMove | None:
        """The recorded move of ``repair_id`` (``kind`` ``migrate``/``remove``), or None."""
        row = await self.pool.fetchrow(
            "SELECT * FROM machine_moves WHERE repair_id = $1 AND kind = $2", repair_id, kind
        )
        return _move(row, created=False) if row else None

    async def migrate(
        self, cluster: str, node: str, old_machine: str, repair_id: str,
        seed: Iterable[str] = (),
    ) -> MachineMove | None:
        """Take a spare of ``cluster`` and bind ``node`` to it, once per ``repair_id``.

        When the pool is empty, ``seed`` (``ClusterConfig.spares``) refills it first,
        leaving out machines that serve a node, were removed, have an open hardware
        ticket, or are ``old_machine`` / the node's current machine. Returns the move
        (``created=False`` on a retry: the same new machine as the first call), or None
        when no spare is available (nothing changed).
        """
        async with self.pool.acquire() as conn, conn.transaction():
            await self._lock(conn, cluster)
            row = await conn.fetchrow(
                "SELECT * FROM machine_moves WHERE repair_id = $1 AND kind = 'migrate'",
                repair_id,
            )
            if row is not None:
                return _move(row, created=False)
            current = await conn.fetchval(
                "SELECT machine FROM node_bindings WHERE cluster = $1 AND node = $2",
                cluster, node,
            )
            unavailable = """
                machine = ANY($2::text[])
                OR EXISTS (SELECT 1 FROM node_bindings b
                           WHERE b.cluster = $1 AND b.machine = m.machine)
                OR EXISTS (SELECT 1 FROM removed_machines r
                           WHERE r.cluster = $1 AND r.machine = m.machine)
                OR EXISTS (SELECT 1 FROM hardware_tickets t WHERE t.cluster = $1
                           AND t.machine = m.machine AND t.status = 'open')"""
            exclude = sorted({old_machine, *([str(current)] if current else [])})
            seeds = list(dict.fromkeys(seed))
            size = await conn.fetchval(
                "SELECT count(*) FROM spare_machines WHERE cluster = $1", cluster
            )
            if not size and seeds:
                await conn.execute(
                    f"""INSERT INTO spare_machines (cluster, machine, run_id)
                        SELECT $1, m.machine, 'seed:config' FROM unnest($3::text[]) AS m(machine)
                        WHERE NOT ({unavailable})
                        ON CONFLICT (cluster, machine) DO NOTHING""",
                    cluster, exclude, seeds,
                )
            pick = await conn.fetchval(
                f"""SELECT m.machine FROM spare_machines m
                    WHERE m.cluster = $1 AND NOT ({unavailable})
                    ORDER BY m.added_at, m.machine LIMIT 1 FOR UPDATE SKIP LOCKED""",
                cluster, exclude,
            )
            if pick is None:
                await self.spares._export(cluster, conn)
                return None
            new = str(pick)
            await conn.execute(
                "DELETE FROM spare_machines WHERE cluster = $1 AND machine = $2", cluster, new
            )
            await conn.execute(
                """INSERT INTO node_bindings (cluster, node, machine, repair_id)
                   VALUES ($1, $2, $3, $4)
                   ON CONFLICT (cluster, node) DO UPDATE SET machine = EXCLUDED.machine,
                     repair_id = EXCLUDED.repair_id, bound_at = now()""",
                cluster, node, new, repair_id,
            )
            row = await conn.fetchrow(
                """INSERT INTO machine_moves
                     (repair_id, kind, cluster, node, old_machine, new_machine)
                   VALUES ($1, 'migrate', $2, $3, $4, $5) RETURNING *""",
                repair_id, cluster, node, str(current or old_machine), new,
            )
            await self.spares._export(cluster, conn)
            return _move(row, created=True)

    async def remove(
        self, cluster: str, node: str, machine: str, repair_id: str,
        ticket_id: str | None, reason: str = "",
    ) -> MachineMove:
        """Mark ``machine`` out of the pool (and out of the spare pool), once per repair.

        The first removal of a machine is kept (a later repair naming it again records
        its own move but not a second removal). Returns the move (``created=False`` on a
        retry).
        """
        async with self.pool.acquire() as conn, conn.transaction():
            await self._lock(conn, cluster)
            row = await conn.fetchrow(
                "SELECT * FROM machine_moves WHERE repair_id = $1 AND kind = 'remove'",
                repair_id,
            )
            if row is not None:
                return _move(row, created=False)
            await conn.execute(
                "DELETE FROM spare_machines WHERE cluster = $1 AND machine = $2",
                cluster, machine,
            )
            await conn.execute(
                """INSERT INTO removed_machines (cluster, machine, repair_id, ticket_id, reason)
                   VALUES ($1, $2, $3, $4, $5) ON CONFLICT (cluster, machine) DO NOTHING""",
                cluster, machine, repair_id, ticket_id, reason,
            )
            row = await conn.fetchrow(
                """INSERT INTO machine_moves
                     (repair_id, kind, cluster, node, old_machine, ticket_id)
                   VALUES ($1, 'remove', $2, $3, $4, $5) RETURNING *""",
                repair_id, cluster, node, machine, ticket_id,
            )
            await self.spares._export(cluster, conn)
            return _move(row, created=True)
