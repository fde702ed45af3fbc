"""Inputs and outputs of the read-only query tools (``autorepair mcp``, :mod:`workers.fleet_query`).

Every input model forbids unknown fields and bounds every field (names: the node-name
pattern of the repair API; limits: a default and a cap), so a tool's JSON schema (what
``tools/list`` advertises) says exactly what it accepts, and a bad call is refused with
the field and the value named (:func:`input_errors`). Outputs are bounded too: list
lengths by the ``limit`` / ``top`` inputs, long texts clipped to :data:`TEXT_CAP`
characters (with ``…`` at the cut).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from workflows.models import Action, Alert, Severity, Stage
from workflows.protocol import STATE_AWAITING_APPROVAL, STATE_IN_PROGRESS

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"
"""Cluster and node names: Kubernetes node names, Slurm host names (the repair API's rule,
:mod:`workers.repairs.models`). The pattern also keeps names safe inside Temporal
visibility queries (no quotes or spaces)."""
LIST_CAP = 200
"""Most rows ``list_alerts`` / ``list_repairs`` return in one call."""
TEXT_CAP = 2000
"""Longest text (evidence text, descriptions, reasons) in an answer, characters."""
TOP_CAP = 50
"""Most entries of each ``fleet_summary`` top list."""
STATE_FILTERS = ("open", STATE_IN_PROGRESS, STATE_AWAITING_APPROVAL)
"""``list_repairs`` state filters beside the stage names: ``open`` (not terminal), and the
``RepairState`` search-attribute values (docs/design.md §4.4)."""

_DURATION = re.compile(r"^(\d+)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_MAX_WINDOW = timedelta(days=366)


def clip(text: str | None, cap: int = TEXT_CAP) -> str:
    """``text`` cut to ``cap`` characters (the last one ``…`` when cut); None → ``""``."""
    if not text:
        return ""
    return text if len(text) <= cap else text[: cap - 1] + "…"


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """A window start from ``value``: a duration back from ``now`` (``90s``, ``30m``,
    ``24h``, ``7d``, ``2w``; at most 366 days) or an ISO 8601 time (UTC when it has no
    offset) before ``now``. Raises ``ValueError`` saying what is accepted, or naming a time
    that is not before ``now`` (a window that starts in the future holds nothing)."""
    now = now or datetime.now(UTC)
    text = value.strip()
    m = _DURATION.match(text)
    if m:
        span = timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])
        if span > _MAX_WINDOW:
            raise ValueError(f"duration {value!r} is longer than 366 days")
        return now - span
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"expected a duration like 30m, 24h, 7d or an ISO 8601 time, got {value!r}"
        ) from None
    t = t if t.tzinfo else t.replace(tzinfo=UTC)
    if t >= now:
        raise ValueError(f"{value!r} is not before now ({now.isoformat()})")
    return t


def input_errors(err: ValidationError, model: type[BaseModel]) -> str:
    """One line per invalid field of ``err``: ``FIELD: what is wrong (got VALUE)``; an
    unknown field also lists the fields the tool takes."""
    lines: list[str] = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "arguments"
        got = repr(e.get("input"))
        got = got if len(got) <= 80 else got[:77] + "..."
        if e["type"] == "extra_forbidden":
            lines.append(f"{field}: unknown field (takes: {', '.join(model.model_fields)})")
        elif e["type"] == "missing":
            lines.append(f"{field}: required")
        else:
            msg = str(e["msg"]).removeprefix("Value error, ")
            lines.append(f"{field}: {msg} (got {got})")
    return "; ".join(lines)


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListAlertsInput(_Input):
    """``list_alerts``: recorded alerts (observed and actionable), newest first."""

    cluster: str | None = Field(None, min_length=1, max_length=253, pattern=NAME_PATTERN,
                                description="only this cluster")
    node: str | None = Field(None, min_length=1, max_length=253, pattern=NAME_PATTERN,
                             description="only this node")
    kind: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[a-z0-9_]+$",
                             description="fault kind, e.g. xid, gpu_lost, straggler")
    severity: Severity | None = Field(None, description="only this severity")
    active: bool | None = Field(None, description="true: raised faults only; false: clears only")
    since: str | None = Field(None, max_length=40, description=(
        "observed at or after: a duration back from now (30m, 24h, 7d) or an ISO 8601 time"))
    limit: int = Field(50, ge=1, le=LIST_CAP, description=f"rows, at most {LIST_CAP}")

    @field_validator("since")
    @classmethod
    def _since(cls, v: str | None) -> str | None:
        if v is not None:
            parse_since(v)
        return v


class ListRepairsInput(_Input):
    """``list_repairs``: repairs newest first."""

    cluster: str | None = Field(None, min_length=1, max_length=253, pattern=NAME_PATTERN,
                                description="only this cluster")
    node: str | None = Field(None, min_length=1, max_length=253, pattern=NAME_PATTERN,
                             description="only this node")
    state: str | None = Field(None, max_length=32, description=(
        "a stage name, or open (not finished), in_progress or awaiting_approval"))
    action: Action | None = Field(None, description="only this action")
    requester: str | None = Field(None, min_length=1, max_length=256,
                                  description="requester name or kind (system, user, detector)")
    limit: int = Field(50, ge=1, le=LIST_CAP, description=f"rows, at most {LIST_CAP}")

    @field_validator("state")
    @classmethod
    def _state(cls, v: str | None) -> str | None:
        stages = [s.value for s in Stage]
        if v is not None and v not in stages and v not in STATE_FILTERS:
            raise ValueError(f"not a stage or one of {list(STATE_FILTERS)} (stages: "
                             f"{', '.join(stages)})")
        return v


class RepairHistoryInput(_Input):
    """``repair_history``: one repair's stages, approval and deciding rules."""

    repair_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$",
                           description="repair id (list_repairs shows them)")
    transitions: int = Field(100, ge=1, le=LIST_CAP,
                             description=f"newest stage transitions to show, at most {LIST_CAP}")


class NodeInput(_Input):
    """``node_status`` / ``explain_recommendation``: one node."""

    node: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN, description="node name")
    cluster: str | None = Field(None, min_length=1, max_length=253, pattern=NAME_PATTERN,
                                description="its cluster (may be left out when the ledger "
                                "knows the node in one cluster only)")


class ExplainInput(NodeInput):
    """``explain_recommendation``: why the platform recommends (or not) an action."""

    alert_id: str | None = Field(None, min_length=1, max_length=256,
                                 description="explain this recorded alert (default: the "
                                 "node's active faults, else its newest alerts)")


class FleetSummaryInput(_Input):
    """``fleet_summary``: counts over a window."""

    cluster: str | None = Field(None, min_length=1, max_length=253, pattern=NAME_PATTERN,
                                description="only this cluster")
    since: str = Field("24h", max_length=40, description=(
        "window start: a duration back from now (30m, 24h, 7d) or an ISO 8601 time"))
    top: int = Field(10, ge=1, le=TOP_CAP, description=f"entries per top list, at most {TOP_CAP}")

    @field_validator("since")
    @classmethod
    def _since(cls, v: str) -> str:
        parse_since(v)
        return v


# ------------------------------------------------------------------------- outputs
class AlertOut(BaseModel):
    """A recorded alert (texts clipped to :data:`TEXT_CAP`)."""

    alert_id: str
    cluster: str
    node: str
    machine_id: str | None = None
    kind: str
    code: int | None = None
    gpu: str | None = None
    severity: str
    mnemonic: str = ""
    actionable: bool
    action: str
    summary: str
    description: str = ""
    evidence_text: str = ""
    level: bool
    active: bool
    source: str
    observed_at: datetime

    @classmethod
    def of(cls, a: Alert) -> AlertOut:
        """From a ledger :class:`~workflows.models.Alert`."""
        return cls(
            alert_id=a.alert_id, cluster=a.cluster, node=a.node, machine_id=a.machine_id,
            kind=a.kind, code=a.code, gpu=a.gpu, severity=a.severity.value,
            mnemonic=a.mnemonic, actionable=a.actionable, action=a.action.value,
            summary=clip(a.summary), description=clip(a.description),
            evidence_text=clip(a.evidence_text), level=a.level, active=a.active,
            source=a.source, observed_at=a.observed_at,
        )


class AlertList(BaseModel):
    """Answer of ``list_alerts``: ``truncated`` when ``limit`` rows came back (more may match)."""

    alerts: list[AlertOut]
    count: int
    truncated: bool


class RepairOut(BaseModel):
    """A repair as the ledger records it; ``state``: ``awaiting_approval``,
    ``in_progress`` or the terminal stage (the ``RepairState`` values)."""

    repair_id: str
    cluster: str
    node: str
    machine_id: str | None = None
    action: str
    stage: str
    state: str
    requester: str
    detector: str | None = None
    reason: str = ""
    approved_by: str | None = None
    decided_by_rule: str | None = None
    alert_ids: list[str] = Field(default_factory=list)
    workflow_id: str | None = None
    created_at: datetime
    updated_at: datetime


class RepairList(BaseModel):
    """Answer of ``list_repairs``."""

    repairs: list[RepairOut]
    count: int
    truncated: bool


class TransitionOut(BaseModel):
    """One stage transition: when, by whom, why."""

    stage: str
    at: datetime
    by: str
    reason: str = ""


class AttemptOut(BaseModel):
    """One executed action of a repair and its outcome (what the ladder counts)."""

    action: str
    alert_kind: str
    code: int | None = None
    outcome: str
    at: datetime


class RepairHistory(BaseModel):
    """Answer of ``repair_history``.

    ``decision``: the recorded ``decided_by_rule`` split into its steps (consent, ladder,
    migrate gate, approval); ``approved_by``: the approver, the requester for a person's
    own repair, or ``auto-approved``; ``live_stage`` / ``live_detail``: the running
    workflow's ``status`` query when Temporal answered; ``notes``: what could not be read.
    """

    repair: RepairOut
    approved_by: str | None = None
    decision: list[str] = Field(default_factory=list)
    transitions: list[TransitionOut]
    transitions_total: int
    attempts: list[AttemptOut]
    evidence: list[AlertOut]
    live_stage: str | None = None
    live_detail: str = ""
    notes: list[str] = Field(default_factory=list)


class WorkflowOut(BaseModel):
    """A running workflow as Temporal visibility lists it, with its search attributes."""

    workflow_id: str
    workflow_type: str
    status: str
    start_time: datetime | None = None
    search_attributes: dict[str, str] = Field(default_factory=dict)


class FaultOut(BaseModel):
    """An active fault the NodeWorkflow holds: its alert, first observation and when its
    persistence window ends (``due_at``); ``held``: why and until when a grace period
    after maintenance holds it (``policy.maintenance.grace_s``; None: not held)."""

    alert: AlertOut
    first_seen: datetime | None = None
    persistence_s: float
    due_at: datetime | None = None
    held: str | None = None


class NodeStatusOut(BaseModel):
    """Answer of ``node_status``.

    ``live``: whether the NodeWorkflow answered its ``status`` query (then ``degraded``,
    ``active_faults``, ``repair_in_flight``, ``cooldown_until`` and ``diagnostics`` are
    its view); ``running_repairs``: RepairWorkflows of the node that visibility lists as
    running; ``recent_alerts`` / ``recent_repairs``: the ledger's newest.
    """

    cluster: str
    node: str
    machine_id: str | None = None
    live: bool
    degraded: bool | None = None
    active_faults: list[FaultOut] = Field(default_factory=list)
    repair_in_flight: str | None = None
    cooldown_until: datetime | None = None
    diagnostics: list[str] = Field(default_factory=list)
    running_repairs: list[WorkflowOut] = Field(default_factory=list)
    recent_alerts: list[AlertOut] = Field(default_factory=list)
    recent_repairs: list[RepairOut] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class CatalogueRow(BaseModel):
    """The catalogue's entry for one fault under the configured overrides
    (:class:`workflows.catalogue.CatalogueEntry`)."""

    severity: str
    mnemonic: str
    action: str
    actionable: bool
    count: int
    window_s: float
    app_level: bool
    mapped: bool
    bucket: str = ""
    description: str
    source: str


class FaultExplanation(BaseModel):
    """Why one alert leads (or not) to an action on its node.

    ``node_decision``: :func:`workflows.policy.decide_node_action` (``rule``, ``reason``,
    with ``occurrences_in_window`` counted from the ledger); ``persistence``: seconds the
    fault must last, first observation, due time and whether it is due; ``ladder`` /
    ``gate`` / ``consent``: :func:`~workflows.policy.ladder_decision`,
    :func:`~workflows.policy.migrate_gate` and :func:`~workflows.policy.consent_decision`
    on that action with the machine's attempt history; ``final_action``: what a repair
    started now would run.
    """

    alert: AlertOut
    catalogue: CatalogueRow
    node_decision: dict[str, Any]
    persistence: dict[str, Any]
    ladder: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    consent: dict[str, Any] | None = None
    final_action: str


class ExplanationOut(BaseModel):
    """Answer of ``explain_recommendation``: one :class:`FaultExplanation` per fault;
    ``recommended_action``: the heaviest final action among the actionable faults (the
    NodeWorkflow starts one repair with the heaviest, docs/design.md §5), ``none`` when none;
    ``summary``: one plain-language line; ``source``: where the faults came from
    (``live`` NodeWorkflow status, ``alert_id``, or ``ledger`` newest alerts)."""

    cluster: str
    node: str
    machine_id: str | None = None
    source: str
    recommended_action: str
    summary: str
    cooldown_until: datetime | None = None
    repair_in_flight: str | None = None
    faults: list[FaultExplanation]
    notes: list[str] = Field(default_factory=list)


class FleetSummaryOut(BaseModel):
    """Answer of ``fleet_summary`` over ``[since, now]``.

    ``alerts``: total, by severity, actionable, top kinds and nodes (ledger);
    ``repairs_by_stage``: repairs created in the window plus every unfinished one;
    ``open_repairs`` / ``awaiting_approval``: of those, not finished / waiting for a person;
    ``workflows``: running NodeWorkflows and RepairWorkflows (and those awaiting approval)
    as Temporal visibility counts them, ``None`` when Temporal did not answer;
    ``downtime``: what the repairs that ended in the window cost, as ``autorepair report``
    counts it (``activities.ledger_reports.fleet_report``): ``{"repairs_ended",
    "gpu_hours", "idle_wait_gpu_hours", "out_of_service_gpu_hours", "cost", "currency",
    "unpriced_repairs", "mttr_s"}`` (GPU-hours; cost in ``currency``; MTTR in seconds over
    succeeded repairs, ``None`` without any); ``reliability``: the reliability figures of
    the same window (MTTR by decision, auto-remediation rate, disruptive actions per 1,000
    GPU-days, time between incidents, second-rung share; shape and formulas:
    ``activities.reliability.reliability_figures``, docs/runbook.md).
    """

    cluster: str | None = None
    since: datetime
    now: datetime
    clusters: list[str]
    alerts: dict[str, Any]
    repairs_by_stage: dict[str, int]
    open_repairs: int
    awaiting_approval: int
    open_hardware_tickets: int
    workflows: dict[str, int] | None = None
    downtime: dict[str, Any] = Field(default_factory=dict)
    reliability: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
