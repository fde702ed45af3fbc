"""Reliability figures of the fleet over a report window (docs/runbook.md "Reliability
figures" gives each formula), read from the ledger.

The arithmetic is pure (:func:`reliability_figures` over :class:`RepairFact` and
:class:`AttemptFact` rows); :func:`reliability_report` reads those rows and hands them over.

Figures (window ``[since, until)``):

- ``mttr_by_decision``: mean and median time to repair of the ``succeeded`` repairs that
  ended in the window, split by how the repair was decided (:func:`decision_of`);
- ``auto_remediation``: repairs that ended ``succeeded`` with no person involved, over all
  repairs that ended in the window (``shadowed`` ones excluded: they touched nothing);
- ``disruptive_per_1k_gpu_days``: disruptive actions executed in the window per 1,000
  GPU-days of the fleet (``fleet_gpus`` × window days);
- ``time_between_incidents``: per machine, the gaps between consecutive repairs created on
  it in the window; the median over all gaps, and the machines with the shortest median gap;
- ``second_rung``: repairs that ended in the window and executed an action, the share of
  them that needed a second rung of the ladder.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from activities.ledger import Ledger
from workflows.config import AutorepairConfig
from workflows.models import AUTO_APPROVED, TERMINAL_STAGES, Action, RequesterKind
from workflows.policy.ladder import NOT_COUNTED
from workflows.policy.shadow import SHADOWED
from workflows.providers import ProviderResolver

DECISIONS = ("automatic", "approved", "operator", "detector")
"""How a repair was decided, in report order: ``automatic`` (the platform decided and the
consent policy approved it), ``approved`` (the platform recommended, a person approved),
``operator`` (a person requested it), ``detector`` (an external detector requested it)."""
ROWS_MAX = 100_000
"""Most repairs (and incidents, and attempts) one report reads (as
``activities.ledger_reports.REPORT_ROWS_MAX``)."""
WORST_MACHINES = 10
"""Rows of the "worst machines" list of time between incidents."""
SECONDS_PER_DAY = 86_400.0
NO_FLEET = ("disruptive actions per 1,000 GPU-days: fleet size unknown (no clusters[].gpu_nodes "
            "or clusters[].nodes configured)")
"""The note when the GPU-days denominator cannot be told."""

_TERMINAL = sorted(s.value for s in TERMINAL_STAGES)
_LADDER_UP = " -> "
"""What a ladder rule that moved a rung up contains (``workflows.policy.ladder``:
``"ladder:reboot x2 in 604800s -> reprovision"``)."""


@dataclass(frozen=True, slots=True)
class RepairFact:
    """A repair that ended in the window. ``started_at``: its recorded start (the
    downtime row's, else ``created_at``); ``outcome``: its terminal stage."""

    repair_id: str
    machine: str
    requester_kind: str
    approved_by: str | None
    decided_by_rule: str | None
    outcome: str
    started_at: datetime
    ended_at: datetime


@dataclass(frozen=True, slots=True)
class AttemptFact:
    """An executed action (``repair_attempts`` row)."""

    repair_id: str
    action: str
    outcome: str
    at: datetime


def decision_of(requester_kind: str, approved_by: str | None) -> str:
    """How a repair was decided (one of :data:`DECISIONS`): a person's request →
    ``operator``; a detector's → ``detector``; the platform's own → ``approved`` when a
    person approved it (``approved_by`` set and not :data:`AUTO_APPROVED`), else
    ``automatic``."""
    if requester_kind == RequesterKind.user.value:
        return "operator"
    if requester_kind == RequesterKind.detector.value:
        return "detector"
    if approved_by not in (None, AUTO_APPROVED):
        return "approved"
    return "automatic"


def no_person(r: RepairFact) -> bool:
    """Whether no person took part in the repair's decision: not requested by a user, and
    approved by the consent policy (or never needing approval)."""
    return r.requester_kind != RequesterKind.user.value and r.approved_by in (None, AUTO_APPROVED)


def counted(a: AttemptFact) -> bool:
    """Whether an attempt is a disruptive action that ran: any action but ``none``, outcome
    not cancelled / self-resolved (the count ``rails.max_actions_per_node`` caps), nor
    ``shadowed`` (shadow mode: nothing ran)."""
    return (a.action != Action.none.value and a.outcome not in NOT_COUNTED
            and a.outcome != SHADOWED)


def _mttr(values: list[float]) -> dict[str, Any]:
    return {"repairs": len(values),
            "mttr_s": statistics.fmean(values) if values else None,
            "mttr_p50_s": statistics.median(values) if values else None}


def reliability_figures(
    ended: Sequence[RepairFact], attempts: Sequence[AttemptFact],
    incidents: Sequence[tuple[str, datetime]], since: datetime, until: datetime,
    fleet_gpus: int | None, *, worst: int = WORST_MACHINES,
) -> dict[str, Any]:
    """The figures of the module docstring, JSON-ready.

    ``ended``: repairs whose terminal transition falls in the window; ``attempts``: the
    attempts of those repairs and every attempt executed in the window (deduplicated by the
    caller); ``incidents``: ``(machine, created_at)`` of every repair created in the window;
    ``fleet_gpus``: GPUs of the fleet (``None`` or 0 = unknown).

    Shape: ``{"mttr_by_decision": {DECISION: {"repairs", "mttr_s", "mttr_p50_s"}},
    "auto_remediation": {"auto_remediated", "repairs", "rate"}, "disruptive_actions": N,
    "fleet_gpus", "gpu_days", "disruptive_per_1k_gpu_days", "time_between_incidents":
    {"machines", "gaps", "median_s", "worst": [{"machine", "incidents", "median_gap_s",
    "min_gap_s"}]}, "second_rung": {"repairs_with_actions", "second_rung", "share"},
    "notes": [...]}``. Seconds throughout; rates and shares are fractions 0..1 (``None``
    where the denominator is 0)."""
    notes: list[str] = []
    ttr: dict[str, list[float]] = {d: [] for d in DECISIONS}
    for r in ended:
        if r.outcome == "succeeded":
            ttr[decision_of(r.requester_kind, r.approved_by)].append(
                (r.ended_at - r.started_at).total_seconds())
    real = [r for r in ended if r.outcome != "shadowed"]
    auto = sum(1 for r in real if r.outcome == "succeeded" and no_person(r))
    in_window = [a for a in attempts if counted(a) and since <= a.at < until]
    days = (until - since).total_seconds() / SECONDS_PER_DAY
    gpu_days = fleet_gpus * days if fleet_gpus else None
    if gpu_days is None:
        notes.append(NO_FLEET)
    by_machine: dict[str, list[datetime]] = defaultdict(list)
    for machine, at in incidents:
        by_machine[machine].append(at)
    gaps: list[float] = []
    rows: list[dict[str, Any]] = []
    for machine, times in by_machine.items():
        times.sort()
        g = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        if g:
            gaps.extend(g)
            rows.append({"machine": machine, "incidents": len(times),
                         "median_gap_s": statistics.median(g), "min_gap_s": min(g)})
    rows.sort(key=lambda x: (x["median_gap_s"], -x["incidents"], x["machine"]))
    actions: dict[str, set[str]] = defaultdict(set)
    for a in attempts:
        if counted(a):
            actions[a.repair_id].add(a.action)
    acted = [r for r in ended if actions.get(r.repair_id)]
    second = sum(1 for r in acted if len(actions[r.repair_id]) > 1
                 or _LADDER_UP in (r.decided_by_rule or ""))
    return {
        "mttr_by_decision": {d: _mttr(v) for d, v in ttr.items()},
        "auto_remediation": {"auto_remediated": auto, "repairs": len(real),
                             "rate": auto / len(real) if real else None},
        "disruptive_actions": len(in_window),
        "fleet_gpus": fleet_gpus or None,
        "gpu_days": gpu_days,
        "disruptive_per_1k_gpu_days": (len(in_window) / gpu_days * 1000.0
                                       if gpu_days else None),
        "time_between_incidents": {"machines": len(rows), "gaps": len(gaps),
                                   "median_s": statistics.median(gaps) if gaps else None,
                                   "worst": rows[:worst]},
        "second_rung": {"repairs_with_actions": len(acted), "second_rung": second,
                        "share": second / len(acted) if acted else None},
        "notes": notes,
    }


def fleet_gpus(config: AutorepairConfig, cluster: str | None = None) -> int | None:
    """GPUs of the configured fleet (of ``cluster`` only, when given): per cluster, each
    listed node's ``gpus_per_node`` under the ``providers`` rules, plus
    ``gpu_nodes − len(nodes)`` unlisted nodes at ``providers.default_gpus_per_node``.
    ``None`` when no cluster sets either."""
    resolver = ProviderResolver(config.providers)
    total = 0
    for c in config.clusters:
        if cluster is not None and c.name != cluster:
            continue
        total += sum(resolver.for_node(c.name, n.name).gpus_per_node for n in c.nodes)
        total += max(0, c.gpu_nodes - len(c.nodes)) * config.providers.default_gpus_per_node
    return total or None


async def reliability_report(
    ledger: Ledger, since: datetime, until: datetime, *, cluster: str | None = None,
    gpus: int | None = None,
) -> dict[str, Any]:
    """Read the window's repairs, attempts and incidents from ``ledger`` and return
    :func:`reliability_figures` over them (``gpus``: the fleet's GPU count,
    :func:`fleet_gpus`). Raises what asyncpg raises when the ledger is unreachable."""
    db = ledger.db
    rows = await db.fetch(
        """SELECT r.repair_id, COALESCE(r.machine_id, r.node) AS machine, r.requester_kind,
                  r.approved_by, r.decided_by_rule, e.stage AS outcome,
                  COALESCE(d.started_at, r.created_at) AS started_at, e.at AS ended_at
           FROM repairs r
           JOIN LATERAL (SELECT stage, at FROM repair_transitions t
                         WHERE t.repair_id = r.repair_id AND t.stage = ANY($3::text[])
                         ORDER BY at, id LIMIT 1) e ON TRUE
           LEFT JOIN repair_downtime d ON d.repair_id = r.repair_id
           WHERE e.at >= $1 AND e.at < $2 AND ($4::text IS NULL OR r.cluster = $4)
           ORDER BY e.at LIMIT $5""",
        since, until, _TERMINAL, cluster, ROWS_MAX)
    ended = [RepairFact(**dict(r)) for r in rows]
    att = await db.fetch(
        """SELECT DISTINCT id, repair_id, action, outcome, at FROM repair_attempts
           WHERE (repair_id = ANY($3::text[]) OR (at >= $1 AND at < $2))
             AND ($4::text IS NULL OR cluster = $4) LIMIT $5""",
        since, until, [r.repair_id for r in ended], cluster, 4 * ROWS_MAX)
    attempts = [AttemptFact(repair_id=a["repair_id"], action=a["action"],
                            outcome=a["outcome"], at=a["at"]) for a in att]
    inc = await db.fetch(
        """SELECT COALESCE(machine_id, node) AS machine, created_at FROM repairs
           WHERE created_at >= $1 AND created_at < $2 AND ($3::text IS NULL OR cluster = $3)
           ORDER BY created_at LIMIT $4""",
        since, until, cluster, ROWS_MAX)
    return reliability_figures(ended, attempts, [(i["machine"], i["created_at"]) for i in inc],
                               since, until, gpus)
