"""Messages between the workflows of this package (lease protocol, node ↔ repair).

Workflows cannot send updates to each other, so the lease protocol uses signals:

1. the requester (``RepairWorkflow``) signals :data:`GUARD_SIGNAL_ACQUIRE` with a
   :class:`LeaseRequest` to ``guard/{cluster}`` (starting the guard when it is not
   running); acquire is idempotent per ``repair_id``;
2. the guard answers with the signal :data:`REPAIR_SIGNAL_LEASE` (:class:`LeaseReply`)
   to ``LeaseRequest.workflow_id`` — granted at once, or later when budget frees up
   or an operator resets the breaker;
3. the requester signals :data:`GUARD_SIGNAL_RELEASE` (:class:`LeaseRelease`) when it
   ends; a lease never released expires after ``rails.lease_ttl_s``.

Operators use :data:`GUARD_QUERY_STATUS` (→ :class:`GuardStatus`) and
:data:`GUARD_SIGNAL_RESET_BREAKER` (``{"by": USER}``) on ``guard/{cluster}``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workflows.models import Alert, RequesterKind, Stage

# --- ClusterGuardWorkflow (id guard/{cluster}) ---
GUARD_SIGNAL_ACQUIRE = "acquire"
GUARD_SIGNAL_RELEASE = "release"
GUARD_SIGNAL_RESET_BREAKER = "reset_breaker"
GUARD_SIGNAL_CLUSTER_ALERT = "cluster_alert"
"""Signal on ``guard/{cluster}`` carrying a cluster-level :class:`~workflows.models.Alert`
(e.g. the ingest's panic-mode alert): recorded in the ledger and notified; it trips
nothing by itself."""
GUARD_QUERY_STATUS = "status"

# --- RepairWorkflow (id repair/{cluster}/{node}/{repair_id}) ---
REPAIR_SIGNAL_APPROVE = "approve"
REPAIR_SIGNAL_REJECT = "reject"
REPAIR_SIGNAL_CANCEL = "cancel"
REPAIR_SIGNAL_LEASE = "lease"
REPAIR_SIGNAL_ATTACH_ALERT = "attach_alert"
REPAIR_QUERY_STATUS = "status"

# --- NodeWorkflow (id node/{cluster}/{node}) ---
NODE_UPDATE_DELIVER_ALERT = "deliver_alert"
NODE_SIGNAL_REPAIR_FINISHED = "repair_finished"
NODE_QUERY_STATUS = "status"

#: RepairState search attribute values while a repair is not terminal (terminal repairs
#: carry their terminal stage name: succeeded, failed, rejected, cancelled, ...).
STATE_IN_PROGRESS = "in_progress"
STATE_AWAITING_APPROVAL = "awaiting_approval"


class LeaseRequest(BaseModel):
    """Ask the cluster guard for a repair lease (signal ``acquire``)."""

    repair_id: str
    workflow_id: str
    cluster: str
    node: str
    node_pool: str | None = None
    automatic: bool = True
    requester_kind: RequesterKind = RequesterKind.system


class LeaseReply(BaseModel):
    """Guard → requester (signal ``lease``).

    ``granted`` false with ``queued`` true: wait, a later reply grants it.
    ``reset_at``: set when the grant came after a breaker reset — evidence observed
    before it is stale (scenario 7).
    """

    repair_id: str
    granted: bool
    queued: bool = False
    reason: str = ""
    reset_at: datetime | None = None


class LeaseRelease(BaseModel):
    """Requester → guard (signal ``release``) when the repair ends or stops waiting."""

    repair_id: str
    outcome: str = ""


class ResetBreakerSignal(BaseModel):
    """Payload of ``reset_breaker``: ``{"by": "alice", "reason": "storage back"}``."""

    by: str
    reason: str = ""


class Lease(BaseModel):
    """A granted lease as the guard holds it."""

    repair_id: str
    workflow_id: str
    node: str
    node_pool: str | None = None
    automatic: bool = True
    requester_kind: RequesterKind = RequesterKind.system
    granted_at: datetime
    expires_at: datetime


class GuardInput(BaseModel):
    """Input of ``ClusterGuardWorkflow``: ``{"cluster": "demo"}``; ``carried`` is owned
    by the workflow (state across continue-as-new)."""

    model_config = ConfigDict(extra="ignore")

    cluster: str
    carried: dict[str, Any] | None = None


class GuardStatus(BaseModel):
    """Result of the guard's ``status`` query (what ``autorepair breaker status`` prints).

    ``budget``: concurrent repairs allowed; ``breaker_threshold``: automatic
    repairs/cordons within ``breaker_window_s`` that trip the breaker;
    ``recent_automatic``: times of those requests inside the window.
    """

    cluster: str
    gpu_nodes: int
    budget: int
    breaker_threshold: int
    breaker_window_s: float
    breaker_open: bool
    tripped_at: datetime | None = None
    tripped_reason: str = ""
    reset_at: datetime | None = None
    reset_by: str | None = None
    leases: list[Lease] = Field(default_factory=list)
    pending: list[LeaseRequest] = Field(default_factory=list)
    recent_automatic: list[datetime] = Field(default_factory=list)
    refused_total: int = 0


class RepairFinished(BaseModel):
    """Repair → node (signal ``repair_finished``): the repair reached a terminal stage."""

    repair_id: str
    stage: Stage
    at: datetime
    alert_ids: list[str] = Field(default_factory=list)


class NodeStatus(BaseModel):
    """Result of the NodeWorkflow ``status`` query."""

    cluster: str
    node: str
    degraded: bool
    active_alerts: list[Alert] = Field(default_factory=list)
    first_seen: dict[str, datetime] = Field(default_factory=dict)
    repair_id: str | None = None
    cooldown_until: datetime | None = None
    seen_alert_ids: int = 0
    recommendations: int = 0
    diagnostics: list[str] = Field(default_factory=list)


def fault_key(alert: Alert) -> str:
    """Identity of one fault on one node across raise/clear edges: ``kind:code:gpu``.

    A clear (``active=False``) has its own ``alert_id`` but the same fault key as the
    raise it clears.
    """
    return f"{alert.kind}:{alert.code if alert.code is not None else ''}:{alert.gpu or ''}"
