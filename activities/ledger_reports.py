"""Downtime records and the fleet report over the ledger (``repair_downtime``).

- :func:`record_downtime`: when a repair ends, compute its downtime and cost from its
  recorded stage transitions (:func:`workflows.downtime.compute_downtime`) and upsert its
  ``repair_downtime`` row (idempotent: the last call wins, so the row follows the final
  ``repairs`` row, whose action may have changed on the ladder).
- :func:`fleet_report`: repairs that ended in a window, by outcome; MTTR; GPU-hours lost
  and cost by cluster, action and fault kind; top fault kinds and machines.

Provider facts of a repair (GPUs per node, hourly rate) come from its first alert's
evidence when ingest stamped them there (the node's IP and labels were known), else from
the ``providers`` rules by cluster and node name (:func:`workflows.providers.info_for`).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import Any

from activities.ledger import Ledger
from activities.reliability import reliability_report
from workflows.activity_api import AttemptRecord
from workflows.config import RepeatOffenderConfig
from workflows.downtime import Downtime, compute_downtime
from workflows.models import TERMINAL_STAGES
from workflows.policy import SHADOWED, repeat_offender
from workflows.providers import ProviderResolver, info_for

MANUAL_KIND = "manual"
"""Fault kind of a repair with no alert behind it (the ``AlertKind`` search attribute's
value for such repairs)."""
REPORT_ROWS_MAX = 100_000
"""Most repairs one report reads (a week of a very large fleet fits many times)."""
TOP_N = 10
"""Rows of the "top fault kinds" and "top machines" lists."""

_TERMINAL = sorted(s.value for s in TERMINAL_STAGES)
_FAILURES = ("failed", "timed_out")


async def record_downtime(
    ledger: Ledger, repair_id: str, resolver: ProviderResolver
) -> Downtime | None:
    """Compute and upsert the downtime of ``repair_id``; ``None`` (nothing written) while
    the repair has no terminal transition or is unknown."""
    db = ledger.db
    row = await db.fetchrow("SELECT * FROM repairs WHERE repair_id = $1", repair_id)
    if row is None:
        return None
    trans = await db.fetch(
        "SELECT stage, at FROM repair_transitions WHERE repair_id = $1 ORDER BY at, id",
        repair_id,
    )
    first = None
    if row["alert_ids"]:
        # the repair's first alert: the oldest observation (the ledger keeps alert_ids as
        # a set, the workflow keeps the triggering alert first)
        first = await db.fetchrow(
            "SELECT kind, evidence FROM alerts WHERE alert_id = ANY($1::text[])"
            " ORDER BY observed_at, alert_id LIMIT 1", row["alert_ids"])
    evidence = (first["evidence"] or {}) if first is not None else {}
    info = info_for(resolver, row["cluster"], row["node"], [evidence])
    down = compute_downtime([(t["stage"], t["at"]) for t in trans], info)
    if down is None:
        return None
    terminal = {s.value for s in TERMINAL_STAGES}
    ended = next(t["at"] for t in trans if t["stage"] in terminal)
    outcome = next(t["stage"] for t in trans if t["stage"] in terminal)
    await db.execute(
        """INSERT INTO repair_downtime (repair_id, cluster, node, machine_id, action,
             fault_kind, outcome, started_at, ended_at, gpus, cordoned_at, rejoined_at,
             duration_s, idle_wait_s, out_of_service_s, gpu_hours, idle_wait_gpu_hours,
             out_of_service_gpu_hours, hourly_rate, cost, currency, provider, region,
             gpu_type)
           VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,
                   $21,$22,$23,$24)
           ON CONFLICT (repair_id) DO UPDATE SET
             machine_id = EXCLUDED.machine_id, action = EXCLUDED.action,
             fault_kind = EXCLUDED.fault_kind, outcome = EXCLUDED.outcome,
             ended_at = EXCLUDED.ended_at, gpus = EXCLUDED.gpus,
             cordoned_at = EXCLUDED.cordoned_at, rejoined_at = EXCLUDED.rejoined_at,
             duration_s = EXCLUDED.duration_s, idle_wait_s = EXCLUDED.idle_wait_s,
             out_of_service_s = EXCLUDED.out_of_service_s, gpu_hours = EXCLUDED.gpu_hours,
             idle_wait_gpu_hours = EXCLUDED.idle_wait_gpu_hours,
             out_of_service_gpu_hours = EXCLUDED.out_of_service_gpu_hours,
             hourly_rate = EXCLUDED.hourly_rate, cost = EXCLUDED.cost,
             currency = EXCLUDED.currency, provider = EXCLUDED.provider,
             region = EXCLUDED.region, gpu_type = EXCLUDED.gpu_type,
             recorded_at = now()""",
        repair_id, row["cluster"], row["node"], row["machine_id"], row["action"],
        first["kind"] if first is not None else MANUAL_KIND, outcome,
        trans[0]["at"] if trans else ended, ended, down.gpus, down.cordoned_at,
        down.rejoined_at, down.duration_s, down.idle_wait_s, down.out_of_service_s,
        down.gpu_hours, down.idle_wait_gpu_hours, down.out_of_service_gpu_hours,
        down.hourly_rate, down.cost, down.currency, down.provider, down.region,
        down.gpu_type,
    )
    return down


def _group(rows: list[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(str(r[x]) for x in keys)
        g = out.setdefault(k, {**dict(zip(keys, k, strict=True)), "repairs": 0,
                               "gpu_hours": 0.0, "cost": 0.0, "failed": 0})
        g["repairs"] += 1
        g["gpu_hours"] += r["gpu_hours"] or 0.0
        g["cost"] += r["cost"] or 0.0
        g["failed"] += r["outcome"] in _FAILURES
    return sorted(out.values(), key=lambda g: (-g["repairs"], -g["gpu_hours"],
                                               [g[x] for x in keys]))


async def repeat_offenders(
    ledger: Ledger, until: datetime, cfg: RepeatOffenderConfig, *, cluster: str | None = None,
    limit: int = TOP_N,
) -> list[dict[str, Any]]:
    """Machines that are repeat offenders at ``until`` under ``cfg``
    (``policy.rails.repeat_offender``; issue 31 item 2): the same rule the repair applies
    (:func:`workflows.policy.repeat_offender`) over the ledger's attempts of the window
    before ``until`` (shadowed attempts left out: nothing touched the machine). Rows
    ``{"cluster", "machine", "disruptive_repairs", "repairs": [{"repair_id", "node",
    "actions", "first_at"}]}``, most repairs first, at most ``limit``."""
    since = until - timedelta(seconds=cfg.window_s)
    rows = await ledger.db.fetch(
        """SELECT repair_id, cluster, node, machine_id, action, alert_kind, code, outcome, at
             FROM repair_attempts
            WHERE at >= $1 AND at <= $2 AND machine_id IS NOT NULL
              AND ($3::text IS NULL OR cluster = $3) AND outcome <> $4
            ORDER BY at, repair_id""",
        since, until, cluster, SHADOWED)
    by_machine: dict[tuple[str, str], list[AttemptRecord]] = defaultdict(list)
    for r in rows:
        by_machine[(r["cluster"], r["machine_id"])].append(AttemptRecord(**dict(r)))
    out: list[dict[str, Any]] = []
    for (cl, machine), atts in by_machine.items():
        ro = repeat_offender(atts, machine, until, cfg)
        if ro is None:
            continue
        repairs = []
        for rid in ro.repairs:
            mine = [a for a in atts if a.repair_id == rid]
            repairs.append({"repair_id": rid, "node": mine[0].node,
                            "actions": sorted({a.action.value for a in mine}),
                            "first_at": min(a.at for a in mine).isoformat()})
        out.append({"cluster": cl, "machine": machine,
                    "disruptive_repairs": len(ro.repairs), "repairs": repairs})
    out.sort(key=lambda o: (-o["disruptive_repairs"], o["cluster"], o["machine"]))
    return out[:limit]


async def fleet_report(
    ledger: Ledger, since: datetime, until: datetime, *, cluster: str | None = None,
    currency: str = "USD", gpus: int | None = None,
    repeat: RepeatOffenderConfig | None = None,
) -> dict[str, Any]:
    """What repairs cost between ``since`` and ``until`` (repairs whose terminal
    transition falls in the window), JSON-ready.

    Shape: ``{"since", "until", "cluster", "currency", "cost_by_currency", "repairs": N, "open": N,
    "outcomes": {stage: N}, "mttr_s", "mttr_p50_s", "gpu_hours", "idle_wait_gpu_hours",
    "out_of_service_gpu_hours", "cost", "unpriced_repairs", "by_cluster": [...],
    "by_action": [...], "by_fault_kind": [...], "breakdown": [...], "top_fault_kinds": [...],
    "top_machines": [...], "daily": [{"day", "repairs", "gpu_hours", "cost"}],
    "reliability": {...}, "repeat_offenders": [...], "shadowed": {"repairs": N,
    "by_action": {ACTION: N}, "by_cluster": {CLUSTER: N}}}`` (``reliability``:
    :func:`activities.reliability.reliability_report` over the same window, ``gpus`` the
    fleet's GPU count for its per-GPU-day rate; ``repeat_offenders``: :func:`repeat_offenders`
    at ``until`` under ``repeat``, the cluster's ``policy.rails.repeat_offender``, default
    when None).
    MTTR: mean time from the repair's first record (the recommendation) to its end, over
    ``succeeded`` repairs; ``None`` without any. ``currency``: that of the recorded costs
    (``currency`` argument when none is priced, ``mixed`` when the providers' currency
    changed inside the window; ``cost_by_currency`` then splits them). ``cost`` sums the
    priced repairs;
    ``unpriced_repairs`` counts those with no hourly rate. Group rows:
    ``{KEY, "repairs", "gpu_hours", "cost", "failed"}``, most repairs first;
    ``breakdown`` rows are keyed by cluster, action and fault kind together (the labels of
    ``autorepair_repair_downtime_gpu_hours_total``).
    Shadowed repairs (``policy.mode: shadow``, issue 29 item 3) touched nothing: they are
    counted apart in ``shadowed`` (by the action that would have run) and left out of
    every other figure (``repairs``, ``outcomes``, MTTR, GPU-hours, cost, groups; the
    reliability figures leave them out of the auto-remediation rate and action counts).
    """
    rows = await ledger.db.fetch(
        """SELECT r.repair_id, r.cluster, r.node, COALESCE(r.machine_id, r.node) AS machine,
                  r.action, r.stage, r.created_at, e.ended_at,
                  COALESCE(d.fault_kind, (SELECT a.kind FROM alerts a
                                          WHERE a.alert_id = ANY(r.alert_ids)
                                          ORDER BY a.observed_at, a.alert_id LIMIT 1),
                           $5) AS fault_kind,
                  d.gpu_hours, d.idle_wait_gpu_hours, d.out_of_service_gpu_hours, d.cost,
                  d.currency, d.started_at
           FROM repairs r
           JOIN LATERAL (SELECT min(at) AS ended_at FROM repair_transitions t
                         WHERE t.repair_id = r.repair_id AND t.stage = ANY($3::text[])) e
             ON e.ended_at IS NOT NULL
           LEFT JOIN repair_downtime d ON d.repair_id = r.repair_id
           WHERE e.ended_at >= $1 AND e.ended_at < $2 AND ($4::text IS NULL OR r.cluster = $4)
           ORDER BY e.ended_at LIMIT $6""",
        since, until, _TERMINAL, cluster, MANUAL_KIND, REPORT_ROWS_MAX,
    )
    open_n = await ledger.db.fetchval(
        "SELECT count(*) FROM repairs WHERE stage <> ALL($1::text[])"
        " AND ($2::text IS NULL OR cluster = $2)", _TERMINAL, cluster)
    recs: list[dict[str, Any]] = []
    shadowed: list[dict[str, Any]] = []
    for r in rows:
        d = dict(r)
        d["outcome"] = d["stage"]
        (shadowed if d["outcome"] == SHADOWED else recs).append(d)
    ttr = sorted((r["ended_at"] - (r["started_at"] or r["created_at"])).total_seconds()
                  for r in recs if r["outcome"] == "succeeded")
    by_day: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"repairs": 0, "gpu_hours": 0.0, "cost": 0.0})
    for r in recs:
        day = by_day[r["ended_at"].date().isoformat()]
        day["repairs"] += 1
        day["gpu_hours"] += r["gpu_hours"] or 0.0
        day["cost"] += r["cost"] or 0.0
    kinds = _group(recs, "fault_kind")
    by_cur: dict[str, float] = defaultdict(float)
    for r in recs:
        if r["cost"] is not None:
            by_cur[r["currency"]] += r["cost"]
    if len(by_cur) == 1:
        currency = next(iter(by_cur))
    elif len(by_cur) > 1:
        currency = "mixed"
    return {
        "since": since.isoformat(), "until": until.isoformat(), "cluster": cluster,
        "currency": currency, "cost_by_currency": dict(sorted(by_cur.items())),
        "repairs": len(recs), "open": int(open_n or 0),
        "outcomes": dict(sorted(Counter(r["outcome"] for r in recs).items())),
        "mttr_s": statistics.fmean(ttr) if ttr else None,
        "mttr_p50_s": statistics.median(ttr) if ttr else None,
        "gpu_hours": sum(r["gpu_hours"] or 0.0 for r in recs),
        "idle_wait_gpu_hours": sum(r["idle_wait_gpu_hours"] or 0.0 for r in recs),
        "out_of_service_gpu_hours": sum(r["out_of_service_gpu_hours"] or 0.0 for r in recs),
        "cost": sum(r["cost"] or 0.0 for r in recs),
        "unpriced_repairs": sum(1 for r in recs if r["cost"] is None),
        "by_cluster": _group(recs, "cluster"),
        "by_action": _group(recs, "action"),
        "by_fault_kind": kinds,
        "breakdown": _group(recs, "cluster", "action", "fault_kind"),
        "top_fault_kinds": kinds[:TOP_N],
        "top_machines": _group(recs, "machine")[:TOP_N],
        "daily": [{"day": k, **v} for k, v in sorted(by_day.items())],
        "reliability": await reliability_report(ledger, since, until, cluster=cluster,
                                                gpus=gpus),
        "repeat_offenders": await repeat_offenders(
            ledger, until, repeat or RepeatOffenderConfig(), cluster=cluster),
        "shadowed": {
            "repairs": len(shadowed),
            "by_action": dict(sorted(Counter(str(r["action"]) for r in shadowed).items())),
            "by_cluster": dict(sorted(Counter(str(r["cluster"]) for r in shadowed).items())),
        },
    }
