"""Every Temporal name of gpu-autorepair, and the messages between its workflows.

Names (docs/design.md §4.4; this module is their only home — workflows, ingest, activities and
workers import them from here):

- task queues :data:`TASK_QUEUE` (``autorepair``) and :data:`BMC_TASK_QUEUE`;
- workflow types :data:`NODE_WORKFLOW`, :data:`REPAIR_WORKFLOW`, :data:`GUARD_WORKFLOW`,
  :data:`VALIDATION_WORKFLOW`, and their ids (:func:`workflow_id_node`,
  :func:`workflow_id_repair`, :func:`workflow_id_guard`, :func:`workflow_id_validation`);
- every signal, query and update name (``*_SIGNAL_*``, ``*_QUERY_*``, ``*_UPDATE_*``);
- the custom search attributes as typed keys (``SA_*``; :data:`SEARCH_ATTRIBUTES` maps
  name → type for namespace setup) and the ``RepairState`` value of a stage
  (:func:`repair_state`).

Workflows cannot send updates to each other, so the lease protocol uses signals:

1. the requester (``RepairWorkflow``) signals :data:`GUARD_SIGNAL_ACQUIRE` with a
   :class:`LeaseRequest` to ``guard/{cluster}`` (starting the guard when it is not
   running); acquire is idempotent per ``repair_id``;
2. the guard answers with the signal :data:`REPAIR_SIGNAL_LEASE` (:class:`LeaseReply`)
   to ``LeaseRequest.workflow_id`` — granted at once, or later when budget frees up
   or an operator resets the breaker;
3. while it holds the lease the requester renews it from every long wait by signalling
   :data:`GUARD_SIGNAL_ACQUIRE` again with ``renew=True`` (the full request, so a guard
   that was terminated or reset re-registers the holder); a waiter re-sends its request
   every :data:`LEASE_RESEND_S` for the same reason;
4. the requester signals :data:`GUARD_SIGNAL_RELEASE` (:class:`LeaseRelease`) when it
   ends; a lease neither renewed nor released expires after ``rails.lease_ttl_s``, and an
   expired holder's renewal is a new request (queued when its slot went to another
   repair): it must hold a lease again before its next disruptive step.

The guard holds at most one lease per (cluster, node), and sizes everything from its own
configuration and the ledger (node pools, GPU node count), never from what an agent
reported.

Operators use :data:`GUARD_QUERY_STATUS` (→ :class:`GuardStatus`),
:data:`GUARD_SIGNAL_RESET_BREAKER` (``{"by": USER}``) and
:data:`GUARD_SIGNAL_RELEASE_DOMAIN` (``{"domain": D, "by": USER}``) on ``guard/{cluster}``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey

from workflows.catalogue.kinds import NODE_LEVEL_KINDS
from workflows.leases import DomainFault as DomainFault
from workflows.leases import DomainHold as DomainHold
from workflows.leases import DomainRelease as DomainRelease
from workflows.leases import Lease as Lease
from workflows.leases import LeaseRelease as LeaseRelease
from workflows.leases import LeaseReply as LeaseReply
from workflows.leases import LeaseRequest as LeaseRequest
from workflows.leases import ReleaseDomainSignal as ReleaseDomainSignal
from workflows.leases import ResetBreakerSignal as ResetBreakerSignal
from workflows.models import TERMINAL_STAGES, Action, Alert, RepairRequest, Stage

# --- task queues (defined in workflows.queues, which imports no Temporal) ---
from workflows.queues import BMC_TASK_QUEUE as BMC_TASK_QUEUE
from workflows.queues import TASK_QUEUE as TASK_QUEUE

# --- workflow types (docs/design.md §4.4) ---
NODE_WORKFLOW = "NodeWorkflow"
REPAIR_WORKFLOW = "RepairWorkflow"
GUARD_WORKFLOW = "ClusterGuardWorkflow"
VALIDATION_WORKFLOW = "ValidationWorkflow"


# --- workflow ids (docs/design.md §4.4) ---
def workflow_id_node(cluster: str, node: str) -> str:
    """``node/{cluster}/{node}`` (docs/design.md §4.4)."""
    return f"node/{cluster}/{node}"


def workflow_id_repair(cluster: str, node: str, repair_id: str) -> str:
    """``repair/{cluster}/{node}/{repair_id}`` (docs/design.md §4.4)."""
    return f"repair/{cluster}/{node}/{repair_id}"


def workflow_id_guard(cluster: str) -> str:
    """``guard/{cluster}`` (docs/design.md §4.4)."""
    return f"guard/{cluster}"


def workflow_id_validation(machine: str, n: str | int) -> str:
    """``validate/{machine}/{n}`` (docs/design.md §4.4)."""
    return f"validate/{machine}/{n}"


# --- how a RepairWorkflow ends ---
REPAIR_FAILED = "RepairFailed"
"""``ApplicationError`` type a RepairWorkflow fails with when the repair ended ``failed``
(its final ``RepairStatus`` is the first detail): Temporal (UI, ``ExecutionStatus``)
then shows the workflow as failed, not as a green Completed."""
REPAIR_TIMED_OUT = "RepairTimedOut"
"""``ApplicationError`` type a RepairWorkflow fails with when the repair ended
``timed_out`` (final ``RepairStatus`` as the first detail)."""

# --- how a ValidationWorkflow ends ---
VALIDATION_VERDICT_NOT_APPLIED = "VerdictNotApplied"
"""``ApplicationError`` type a ValidationWorkflow fails with when its verdict was recorded
but could not be applied to the machine (``return_machine`` failed after its retries);
the ``ValidationResult`` is the first detail."""

# --- ClusterGuardWorkflow (id guard/{cluster}) ---
GUARD_SIGNAL_ACQUIRE = "acquire"
GUARD_SIGNAL_RELEASE = "release"
GUARD_SIGNAL_RESET_BREAKER = "reset_breaker"
GUARD_SIGNAL_CLUSTER_ALERT = "cluster_alert"
"""Signal on ``guard/{cluster}`` carrying a cluster-level :class:`~workflows.models.Alert`
(e.g. the ingest's panic-mode alert): recorded in the ledger and notified; it trips
nothing by itself."""
GUARD_SIGNAL_RELEASE_DOMAIN = "release_domain"
"""Signal on ``guard/{cluster}`` (:class:`ReleaseDomainSignal`): an operator lifts the
hold of a failure domain (issue 29 item 2); its waiting repairs are then granted as the
other rails allow, and the release is recorded as the hold alert's clear."""
GUARD_SIGNAL_FAULT_SEEN = "fault_seen"
"""Signal on ``guard/{cluster}`` (:class:`~workflows.leases.FaultReport`): a node of a
failure domain reports an actionable fault when it is first raised, before any repair
asks for a lease (issue 29 item 2: the domain is judged on faults, so a rack whose faults
wait out a grace period is held before the first of its repairs asks)."""
GUARD_QUERY_STATUS = "status"
LEASE_RESEND_S = 300.0
"""How often a repair waiting for a lease re-sends its request, seconds (5 min: a guard
that was terminated or reset learns of every waiter within that time; each re-send adds
a handful of history events, ~100 a day)."""
LEASE_RESEND_JITTER = 0.02
"""A waiter's re-send comes after ``LEASE_RESEND_S × (1 + u × LEASE_RESEND_JITTER)``, u
uniform in [0, 1) from ``workflow.random()`` (replay-safe), so 300–306 s: the repairs a
storm queued at one moment do not re-send in the same instant, and a re-send timer does
not line up, to the millisecond, with another repair's polling that ends on a multiple
of a minute (the grant it then gets would cancel a timer firing at that instant, which
Temporal's time-skipping test server refuses for good: temporalio/sdk-java#3088). Kept
small so that "past ``LEASE_RESEND_S``" stays a few seconds past it."""
LEASE_RENEW_S = 900.0
"""How often a lease holder renews from its long waits, seconds (15 min, or half of
``rails.lease_ttl_s`` when that is shorter): a guard that was reset to an earlier point
learns of every holder within that time; ~6 history events per renewal."""

# --- RepairWorkflow (id repair/{cluster}/{node}/{repair_id}) ---
REPAIR_SIGNAL_APPROVE = "approve"
REPAIR_SIGNAL_REJECT = "reject"
REPAIR_SIGNAL_CANCEL = "cancel"
REPAIR_SIGNAL_LEASE = "lease"
REPAIR_SIGNAL_ATTACH_ALERT = "attach_alert"
REPAIR_QUERY_STATUS = "status"

# --- NodeWorkflow (id node/{cluster}/{node}) ---
NODE_UPDATE_DELIVER_ALERT = "deliver_alert"
"""Update on ``NodeWorkflow`` taking an :class:`~workflows.models.Alert`, returning
:class:`~workflows.models.AlertDelivery`. The ingest service and the watchers call it with
update-with-start (``NodeWorkflow`` started with :class:`~workflows.models.NodeInput`
when not running)."""
NODE_SIGNAL_REPAIR_FINISHED = "repair_finished"
NODE_QUERY_STATUS = "status"

# --- ValidationWorkflow (id validate/{machine}/{n}) ---
VALIDATION_QUERY_STATUS = "status"

# --- custom search attributes (docs/design.md §4.4; all Keyword) ---
SA_NODE = SearchAttributeKey.for_keyword("NodeId")
SA_CLUSTER = SearchAttributeKey.for_keyword("ClusterId")
SA_MACHINE = SearchAttributeKey.for_keyword("MachineId")
SA_ACTION = SearchAttributeKey.for_keyword("RepairAction")
SA_STAGE = SearchAttributeKey.for_keyword("RepairStage")
SA_STATE = SearchAttributeKey.for_keyword("RepairState")
SA_REQUESTER = SearchAttributeKey.for_keyword("Requester")
SA_ALERT_KIND = SearchAttributeKey.for_keyword("AlertKind")
SEARCH_ATTRIBUTE_KEYS: tuple[SearchAttributeKey[Any], ...] = (
    SA_NODE, SA_CLUSTER, SA_MACHINE, SA_ACTION, SA_STAGE, SA_STATE, SA_REQUESTER, SA_ALERT_KIND,
)
"""Every custom search attribute the workflows set; the namespace must register them."""

#: Type names as ``temporal operator search-attribute create --type`` and
#: ``temporal server start-dev --search-attribute NAME=TYPE`` spell them.
_TYPE_NAMES: dict[SearchAttributeIndexedValueType, str] = {
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
    SearchAttributeIndexedValueType.BOOL: "Bool",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
}
SEARCH_ATTRIBUTES: dict[str, str] = {
    k.name: _TYPE_NAMES[k.indexed_value_type] for k in SEARCH_ATTRIBUTE_KEYS
}
"""Custom search attributes and their type names, e.g. ``{"NodeId": "Keyword", ...}``
(what the dev stack registers and ``deploy/temporal/setup-namespace.sh`` must list)."""

#: RepairState search attribute values while a repair is not terminal (terminal repairs
#: carry their terminal stage name: succeeded, failed, rejected, cancelled, ...).
STATE_IN_PROGRESS = "in_progress"
STATE_AWAITING_APPROVAL = "awaiting_approval"


def repair_state(stage: Stage | str, approval_pending: bool | None = None) -> str:
    """``RepairState`` search-attribute value of a repair stage (docs/design.md §4.4 stage names).

    The terminal stage name once ended (``succeeded``, ``failed``, ...),
    :data:`STATE_AWAITING_APPROVAL` while waiting for a person, :data:`STATE_IN_PROGRESS`
    otherwise. ``stage`` is a :class:`~workflows.models.Stage` or its value; an unknown
    string counts as in progress. ``approval_pending``: whether a person is asked now
    (:attr:`~workflows.activity_api.RepairRecord.approval_pending`); ``False`` at
    ``awaiting_approval`` — approved, the repair keeps the stage (the documented order)
    while it waits for its lease or a maintenance window — is :data:`STATE_IN_PROGRESS`.
    ``None`` (unknown: rows written before it was recorded) judges by the stage alone.
    """
    value = stage.value if isinstance(stage, Stage) else stage
    if value in {s.value for s in TERMINAL_STAGES}:
        return value
    if value == Stage.awaiting_approval.value and approval_pending is not False:
        return STATE_AWAITING_APPROVAL
    return STATE_IN_PROGRESS


def repair_identity_attributes(
    req: RepairRequest, machine: str | None
) -> list[tuple[SearchAttributeKey[str], str]]:
    """The search attributes that name a repair (docs/design.md §4.4), as ``(key, value)`` pairs:
    node, cluster, requester (``kind:name``), the first alert's kind (``manual`` without
    one), and the machine when known. One builder for the NodeWorkflow, which starts the
    repair with them, and the RepairWorkflow, which upserts them first."""
    first = req.alerts[0] if req.alerts else None
    pairs: list[tuple[SearchAttributeKey[str], str]] = [
        (SA_NODE, req.node),
        (SA_CLUSTER, req.cluster),
        (SA_REQUESTER, f"{req.requester.kind.value}:{req.requester.name}"),
        (SA_ALERT_KIND, first.kind if first else "manual"),
    ]
    if machine:
        pairs.append((SA_MACHINE, machine))
    return pairs


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
    #: Leases that expired without being renewed or released (newest last, bounded).
    expired: list[Lease] = Field(default_factory=list)
    #: Best-effort side effects (notifications, ledger writes) that failed, newest last.
    errors: list[str] = Field(default_factory=list)
    #: When the guard rebuilt its state from the ledger (a fresh start), if it did.
    rebuilt_at: datetime | None = None
    #: Whether the guard has read the policy (``load_policy``). False in the moment after
    #: a (re)start, or while the policy cannot be read: ``budget`` and
    #: ``breaker_threshold`` are then those of the default policy, which the guard also
    #: serves by until it reads the configured one.
    policy_loaded: bool = True
    #: Failure-domain holds in force (issue 29 item 2): ``{"domain", "opened_at", "nodes",
    #: "kinds", "alert_id", "reason"}`` each.
    domain_holds: list[DomainHold] = Field(default_factory=list)
    #: Lease requests of automatic repairs counted per domain inside ``domain_window_s``.
    domain_faults: list[DomainFault] = Field(default_factory=list)
    #: The newest releases of holds (``{"domain", "by", "reason", "at", "opened_at"}``).
    domain_releases: list[DomainRelease] = Field(default_factory=list)
    domain_threshold: int = 3
    domain_window_s: float = 600.0


class RepairFinished(BaseModel):
    """Repair → node (signal ``repair_finished``): the repair reached a terminal stage."""

    repair_id: str
    stage: Stage
    at: datetime
    alert_ids: list[str] = Field(default_factory=list)
    #: The actions that ran on the machine, in order (``None``: a sender that predates
    #: the field; the node then judges by the action it started the repair with). An
    #: operator's ``approve --action`` or the ladder can make them differ from it.
    actions: list[Action] | None = None
    #: The repair ended because its machine is held for RMA (I18: removed and not
    #: returned): the node takes the faults it stood for as dealt with — the machine is
    #: out of service — so it does not open another repair for them every cooldown.
    machine_held: bool = False
    #: Alerts attached after the repair last checked that its fault had not come back
    #: (while it put the node back in service and closed): nothing judged them, so the
    #: node keeps their faults open instead of retiring them as fixed (I20; a recurrence
    #: from the new boot received during the rejoin, with or without a boot id).
    unjudged_alert_ids: list[str] = Field(default_factory=list)


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
    #: Faults held by a grace period after maintenance: fault key → why and until when
    #: (issue 29 item 1, ``policy.maintenance.grace_s``).
    held: dict[str, str] = Field(default_factory=dict)


def fault_key(alert: Alert) -> str:
    """Identity of one fault on one node across raise/clear edges: ``kind:code:gpu``
    (``kind:code:`` for :data:`~workflows.catalogue.kinds.NODE_LEVEL_KINDS`).

    A clear (``active=False``) has its own ``alert_id`` but the same fault key as the
    raise it clears.
    """
    gpu = "" if alert.kind in NODE_LEVEL_KINDS else (alert.gpu or "")
    return f"{alert.kind}:{alert.code if alert.code is not None else ''}:{gpu}"
