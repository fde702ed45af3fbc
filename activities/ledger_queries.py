"""Read-only queries over the ledger for the query layer (``autorepair mcp``).

:func:`connect_read_only` opens an asyncpg pool whose sessions run with PostgreSQL's
``default_transaction_read_only = on``, so every statement sent through it is refused by
the server if it would write (SQLSTATE 25006 ``read_only_sql_transaction``), whatever the
caller does. The functions here only ``SELECT``; they take such a pool (or any pool) and
return plain values, pydantic models of :mod:`workflows.models`, or dicts of JSON types.

Filters are bound parameters (never interpolated); ``limit`` arguments are applied in SQL,
so an answer never holds more rows than asked for.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import asyncpg

from workflows.models import TERMINAL_STAGES, Alert

#: Terminal stage names (docs/design.md §4.4), as stored in ``repairs.stage``.
_TERMINAL = tuple(sorted(s.value for s in TERMINAL_STAGES))


async def _init_conn(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def connect_read_only(
    dsn: str, *, schema: str | None = None, max_size: int = 4
) -> asyncpg.Pool:
    """A pool on ``dsn`` whose transactions are read-only (see module docstring).

    ``schema``: search path (tests use one schema per test); ``max_size``: connections.
    Raises ``asyncpg.PostgresError`` / ``OSError`` when PostgreSQL is unreachable or
    refuses the login."""
    settings = {"default_transaction_read_only": "on"}
    if schema:
        settings["search_path"] = schema
    pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=max_size, init=_init_conn, server_settings=settings
    )
    assert pool is not None
    return pool


def _alert(row: asyncpg.Record) -> Alert:
    return Alert.model_validate({k: row[k] for k in row.keys() if k != "recorded_at"})


async def find_alerts(
    pool: asyncpg.Pool,
    *,
    cluster: str | None = None,
    node: str | None = None,
    kind: str | None = None,
    severity: str | None = None,
    active: bool | None = None,
    since: datetime | None = None,
    limit: int = 50,
) -> list[Alert]:
    """Alerts newest first by when the control plane received them (``received_at``;
    ``observed_at`` for an alert that never passed ingest: I17, a sender's clock never
    orders or windows them), filtered by every argument that is not None; ``since``:
    received at or after it. At most ``limit`` rows."""
    rows = await pool.fetch(
        """SELECT * FROM alerts
           WHERE ($1::text IS NULL OR cluster = $1) AND ($2::text IS NULL OR node = $2)
             AND ($3::text IS NULL OR kind = $3) AND ($4::text IS NULL OR severity = $4)
             AND ($5::boolean IS NULL OR active = $5)
             AND ($6::timestamptz IS NULL OR coalesce(received_at, observed_at) >= $6)
           ORDER BY coalesce(received_at, observed_at) DESC, alert_id LIMIT $7""",
        cluster, node, kind, severity, active, since, limit,
    )
    return [_alert(r) for r in rows]


async def occurrence_times(
    pool: asyncpg.Pool, cluster: str, node: str, kind: str, code: int | None,
    since: datetime, until: datetime, *, same_gpu: tuple[str | None, str] | None = None,
    limit: int = 1000,
) -> list[datetime]:
    """Receipt times (``received_at``, else ``observed_at``: the clock the NodeWorkflow
    counts on, I17) of raised (``active``) alerts of ``kind``/``code`` on the node in
    ``[since, until]``, oldest first (at most ``limit``, the newest kept): what the
    NodeWorkflow counts for count-in-window thresholds. ``same_gpu``: ``(gpu, gpc)`` to
    count only repeats on that GPU and GPC (``evidence.gpc``, else ``evidence.tpc``, else
    empty: the key of :func:`workflows.policy.repeat_key`)."""
    gpu, gpc = same_gpu if same_gpu is not None else (None, "")
    rows = await pool.fetch(
        """SELECT at FROM (
             SELECT coalesce(received_at, observed_at) AS at FROM alerts
             WHERE cluster = $1 AND node = $2 AND kind = $3 AND code IS NOT DISTINCT FROM $4
               AND active AND coalesce(received_at, observed_at) >= $5
               AND coalesce(received_at, observed_at) <= $6
               AND (NOT $7 OR (coalesce(gpu, '') = coalesce($8, '')
                    AND coalesce(evidence->>'gpc', evidence->>'tpc', '') = $9))
             ORDER BY at DESC LIMIT $10) t ORDER BY at""",
        cluster, node, kind, code, since, until, same_gpu is not None, gpu, gpc, limit,
    )
    return [r["at"] for r in rows]


async def find_repairs(
    pool: asyncpg.Pool,
    *,
    cluster: str | None = None,
    node: str | None = None,
    stages: list[str] | None = None,
    action: str | None = None,
    requester: str | None = None,
    limit: int = 50,
    asked: bool | None = None,
) -> list[dict[str, Any]]:
    """Repair rows newest first (``created_at``), filtered by every argument that is not
    None; ``stages``: any of these stage names; ``requester``: its name or its kind;
    ``asked``: rows at ``awaiting_approval`` only where a person is asked now (True;
    ``approval_pending`` not false) or only approved ones waiting for their lease or a
    window (False), other stages pass (as :meth:`activities.ledger.Ledger.list_repairs`).
    At most ``limit`` rows."""
    rows = await pool.fetch(
        """SELECT * FROM repairs
           WHERE ($1::text IS NULL OR cluster = $1) AND ($2::text IS NULL OR node = $2)
             AND ($3::text[] IS NULL OR stage = ANY($3)) AND ($4::text IS NULL OR action = $4)
             AND ($5::text IS NULL OR requester_name = $5 OR requester_kind = $5)
             AND ($7::boolean IS NULL OR stage <> 'awaiting_approval'
                  OR (approval_pending IS NOT DISTINCT FROM false) <> $7::boolean)
           ORDER BY created_at DESC, repair_id LIMIT $6""",
        cluster, node, stages, action, requester, limit, asked,
    )
    return [dict(r) for r in rows]


async def clusters_of_node(pool: asyncpg.Pool, node: str, *, limit: int = 20) -> list[str]:
    """Clusters in which the ledger has an alert or a repair of ``node``, sorted."""
    rows = await pool.fetch(
        """SELECT cluster FROM (SELECT DISTINCT cluster FROM alerts WHERE node = $1
                                UNION SELECT DISTINCT cluster FROM repairs WHERE node = $1) c
           ORDER BY cluster LIMIT $2""", node, limit)
    return [r["cluster"] for r in rows]


async def alert_counts(
    pool: asyncpg.Pool, *, cluster: str | None, since: datetime, top: int = 10
) -> dict[str, Any]:
    """Alert counts received since ``since`` (``received_at``, else ``observed_at``; of
    ``cluster`` or all): ``{"total",
    "by_severity": {severity: n}, "actionable", "top_kinds": [{"kind", "count"}],
    "top_nodes": [{"cluster", "node", "count", "critical"}]}`` (``top`` of each, most
    first)."""
    args = (cluster, since)
    where = "($1::text IS NULL OR cluster = $1) AND coalesce(received_at, observed_at) >= $2"
    sev = await pool.fetch(
        f"SELECT severity, count(*) AS n, count(*) FILTER (WHERE actionable) AS act"
        f" FROM alerts WHERE {where} GROUP BY severity", *args)
    kinds = await pool.fetch(
        f"SELECT kind, count(*) AS n FROM alerts WHERE {where}"
        f" GROUP BY kind ORDER BY n DESC, kind LIMIT $3", *args, top)
    nodes = await pool.fetch(
        f"SELECT cluster, node, count(*) AS n,"
        f" count(*) FILTER (WHERE severity = 'critical') AS crit FROM alerts WHERE {where}"
        f" GROUP BY cluster, node ORDER BY n DESC, cluster, node LIMIT $3", *args, top)
    return {
        "total": sum(int(r["n"]) for r in sev),
        "by_severity": {r["severity"]: int(r["n"]) for r in sev},
        "actionable": sum(int(r["act"]) for r in sev),
        "top_kinds": [{"kind": r["kind"], "count": int(r["n"])} for r in kinds],
        "top_nodes": [{"cluster": r["cluster"], "node": r["node"], "count": int(r["n"]),
                       "critical": int(r["crit"])} for r in nodes],
    }


async def repair_counts(
    pool: asyncpg.Pool, *, cluster: str | None, since: datetime
) -> dict[str, int]:
    """Repairs by stage: every repair not yet terminal (whenever created) plus the
    repairs created since ``since``; ``terminal``: the terminal stage names."""
    rows = await pool.fetch(
        """SELECT stage, count(*) AS n FROM repairs
           WHERE ($1::text IS NULL OR cluster = $1)
             AND (created_at >= $2 OR stage <> ALL($3::text[]))
           GROUP BY stage""",
        cluster, since, list(_TERMINAL),
    )
    return {r["stage"]: int(r["n"]) for r in rows}


async def clusters_seen(pool: asyncpg.Pool, *, limit: int = 100) -> list[str]:
    """Cluster names found in alerts or repairs, sorted (at most ``limit``)."""
    rows = await pool.fetch(
        """SELECT cluster FROM (SELECT DISTINCT cluster FROM alerts
                                UNION SELECT DISTINCT cluster FROM repairs) c
           ORDER BY cluster LIMIT $1""", limit)
    return [r["cluster"] for r in rows]


async def open_tickets_count(pool: asyncpg.Pool) -> int:
    """Open hardware tickets."""
    return int(await pool.fetchval(
        "SELECT count(*) FROM hardware_tickets WHERE status = 'open'") or 0)


#: Columns of an alert row the what-if replays (everything :class:`Alert` holds).
_WHATIF_COLS = ("alert_id, cluster, node, machine_id, node_pool, kind, code, gpu, severity, "
                "mnemonic, actionable, action, summary, description, evidence_text, evidence, "
                "level, active, source, observed_at, received_at, "
                "coalesce(received_at, observed_at) AS _at")


async def whatif_alerts(
    pool: asyncpg.Pool, since: datetime, until: datetime, *, cluster: str | None = None,
    batch: int = 5000,
) -> AsyncIterator[list[Alert]]:
    """The node alerts the control plane received in ``[since, until)`` (``cluster``
    only, when given), in receipt order (``received_at``, ``observed_at`` for a row
    without one — recorded before migration 0014 —, then ``alert_id``; never the
    sender's clock, I17), ``batch`` rows a query (keyset
    pages: the answer is never held in one result). The guard's own cluster alerts (kinds
    ``circuit_breaker`` and ``failure_domain``) are left out: the replay's guard raises its
    own. Raises
    ``ValueError`` naming ``batch`` when it is below 1."""
    if batch < 1:
        raise ValueError(f"batch: must be at least 1 (got {batch})")
    after_t: datetime | None = None
    after_id = ""
    while True:
        rows = await pool.fetch(
            f"""SELECT {_WHATIF_COLS} FROM alerts
                WHERE coalesce(received_at, observed_at) >= $1
                  AND coalesce(received_at, observed_at) < $2
                  AND ($3::text IS NULL OR cluster = $3)
                  AND kind NOT IN ('circuit_breaker', 'failure_domain')
                  AND ($4::timestamptz IS NULL
                       OR (coalesce(received_at, observed_at), alert_id) > ($4, $5))
                ORDER BY coalesce(received_at, observed_at), alert_id LIMIT $6""",
            since, until, cluster, after_t, after_id, batch,
        )
        if not rows:
            return
        yield [Alert.model_validate({k: v for k, v in dict(r).items() if k != "_at"})
               for r in rows]
        after_t, after_id = rows[-1]["_at"], rows[-1]["alert_id"]
        if len(rows) < batch:
            return


async def whatif_measures(
    pool: asyncpg.Pool, since: datetime, until: datetime, *, cluster: str | None = None,
) -> tuple[dict[str, dict[str, float]], float | None, dict[tuple[str, str, str], list[str]]]:
    """What the ledger measured in ``[since, until)`` for the what-if: the median seconds
    repairs of each action spent in ``waiting_for_idle``, ``draining``, ``repairing``
    (``migrating`` filed as ``repairing``) and ``joining`` (a stage's time: from its
    transition to the repair's next one); the median wait in ``awaiting_approval`` (None:
    no repair waited); the recorded attempt outcomes per ``(cluster, node, action)``,
    oldest first."""
    rows = await pool.fetch(
        """WITH t AS (
             SELECT r.action, CASE WHEN x.stage = 'migrating' THEN 'repairing' ELSE x.stage END
                    AS stage,
                    EXTRACT(EPOCH FROM (LEAD(x.at) OVER (PARTITION BY x.repair_id
                                                         ORDER BY x.at, x.id) - x.at)) AS s
               FROM repair_transitions x JOIN repairs r USING (repair_id)
              WHERE r.created_at >= $1 AND r.created_at < $2
                AND ($3::text IS NULL OR r.cluster = $3))
           SELECT action, stage, percentile_cont(0.5) WITHIN GROUP (ORDER BY s) AS median
             FROM t WHERE s IS NOT NULL AND stage IN ('waiting_for_idle', 'draining',
                  'repairing', 'joining', 'awaiting_approval')
            GROUP BY action, stage ORDER BY action, stage""",
        since, until, cluster,
    )
    by_action: dict[str, dict[str, float]] = {}
    waits: list[float] = []
    for r in rows:
        if r["stage"] == "awaiting_approval":
            waits.append(float(r["median"]))
        else:
            by_action.setdefault(r["action"], {})[r["stage"]] = float(r["median"])
    approval: float | None = None
    if waits:
        row = await pool.fetchrow(
            """WITH t AS (
                 SELECT x.stage, EXTRACT(EPOCH FROM (LEAD(x.at) OVER (
                          PARTITION BY x.repair_id ORDER BY x.at, x.id) - x.at)) AS s
                   FROM repair_transitions x JOIN repairs r USING (repair_id)
                  WHERE r.created_at >= $1 AND r.created_at < $2
                    AND ($3::text IS NULL OR r.cluster = $3))
               SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s) AS median
                 FROM t WHERE stage = 'awaiting_approval' AND s IS NOT NULL""",
            since, until, cluster,
        )
        approval = None if row is None or row["median"] is None else float(row["median"])
    outcomes: dict[tuple[str, str, str], list[str]] = {}
    for r in await pool.fetch(
            """SELECT cluster, node, action, outcome FROM repair_attempts
                WHERE at >= $1 AND at < $2 AND ($3::text IS NULL OR cluster = $3)
                ORDER BY at, id""", since, until, cluster):
        outcomes.setdefault((r["cluster"], r["node"], r["action"]), []).append(r["outcome"])
    return by_action, approval, outcomes


async def breaker_reset_median(
    pool: asyncpg.Pool, since: datetime, until: datetime, *, cluster: str | None = None,
) -> float | None:
    """Median seconds from a breaker trip (a ``circuit_breaker`` alert raised) to its reset
    (the next one cleared, same cluster) for trips in ``[since, until)``; None when no
    trip of the window was reset."""
    row = await pool.fetchrow(
        """WITH b AS (
             SELECT cluster, active, observed_at,
                    LEAD(active) OVER w AS next_active, LEAD(observed_at) OVER w AS next_at
               FROM alerts WHERE kind = 'circuit_breaker'
                AND ($3::text IS NULL OR cluster = $3)
             WINDOW w AS (PARTITION BY cluster ORDER BY observed_at, alert_id))
           SELECT percentile_cont(0.5) WITHIN GROUP (
                    ORDER BY EXTRACT(EPOCH FROM (next_at - observed_at))) AS median
             FROM b WHERE active AND next_active IS FALSE
              AND observed_at >= $1 AND observed_at < $2""",
        since, until, cluster,
    )
    return None if row is None or row["median"] is None else float(row["median"])


async def domain_release_median(
    pool: asyncpg.Pool, since: datetime, until: datetime, *, cluster: str | None = None,
) -> float | None:
    """Median seconds from a failure-domain hold (a ``failure_domain`` alert raised) to its
    release (the next one of the same cluster and domain, ``evidence.domain``, cleared)
    for holds in ``[since, until)``; None when no hold of the window was released."""
    row = await pool.fetchrow(
        """WITH d AS (
             SELECT active, observed_at,
                    LEAD(active) OVER w AS next_active, LEAD(observed_at) OVER w AS next_at
               FROM alerts WHERE kind = 'failure_domain'
                AND ($3::text IS NULL OR cluster = $3)
             WINDOW w AS (PARTITION BY cluster, evidence->>'domain'
                          ORDER BY observed_at, alert_id))
           SELECT percentile_cont(0.5) WITHIN GROUP (
                    ORDER BY EXTRACT(EPOCH FROM (next_at - observed_at))) AS median
             FROM d WHERE active AND next_active IS FALSE
              AND observed_at >= $1 AND observed_at < $2""",
        since, until, cluster,
    )
    return None if row is None or row["median"] is None else float(row["median"])
