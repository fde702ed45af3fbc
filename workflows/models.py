"""Shared pydantic models: the wire and workflow contract of the control plane.

Everything that crosses a process or Temporal boundary (alerts, repair requests,
signals, query results, validation results) is defined here so that `ingest`,
`activities`, `workers` and the workflows agree on one shape. These models import
no I/O library and are safe inside the Temporal workflow sandbox.

Names and vocabularies follow ``docs/design.md`` §4.4 (stages, terminal states, signal
payloads) and §5 (action vocabulary); the Temporal names themselves (workflow types,
ids, task queue, signal/query/update names, search attributes) are in
:mod:`workflows.protocol`.
"""

from __future__ import annotations

import math
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Severity(StrEnum):
    """Alert severity (docs/design.md §5)."""

    info = "info"
    warning = "warning"
    critical = "critical"


class Action(StrEnum):
    """Node-level action vocabulary, lightest first (docs/design.md §5).

    ``power_cycle`` sits beside ``reboot`` (host power off/on through the BMC, for faults
    that need the GPU to lose power); ``remove`` is human-only.
    """

    none = "none"
    reset_gpu = "reset_gpu"
    reboot = "reboot"
    power_cycle = "power_cycle"
    reprovision = "reprovision"
    migrate = "migrate"
    remove = "remove"


#: Escalation weight of each action; a higher number is a heavier action.
ACTION_WEIGHT: dict[Action, int] = {
    Action.none: 0,
    Action.reset_gpu: 1,
    Action.reboot: 2,
    Action.power_cycle: 3,
    Action.reprovision: 4,
    Action.migrate: 5,
    Action.remove: 6,
}


class Stage(StrEnum):
    """Repair stages and terminal states (docs/design.md §4.4)."""

    recommended = "recommended"
    awaiting_approval = "awaiting_approval"
    cordoning = "cordoning"
    waiting_for_idle = "waiting_for_idle"
    draining = "draining"
    repairing = "repairing"
    migrating = "migrating"
    joining = "joining"
    running = "running"
    # terminal
    succeeded = "succeeded"
    failed = "failed"
    rejected = "rejected"
    cancelled = "cancelled"
    auto_resolved = "auto_resolved"
    timed_out = "timed_out"
    #: shadow mode (``policy.mode: shadow``, issue 29 item 3): every decision ran and was
    #: recorded, nothing was cordoned, drained or acted on; the reason says what would
    #: have been done
    shadowed = "shadowed"


TERMINAL_STAGES: frozenset[Stage] = frozenset(
    {
        Stage.succeeded,
        Stage.failed,
        Stage.rejected,
        Stage.cancelled,
        Stage.auto_resolved,
        Stage.timed_out,
        Stage.shadowed,
    }
)


class RequesterKind(StrEnum):
    """Who asked for a repair: the platform itself, a person, or an external detector."""

    system = "system"
    user = "user"
    detector = "detector"


class Requester(BaseModel):
    """The origin of a repair request; a detector is never recorded as a user."""

    kind: RequesterKind = RequesterKind.system
    name: str = "autorepair"


def _without_nul(value: Any) -> Any:
    """``value`` with every U+0000 in its strings (keys and nested values included)
    replaced by U+FFFD, and every float that is not finite (NaN, ±Inf: OTLP and Python's
    JSON reader carry them) replaced by its text (``"nan"``, ``"inf"``, ``"-inf"``).
    PostgreSQL stores no NUL in ``text`` or ``jsonb`` and no NaN in ``jsonb``, so a record
    carrying one would fail its ledger write on every retry."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value


#: Largest fault code an alert carries: the ledger's ``INTEGER`` column (Xid and SXid
#: codes are under 200).
MAX_FAULT_CODE = 2**31 - 1


class Alert(BaseModel):
    """One observed fault on one node, with its evidence.

    ``alert_id`` is stable for the same observation (hash of cluster, node, kind, code,
    GPU and the raw evidence / observation time), so a re-delivery de-duplicates.
    ``active=False`` clears a level fault (raise/clear edges); event faults (Xid) are
    single observations and are never cleared explicitly. NUL characters in any text
    (sender-controlled: kernel lines, attributes) become U+FFFD, so every alert can be
    recorded in the ledger.
    """

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return _without_nul(data) if isinstance(data, dict) else data

    alert_id: str
    cluster: str
    node: str
    machine_id: str | None = None
    node_pool: str | None = None
    kind: str
    code: int | None = Field(default=None, ge=0, le=MAX_FAULT_CODE)
    gpu: str | None = None
    severity: Severity = Severity.warning
    mnemonic: str = ""
    actionable: bool = False
    action: Action = Action.none
    summary: str
    description: str = ""
    evidence_text: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)
    level: bool = False
    active: bool = True
    source: str = "agent"
    observed_at: datetime
    #: When the control plane (ingest) received the report, its own clock (UTC); None for
    #: an alert that did not pass through ingest. Judges recurrence, persistence and the
    #: order of edges (I17); ``observed_at`` is the sender's clock: evidence only.
    received_at: datetime | None = None


class AlertOutcome(StrEnum):
    """What a NodeWorkflow did with a delivered alert."""

    new = "new"
    attached = "attached"
    deduplicated = "deduplicated"
    ignored = "ignored"
    cleared = "cleared"
    recommended = "recommended"


class AlertDelivery(BaseModel):
    """Result of delivering an alert (update on NodeWorkflow)."""

    alert_id: str
    outcome: AlertOutcome
    reason: str = ""
    repair_id: str | None = None


class StageTransition(BaseModel):
    """One recorded stage change of a repair."""

    stage: Stage
    at: datetime
    by: str = "system"
    reason: str = ""


class ApproveSignal(BaseModel):
    """Payload of the ``approve`` signal: ``{"by": USER, "action": optional override}``."""

    by: str
    action: Action | None = None


class RejectSignal(BaseModel):
    """Payload of the ``reject`` signal: ``{"by", "reason"}``."""

    by: str
    reason: str = ""


class CancelSignal(BaseModel):
    """Payload of the ``cancel`` signal: ``{"by", "reason"}``."""

    by: str
    reason: str = ""


class RepairRequest(BaseModel):
    """Input of ``RepairWorkflow`` (JSON a person can type).

    ``action`` is the recommended action (already through catalogue, ladder and the
    migrate evidence gate when the NodeWorkflow built it). ``alerts`` is the evidence.
    """

    model_config = ConfigDict(extra="ignore")

    repair_id: str
    cluster: str
    node: str
    machine_id: str | None = None
    node_pool: str | None = None
    action: Action
    requester: Requester = Field(default_factory=Requester)
    reason: str = ""
    alerts: list[Alert] = Field(default_factory=list)
    detector: str | None = None
    request_id: str | None = None
    auto_approved_rule: str | None = None
    #: State carried across continue-as-new (owned by the workflow; leave it out).
    carried: dict[str, Any] | None = None


AUTO_APPROVED = "auto-approved"
"""``RepairStatus.approved_by`` of a repair the consent policy approved without a person
(docs/design.md §5 consent: *fully automatic* per action and Xid code)."""


class RepairStatus(BaseModel):
    """Result of the ``status`` query on ``RepairWorkflow``.

    ``approved_by``: the approver's name, the requester's for a user-requested repair,
    or :data:`AUTO_APPROVED`; None until approved.
    """

    repair_id: str
    cluster: str
    node: str
    machine_id: str | None = None
    stage: Stage
    action: Action
    requester: Requester
    approved_by: str | None = None
    decided_by_rule: str | None = None
    evidence: list[Alert] = Field(default_factory=list)
    history: list[StageTransition] = Field(default_factory=list)
    detail: str = ""
    #: ``enforce`` or ``shadow`` (issue 29 item 3: a shadow-mode repair ends ``shadowed``
    #: without acting)
    mode: str = "enforce"
    #: One line per evidence capture before a disruptive action (issue 31 item 3):
    #: ``before ACTION (attempt N): evidence: …`` (:meth:`EvidenceCapture.summary`).
    evidence_captures: list[str] = Field(default_factory=list)
    #: ``RepairState`` now (:func:`workflows.protocol.repair_state`): ``in_progress`` for a
    #: repair approved at ``awaiting_approval`` that waits for its lease or a maintenance
    #: window (the stage is kept: docs/design.md §4.4 order); None from workers before it.
    state: str | None = None


class ValidationRequest(BaseModel):
    """Input of ``ValidationWorkflow``: e.g. ``{"cluster": "demo", "machine": "gpu-02"}``."""

    model_config = ConfigDict(extra="ignore")

    cluster: str
    machine: str
    node: str | None = None
    reason: str = "operator request"
    repair_id: str | None = None
    requested_by: str = "operator"
    return_to: str = "pool"


class Verdict(StrEnum):
    """Validation verdict (docs/design.md §1.5)."""

    passed = "passed"
    failed = "failed"
    aborted = "aborted"


class CheckOutcome(StrEnum):
    """Outcome of one check in the validation suite."""

    passed = "passed"
    failed = "failed"
    skipped = "skipped"


class CheckResult(BaseModel):
    """One check: name, outcome, numbers with units, and a log excerpt."""

    name: str
    outcome: CheckOutcome
    detail: str = ""
    measurements: dict[str, float] = Field(default_factory=dict)
    log: str = ""


class ValidationResult(BaseModel):
    """Structured result of a validation run (what ``autorepair-agent validate --json`` prints)."""

    machine: str
    verdict: Verdict
    checks: list[CheckResult] = Field(default_factory=list)
    reason: str = ""
    ticket_id: str | None = None


class NodeInput(BaseModel):
    """Input of ``NodeWorkflow`` (id ``node/{cluster}/{node}``).

    ``carried`` holds the state carried across continue-as-new (owned by the workflow).
    """

    model_config = ConfigDict(extra="ignore")

    cluster: str
    node: str
    machine_id: str | None = None
    node_pool: str | None = None
    carried: dict[str, Any] | None = None


class AttemptRecord(BaseModel):
    """One executed action on a machine, for the ladder (docs/design.md §5)."""

    repair_id: str
    cluster: str
    node: str
    machine_id: str | None = None
    action: Action
    alert_kind: str
    code: int | None = None
    #: succeeded | failed | cancelled | auto_resolved | shadowed (the action a shadow-mode
    #: repair stood for: counted by the rails of shadow-mode repairs only)
    outcome: str
    at: datetime
    #: The write's own idempotency key, ``"<run id>/<n>"`` (``RepairWorkflow`` counts its
    #: ledger writes per run): the same attempt written again by a workflow task re-run
    #: after a worker crash (later ``at``) overwrites its row instead of adding a second
    #: attempt (migration 0013). None: idempotent on (repair, action, at) only.
    write_key: str | None = None
