"""PostgreSQL ledger: the durable record of alerts, repairs, attempts and verdicts.

A small repository over an ``asyncpg`` pool. Every write is idempotent (primary or unique
keys with ``ON CONFLICT``), so a retried activity never records twice.

A :class:`Ledger` runs each call on its own pooled connection; :meth:`Ledger.transaction`
yields a *connection-scoped* ledger whose calls share one transaction (optionally under
an advisory lock), for callers whose reads and writes must see one winner (the repair
intake's claim + cap check + record).

Alerts and the ingest's hand-off: every alert ingest accepts is recorded here before the push
is answered (:meth:`Ledger.accept_alerts`, one statement per push) with ``handed_off_at``
NULL; ingest sets it once the node's workflow took the alert or it was dead-lettered
(:meth:`Ledger.mark_handed_off`) and re-delivers what is still NULL after a restart
(:meth:`Ledger.pending_handoff`). The workflows' own :meth:`Ledger.record_alert` of the
same alert id then finds the row and changes nothing.

Schema: versioned SQL files in ``activities/migrations/NNNN_name.sql``, applied in order
by :func:`migrate` under an advisory lock (several workers may start at once) and
recorded in ``schema_migrations``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Collection, Sequence
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import asyncpg

from workflows.activity_api import (
    AttemptHistory,
    AttemptQuery,
    AttemptRecord,
    AutomaticStart,
    ClaimInput,
    ClaimResult,
    GuardLedgerState,
    GuardStateQuery,
    HeldRepair,
    RepairRecord,
    TicketInput,
    TicketResult,
    TransitionRecord,
    VerdictRecord,
)
from workflows.evidence import EvidenceRecord
from workflows.leases import DomainHold, DomainRelease
from workflows.models import (
    AUTO_APPROVED,
    TERMINAL_STAGES,
    Action,
    Alert,
    Requester,
    RequesterKind,
    Severity,
    Stage,
)
from workflows.providers import ATTR_PROVIDER, ATTRS, ProviderResolver

#: A dead letter's alert larger than this (bytes of JSON) is kept as its identity, kind and
#: summary only (``Ledger.record_dead_letter``): 256 KiB, the default
#: ``ingest.max_alert_bytes``, so an alert that capping bounded is kept whole.
DEAD_LETTER_MAX_BYTES = 256 * 1024

#: Arbitrary but fixed advisory-lock key serialising migrations across processes.
_MIGRATION_LOCK = 0x6770_7561_7574


def _migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every bundled migration, in version order."""
    out: list[tuple[int, str, str]] = []
    for entry in resources.files("activities.migrations").iterdir():
        name = entry.name
        if not name.endswith(".sql"):
            continue
        version = int(name.split("_", 1)[0])
        out.append((version, name, entry.read_text(encoding="utf-8")))
    return sorted(out)


async def migrate(pool: asyncpg.Pool) -> list[str]:
    """Apply pending migrations; returns the names applied now (empty when current)."""
    applied: list[str] = []
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, name, sql in _migrations():
            if version in done:
                continue
            await conn.execute(sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name
            )
            applied.append(name)
    return applied


async def _init_conn(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def connect(
    dsn: str, *, schema: str | None = None, min_size: int = 1, max_size: int = 10
) -> asyncpg.Pool:
    """Open a pool; ``schema`` (created if missing) becomes the search path (tests use one
    schema per test). Raises ``asyncpg`` / ``OSError`` when PostgreSQL is unreachable."""
    settings: dict[str, str] = {}
    if schema:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        finally:
            await conn.close()
        settings["search_path"] = schema
    pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=_init_conn, server_settings=settings
    )
    assert pool is not None
    return pool


def _alert_from_row(row: asyncpg.Record) -> Alert:
    return Alert(
        alert_id=row["alert_id"],
        cluster=row["cluster"],
        node=row["node"],
        machine_id=row["machine_id"],
        kind=row["kind"],
        code=row["code"],
        gpu=row["gpu"],
        severity=Severity(row["severity"]),
        mnemonic=row["mnemonic"],
        actionable=row["actionable"],
        action=Action(row["action"]),
        summary=row["summary"],
        description=row["description"],
        evidence_text=row["evidence_text"],
        evidence=row["evidence"] or {},
        level=row["level"],
        active=row["active"],
        source=row["source"],
        observed_at=row["observed_at"],
        received_at=row.get("received_at"),
        node_pool=row.get("node_pool"),
    )


#: Stages of a repair that holds (or held) its lease: from cordoning to running
#: (docs/design.md §4.4 stage order; the lease is granted right before cordoning).
HOLDING_STAGES: tuple[str, ...] = tuple(
    s.value
    for s in (
        Stage.cordoning,
        Stage.waiting_for_idle,
        Stage.draining,
        Stage.repairing,
        Stage.migrating,
        Stage.joining,
        Stage.running,
    )
)
_TERMINAL: list[str] = sorted(s.value for s in TERMINAL_STAGES)
#: Alert kind of the guard's circuit-breaker trips (raise) and resets (clear).
BREAKER_KIND = "circuit_breaker"
BREAKER_SOURCE = "guard"
#: Kind of the guard's failure-domain hold alerts (issue 29 item 2; a release clears).
DOMAIN_KIND = "failure_domain"
"""``Alert.source`` of the guard's breaker alerts: the only breaker state the ledger
reads back (a sender's record of that kind is refused at ingest, and any other row is
not control-plane state)."""


def _clear_of_its_raise_first(suffix: str) -> str:
    """SQL ``ORDER BY`` keys (after ``observed_at DESC``) over the guard's rows ``a`` of one
    kind: at one instant, the clear whose id is a raise's id + ``suffix`` (the guard's
    reset of a trip, release of a hold, decided in the step that raised it) comes first,
    then a raise, then any other clear; ``alert_id`` last. The row picked first is the
    state as the guard left it."""
    return f"""CASE WHEN NOT active AND EXISTS (
                                 SELECT 1 FROM alerts t
                                 WHERE t.cluster = a.cluster AND t.kind = a.kind
                                   AND t.source = a.source AND t.node = '*' AND t.active
                                   AND t.observed_at = a.observed_at
                                   AND a.alert_id = t.alert_id || '{suffix}') THEN 0
                             WHEN active THEN 1 ELSE 2 END,
                        alert_id DESC"""


#: :func:`_clear_of_its_raise_first` for breaker resets and domain-hold releases.
_CLEAR_OF_RESET = _clear_of_its_raise_first("/reset")
_CLEAR_OF_RELEASE = _clear_of_its_raise_first("/release")

#: :meth:`Ledger.accept_alerts`: one INSERT of the push's alerts from parallel arrays
#: (``unnest … WITH ORDINALITY`` keeps their order), counting new unmapped kinds on the way.
_ACCEPT_ALERTS = """
WITH given AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                       $7::int[], $8::text[], $9::text[], $10::text[], $11::bool[],
                       $12::text[], $13::text[], $14::text[], $15::text[], $16::text[],
                       $17::bool[], $18::bool[], $19::text[], $20::timestamptz[],
                       $21::timestamptz[])
         WITH ORDINALITY AS g(alert_id, cluster, node, machine_id, node_pool, kind, code, gpu,
                              severity, mnemonic, actionable, action, summary, description,
                              evidence_text, evidence, level, active, source, observed_at,
                              received_at, ord)
), ins AS (
  INSERT INTO alerts (alert_id, cluster, node, machine_id, node_pool, kind, code, gpu,
                      severity, mnemonic, actionable, action, summary, description,
                      evidence_text, evidence, level, active, source, observed_at,
                      received_at, handed_off_at, accepted_ord)
  SELECT alert_id, cluster, node, machine_id, node_pool, kind, code, gpu, severity, mnemonic,
         actionable, action, summary, description, evidence_text, evidence::jsonb, level,
         active, source, observed_at, received_at, NULL, ord::integer
    FROM given ORDER BY ord
  ON CONFLICT (alert_id) DO NOTHING
  RETURNING alert_id, kind, action, actionable
), unmapped AS (
  INSERT INTO unmapped_alert_counts (kind, count)
  SELECT kind, count(*) FROM ins WHERE action = 'none' AND NOT actionable GROUP BY kind
  ON CONFLICT (kind) DO UPDATE SET count = unmapped_alert_counts.count + EXCLUDED.count
)
SELECT alert_id FROM ins
"""


def ticket_id_for(run_id: str) -> str:
    """Stable ticket id of a validation run (``HW-`` + 10 hex digits of sha256)."""
    return "HW-" + hashlib.sha256(run_id.encode()).hexdigest()[:10].upper()


class Ledger:
    """Repository over one asyncpg pool. All methods are idempotent.

    ``pool``: the asyncpg pool. ``conn``: set only on the connection-scoped ledgers that
    :meth:`transaction` yields; every statement then runs on that connection.
    ``providers``: stamps each recorded alert's evidence with the node's provider facts
    (``autorepair.provider…``) unless the alert already carries them (ingest stamps
    alerts with what it knows of the node: IP, labels)."""

    def __init__(self, pool: asyncpg.Pool, conn: asyncpg.Connection | None = None,
                 providers: ProviderResolver | None = None) -> None:
        self.pool = pool
        self._conn = conn
        self.providers = providers
        # fetch/fetchrow/fetchval/execute: the pool and a connection offer the same calls.
        self._db: Any = conn if conn is not None else pool

    @contextlib.asynccontextmanager
    async def _atomic(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection in a transaction: this ledger's own (a savepoint inside the outer
        transaction) or a fresh one from the pool."""
        if self._conn is not None:
            async with self._conn.transaction():
                yield self._conn
        else:
            async with self.pool.acquire() as conn, conn.transaction():
                yield conn

    @contextlib.asynccontextmanager
    async def transaction(self, lock: tuple[int, str] | None = None) -> AsyncIterator[Ledger]:
        """A ledger whose calls share one connection and one transaction (committed when
        the block ends, rolled back when it raises; nested in the outer transaction when
        called on a connection-scoped ledger).

        ``lock``: ``(namespace, key)`` of a transaction-scoped PostgreSQL advisory lock
        (``pg_advisory_xact_lock(namespace, hashtext(key))``) taken first, so blocks with
        the same lock run one after the other across processes."""
        async with self._atomic() as conn:
            if lock is not None:
                await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", *lock)
            yield Ledger(self.pool, conn, self.providers)

    @property
    def db(self) -> Any:
        """The pool, or the connection of a connection-scoped ledger (``fetch``,
        ``fetchrow``, ``fetchval``, ``execute``): for query modules beside this one."""
        return self._db

    # -- alerts -------------------------------------------------------------------------
    def _evidence(self, alert: Alert) -> dict[str, Any]:
        """The alert's evidence stamped with its node's provider facts (``autorepair.
        provider…``) unless it carries them already."""
        if self.providers is not None and ATTRS["gpus_per_node"] not in alert.evidence:
            info = self.providers.for_node(alert.cluster, alert.node)
            return {**alert.evidence, ATTR_PROVIDER: None, **info.attributes()}
        return alert.evidence

    async def record_alert(self, alert: Alert) -> bool:
        """Insert the alert; True when new. Unmapped kinds (no action) are also counted.
        An alert ingest already accepted (:meth:`accept_alerts`) is left as it is."""
        async with self._atomic() as conn:
            status = await conn.execute(
                """INSERT INTO alerts (alert_id, cluster, node, machine_id, kind, code, gpu,
                     severity, mnemonic, actionable, action, summary, description,
                     evidence_text, evidence, level, active, source, observed_at, node_pool,
                     received_at)
                   VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,
                           $20,$21)
                   ON CONFLICT (alert_id) DO NOTHING""",
                alert.alert_id,
                alert.cluster,
                alert.node,
                alert.machine_id,
                alert.kind,
                alert.code,
                alert.gpu,
                alert.severity.value,
                alert.mnemonic,
                alert.actionable,
                alert.action.value,
                alert.summary,
                alert.description,
                alert.evidence_text,
                self._evidence(alert),
                alert.level,
                alert.active,
                alert.source,
                alert.observed_at,
                alert.node_pool,
                alert.received_at,
            )
            inserted = status.endswith(" 1")
            if inserted and alert.action == Action.none and not alert.actionable:
                await conn.execute(
                    """INSERT INTO unmapped_alert_counts (kind, count) VALUES ($1, 1)
                       ON CONFLICT (kind) DO UPDATE
                       SET count = unmapped_alert_counts.count + 1""",
                    alert.kind,
                )
        return inserted

    async def accept_alerts(self, alerts: Sequence[Alert]) -> set[str]:
        """Record the alerts ingest accepted from one push, in one statement (one round
        trip), as not yet handed off (``handed_off_at`` NULL), in the given order
        (``accepted_ord``). Returns the ids that were new: an id already recorded (a
        re-sent push, or twice in ``alerts``) is left as it is. Unmapped kinds are counted
        as by :meth:`record_alert`. Raises asyncpg / ``OSError`` errors when PostgreSQL
        cannot take them; then nothing of the push is recorded."""
        if not alerts:
            return set()
        cols: list[list[Any]] = [[] for _ in range(21)]
        for a in alerts:
            for col, v in zip(cols, (
                    a.alert_id, a.cluster, a.node, a.machine_id, a.node_pool, a.kind, a.code,
                    a.gpu, a.severity.value, a.mnemonic, a.actionable, a.action.value,
                    a.summary, a.description, a.evidence_text, json.dumps(self._evidence(a)),
                    a.level, a.active, a.source, a.observed_at, a.received_at), strict=True):
                col.append(v)
        rows = await self._db.fetch(_ACCEPT_ALERTS, *cols)
        return {r["alert_id"] for r in rows}

    async def mark_handed_off(self, alert_ids: Sequence[str]) -> int:
        """Set ``handed_off_at`` of the given alerts (still NULL) to now, in one statement;
        returns how many rows changed. Unknown ids are ignored."""
        if not alert_ids:
            return 0
        status: str = await self._db.execute(
            "UPDATE alerts SET handed_off_at = now()"
            " WHERE alert_id = ANY($1::text[]) AND handed_off_at IS NULL", list(alert_ids))
        return int(status.rsplit(" ", 1)[-1])

    async def pending_handoff(self, older_than_s: float = 0.0, limit: int = 1000
                              ) -> list[Alert]:
        """Alerts ingest accepted that no workflow has taken yet (``handed_off_at`` NULL),
        recorded at least ``older_than_s`` seconds ago, at most ``limit``, in the order they
        were accepted (per node: the order to re-deliver them in)."""
        rows = await self._db.fetch(
            """SELECT * FROM alerts
                WHERE handed_off_at IS NULL
                  AND recorded_at <= now() - make_interval(secs => $1)
                ORDER BY recorded_at, accepted_ord, alert_id LIMIT $2""",
            float(older_than_s), limit)
        return [_alert_from_row(r) for r in rows]

    async def list_alerts(
        self, *, cluster: str | None = None, node: str | None = None, limit: int = 100
    ) -> list[Alert]:
        """Newest alerts first by when the control plane received them (``received_at``,
        else ``observed_at``: I17), optionally for one cluster / node."""
        rows = await self._db.fetch(
            """SELECT * FROM alerts
               WHERE ($1::text IS NULL OR cluster = $1) AND ($2::text IS NULL OR node = $2)
               ORDER BY coalesce(received_at, observed_at) DESC, alert_id LIMIT $3""",
            cluster,
            node,
            limit,
        )
        return [_alert_from_row(r) for r in rows]

    async def get_alert(self, alert_id: str) -> Alert | None:
        row = await self._db.fetchrow("SELECT * FROM alerts WHERE alert_id = $1", alert_id)
        return _alert_from_row(row) if row else None

    async def get_alerts(self, alert_ids: list[str]) -> list[Alert]:
        """The recorded alerts among ``alert_ids``, oldest observation first (unknown ids
        left out)."""
        if not alert_ids:
            return []
        rows = await self._db.fetch("SELECT * FROM alerts WHERE alert_id = ANY($1::text[])"
                                    " ORDER BY observed_at, alert_id", alert_ids)
        return [_alert_from_row(r) for r in rows]

    async def unmapped_counts(self) -> dict[str, int]:
        rows = await self._db.fetch("SELECT kind, count FROM unmapped_alert_counts")
        return {r["kind"]: int(r["count"]) for r in rows}

    async def last_level_edges(self, cluster: str, source: str) -> list[Alert]:
        """The newest recorded edge of every level fault ``source`` raised in ``cluster``:
        per (node, kind, code, gpu), the newest level alert, raise (``active``) or clear;
        at one instant the clear. Newest first. What a watcher reads after a restart: it
        re-opens the raises and stamps later raises of a cleared fault after its clear."""
        rows = await self._db.fetch(
            """SELECT * FROM (
                 SELECT DISTINCT ON (node, kind, coalesce(code, -1), coalesce(gpu, ''))
                        * FROM alerts
                  WHERE cluster = $1 AND source = $2 AND level
                  ORDER BY node, kind, coalesce(code, -1), coalesce(gpu, ''),
                           observed_at DESC, active ASC, alert_id
               ) last ORDER BY observed_at DESC""",
            cluster,
            source,
        )
        return [_alert_from_row(r) for r in rows]

    async def node_bound_alert(self, cluster: str, node: str, kinds: Collection[str],
                               since: datetime) -> str | None:
        """The id of the newest active alert of one of ``kinds`` on ``node`` that the
        node's own agent reported (``source = 'agent'`` and ingest's stamp
        ``evidence.reported_by = 'node'``: a per-node identity) received at or after
        ``since`` (the control plane's receipt time, I17; ``observed_at`` for rows
        recorded without one);
        ``None`` when there is none. Confirms a Kubernetes node condition
        (``workers.watchers.kube``)."""
        val = await self._db.fetchval(
            """SELECT alert_id FROM alerts
               WHERE cluster = $1 AND node = $2 AND source = 'agent' AND active
                 AND kind = ANY($3::text[]) AND evidence->>'reported_by' = 'node'
                 AND coalesce(received_at, observed_at) >= $4
               ORDER BY coalesce(received_at, observed_at) DESC LIMIT 1""",
            cluster, node, list(kinds), since,
        )
        return str(val) if val is not None else None

    async def open_level_alerts(self, cluster: str, source: str) -> list[Alert]:
        """Level faults raised by ``source`` in ``cluster`` whose last recorded edge is a
        raise (no clear after it): :meth:`last_level_edges` kept when active. Newest
        first."""
        return [a for a in await self.last_level_edges(cluster, source) if a.active]

    # -- dead letters ---------------------------------------------------------------------
    async def record_dead_letter(
        self, alert: Alert, reason: str, error: str = "", attempts: int = 0
    ) -> None:
        """Keep an alert that could not be delivered (table ``dead_letters``); a second
        failure of the same alert id updates the row. ``reason``: ``rejected`` |
        ``too_large`` | ``retries_exhausted`` (anything else raises asyncpg's
        ``CheckViolationError``). An alert over 256 KiB of JSON is kept as its identity,
        kind and summary only."""
        doc = alert.model_dump(mode="json")
        size = len(alert.model_dump_json().encode())
        if size > DEAD_LETTER_MAX_BYTES:
            doc = {k: doc[k] for k in ("alert_id", "cluster", "node", "kind", "code", "gpu",
                                       "summary", "observed_at", "source")}
        await self._db.execute(
            """INSERT INTO dead_letters (alert_id, cluster, node, kind, reason, error,
                 attempts, alert_bytes, alert)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)
               ON CONFLICT (alert_id) DO UPDATE SET reason = EXCLUDED.reason,
                 error = EXCLUDED.error, attempts = EXCLUDED.attempts,
                 recorded_at = now(), replayed_at = NULL, replay_outcome = NULL""",
            alert.alert_id, alert.cluster, alert.node, alert.kind, reason, error[:2000],
            attempts, size, doc,
        )

    async def list_dead_letters(
        self, *, cluster: str | None = None, limit: int = 100, include_replayed: bool = True
    ) -> list[dict[str, Any]]:
        """Newest dead letters first: ``{"alert_id", "cluster", "node", "kind", "reason",
        "error", "attempts", "alert_bytes", "alert", "recorded_at", "replayed_at",
        "replay_outcome"}``; ``include_replayed=False`` leaves out those re-delivered."""
        rows = await self._db.fetch(
            """SELECT * FROM dead_letters WHERE ($1::text IS NULL OR cluster = $1)
                 AND ($3 OR replayed_at IS NULL)
               ORDER BY recorded_at DESC LIMIT $2""",
            cluster,
            limit,
            include_replayed,
        )
        return [dict(r) for r in rows]

    async def get_dead_letters(self, alert_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The dead letters whose id is one of ``alert_ids`` or starts with one of them
        of 8 characters or more (the shortened ids ``dead-letters list`` prints); rows as
        :meth:`list_dead_letters`. The caller tells an ambiguous prefix apart."""
        rows = await self._db.fetch(
            """SELECT * FROM dead_letters
                WHERE alert_id = ANY($1::text[])
                   OR EXISTS (SELECT 1 FROM unnest($1::text[]) p
                               WHERE length(p) >= 8 AND left(alert_id, length(p)) = p)""",
            list(alert_ids),
        )
        return [dict(r) for r in rows]

    async def pending_dead_letters(
        self, *, cluster: str | None = None, limit: int = 10_000
    ) -> list[dict[str, Any]]:
        """Dead letters not replayed, oldest receipt first (then oldest recorded),
        at most ``limit``: the order a replay must deliver them in (a fault's raise before
        its clear, even when the raise was dead-lettered again later)."""
        rows = await self._db.fetch(
            """SELECT * FROM dead_letters
                WHERE replayed_at IS NULL AND ($1::text IS NULL OR cluster = $1)
                ORDER BY coalesce((alert->>'received_at')::timestamptz,
                                  (alert->>'observed_at')::timestamptz), recorded_at
                LIMIT $2""",
            cluster,
            limit,
        )
        return [dict(r) for r in rows]

    async def clear_after(self, alert: Alert) -> datetime | None:
        """The newest receipt time of a clear of ``alert``'s fault (same cluster, node,
        kind, code and GPU) recorded in ``alerts`` and received at or after ``alert``
        was; None when there is none. Receipt times (``received_at``; ``observed_at``
        only for a row without one), never the sender's stamps (I17)."""
        at: datetime | None = await self._db.fetchval(
            """SELECT max(coalesce(received_at, observed_at)) FROM alerts
                WHERE cluster = $1 AND node = $2 AND kind = $3
                  AND coalesce(code, -1) = coalesce($4::int, -1)
                  AND coalesce(gpu, '') = coalesce($5::text, '')
                  AND level AND NOT active
                  AND coalesce(received_at, observed_at) >= $6""",
            alert.cluster, alert.node, alert.kind, alert.code, alert.gpu,
            alert.received_at or alert.observed_at,
        )
        return at

    async def mark_dead_letter_replayed(self, alert_id: str, outcome: str) -> bool:
        """Record that the node's workflow took dead letter ``alert_id`` on replay, with
        its answer ``outcome``; False when there is no such row."""
        done = await self._db.execute(
            """UPDATE dead_letters SET replayed_at = now(), replay_outcome = $2
                WHERE alert_id = $1""",
            alert_id,
            outcome,
        )
        return bool(done.endswith(" 1"))

    # -- repairs ------------------------------------------------------------------------
    async def repairs_in_flight(self, cluster: str, node: str) -> list[str]:
        """Ids of the node's repairs that have not reached a terminal stage, newest first."""
        rows = await self._db.fetch(
            """SELECT repair_id FROM repairs WHERE cluster = $1 AND node = $2
                 AND stage <> ALL($3::text[]) ORDER BY created_at DESC""",
            cluster,
            node,
            [s.value for s in TERMINAL_STAGES],
        )
        return [str(r["repair_id"]) for r in rows]

    async def upsert_repair(self, rec: RepairRecord) -> None:
        """Create the repair row or update its mutable fields (stage, action, approval).

        A terminal stage is never replaced by a non-terminal one written with an older or
        equal ``updated_at``: an activity attempt the workflow abandoned (a cancellation,
        a timed-out attempt that still ran) can land after the repair ended. A later
        time (a Temporal reset of the workflow) still moves the row on."""
        await self._db.execute(
            """INSERT INTO repairs (repair_id, cluster, node, machine_id, action, stage,
                 requester_kind, requester_name, reason, approved_by, decided_by_rule,
                 detector, request_id, alert_ids, workflow_id, created_at, updated_at,
                 lease_held, approval_pending, mode, node_pool)
               VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$16,$18,$19,
                       $20,$21)
               ON CONFLICT (repair_id) DO UPDATE SET
                 action = EXCLUDED.action,
                 lease_held = CASE WHEN EXCLUDED.updated_at >= repairs.updated_at
                                   THEN EXCLUDED.lease_held ELSE repairs.lease_held END,
                 approval_pending = CASE WHEN EXCLUDED.updated_at >= repairs.updated_at
                                         THEN EXCLUDED.approval_pending
                                         ELSE repairs.approval_pending END,
                 stage = CASE WHEN repairs.stage = ANY($17::text[])
                                   AND NOT EXCLUDED.stage = ANY($17::text[])
                                   AND EXCLUDED.updated_at <= repairs.updated_at
                              THEN repairs.stage ELSE EXCLUDED.stage END,
                 machine_id = COALESCE(EXCLUDED.machine_id, repairs.machine_id),
                 mode = COALESCE(EXCLUDED.mode, repairs.mode),
                 node_pool = COALESCE(EXCLUDED.node_pool, repairs.node_pool),
                 approved_by = COALESCE(EXCLUDED.approved_by, repairs.approved_by),
                 decided_by_rule = COALESCE(EXCLUDED.decided_by_rule, repairs.decided_by_rule),
                 alert_ids = (SELECT ARRAY(SELECT DISTINCT unnest(
                                 repairs.alert_ids || EXCLUDED.alert_ids))),
                 updated_at = GREATEST(repairs.updated_at, EXCLUDED.updated_at)""",
            rec.repair_id,
            rec.cluster,
            rec.node,
            rec.machine_id,
            rec.action.value,
            rec.stage.value,
            rec.requester.kind.value,
            rec.requester.name,
            rec.reason,
            rec.approved_by,
            rec.decided_by_rule,
            rec.detector,
            rec.request_id,
            rec.alert_ids,
            rec.workflow_id,
            rec.updated_at,
            _TERMINAL,
            rec.lease_held,
            rec.approval_pending,
            rec.mode,
            rec.node_pool,
        )

    async def record_transition(self, t: TransitionRecord) -> None:
        """Append a stage transition (idempotent on repair, stage and time) and move the
        row's stage to it, with the same guard against stale writes as
        :meth:`upsert_repair`. With ``t.write_key`` the row of that key is replaced
        instead (the same write of a workflow task run again after a crash, with a later
        ``at``: migration 0013), so the transition is recorded once. ``t.approval_pending``
        (when not None) is written with the stage, under the same freshness rule as
        :meth:`upsert_repair`."""
        args = (t.repair_id, t.stage.value, t.at, t.by, t.reason, t.write_key)
        async with self._atomic() as conn:
            done = "UPDATE 0"
            if t.write_key is not None:
                done = await conn.execute(
                    """UPDATE repair_transitions SET stage = $2, at = $3, by_whom = $4,
                         reason = $5
                       WHERE write_key = $6 AND repair_id = $1 AND NOT EXISTS (
                         SELECT 1 FROM repair_transitions o WHERE o.repair_id = $1
                           AND o.stage = $2 AND o.at = $3
                           AND o.write_key IS DISTINCT FROM $6)""",
                    *args)
            if done == "UPDATE 0":
                await conn.execute(
                    """INSERT INTO repair_transitions (repair_id, stage, at, by_whom, reason,
                         write_key)
                       VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT DO NOTHING""",
                    *args)
            await conn.execute(
                "UPDATE repairs SET stage = CASE WHEN stage = ANY($4::text[])"
                " AND NOT $2 = ANY($4::text[]) AND $3 <= updated_at THEN stage ELSE $2 END,"
                " approval_pending = CASE WHEN $5::boolean IS NOT NULL AND $3 >= updated_at"
                " THEN $5::boolean ELSE approval_pending END,"
                " updated_at = GREATEST(updated_at, $3) WHERE repair_id = $1",
                t.repair_id,
                t.stage.value,
                t.at,
                _TERMINAL,
                t.approval_pending,
            )

    async def claim_notice(self, repair_id: str, stage: str) -> dict[str, Any] | None:
        """Claim the newest ``stage`` transition of the repair for notification: returns it
        (``stage``, ``at``, ``by_whom``, ``reason``) the first time, ``None`` when it was
        claimed before or does not exist. One winner across retries and workers."""
        row = await self._db.fetchrow(
            """UPDATE repair_transitions SET notified_at = now()
               WHERE id = (SELECT id FROM repair_transitions WHERE repair_id = $1
                           AND stage = $2 ORDER BY at DESC, id DESC LIMIT 1)
                 AND notified_at IS NULL
               RETURNING stage, at, by_whom, reason""",
            repair_id,
            stage,
        )
        return dict(row) if row is not None else None

    async def get_repair(self, repair_id: str) -> dict[str, Any] | None:
        """The repair row with its ``transitions`` (oldest first; at one time a terminal
        stage sorts last, whatever order late writes landed in) and ``attempts``."""
        row = await self._db.fetchrow("SELECT * FROM repairs WHERE repair_id = $1", repair_id)
        if row is None:
            return None
        out = dict(row)
        trans = await self._db.fetch(
            "SELECT stage, at, by_whom, reason FROM repair_transitions"
            " WHERE repair_id = $1 ORDER BY at, stage = ANY($2::text[]), id",
            repair_id,
            _TERMINAL,
        )
        out["transitions"] = [dict(t) for t in trans]
        atts = await self._db.fetch(
            "SELECT action, alert_kind, code, outcome, at FROM repair_attempts"
            " WHERE repair_id = $1 ORDER BY at, id",
            repair_id,
        )
        out["attempts"] = [dict(a) for a in atts]
        down = await self._db.fetchrow(
            "SELECT * FROM repair_downtime WHERE repair_id = $1", repair_id)
        out["downtime"] = dict(down) if down is not None else None
        out["evidence"] = await self.evidence(repair_id)
        return out

    async def list_repairs(
        self,
        *,
        cluster: str | None = None,
        node: str | None = None,
        stage: str | None = None,
        action: str | None = None,
        requester: str | None = None,
        limit: int = 200,
        stages: Sequence[str] | None = None,
        asked: bool | None = None,
    ) -> list[dict[str, Any]]:
        """Repairs newest first, filtered by any of the given fields (``stages``: the stage
        is one of them; the ``limit`` newest rows that match); ``downtime``: the repair's
        ``repair_downtime`` row as a dict (JSON types) once it finished. ``asked``: rows at
        ``awaiting_approval`` only where a person is asked now (True: ``approval_pending``
        not false, NULL rows judged by their stage) or only approved ones waiting for their
        lease or a window (False); other stages pass."""
        rows = await self._db.fetch(
            """SELECT repairs.*, (SELECT to_jsonb(d) FROM repair_downtime d
                                  WHERE d.repair_id = repairs.repair_id) AS downtime
               FROM repairs
               WHERE ($1::text IS NULL OR cluster = $1) AND ($2::text IS NULL OR node = $2)
                 AND ($3::text IS NULL OR stage = $3) AND ($4::text IS NULL OR action = $4)
                 AND ($5::text IS NULL OR requester_name = $5 OR requester_kind = $5)
                 AND ($7::text[] IS NULL OR stage = ANY($7::text[]))
                 AND ($8::boolean IS NULL OR stage <> 'awaiting_approval'
                      OR (approval_pending IS NOT DISTINCT FROM false) <> $8::boolean)
               ORDER BY created_at DESC LIMIT $6""",
            cluster,
            node,
            stage,
            action,
            requester,
            limit,
            None if stages is None else list(stages),
            asked,
        )
        return [dict(r) for r in rows]

    async def repair_requester(self, repair_id: str) -> Requester | None:
        row = await self._db.fetchrow(
            "SELECT requester_kind, requester_name FROM repairs WHERE repair_id = $1", repair_id
        )
        if row is None:
            return None
        return Requester(kind=RequesterKind(row["requester_kind"]), name=row["requester_name"])

    # -- escalation history ---------------------------------------------------------------
    async def record_attempt(self, a: AttemptRecord) -> None:
        """Record an executed action; a repeat on (repair, action, at) updates the outcome.
        With ``a.write_key`` the row of that key is replaced first (the same write of a
        workflow task run again after a crash, with a later ``at``: migration 0013), so
        the attempt is counted once."""
        args = (a.repair_id, a.cluster, a.node, a.machine_id, a.action.value, a.alert_kind,
                a.code, a.outcome, a.at, a.write_key)
        async with self._atomic() as conn:
            if a.write_key is not None:
                done = await conn.execute(
                    """UPDATE repair_attempts SET machine_id = $4, action = $5,
                         alert_kind = $6, code = $7, outcome = $8, at = $9
                       WHERE write_key = $10 AND NOT EXISTS (
                         SELECT 1 FROM repair_attempts o WHERE o.repair_id = $1
                           AND o.action = $5 AND o.at = $9
                           AND o.write_key IS DISTINCT FROM $10)
                         AND repair_id = $1 AND cluster = $2 AND node = $3""",
                    *args)
                if done != "UPDATE 0":
                    return
            await conn.execute(
                """INSERT INTO repair_attempts (repair_id, cluster, node, machine_id, action,
                     alert_kind, code, outcome, at, write_key)
                   VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)
                   ON CONFLICT (repair_id, action, at) DO UPDATE SET
                     outcome = EXCLUDED.outcome""",
                *args)

    async def attempt_history(self, q: AttemptQuery) -> AttemptHistory:
        """Attempts on the machine or on the node since ``q.since`` (the ladder follows a
        node's fault episode across a migrate, and the per-node action cap counts the node),
        and critical alerts the control plane received on the machine (the node when no
        machine id) in the same period (for the migrate evidence gate; I17: by
        ``received_at``, ``observed_at`` only for alerts recorded without one)."""
        if q.machine_id:
            where, key = "cluster = $1 AND machine_id = $2", q.machine_id
        else:
            where, key = "cluster = $1 AND node = $2", q.node
        rows = await self._db.fetch(
            "SELECT * FROM repair_attempts WHERE cluster = $1 AND (node = $2 OR machine_id = $3)"
            " AND at >= $4 ORDER BY at",
            q.cluster,
            q.node,
            q.machine_id,
            q.since,
        )
        attempts = [
            AttemptRecord(
                repair_id=r["repair_id"],
                cluster=r["cluster"],
                node=r["node"],
                machine_id=r["machine_id"],
                action=Action(r["action"]),
                alert_kind=r["alert_kind"],
                code=r["code"],
                outcome=r["outcome"],
                at=r["at"],
            )
            for r in rows
        ]
        alerts = await self._db.fetch(
            f"SELECT * FROM alerts WHERE {where} AND coalesce(received_at, observed_at) >= $3"
            " AND severity = 'critical' ORDER BY coalesce(received_at, observed_at)",
            q.cluster,
            key,
            q.since,
        )
        return AttemptHistory(
            attempts=attempts, critical_alerts=[_alert_from_row(r) for r in alerts]
        )

    # -- idempotency ----------------------------------------------------------------------
    async def claim_request(self, c: ClaimInput) -> ClaimResult:
        """Claim detector + request id for ``c.repair_id``; returns the repair that owns it.

        Two racing claims produce one winner; the loser gets the winner's repair id.
        """
        row = await self._db.fetchrow(
            """INSERT INTO idempotency_keys (detector, request_id, repair_id, cluster, node)
               VALUES ($1,$2,$3,$4,$5) ON CONFLICT (detector, request_id) DO NOTHING
               RETURNING repair_id""",
            c.detector,
            c.request_id,
            c.repair_id,
            c.cluster,
            c.node,
        )
        if row is not None:
            return ClaimResult(repair_id=row["repair_id"], created=True)
        existing = await self._db.fetchval(
            "SELECT repair_id FROM idempotency_keys WHERE detector = $1 AND request_id = $2",
            c.detector,
            c.request_id,
        )
        return ClaimResult(repair_id=str(existing), created=False)

    async def count_detector_repairs(self, cluster: str, open_only: bool = True,
                                     detector: str | None = None) -> int:
        """Detector-requested repairs of the cluster (in flight only when ``open_only``; of
        ``detector`` only when given)."""
        terminal = _TERMINAL
        val = await self._db.fetchval(
            """SELECT count(*) FROM repairs WHERE cluster = $1 AND requester_kind = 'detector'
               AND (NOT $2 OR stage <> ALL($3::text[]))
               AND ($4::text IS NULL OR detector = $4)""",
            cluster,
            open_only,
            list(terminal),
            detector,
        )
        return int(val or 0)

    # -- cluster guard ----------------------------------------------------------------------
    async def guard_state(self, q: GuardStateQuery) -> GuardLedgerState:
        """What a freshly started cluster guard rebuilds (see :class:`GuardLedgerState`):
        open repairs in :data:`HOLDING_STAGES` or that record holding a lease
        (``repairs.lease_held``: granted and not handed back — before its cordon, or
        waiting for a person after it acted), automatic repairs that cordoned (or
        ended ``shadowed``: shadow mode's stand-in for the cordon) since ``q.since`` (their
        lease was granted), the guard's newest circuit-breaker alert and its last reset
        (newest clear), and per failure domain the hold in force and the last release.
        ``gpu_nodes_reported`` stays 0: nodes named by alerts are no denominator
        (issue 27 item 9)."""
        # the holder records its lease (I21): one granted before its cordon, or waiting
        # for a person after it acted, counts; one that handed it back (a stale cordon a
        # person must look at, a maintenance window) does not
        rows = await self.pool.fetch(
            """SELECT repair_id, node, workflow_id, approved_by, requester_kind, stage,
                      created_at, node_pool
               FROM repairs r WHERE cluster = $1 AND (stage = ANY($2::text[])
                 OR (lease_held AND NOT stage = ANY($3::text[])))
               ORDER BY created_at""",
            q.cluster,
            list(HOLDING_STAGES),
            list(_TERMINAL),
        )
        holders = [
            HeldRepair(
                repair_id=r["repair_id"],
                node=r["node"],
                workflow_id=r["workflow_id"],
                automatic=r["approved_by"] == AUTO_APPROVED,
                requester_kind=r["requester_kind"],
                stage=Stage(r["stage"]),
                requested_at=r["created_at"],
                node_pool=r["node_pool"],
            )
            for r in rows
        ]
        auto = await self.pool.fetch(
            """SELECT r.repair_id, min(t.at) AS at
               FROM repairs r JOIN repair_transitions t ON t.repair_id = r.repair_id
               WHERE r.cluster = $1 AND r.approved_by = $2 AND t.stage = ANY($3::text[])
                 AND t.at >= $4
               GROUP BY r.repair_id ORDER BY at""",
            q.cluster,
            AUTO_APPROVED,
            # a shadowed repair stands for the cordon it would have set (issue 29 item 3)
            [Stage.cordoning.value, Stage.shadowed.value],
            q.since,
        )
        # the newest breaker row; at one instant (a reset and a trip decided in one guard
        # step) the reset of the trip of that instant (its id: the trip's + "/reset")
        # follows the trip, and a trip follows the reset of an earlier trip (a reset
        # racing a new trip): the breaker is as the guard left it
        breaker = await self.pool.fetchrow(
            f"""SELECT active, observed_at, evidence FROM alerts a
               WHERE cluster = $1 AND kind = $2 AND source = $3 AND node = '*'
               ORDER BY observed_at DESC,
                        {_CLEAR_OF_RESET}
               LIMIT 1""",
            q.cluster,
            BREAKER_KIND,
            BREAKER_SOURCE,
        )
        is_open = bool(breaker is not None and breaker["active"])
        # the last reset, whatever came after it: a trip since (the breaker open again)
        # does not undo what the reset marked (I23: a request first asked for before it,
        # a person's budget-queued one too, acts only on evidence after it)
        reset_row = await self.pool.fetchrow(
            """SELECT observed_at, evidence->>'by' AS by FROM alerts
               WHERE cluster = $1 AND kind = $2 AND source = $3 AND node = '*'
                 AND NOT active
               ORDER BY observed_at DESC LIMIT 1""",
            q.cluster,
            BREAKER_KIND,
            BREAKER_SOURCE,
        )
        last_reset = reset_row["observed_at"] if reset_row is not None else None
        evidence = (breaker["evidence"] or {}) if breaker is not None else {}
        # per domain the guard's newest hold row: a raise is a hold in force, a
        # release's clear is none (issue 29 item 2). At one instant (a release and the
        # faults that hold the domain again decided in one guard step) the release of the
        # hold raised at that instant (its id: the raise's + "/release") follows its
        # raise, and a raise follows the release of an earlier hold: the domain is as the
        # guard left it
        domain_rows = await self.pool.fetch(
            f"""SELECT * FROM (SELECT DISTINCT ON (evidence->>'domain') alert_id, active,
                      observed_at, description, evidence FROM alerts a
               WHERE cluster = $1 AND kind = $2 AND source = $3 AND node = '*'
                 AND evidence ? 'domain'
               ORDER BY evidence->>'domain', observed_at DESC,
                        {_CLEAR_OF_RELEASE}) d
               WHERE active ORDER BY observed_at""",
            q.cluster,
            DOMAIN_KIND,
            BREAKER_SOURCE,
        )
        holds = []
        for r in domain_rows:
            ev = r["evidence"] or {}
            holds.append(DomainHold(
                domain=str(ev["domain"]), opened_at=r["observed_at"],
                nodes=[str(n) for n in ev.get("nodes") or []],
                kinds=[str(k) for k in ev.get("kinds") or []],
                alert_id=r["alert_id"], reason=r["description"] or ""))
        # per domain the guard's newest release (a hold's clear, at the guard's clock):
        # a rebuilt guard marks a request first asked for before it (the release marked
        # the requests its hold kept queued; a restart lost that queue)
        release_rows = await self.pool.fetch(
            """SELECT DISTINCT ON (evidence->>'domain') observed_at, description, evidence
               FROM alerts
               WHERE cluster = $1 AND kind = $2 AND source = $3 AND node = '*'
                 AND NOT active AND evidence ? 'domain'
               ORDER BY evidence->>'domain', observed_at DESC""",
            q.cluster,
            DOMAIN_KIND,
            BREAKER_SOURCE,
        )
        releases = []
        for r in release_rows:
            ev = r["evidence"] or {}
            opened = ev.get("opened_at")
            releases.append(DomainRelease(
                domain=str(ev["domain"]), by=str(ev.get("by") or ""),
                reason=str(ev.get("reason") or r["description"] or ""), at=r["observed_at"],
                opened_at=datetime.fromisoformat(opened) if isinstance(opened, str) else None))
        return GuardLedgerState(
            holders=holders,
            automatic=[AutomaticStart(repair_id=r["repair_id"], at=r["at"]) for r in auto],
            breaker_open=is_open,
            tripped_at=breaker["observed_at"] if is_open and breaker is not None else None,
            tripped_reason=str(evidence.get("reason", "")) if is_open else "",
            domain_holds=holds,
            reset_at=last_reset,
            reset_by=reset_row["by"] if reset_row is not None else None,
            domain_releases=sorted(releases, key=lambda r: r.at),
        )

    async def open_repair(
        self, cluster: str, node: str, repair_id: str | None = None
    ) -> dict[str, Any] | None:
        """``{"repair_id", "workflow_id", "stage"}`` of repair ``repair_id`` (any stage),
        or of the node's newest open repair that has a workflow when ``repair_id`` is
        None; None when there is no such row."""
        if repair_id is not None:
            row = await self.pool.fetchrow(
                "SELECT repair_id, workflow_id, stage FROM repairs WHERE repair_id = $1",
                repair_id,
            )
        else:
            row = await self.pool.fetchrow(
                """SELECT repair_id, workflow_id, stage FROM repairs
                   WHERE cluster = $1 AND node = $2 AND workflow_id IS NOT NULL
                     AND stage <> ALL($3::text[])
                   ORDER BY created_at DESC LIMIT 1""",
                cluster,
                node,
                _TERMINAL,
            )
        return dict(row) if row is not None else None

    async def last_ended_repair(self, cluster: str, node: str) -> dict[str, Any] | None:
        """``{"repair_id", "stage", "ended_at", "actions", "alert_ids"}`` of the node's
        newest repair in a terminal stage (``ended_at``: its terminal transition, else the
        row's last update; ``actions``: what its attempts ran, shadowed ones not), or
        None."""
        row = await self.pool.fetchrow(
            """SELECT r.repair_id, r.stage, r.alert_ids,
                      coalesce((SELECT max(t.at) FROM repair_transitions t
                                WHERE t.repair_id = r.repair_id AND t.stage = r.stage),
                               r.updated_at) AS ended_at,
                      coalesce((SELECT array_agg(DISTINCT a.action) FROM repair_attempts a
                                WHERE a.repair_id = r.repair_id
                                  AND a.outcome <> 'shadowed'), '{}') AS actions
               FROM repairs r
               WHERE r.cluster = $1 AND r.node = $2 AND r.stage = ANY($3::text[])
               ORDER BY r.updated_at DESC LIMIT 1""",
            cluster,
            node,
            _TERMINAL,
        )
        return dict(row) if row is not None else None

    # -- validation -----------------------------------------------------------------------
    async def record_verdict(self, v: VerdictRecord) -> None:
        """Record the verdict of a run; a pass closes the machine's open tickets (unless
        ``v.close_tickets`` is false: a removed machine keeps its RMA ticket)."""
        async with self._atomic() as conn:
            await conn.execute(
                """INSERT INTO validation_verdicts (run_id, cluster, machine, verdict, result, at)
                   VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (run_id) DO NOTHING""",
                v.run_id,
                v.cluster,
                v.machine,
                v.verdict.value,
                v.result.model_dump(mode="json"),
                v.at,
            )
            if v.verdict.value == "passed" and v.close_tickets:
                await conn.execute(
                    """UPDATE hardware_tickets SET status = 'closed', closed_at = $2
                       WHERE machine = $1 AND status = 'open'""",
                    v.machine,
                    v.at,
                )

    async def machine_hold(self, cluster: str, machine: str | None) -> dict[str, Any] | None:
        """The machine's RMA hold (issue 26 I18), or None when it is not held: its newest
        removal (a succeeded ``remove`` attempt in ``repair_attempts``, or its
        ``removed_machines`` row) when no return (``machine_returns``) lifted it: a
        return lifts the removals up to the newest one it saw (``lifts_through``),
        whatever the clocks, so a later removal holds again.
        Returns ``{"machine", "since", "repair_id", "reason"}``."""
        if not machine:
            return None
        row = await self._db.fetchrow(
            """SELECT since, repair_id, reason FROM (
                   SELECT at AS since, repair_id, 'removed for RMA' AS reason
                     FROM repair_attempts
                    WHERE cluster = $1 AND machine_id = $2 AND action = 'remove'
                      AND outcome = 'succeeded'
                   UNION ALL
                   SELECT removed_at, repair_id,
                          COALESCE(NULLIF(reason, ''), 'removed for RMA')
                     FROM removed_machines WHERE cluster = $1 AND machine = $2
               ) h
               WHERE NOT EXISTS (SELECT 1 FROM machine_returns r
                                  WHERE r.cluster = $1 AND r.machine = $2
                                    AND COALESCE(r.lifts_through, r.returned_at)
                                        >= h.since)
               ORDER BY since DESC LIMIT 1""",
            cluster, machine,
        )
        if row is None:
            return None
        return {"machine": machine, "since": row["since"], "repair_id": row["repair_id"],
                "reason": str(row["reason"])}

    async def held_machines(self, cluster: str | None = None) -> list[dict[str, Any]]:
        """Every machine held for RMA now (as :meth:`machine_hold`, for all machines of
        ``cluster``, or of every cluster with ``None``), ordered by cluster and machine.
        Returns ``[{"cluster", "machine", "since", "repair_id", "reason"}, ...]``."""
        rows = await self._db.fetch(
            """SELECT DISTINCT ON (h.cluster, h.machine)
                      h.cluster, h.machine, h.since, h.repair_id, h.reason FROM (
                   SELECT cluster, machine_id AS machine, at AS since, repair_id,
                          'removed for RMA' AS reason
                     FROM repair_attempts
                    WHERE action = 'remove' AND outcome = 'succeeded'
                      AND machine_id IS NOT NULL AND machine_id <> ''
                      AND ($1::text IS NULL OR cluster = $1)
                   UNION ALL
                   SELECT cluster, machine, removed_at, repair_id,
                          COALESCE(NULLIF(reason, ''), 'removed for RMA')
                     FROM removed_machines WHERE $1::text IS NULL OR cluster = $1
               ) h
               WHERE NOT EXISTS (SELECT 1 FROM machine_returns r
                                  WHERE r.cluster = h.cluster AND r.machine = h.machine
                                    AND r.returned_at >= h.since)
               ORDER BY h.cluster, h.machine, h.since DESC""",
            cluster,
        )
        return [{"cluster": r["cluster"], "machine": r["machine"], "since": r["since"],
                 "repair_id": r["repair_id"], "reason": str(r["reason"])} for r in rows]

    async def return_machine(self, cluster: str, machine: str, by: str, reason: str
                             ) -> dict[str, Any] | None:
        """An operator returns a held machine to service: records the return and takes
        it off ``removed_machines`` (its spare-pool exclusion) in one transaction.
        Idempotent: a machine that is not held is left as it is and None is returned;
        otherwise the hold that was lifted (as :meth:`machine_hold`)."""
        if not by:
            raise ValueError("by: the operator returning the machine must be named (got '')")
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))",
                               f"machine-return/{cluster}/{machine}")
            hold = await Ledger(self.pool, conn).machine_hold(cluster, machine)
            if hold is None:
                return None
            await conn.execute(
                "INSERT INTO machine_returns (cluster, machine, returned_by, reason,"
                " lifts_through) VALUES ($1, $2, $3, $4, $5)",
                cluster, machine, by, reason, hold["since"])
            await conn.execute(
                "DELETE FROM removed_machines WHERE cluster = $1 AND machine = $2",
                cluster, machine)
        return hold

    async def latest_verdict(self, machine: str) -> dict[str, Any] | None:
        row = await self._db.fetchrow(
            "SELECT * FROM validation_verdicts WHERE machine = $1 ORDER BY at DESC LIMIT 1",
            machine,
        )
        return dict(row) if row else None

    async def record_evidence(self, e: EvidenceRecord) -> bool:
        """Store the evidence captured for repair ``e.repair_id`` before ``e.action``
        (attempt ``e.attempt``); True when recorded now, False when that key already had
        its row (a retried activity: the first write stays). The row's cluster, node and
        machine come from the repair's row. Raises ``KeyError`` naming the repair id when
        the repair is unknown."""
        c = e.capture
        row = await self._db.fetchrow(
            """INSERT INTO repair_evidence (repair_id, action, attempt, cluster, node, machine,
                 node_capture, bmc_capture, notes, summary, captured_at)
               SELECT r.repair_id, $2, $3, r.cluster, r.node, COALESCE(r.machine_id, r.node),
                      $4, $5, $6, $7, $8
               FROM repairs r WHERE r.repair_id = $1
               ON CONFLICT (repair_id, action, attempt) DO NOTHING
               RETURNING repair_id""",
            e.repair_id, e.action.value, e.attempt,
            c.node.model_dump(mode="json") if c.node else None,
            c.bmc.model_dump(mode="json") if c.bmc else None,
            list(c.notes), c.summary(), e.at,
        )
        if row is not None:
            return True
        known = await self._db.fetchval(
            "SELECT 1 FROM repairs WHERE repair_id = $1", e.repair_id)
        if known is None:
            raise KeyError(f"repair_id: no repair {e.repair_id!r} in the ledger")
        return False

    async def evidence(self, repair_id: str) -> list[dict[str, Any]]:
        """The evidence rows of a repair, oldest first: ``{"action", "attempt", "node"
        (NodeCapture JSON or None), "bmc" (BmcCapture JSON or None), "notes", "summary",
        "captured_at"}``."""
        rows = await self._db.fetch(
            """SELECT action, attempt, node_capture AS node, bmc_capture AS bmc, notes,
                      summary, captured_at FROM repair_evidence
               WHERE repair_id = $1 ORDER BY captured_at, action, attempt""", repair_id)
        return [dict(r) for r in rows]

    async def machine_evidence(self, cluster: str, machine: str) -> list[dict[str, Any]]:
        """The evidence of the newest repair of ``machine`` that captured any (what a
        hardware ticket of the machine carries), as :meth:`evidence` rows plus
        ``repair_id``; empty when none did."""
        rid = await self._db.fetchval(
            """SELECT repair_id FROM repair_evidence WHERE cluster = $1 AND machine = $2
               ORDER BY captured_at DESC LIMIT 1""", cluster, machine)
        if rid is None:
            return []
        return [{"repair_id": rid, **r} for r in await self.evidence(rid)]

    async def open_ticket(self, t: TicketInput) -> TicketResult:
        """Open (once per run) a hardware ticket carrying every test's result and the
        evidence captured before the newest repair of the machine that captured any
        (:meth:`machine_evidence`; also in the result, ``evidence``)."""
        ticket_id = ticket_id_for(t.run_id)
        evidence = await self.machine_evidence(t.cluster, t.machine)
        await self._db.execute(
            """INSERT INTO hardware_tickets (ticket_id, cluster, machine, run_id, summary, result,
                 evidence)
               VALUES ($1,$2,$3,$4,$5,$6,$7) ON CONFLICT (run_id) DO NOTHING""",
            ticket_id,
            t.cluster,
            t.machine,
            t.run_id,
            t.summary,
            t.result.model_dump(mode="json"),
            [{**e, "captured_at": e["captured_at"].isoformat()} for e in evidence],
        )
        stored = await self._db.fetchval(
            "SELECT evidence FROM hardware_tickets WHERE run_id = $1", t.run_id)
        return TicketResult(ticket_id=ticket_id,
                            evidence=[str(e.get("summary", "")) for e in stored or []])

    async def open_tickets(self, machine: str | None = None) -> list[dict[str, Any]]:
        rows = await self._db.fetch(
            """SELECT * FROM hardware_tickets WHERE status = 'open'
               AND ($1::text IS NULL OR machine = $1) ORDER BY opened_at""",
            machine,
        )
        return [dict(r) for r in rows]


def utcnow() -> datetime:
    """Timezone-aware now (UTC); for code outside workflows only."""
    return datetime.now(UTC)
