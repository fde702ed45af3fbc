"""The repair API (``/api/v1/repairs`` on the API port) and the intake behind it.

Every repair that does not come from the platform's own detection — an operator's, an
HTTP detector's, a Kubernetes node annotation's (``workers.watchers.kube``) — enters
through :class:`RepairIntake`, so it becomes the same ledger record and the same
``RepairWorkflow`` (id ``repair/{cluster}/{node}/{repair_id}``, input
:class:`~workflows.models.RepairRequest`) as a system repair, and passes the same
evidence gate, guard lease (capacity, budget, breaker) and rails inside that workflow.

Intake rules (DESIGN §5):

* **Idempotency, forever.** ``detector + request_id`` is claimed in the ledger
  (``idempotency_keys``); the repair id is derived from that key
  (:func:`repair_id_for_request`), so a retried or racing create returns the one
  existing repair, also after it finished.
* **Detector cap.** At most ``policy.rails.detector_cap`` detector-requested repairs in
  flight per cluster; a request beyond it is *refused and recorded*: a repair row in
  stage ``rejected`` whose transition reason names the cap.
* **Remove is human-only.** A detector asking for ``remove`` is refused (HTTP: 403;
  annotation: recorded refusal).
* **Approval.** Node-annotation requests skip the approval queue
  (``RepairRequest.auto_approved_rule = "detector_request"``); HTTP requests go through
  the consent policy like any other repair (a detector's request waits for an operator's
  approval under the default *approve before repair*; an operator's own request counts
  as approved by its creator, except ``remove``, which always waits for a person).

HTTP (JSON; ``Authorization: Bearer TOKEN``; OpenAPI at ``/api/v1/openapi.json``):

====== ================================= ========= ==========================================
method path                              role      answer
====== ================================= ========= ==========================================
POST   /api/v1/repairs                   detector+ 201 new / 200 existing :class:`CreateResult`
GET    /api/v1/repairs?node&cluster&...  viewer+   200 ``{"repairs": [RepairView, ...]}``
GET    /api/v1/repairs/{id}              viewer+   200 :class:`RepairView` (with live status)
POST   /api/v1/repairs/{id}/approve      operator  200 :class:`RepairView`
POST   /api/v1/repairs/{id}/reject       operator  200 :class:`RepairView`
POST   /api/v1/repairs/{id}/cancel       operator  200 :class:`RepairView`
====== ================================= ========= ==========================================

Errors: 401 without or with an unknown token (or when no tokens file is configured),
403 for a role that may not do it, 404 unknown repair, 409 decision on a finished
repair or a request id reused for another node, 422 malformed body naming the field
(FastAPI's ``{"detail": [{"loc": ["body", FIELD], "msg": ...}]}`` shape).
"""

# No ``from __future__ import annotations``: FastAPI resolves the dependency annotations
# of the route closures at definition time.
import asyncio
import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, cast

import asyncpg
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.ledger import Ledger, connect
from workflows.activity_api import ClaimInput, RepairRecord
from workflows.config import AutorepairConfig, ClusterConfig
from workflows.models import (
    TERMINAL_STAGES,
    Action,
    Alert,
    ApproveSignal,
    CancelSignal,
    RejectSignal,
    RepairRequest,
    RepairStatus,
    Requester,
    RequesterKind,
    Severity,
    Stage,
    workflow_id_repair,
)

log = logging.getLogger("autorepair.api.repairs")

REPAIR_WORKFLOW = "RepairWorkflow"
"""Workflow type of a repair (DESIGN §4.4)."""
SIGNAL_APPROVE, SIGNAL_REJECT, SIGNAL_CANCEL, QUERY_STATUS = "approve", "reject", "cancel", "status"
"""Signal and query names on ``RepairWorkflow`` (DESIGN §4.4)."""
DETECTOR_RULE = "detector_request"
"""``RepairRequest.auto_approved_rule`` of detector requests: they skip the approval queue."""
REQUEST_ALERT_KIND = "repair_request"
"""Alert kind of the evidence record an external request carries."""
ROLES: frozenset[str] = frozenset({"operator", "detector", "viewer"})
"""Token roles (``workflows.config.ApiConfig.tokens_file``)."""
_QUERY_TIMEOUT = timedelta(seconds=2)
_CAP_LOCK_NS = 0x6172_6361  # advisory lock namespace for the per-cluster detector cap


# ------------------------------------------------------------------------- auth
@dataclass(frozen=True, slots=True)
class Principal:
    """Who called: ``user`` and ``role`` (operator | detector | viewer)."""

    user: str
    role: str


class ApiTokens:
    """Bearer tokens of the repair API, from a file of ``TOKEN ROLE USER`` lines.

    Blank lines and ``#`` comments are ignored. Lookup compares the presented token
    against *every* configured token with ``hmac.compare_digest`` (constant time, no
    early exit). Tokens never reach logs or error messages.
    """

    def __init__(self, entries: list[tuple[bytes, Principal]]) -> None:
        self._entries = tuple(entries)

    @property
    def enabled(self) -> bool:
        """True when at least one token is configured."""
        return bool(self._entries)

    @classmethod
    def load(cls, path: str | Path | None) -> "ApiTokens":
        """Read ``path`` (``None`` → no tokens: every request is refused with 401).

        Raises ``ValueError`` naming the file and line for an unreadable file, a line
        without three fields, or an unknown role.
        """
        if not path:
            return cls([])
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"api.tokens_file {str(path)!r}: {e.strerror}") from e
        entries: list[tuple[bytes, Principal]] = []
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 3:
                raise ValueError(
                    f"api.tokens_file {str(path)!r} line {n}: expected 'TOKEN ROLE USER', "
                    f"got {len(parts)} fields"
                )
            token, role, user = parts
            if role not in ROLES:
                raise ValueError(
                    f"api.tokens_file {str(path)!r} line {n}: role {role!r} is not one of "
                    f"{sorted(ROLES)}"
                )
            entries.append((token.encode(), Principal(user=user, role=role)))
        return cls(entries)

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal of ``token``, or ``None`` (constant time over all tokens)."""
        if not token:
            return None
        cand = token.encode()
        found: Principal | None = None
        for t, p in self._entries:
            if hmac.compare_digest(cand, t) and found is None:
                found = p
        return found


# ----------------------------------------------------------------------- models
class RepairMode(StrEnum):
    """What an external request may ask for (DESIGN §4.1 ``--mode``)."""

    reboot = "reboot"
    reprovision = "reprovision"
    migrate = "migrate"
    remove = "remove"


_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"


class RepairCreate(BaseModel):
    """Body of ``POST /api/v1/repairs``.

    ``request_id`` with ``detector`` is the idempotency key (forever). ``detector``
    defaults to the token's user for the detector role and to ``user:<name>`` for an
    operator. ``evidence_alert`` cites a ledger alert id; ``evidence_run`` names a
    health-check run of the detector. ``detected_at``: when the fault was detected
    (default: now). ``cluster`` may be left out when the node belongs to exactly one
    configured cluster (or only one is configured).
    """

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1, max_length=253, pattern=_NAME)
    mode: RepairMode
    request_id: str = Field(min_length=1, max_length=256)
    reason: str = Field(min_length=1, max_length=4000)
    detector: str | None = Field(None, min_length=1, max_length=128, pattern=_NAME)
    cluster: str | None = Field(None, min_length=1, max_length=253)
    evidence_alert: str | None = Field(None, min_length=1, max_length=256)
    evidence_run: str | None = Field(None, min_length=1, max_length=256)
    detected_at: datetime | None = None


class DecisionBody(BaseModel):
    """Body of approve / reject / cancel: a reason and, for approve, an action override."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field("", max_length=4000)
    action: Action | None = None


class TransitionView(BaseModel):
    """One recorded stage transition."""

    stage: str
    at: datetime
    by: str
    reason: str = ""


class RepairView(BaseModel):
    """A repair as the API shows it (ledger row, transitions, live workflow status).

    ``state``: ``awaiting_approval``, ``in_progress`` or the terminal stage name
    (the ``RepairState`` search attribute values).
    """

    repair_id: str
    cluster: str
    node: str
    machine_id: str | None = None
    action: str
    stage: str
    state: str
    requester_kind: str
    requester_name: str
    detector: str | None = None
    request_id: str | None = None
    reason: str = ""
    approved_by: str | None = None
    decided_by_rule: str | None = None
    alert_ids: list[str] = Field(default_factory=list)
    workflow_id: str | None = None
    created_at: datetime
    updated_at: datetime
    transitions: list[TransitionView] = Field(default_factory=list)
    live: RepairStatus | None = None


class CreateResult(BaseModel):
    """Answer of a create: ``created`` false for a retried key; ``refused`` with
    ``refused_reason`` when the request was recorded as refused (detector cap, remove)."""

    created: bool
    refused: bool = False
    refused_reason: str = ""
    repair: RepairView


class RepairList(BaseModel):
    """Answer of ``GET /api/v1/repairs``."""

    repairs: list[RepairView]


class AlertList(BaseModel):
    """Answer of ``GET /api/v1/alerts``: recorded alerts, newest first."""

    alerts: list[Alert]


# ------------------------------------------------------------------------ errors
class IntakeError(Exception):
    """A request the intake cannot take; ``status`` is the HTTP status, ``field`` the
    body field at fault (or ``None``)."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field

    def detail(self) -> Any:
        """FastAPI-shaped detail: a list naming the field for 422, else the message."""
        if self.status == 422 and self.field:
            return [{"loc": ["body", self.field], "msg": self.message, "type": "value_error"}]
        return self.message


# ------------------------------------------------------------------------ intake
def repair_id_for_request(detector: str, request_id: str) -> str:
    """Repair id of an external request: ``req-`` + 16 hex digits of
    sha256(detector NUL request_id). Deterministic, so racing creates agree."""
    digest = hashlib.sha256(f"{detector}\0{request_id}".encode()).hexdigest()
    return f"req-{digest[:16]}"


def repair_state(stage: str) -> str:
    """``RepairState`` value of a stage: terminal name, ``awaiting_approval`` or
    ``in_progress``."""
    if stage in {s.value for s in TERMINAL_STAGES}:
        return stage
    return "awaiting_approval" if stage == Stage.awaiting_approval.value else "in_progress"


def _view(row: dict[str, Any], live: RepairStatus | None = None) -> RepairView:
    return RepairView(
        repair_id=row["repair_id"],
        cluster=row["cluster"],
        node=row["node"],
        machine_id=row.get("machine_id"),
        action=row["action"],
        stage=row["stage"],
        state=repair_state(row["stage"]),
        requester_kind=row["requester_kind"],
        requester_name=row["requester_name"],
        detector=row.get("detector"),
        request_id=row.get("request_id"),
        reason=row.get("reason") or "",
        approved_by=row.get("approved_by"),
        decided_by_rule=row.get("decided_by_rule"),
        alert_ids=list(row.get("alert_ids") or []),
        workflow_id=row.get("workflow_id"),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        transitions=[
            TransitionView(stage=t["stage"], at=t["at"], by=t["by_whom"], reason=t["reason"])
            for t in row.get("transitions", [])
        ],
        live=live,
    )


class RepairIntake:
    """Creates, lists and decides repairs (see module docstring).

    ``ledger``: the PostgreSQL ledger (its pool needs at least 2 connections: the cap
    check holds one under an advisory lock). ``client``: Temporal client with the
    pydantic data converter. ``clock``: timezone-aware now, for tests.
    """

    def __init__(
        self,
        config: AutorepairConfig,
        ledger: Ledger,
        client: Client,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.client = client
        self.clock = clock or (lambda: datetime.now(UTC))

    # -- lookups ---------------------------------------------------------------------
    def resolve_cluster(self, cluster: str | None, node: str) -> ClusterConfig | None:
        """The configured cluster of the request (``None`` when none is configured and
        ``cluster`` was given: an unconfigured cluster is accepted as named).

        Raises :class:`IntakeError` 422 naming ``cluster`` or ``node``."""
        clusters = self.config.clusters
        if cluster is not None:
            for c in clusters:
                if c.name == cluster:
                    if c.nodes and node not in {n.name for n in c.nodes}:
                        raise IntakeError(
                            422, f"node {node!r} is not a node of cluster {cluster!r}", "node"
                        )
                    return c
            if clusters:
                raise IntakeError(
                    422,
                    f"unknown cluster {cluster!r} (configured: {[c.name for c in clusters]})",
                    "cluster",
                )
            return None
        owners = [c for c in clusters if node in {n.name for n in c.nodes}]
        if len(owners) == 1:
            return owners[0]
        if not owners and len(clusters) == 1:
            if clusters[0].nodes:
                raise IntakeError(
                    422, f"node {node!r} is not a node of cluster {clusters[0].name!r}", "node"
                )
            return clusters[0]
        raise IntakeError(
            422,
            f"required: node {node!r} is in {len(owners)} of the configured clusters",
            "cluster",
        )

    async def _evidence(
        self, req: RepairCreate, cluster: str, requester: Requester, detector: str,
        repair_id: str, machine_id: str | None, pool: str | None, now: datetime,
    ) -> list[Alert]:
        alerts: list[Alert] = []
        if req.evidence_alert:
            cited = await self.ledger.get_alert(req.evidence_alert)
            if cited is None:
                raise IntakeError(
                    422, f"no alert {req.evidence_alert!r} in the ledger", "evidence_alert"
                )
            if cited.cluster != cluster or cited.node != req.node:
                raise IntakeError(
                    422,
                    f"alert {req.evidence_alert!r} is on {cited.cluster}/{cited.node}, "
                    f"not {cluster}/{req.node}",
                    "evidence_alert",
                )
            alerts.append(cited)
        detected = req.detected_at or now
        if detected.tzinfo is None:
            detected = detected.replace(tzinfo=UTC)
        evidence: dict[str, Any] = {
            "detector": detector,
            "request_id": req.request_id,
            "mode": req.mode.value,
            "detected_at": detected.isoformat(),
            "requester_kind": requester.kind.value,
            "requester": requester.name,
        }
        if req.evidence_run:
            evidence["health_check_run"] = req.evidence_run
        if req.evidence_alert:
            evidence["alert_id"] = req.evidence_alert
        alerts.append(
            Alert(
                alert_id="rq-" + repair_id.removeprefix("req-"),
                cluster=cluster,
                node=req.node,
                machine_id=machine_id,
                node_pool=pool,
                kind=REQUEST_ALERT_KIND,
                severity=Severity.warning,
                actionable=True,
                action=Action(req.mode.value),
                summary=f"{detector} requests {req.mode.value} of {req.node}",
                description=req.reason,
                evidence_text=req.reason,
                evidence=evidence,
                source=f"{requester.kind.value}:{requester.name}",
                observed_at=detected,
            )
        )
        return alerts

    # -- create ----------------------------------------------------------------------
    async def create(
        self,
        req: RepairCreate,
        requester: Requester,
        *,
        skip_approval: bool = False,
        refuse_remove: bool | None = None,
    ) -> CreateResult:
        """Record and start the repair ``req`` asks for (idempotent on detector +
        request id, forever).

        ``requester``: who asks (a detector is never recorded as a user).
        ``skip_approval``: detector requests bypass the approval queue.
        ``refuse_remove``: record ``remove`` as refused (default: for detectors).

        Raises :class:`IntakeError` (422 unknown cluster/node/evidence alert, 409 request
        id already used for another node).
        """
        detector = req.detector or (
            requester.name if requester.kind == RequesterKind.detector
            else f"user:{requester.name}"
        )
        cfg = self.resolve_cluster(req.cluster, req.node)
        cluster = cfg.name if cfg is not None else str(req.cluster)
        node_cfg = next((n for n in cfg.nodes if n.name == req.node), None) if cfg else None
        machine_id = node_cfg.machine if node_cfg else None
        pool = node_cfg.pool if node_cfg else None
        now = self.clock()
        repair_id = repair_id_for_request(detector, req.request_id)
        alerts = await self._evidence(
            req, cluster, requester, detector, repair_id, machine_id, pool, now
        )

        remove_refused = (
            refuse_remove if refuse_remove is not None
            else requester.kind == RequesterKind.detector
        )
        refusal = ""
        if req.mode == RepairMode.remove and remove_refused:
            refusal = "refused: remove is human-only (DESIGN §5); a detector may not request it"
        for a in alerts:
            await self.ledger.record_alert(a)
        wf_id = workflow_id_repair(cluster, req.node, repair_id)
        async with self.ledger.pool.acquire() as conn, conn.transaction():
            # One transaction under a per-cluster lock: claim the key, check the cap and
            # record the repair, so racing requests see one winner and cannot overshoot
            # the cap. A Ledger over this connection runs the ledger's own statements.
            await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))",
                               _CAP_LOCK_NS, cluster)
            locked = Ledger(cast(asyncpg.Pool, conn))
            claim = await locked.claim_request(
                ClaimInput(detector=detector, request_id=req.request_id, repair_id=repair_id,
                           cluster=cluster, node=req.node)
            )
            repair_id = claim.repair_id
            existing = await locked.get_repair(repair_id)
            if existing is not None and (
                existing["cluster"] != cluster or existing["node"] != req.node
            ):
                raise IntakeError(
                    409,
                    f"request_id {req.request_id!r} of detector {detector!r} already names "
                    f"repair {repair_id} on {existing['cluster']}/{existing['node']}",
                    "request_id",
                )
            if existing is None:
                if not refusal and requester.kind == RequesterKind.detector:
                    cap = self.config.policy.rails.detector_cap
                    in_flight = await locked.count_detector_repairs(cluster)
                    if in_flight >= cap:
                        refusal = (
                            f"refused: detector cap reached — {in_flight} detector-requested "
                            f"repairs in flight in cluster {cluster!r} "
                            f"(policy.rails.detector_cap={cap})"
                        )
                await locked.upsert_repair(
                    RepairRecord(
                        repair_id=repair_id, cluster=cluster, node=req.node,
                        machine_id=machine_id, action=Action(req.mode.value),
                        stage=Stage.rejected if refusal else Stage.recommended,
                        requester=requester, reason=req.reason, detector=detector,
                        request_id=req.request_id, alert_ids=[a.alert_id for a in alerts],
                        workflow_id=None if refusal else wf_id, updated_at=now,
                    )
                )
                if refusal:
                    await locked.pool.execute(
                        """INSERT INTO repair_transitions (repair_id, stage, at, by_whom, reason)
                           VALUES ($1, $2, $3, 'autorepair', $4) ON CONFLICT DO NOTHING""",
                        repair_id, Stage.rejected.value, now, refusal,
                    )
        if existing is not None and existing["stage"] != Stage.recommended.value:
            log.info("event=repair_request_replayed repair_id=%s detector=%s request_id=%s",
                     repair_id, detector, req.request_id)
            refused = existing["workflow_id"] is None and existing["stage"] == "rejected"
            return CreateResult(
                created=False, refused=refused,
                refused_reason=existing["transitions"][-1]["reason"] if refused else "",
                repair=_view(existing),
            )
        request = RepairRequest(
            repair_id=repair_id, cluster=cluster, node=req.node, machine_id=machine_id,
            node_pool=pool, action=Action(req.mode.value), requester=requester,
            reason=req.reason, alerts=alerts, detector=detector, request_id=req.request_id,
            auto_approved_rule=DETECTOR_RULE if skip_approval else None,
        )
        if refusal:
            log.warning(
                "event=repair_request_refused cluster=%s node=%s repair_id=%s detector=%s "
                "request_id=%s reason=%r", cluster, req.node, repair_id, detector,
                req.request_id, refusal,
            )
        else:
            try:
                await self.client.start_workflow(
                    REPAIR_WORKFLOW, request, id=wf_id,
                    task_queue=self.config.temporal.task_queue,
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                )
            except WorkflowAlreadyStartedError:
                pass
            log.info(
                "event=repair_requested cluster=%s node=%s repair_id=%s action=%s "
                "requester=%s:%s detector=%s request_id=%s",
                cluster, req.node, repair_id, req.mode.value, requester.kind.value,
                requester.name, detector, req.request_id,
            )
        row = await self.ledger.get_repair(repair_id)
        assert row is not None
        return CreateResult(created=claim.created, refused=bool(refusal),
                            refused_reason=refusal, repair=_view(row))

    # -- read ------------------------------------------------------------------------
    async def get(self, repair_id: str, *, live: bool = True) -> RepairView:
        """The repair with its transitions and (``live``) workflow status.

        Raises :class:`IntakeError` 404 for an unknown id."""
        row = await self.ledger.get_repair(repair_id)
        if row is None:
            raise IntakeError(404, f"no repair {repair_id!r}")
        status: RepairStatus | None = None
        if live and row.get("workflow_id"):
            try:
                status = await self._handle(row).query(
                    QUERY_STATUS, result_type=RepairStatus, rpc_timeout=_QUERY_TIMEOUT
                )
            except Exception as e:  # live status is best effort; the ledger answers
                log.debug("event=repair_query_failed repair_id=%s error=%s", repair_id,
                          type(e).__name__)
        return _view(row, status)

    async def list(
        self, *, cluster: str | None = None, node: str | None = None, state: str | None = None,
        action: str | None = None, requester: str | None = None, limit: int = 200,
    ) -> list[RepairView]:
        """Repairs newest first. ``state``: a stage name, ``open`` (not terminal),
        ``awaiting_approval``, ``in_progress`` or a terminal state.

        Raises :class:`IntakeError` 422 naming ``state`` or ``action`` when unknown."""
        stages = {s.value for s in Stage}
        if state is not None and state not in stages | {"open", "in_progress"}:
            raise IntakeError(422, f"state {state!r} is not a stage, 'open' or 'in_progress'",
                              "state")
        if action is not None and action not in {a.value for a in Action}:
            raise IntakeError(422, f"action {action!r} is not an action", "action")
        exact = state if state in stages else None
        rows = await self.ledger.list_repairs(
            cluster=cluster, node=node, stage=exact, action=action, requester=requester,
            limit=limit,
        )
        out = [_view(r) for r in rows]
        if state == "open":
            out = [v for v in out if v.stage not in {s.value for s in TERMINAL_STAGES}]
        elif state == "in_progress":
            out = [v for v in out if v.state == "in_progress"]
        return out

    # -- decisions -------------------------------------------------------------------
    def _handle(self, row: dict[str, Any]) -> WorkflowHandle[Any, Any]:
        wf_id = row.get("workflow_id") or workflow_id_repair(
            row["cluster"], row["node"], row["repair_id"])
        return self.client.get_workflow_handle(wf_id)

    async def _decide(self, repair_id: str, signal: str, payload: BaseModel) -> RepairView:
        row = await self.ledger.get_repair(repair_id)
        if row is None:
            raise IntakeError(404, f"no repair {repair_id!r}")
        if row["stage"] in {s.value for s in TERMINAL_STAGES}:
            raise IntakeError(409, f"repair {repair_id} already finished ({row['stage']})")
        try:
            await self._handle(row).signal(signal, payload)
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise IntakeError(409, f"repair {repair_id} has no running workflow") from e
            raise
        log.info("event=repair_%s repair_id=%s by=%s", signal, repair_id,
                 getattr(payload, "by", ""))
        return await self.get(repair_id, live=False)

    async def approve(self, repair_id: str, by: str, action: Action | None = None) -> RepairView:
        """Signal ``approve {"by", "action"}``. Raises :class:`IntakeError` 404/409."""
        return await self._decide(repair_id, SIGNAL_APPROVE, ApproveSignal(by=by, action=action))

    async def reject(self, repair_id: str, by: str, reason: str = "") -> RepairView:
        """Signal ``reject {"by", "reason"}``. Raises :class:`IntakeError` 404/409."""
        return await self._decide(repair_id, SIGNAL_REJECT, RejectSignal(by=by, reason=reason))

    async def cancel(self, repair_id: str, by: str, reason: str = "") -> RepairView:
        """Signal ``cancel {"by", "reason"}``. Raises :class:`IntakeError` 404/409."""
        return await self._decide(repair_id, SIGNAL_CANCEL, CancelSignal(by=by, reason=reason))


class LazyIntake:
    """Connects the ledger on first use (the API app is built before the loop runs).

    ``get()`` raises ``RuntimeError`` naming ``ledger.dsn`` when it is empty or
    PostgreSQL is unreachable (the API answers 503)."""

    def __init__(self, config: AutorepairConfig, client: Client) -> None:
        self.config = config
        self.client = client
        self._intake: RepairIntake | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> RepairIntake:
        """The intake, connecting the ledger pool once."""
        if self._intake is not None:
            return self._intake
        async with self._lock:
            if self._intake is None:
                if not self.config.ledger.dsn:
                    raise RuntimeError("ledger.dsn: empty; the repair API needs the ledger")
                try:
                    pool = await connect(self.config.ledger.dsn, min_size=1,
                                         max_size=max(2, self.config.ledger.max_pool))
                except (OSError, asyncpg.PostgresError) as e:
                    raise RuntimeError(f"ledger.dsn: cannot reach PostgreSQL: {e}") from e
                self._intake = RepairIntake(self.config, Ledger(pool), self.client)
        return self._intake

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        if self._intake is not None:
            await self._intake.ledger.pool.close()
            self._intake = None


# ------------------------------------------------------------------------ router
_PERMS: dict[str, frozenset[str]] = {
    "viewer": frozenset({"read"}),
    "detector": frozenset({"read", "create"}),
    "operator": frozenset({"read", "create", "remove", "decide"}),
}


def build_repairs_router(
    intake: Callable[[], Awaitable[RepairIntake]],
    tokens: ApiTokens,
) -> APIRouter:
    """The ``/api/v1/repairs`` router (routes and errors in the module docstring).

    ``intake``: returns the :class:`RepairIntake` (e.g. ``LazyIntake(config,
    client).get``). ``tokens``: :meth:`ApiTokens.load` of ``api.tokens_file``.
    Also serves the app's OpenAPI document at ``/api/v1/openapi.json``.
    """
    bearer = HTTPBearer(auto_error=False, description="TOKEN from api.tokens_file")
    router = APIRouter(prefix="/api/v1", tags=["repairs"])

    def need(perm: str) -> Callable[..., Principal]:
        def dep(
            creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
        ) -> Principal:
            who = tokens.authenticate(creds.credentials if creds else None)
            if who is None:
                msg = ("missing or invalid bearer token" if tokens.enabled
                       else "api.tokens_file is not configured; the repair API needs tokens")
                raise HTTPException(401, msg, headers={"WWW-Authenticate": "Bearer"})
            if perm not in _PERMS[who.role]:
                raise HTTPException(403, f"role {who.role!r} may not {perm} repairs")
            return who

        return dep

    async def get_intake() -> RepairIntake:
        try:
            return await intake()
        except RuntimeError as e:
            raise HTTPException(503, str(e)) from e

    def fail(e: IntakeError) -> HTTPException:
        return HTTPException(e.status, e.detail())

    Intake = Annotated[RepairIntake, Depends(get_intake)]

    @router.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> dict[str, Any]:
        return cast(dict[str, Any], request.app.openapi())

    @router.post("/repairs", response_model=CreateResult, status_code=201,
                 responses={200: {"model": CreateResult, "description": "existing repair"}})
    async def create(
        body: RepairCreate, response: Response, ix: Intake,
        who: Annotated[Principal, Depends(need("create"))],
    ) -> CreateResult:
        """Create a repair (idempotent on detector + request_id)."""
        if body.mode == RepairMode.remove and "remove" not in _PERMS[who.role]:
            raise HTTPException(403, f"role {who.role!r} may not request remove "
                                "(human-only, DESIGN §5)")
        if who.role == "detector":
            if body.detector is not None and body.detector != who.user:
                raise HTTPException(403, f"detector {body.detector!r}: this token belongs to "
                                    f"detector {who.user!r}")
            requester = Requester(kind=RequesterKind.detector, name=who.user)
        else:
            requester = Requester(kind=RequesterKind.user, name=who.user)
        try:
            result = await ix.create(body, requester, skip_approval=False)
        except IntakeError as e:
            raise fail(e) from e
        if not result.created:
            response.status_code = 200
        return result

    @router.get("/repairs", response_model=RepairList)
    async def list_repairs(
        ix: Intake, _: Annotated[Principal, Depends(need("read"))],
        node: str | None = Query(None, max_length=253),
        cluster: str | None = Query(None, max_length=253),
        state: str | None = Query(None, max_length=64),
        action: str | None = Query(None, max_length=64),
        requester: str | None = Query(None, max_length=256),
        limit: int = Query(200, ge=1, le=1000),
    ) -> RepairList:
        """Repairs newest first, filtered by node, cluster, state, action, requester."""
        try:
            views = await ix.list(cluster=cluster, node=node, state=state, action=action,
                                  requester=requester, limit=limit)
        except IntakeError as e:
            if e.status == 422 and e.field:
                raise HTTPException(422, [{"loc": ["query", e.field], "msg": e.message,
                                           "type": "value_error"}]) from e
            raise fail(e) from e
        return RepairList(repairs=views)

    @router.get("/alerts", response_model=AlertList)
    async def list_alerts(
        ix: Intake, _: Annotated[Principal, Depends(need("read"))],
        cluster: str | None = Query(None, max_length=253),
        node: str | None = Query(None, max_length=253),
        limit: int = Query(50, ge=1, le=1000),
    ) -> AlertList:
        """Alerts recorded in the ledger (observed and actionable), newest first."""
        return AlertList(alerts=await ix.ledger.list_alerts(cluster=cluster, node=node,
                                                            limit=limit))

    @router.get("/repairs/{repair_id}", response_model=RepairView)
    async def show(repair_id: str, ix: Intake,
                   _: Annotated[Principal, Depends(need("read"))]) -> RepairView:
        """One repair with transitions and live workflow status."""
        try:
            return await ix.get(repair_id)
        except IntakeError as e:
            raise fail(e) from e

    @router.post("/repairs/{repair_id}/approve", response_model=RepairView)
    async def approve(repair_id: str, ix: Intake,
                      who: Annotated[Principal, Depends(need("decide"))],
                      body: DecisionBody | None = None) -> RepairView:
        """Approve (optionally overriding the action)."""
        try:
            return await ix.approve(repair_id, who.user, body.action if body else None)
        except IntakeError as e:
            raise fail(e) from e

    @router.post("/repairs/{repair_id}/reject", response_model=RepairView)
    async def reject(repair_id: str, ix: Intake,
                     who: Annotated[Principal, Depends(need("decide"))],
                     body: DecisionBody | None = None) -> RepairView:
        """Reject with a reason."""
        try:
            return await ix.reject(repair_id, who.user, body.reason if body else "")
        except IntakeError as e:
            raise fail(e) from e

    @router.post("/repairs/{repair_id}/cancel", response_model=RepairView)
    async def cancel(repair_id: str, ix: Intake,
                     who: Annotated[Principal, Depends(need("decide"))],
                     body: DecisionBody | None = None) -> RepairView:
        """Cancel with a reason."""
        try:
            return await ix.cancel(repair_id, who.user, body.reason if body else "")
        except IntakeError as e:
            raise fail(e) from e

    return router


def api_routers(
    config: AutorepairConfig,
) -> Callable[[Client], tuple[list[APIRouter], list[Callable[[], Awaitable[None]]]]]:
    """The factory ``autorepair ingest`` hands to ``ingest.service.run_ingest``: the repair
    router on the given Temporal client, and the intake's ``close`` for shutdown.

    Raises ``ValueError`` naming the tokens file when it is malformed (at call time)."""

    def build(client: Client) -> tuple[list[APIRouter], list[Callable[[], Awaitable[None]]]]:
        router, intake = repairs_router_for(config, client)
        return [router], [intake.close]

    return build


def repairs_router_for(config: AutorepairConfig, client: Client) -> tuple[APIRouter, LazyIntake]:
    """Router wired to ``config`` (tokens from ``api.tokens_file``, falling back to
    ``secrets.api_tokens_file``) and a :class:`LazyIntake`; close the intake on shutdown.

    Raises ``ValueError`` naming the tokens file when it is malformed."""
    tokens = ApiTokens.load(config.api.tokens_file or config.secrets.api_tokens_file)
    lazy = LazyIntake(config, client)
    return build_repairs_router(lazy.get, tokens), lazy
