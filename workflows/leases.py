"""The lease protocol's messages between repairs and the cluster guard (docs/design.md §4.4),
kept free of Temporal so the pure guard machine (:mod:`workflows.lifecycle.guard`) can
use them; :mod:`workflows.protocol` re-exports every name (the wire format is unchanged).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from workflows.models import RequesterKind


class LeaseRequest(BaseModel):
    """Ask the cluster guard for a repair lease (signal ``acquire``).

    ``node_pool``: the pool the requester found in the configuration; the guard uses its
    own configuration's pool for the node when it has one. ``renew``: the requester holds
    (or held) a lease and is renewing it. ``gpu_evidence``: the repair's evidence names a
    GPU (counted for the breaker's denominator when no GPU node count is configured).
    ``requested_at``: when the repair first asked (kept across re-sends).
    """

    repair_id: str
    workflow_id: str
    cluster: str
    node: str
    node_pool: str | None = None
    automatic: bool = True
    requester_kind: RequesterKind = RequesterKind.system
    renew: bool = False
    gpu_evidence: bool = False
    requested_at: datetime | None = None
    #: Kinds of the repair's actionable faults (the failure-domain hold names them;
    #: empty from a requester that predates the field).
    fault_kinds: list[str] = Field(default_factory=list)


class LeaseReply(BaseModel):
    """Guard → requester (signal ``lease``).

    ``granted`` false with ``queued`` true: wait, a later reply grants it (a renewal
    answered so means the lease expired and its slot is taken: do not act until granted).
    ``reset_at``: set when the grant came after a breaker reset — evidence observed
    before it is stale (docs/design.md §5 rails: evidence is re-checked right before acting).
    """

    repair_id: str
    granted: bool
    queued: bool = False
    reason: str = ""
    reset_at: datetime | None = None
    #: When the granted lease expires unless renewed (None on a refusal).
    expires_at: datetime | None = None


class LeaseRelease(BaseModel):
    """Requester → guard (signal ``release``) when the repair ends or stops waiting."""

    repair_id: str
    outcome: str = ""


class ResetBreakerSignal(BaseModel):
    """Payload of ``reset_breaker``: ``{"by": "alice", "reason": "storage back"}``."""

    by: str
    reason: str = ""


class ReleaseDomainSignal(BaseModel):
    """Payload of ``release_domain`` (issue 29 item 2): an operator lifts the hold of a
    failure domain, ``{"domain": "rack-07", "by": "alice", "reason": "PSU replaced"}``."""

    domain: str = Field(min_length=1, max_length=253)
    by: str
    reason: str = ""


class FaultReport(BaseModel):
    """Payload of ``fault_seen`` (issue 29 item 2): node ``node`` of ``cluster``, which
    belongs to ``domains``, raised the actionable fault ``alert_id`` of ``kind`` (``code``:
    the Xid or other code, None when it has none). Time is the guard's: it counts the
    report when it arrives, never at a sender's clock."""

    cluster: str
    node: str
    alert_id: str
    kind: str
    code: int | None = None
    domains: list[str] = Field(default_factory=list)


class DomainFault(BaseModel):
    """A count toward a failure domain's hold: ``node`` of ``domain`` asked at ``at``
    (the guard's clock) for ``kinds``. ``repair_id``: the repair whose lease request
    counted, or ``fault/{alert id}`` for a node's :class:`FaultReport`."""

    domain: str
    node: str
    repair_id: str
    kinds: list[str] = Field(default_factory=list)
    at: datetime


class DomainHold(BaseModel):
    """A failure-domain hold in force (issue 29 item 2): no automatic repair of a node of
    ``domain`` is granted a lease until an operator releases it. ``nodes`` and ``kinds``:
    what opened it (sorted); ``alert_id``: its ``failure_domain`` cluster alert."""

    domain: str
    opened_at: datetime
    nodes: list[str] = Field(default_factory=list)
    kinds: list[str] = Field(default_factory=list)
    alert_id: str
    reason: str = ""


class DomainRelease(BaseModel):
    """An operator's release of a hold (kept for ``status``, newest last)."""

    domain: str
    by: str
    reason: str = ""
    at: datetime
    opened_at: datetime | None = None


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
    #: ``ledger`` for a lease the guard rebuilt from the ledger's open repairs after a
    #: fresh start (its holder re-registers on its next renewal), else ``granted``.
    source: str = "granted"
    #: The breaker reset the grant carried (``LeaseReply.reset_at``; None: none): every
    #: later answer to the holder carries it too, so a holder whose grant reply was lost
    #: still acts only on evidence observed after the reset (I23, issue 30 item 1).
    evidence_after: datetime | None = None
