"""The repair intake: how a repair that the platform did not detect itself enters.

Every repair that does not come from the platform's own detection — an operator's, an
HTTP detector's, a Kubernetes node annotation's (``workers.watchers.kube``) — enters
through :class:`RepairIntake`, so it becomes the same ledger record and the same
``RepairWorkflow`` (id ``repair/{cluster}/{node}/{repair_id}``, input
:class:`~workflows.models.RepairRequest`) as a system repair, and passes the same
evidence gate, guard lease (capacity, budget, breaker) and rails inside that workflow.

Intake rules (docs/design.md §5):

* **Idempotency, forever.** ``detector + request_id`` is claimed in the ledger
  (``idempotency_keys``), the detector keyed by its source (:func:`request_key`: an
  annotation's ``NAME#annotation`` is another key than the API detector ``NAME``, and so
  is its per-detector cap count); the repair id is derived from that key
  (:func:`repair_id_for_request`), so a retried or racing create returns the one
  existing repair, also after it finished.
* **Detector caps.** At most ``policy.rails.detector_cap`` detector-requested repairs in
  flight per cluster, and at most the detector's own cap (``clusters[].detectors.allowed.
  NAME.cap``, else ``clusters[].detectors.default_cap``) per detector, so one detector
  cannot take the whole cluster budget from the others; a request beyond either is
  *refused and recorded*: a repair row in stage ``rejected`` whose transition reason names
  the cap. Both are counted here, from the ledger, under one per-cluster lock (the
  cluster guard counts detector leases per cluster too, not per detector).
* **Annotation requests from detectors outside ``detectors.allowed``** open no repair:
  :meth:`RepairIntake.observe_request` records them as an observed alert (not
  actionable) for an operator, who may open the repair citing it. A node annotation
  names its detector itself, and ``nodes/patch`` is held by many cluster components (the
  kubelet for its own Node among them).
* **Remove is human-only.** A detector asking for ``remove`` is refused (HTTP: 403;
  annotation: recorded refusal).
* **Approval.** Node-annotation requests skip the approval queue
  (``RepairRequest.auto_approved_rule = "detector_request"``); HTTP requests go through
  the consent policy like any other repair (a detector's request waits for an operator's
  approval under the default *approve before repair*; an operator's own request counts
  as approved by its creator, except ``remove``, which always waits for a person).

Errors: :class:`IntakeError` carries the HTTP status the API answers with (404 unknown
repair, 409 decision on a finished repair or a request id reused for another node, 422
naming the field at fault). The HTTP side is :mod:`workers.repairs.router`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from pydantic import BaseModel
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.ledger import Ledger, connect
from workers.repairs.models import (
    CreateResult,
    RepairCreate,
    RepairMode,
    RepairView,
    TransitionView,
)
from workflows.activity_api import ClaimInput, RepairRecord, TransitionRecord
from workflows.config import AutorepairConfig, ClusterConfig, DetectorsConfig
from workflows.console import repair_details, repair_summary
from workflows.downtime import Downtime
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
)
from workflows.protocol import (
    REPAIR_QUERY_STATUS,
    REPAIR_SIGNAL_APPROVE,
    REPAIR_SIGNAL_CANCEL,
    REPAIR_SIGNAL_REJECT,
    REPAIR_WORKFLOW,
    STATE_AWAITING_APPROVAL,
    STATE_IN_PROGRESS,
    repair_state,
    workflow_id_repair,
)
from workflows.providers import ProviderResolver

log = logging.getLogger("autorepair.api.repairs")

DETECTOR_RULE = "detector_request"
"""``RepairRequest.auto_approved_rule`` of detector requests: they skip the approval queue."""
REQUEST_ALERT_KIND = "repair_request"
"""Alert kind of the evidence record an external request carries."""
STATE_TERMINAL = "terminal"
"""``state`` filter of :meth:`RepairIntake.list` for every finished repair (any terminal
stage; the counterpart of ``open``; the CLI's ``repairs list --state terminal``)."""
_QUERY_TIMEOUT = timedelta(seconds=2)
_CAP_LOCK_NS = 0x6172_6361  # advisory lock namespace for the per-cluster detector cap


async def _requested_mode(ledger: Ledger, row: dict[str, Any]) -> str | None:
    """The mode the request behind repair ``row`` asked for (its ``repair_request`` alert's
    evidence), or None when the repair has no such alert (not from a request)."""
    for alert in await ledger.get_alerts([a for a in row.get("alert_ids") or []
                                          if str(a).startswith("rq-")]):
        if alert.kind == REQUEST_ALERT_KIND:
            mode = (alert.evidence or {}).get("mode")
            return str(mode) if mode is not None else None
    return None


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


API_SOURCE = "api"
"""Source of requests made through the repair API (``POST /api/v1/repairs``)."""
ANNOTATION_SOURCE = "annotation"
"""Source of Kubernetes node-annotation requests (``workers.watchers.kube``)."""


def request_key(detector: str, source: str = API_SOURCE) -> str:
    """The idempotency and per-detector cap key of a request: the detector's name for
    the repair API, ``"{detector}#{source}"`` for any other source. An annotation names
    its detector itself (any holder of ``nodes/patch`` writes it), so keyed by (detector,
    source) it can neither pre-claim an API detector's request ids (a 409 or a "replayed"
    repair for the real request) nor spend that detector's cap; ``#`` is outside the
    detector-name pattern, so no API detector can name a key of another source."""
    return detector if source == API_SOURCE else f"{detector}#{source}"


def repair_id_for_request(detector: str, request_id: str) -> str:
    """Repair id of an external request: ``req-`` + 16 hex digits of
    sha256(detector NUL request_id). Deterministic, so racing creates agree."""
    digest = hashlib.sha256(f"{detector}\0{request_id}".encode()).hexdigest()
    return f"req-{digest[:16]}"


def _view(row: dict[str, Any], live: RepairStatus | None = None) -> RepairView:
    return RepairView(
        repair_id=row["repair_id"],
        cluster=row["cluster"],
        node=row["node"],
        machine_id=row.get("machine_id"),
        action=row["action"],
        stage=row["stage"],
        state=repair_state(row["stage"], row.get("approval_pending")),
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
        downtime=Downtime.model_validate(row["downtime"]) if row.get("downtime") else None,
        evidence=list(row.get("evidence") or []),
    )


class RepairIntake:
    """Creates, lists and decides repairs (see module docstring).

    ``ledger``: the PostgreSQL ledger (its pool needs at least 2 connections: the cap
    check holds one under an advisory lock). ``client``: Temporal client with the
    pydantic data converter. ``clock``: timezone-aware now, for tests. ``known``:
    ``(cluster, node) → bool``, the ingest inventory (``NodeInventory.known``); a request
    for a node it does not list is refused (422 naming ``node``). ``None``: only
    ``clusters[].nodes`` is checked.
    """

    def __init__(
        self,
        config: AutorepairConfig,
        ledger: Ledger,
        client: Client,
        *,
        clock: Callable[[], datetime] | None = None,
        known: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.client = client
        self.clock = clock or (lambda: datetime.now(UTC))
        self.known = known

    def _check_inventory(self, cluster: str, node: str) -> None:
        """Raises :class:`IntakeError` 422 naming ``node`` when ``known`` (the ingest
        inventory: configured nodes plus the scheduler's node list) does not list
        ``node`` in ``cluster``: a node outside the inventory is observed, never
        repaired, on every path (issue 27 item 0)."""
        if self.known is not None and not self.known(cluster, node):
            raise IntakeError(
                422, f"node {node!r} is not in the inventory of cluster {cluster!r} "
                "(clusters[].nodes or the scheduler's node list)", "node")

    def window_scope_problem(self, cluster: str, pool: str | None,
                             nodes: list[str] | None) -> tuple[str, str] | None:
        """What is wrong with a maintenance window's scope, as ``(field, message)``, or
        None: a node that is not the cluster's (configured, or in the inventory), a pool
        no configured node of the cluster is in. A typo (``gpu-1`` for ``gpu-01``) would
        open a window covering nothing while the real node stays open to automatic
        repairs. A cluster that lists no nodes (discovered from its scheduler) is checked
        against the inventory only, and its pools not at all. Raises ``KeyError`` naming
        an unknown cluster when clusters are configured."""
        if not self.config.clusters:
            return None
        c = self.config.cluster(cluster)
        names = {n.name for n in c.nodes}
        for node in nodes or []:
            if node in names or (self.known is not None and self.known(cluster, node)):
                continue
            if names or self.known is not None:
                return "nodes", f"node {node!r} is not a node of cluster {cluster!r}"
        pools = {n.pool for n in c.nodes if n.pool}
        if pool is not None and names and pool not in pools:
            return "pool", (f"pool {pool!r} has no node in cluster {cluster!r} "
                            f"(pools: {sorted(pools)})")
        return None

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
        source: str = API_SOURCE,
    ) -> CreateResult:
        """Record and start the repair ``req`` asks for (idempotent on detector +
        request id, forever).

        ``requester``: who asks (a detector is never recorded as a user).
        ``skip_approval``: detector requests bypass the approval queue.
        ``refuse_remove``: record ``remove`` as refused (default: for detectors).
        ``source``: where the request came from (:data:`API_SOURCE`,
        :data:`ANNOTATION_SOURCE`); the idempotency key, the repair id and the
        per-detector cap count use :func:`request_key` (the cap's configured value is the
        detector's, ``clusters[].detectors.allowed.NAME.cap``).

        Raises :class:`IntakeError` (422 unknown cluster/node/evidence alert, 409 request
        id already used for another node or another mode).
        """
        detector = req.detector or (
            requester.name if requester.kind == RequesterKind.detector
            else f"user:{requester.name}"
        )
        cfg = self.resolve_cluster(req.cluster, req.node)
        cluster = cfg.name if cfg is not None else str(req.cluster)
        self._check_inventory(cluster, req.node)
        node_cfg = next((n for n in cfg.nodes if n.name == req.node), None) if cfg else None
        machine_id = node_cfg.machine if node_cfg else None
        pool = node_cfg.pool if node_cfg else None
        now = self.clock()
        name, detector = detector, request_key(detector, source)
        repair_id = repair_id_for_request(detector, req.request_id)
        alerts = await self._evidence(
            req, cluster, requester, name, repair_id, machine_id, pool, now
        )

        remove_refused = (
            refuse_remove if refuse_remove is not None
            else requester.kind == RequesterKind.detector
        )
        refusal = ""
        if req.mode == RepairMode.remove and remove_refused:
            refusal = "refused: remove is human-only (design.md §5); a detector may not request it"
        for a in alerts:
            await self.ledger.record_alert(a)
        wf_id = workflow_id_repair(cluster, req.node, repair_id)
        # One transaction under a per-cluster lock: claim the key, check the cap and
        # record the repair, so racing requests see one winner and cannot overshoot the cap.
        async with self.ledger.transaction(lock=(_CAP_LOCK_NS, cluster)) as locked:
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
            if existing is not None:
                asked = await _requested_mode(locked, existing)
                if asked is not None and asked != req.mode.value:
                    raise IntakeError(
                        409,
                        f"mode {req.mode.value!r}: request_id {req.request_id!r} of detector "
                        f"{detector!r} already names repair {repair_id}, requested as "
                        f"mode {asked!r} (a new request needs a new request_id)",
                        "mode",
                    )
            if existing is None:
                if not refusal and requester.kind == RequesterKind.detector:
                    cap = self.config.policy.rails.detector_cap
                    in_flight = await locked.count_detector_repairs(cluster)
                    own_cap, key = (cfg.detectors if cfg is not None
                                    else DetectorsConfig()).cap_of(name)
                    own = await locked.count_detector_repairs(cluster, detector=detector)
                    if in_flight >= cap:
                        refusal = (
                            f"refused: detector cap reached — {in_flight} detector-requested "
                            f"repairs in flight in cluster {cluster!r} "
                            f"(policy.rails.detector_cap={cap})"
                        )
                    elif own >= own_cap:
                        refusal = (
                            f"refused: per-detector cap reached — {own} repairs of detector "
                            f"{detector!r} in flight in cluster {cluster!r} "
                            f"(clusters[{cluster}].{key}={own_cap})"
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
                    await locked.record_transition(TransitionRecord(
                        repair_id=repair_id, stage=Stage.rejected, at=now, by="autorepair",
                        reason=refusal))
        if existing is not None and existing["stage"] != Stage.recommended.value:
            log.info("event=repair_request_replayed repair_id=%s detector=%r request_id=%r",
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
                "event=repair_request_refused cluster=%s node=%r repair_id=%s detector=%r "
                "request_id=%r reason=%r", cluster, req.node, repair_id, detector,
                req.request_id, refusal,
            )
        else:
            try:
                await self.client.start_workflow(
                    REPAIR_WORKFLOW, request, id=wf_id,
                    task_queue=self.config.temporal.task_queue,
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    static_summary=repair_summary(request),
                    static_details=repair_details(request),
                )
            except WorkflowAlreadyStartedError:
                pass
            log.info(
                "event=repair_requested cluster=%s node=%r repair_id=%s action=%s "
                "requester=%s:%r detector=%r request_id=%r",
                cluster, req.node, repair_id, req.mode.value, requester.kind.value,
                requester.name, detector, req.request_id,
            )
        row = await self.ledger.get_repair(repair_id)
        assert row is not None
        return CreateResult(created=claim.created, refused=bool(refusal),
                            refused_reason=refusal, repair=_view(row))

    async def observe_request(self, req: RepairCreate, detector: str, why: str) -> Alert:
        """Record ``req`` as an **observed** alert (kind ``repair_request``, not actionable,
        action ``none``; the requested mode in ``evidence["requested_action"]``) and open no
        repair: the request of a detector the cluster does not trust (``why`` says so). The
        alert id is ``ob-`` + the hash of detector and request id, so re-reading the same
        request records nothing new. An operator acts on it with ``autorepair repairs
        create --evidence-alert ALERT_ID``.

        Raises :class:`IntakeError` 422 naming ``cluster``, ``node`` or ``evidence_alert``.
        """
        cfg = self.resolve_cluster(req.cluster, req.node)
        cluster = cfg.name if cfg is not None else str(req.cluster)
        node_cfg = next((n for n in cfg.nodes if n.name == req.node), None) if cfg else None
        repair_id = repair_id_for_request(request_key(detector, ANNOTATION_SOURCE),
                                          req.request_id)
        (*_, request) = await self._evidence(
            req, cluster, Requester(kind=RequesterKind.detector, name=detector), detector,
            repair_id, node_cfg.machine if node_cfg else None,
            node_cfg.pool if node_cfg else None, self.clock(),
        )
        alert = request.model_copy(update={
            "alert_id": "ob-" + repair_id.removeprefix("req-"),
            "actionable": False, "action": Action.none,
            "summary": f"{detector} asks for {req.mode.value} of {req.node} (observed: not "
                       "an allowed detector)",
            "evidence": {**request.evidence, "requested_action": req.mode.value,
                         "observed_because": why},
        })
        await self.ledger.record_alert(alert)
        log.warning("event=repair_request_observed cluster=%s node=%r detector=%r "
                    "request_id=%r alert_id=%s why=%r", cluster, req.node, detector,
                    req.request_id, alert.alert_id, why)
        return alert

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
                    REPAIR_QUERY_STATUS, result_type=RepairStatus, rpc_timeout=_QUERY_TIMEOUT
                )
            except Exception as e:  # live status is best effort; the ledger answers
                log.debug("event=repair_query_failed repair_id=%s error=%s", repair_id,
                          type(e).__name__)
        return _view(row, status)

    async def list(
        self, *, cluster: str | None = None, node: str | None = None, state: str | None = None,
        action: str | None = None, requester: str | None = None, limit: int = 200,
    ) -> list[RepairView]:
        """Repairs newest first (at most ``limit`` that match). ``state``: a stage name,
        ``open`` (not terminal), ``terminal`` (finished: any terminal stage),
        ``awaiting_approval``, ``in_progress`` or a terminal state.

        Raises :class:`IntakeError` 422 naming ``state`` or ``action`` when unknown."""
        stages = {s.value for s in Stage}
        terminal = {s.value for s in TERMINAL_STAGES}
        groups: dict[str, set[str]] = {
            "open": stages - terminal,
            STATE_TERMINAL: terminal,
            # an approved repair keeps the stage awaiting_approval until its cordon (the
            # documented order) but is not waiting for a person: in progress (``asked``)
            STATE_IN_PROGRESS: {s for s in stages if repair_state(s) == STATE_IN_PROGRESS}
            | {Stage.awaiting_approval.value},
        }
        if state is not None and state not in stages and state not in groups:
            raise IntakeError(422, f"state {state!r} is not a stage, 'open', 'in_progress' "
                                   f"or '{STATE_TERMINAL}'", "state")
        if action is not None and action not in {a.value for a in Action}:
            raise IntakeError(422, f"action {action!r} is not an action", "action")
        exact = state if state in stages else None
        # the group is filtered in the query, so the limit counts matching repairs only
        # (filtered after it, 200 newer finished repairs hid every open one)
        group = sorted(groups[state]) if state in groups else None
        rows = await self.ledger.list_repairs(
            cluster=cluster, node=node, stage=exact, action=action, requester=requester,
            limit=limit, stages=group,
            asked={STATE_IN_PROGRESS: False, STATE_AWAITING_APPROVAL: True}.get(state or ""),
        )
        return [_view(r) for r in rows]

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
            raise IntakeError(409, f"repair {repair_id!r} already finished ({row['stage']})")
        if signal == REPAIR_SIGNAL_APPROVE and row["stage"] in APPROVED_STAGES:
            # the repair was approved and acts on that approval; an approval sent now
            # would be dropped when it next asks (it covers one action at one rung)
            raise IntakeError(
                409, f"repair {repair_id!r} is at stage {row['stage']}: it is not waiting "
                "for an approval (it acts on the one it had; when it asks again it is "
                "awaiting_approval); cancel or reject stop it")
        if signal == REPAIR_SIGNAL_APPROVE and approved_waiting(row):
            # approved before its cordon, it keeps the stage (the documented order) while
            # it waits for its lease or a maintenance window: an approval now changes
            # nothing (it would sit unread until the repair next asks, a new decision)
            last = row.get("transitions") or []
            why = f" (last: {last[-1]['reason'][:300]})" if last else ""
            raise IntakeError(
                409, f"repair {repair_id!r} is at stage {row['stage']} but already approved "
                f"by {row.get('approved_by') or 'someone'} and not waiting for a person: it "
                f"waits for its lease or a maintenance window{why}; this approval changes "
                "nothing (when the decision changes it asks again); cancel or reject stop it")
        try:
            await self._handle(row).signal(signal, payload)
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise IntakeError(409, f"repair {repair_id!r} has no running workflow") from e
            raise
        log.info("event=repair_%s repair_id=%s by=%r", signal, repair_id,
                 getattr(payload, "by", ""))
        return await self.get(repair_id, live=False)

    async def approve(self, repair_id: str, by: str, action: Action | None = None) -> RepairView:
        """Signal ``approve {"by", "action"}``. Raises :class:`IntakeError` 404/409."""
        return await self._decide(repair_id, REPAIR_SIGNAL_APPROVE,
                                  ApproveSignal(by=by, action=action))

    async def reject(self, repair_id: str, by: str, reason: str = "") -> RepairView:
        """Signal ``reject {"by", "reason"}``. Raises :class:`IntakeError` 404/409."""
        return await self._decide(repair_id, REPAIR_SIGNAL_REJECT,
                                  RejectSignal(by=by, reason=reason))

    async def cancel(self, repair_id: str, by: str, reason: str = "") -> RepairView:
        """Signal ``cancel {"by", "reason"}``. Raises :class:`IntakeError` 404/409."""
        return await self._decide(repair_id, REPAIR_SIGNAL_CANCEL,
                                  CancelSignal(by=by, reason=reason))


#: Stages past an approval and before the repair asks again: an approve is refused (409)
#: there instead of kept and silently dropped at the next question. ``recommended`` keeps
#: an early approval (operator intent is never dropped before the question).
APPROVED_STAGES = frozenset({Stage.cordoning.value, Stage.waiting_for_idle.value,
                             Stage.draining.value, Stage.repairing.value,
                             Stage.migrating.value, Stage.joining.value,
                             Stage.running.value})


def approved_waiting(row: dict[str, Any]) -> bool:
    """Whether the ledger row is of a repair approved before its cordon that waits at
    ``awaiting_approval`` for its lease or a maintenance window, nobody asked
    (``approval_pending`` false, migration 0017): an approve changes nothing there. A row
    from a writer before the column (None) is judged by its stage: not refused."""
    return row["stage"] == Stage.awaiting_approval.value and row.get("approval_pending") is False


class LazyIntake:
    """Connects the ledger on first use (the API app is built before the loop runs).

    ``get()`` raises ``RuntimeError`` naming ``ledger.dsn`` when it is empty or
    PostgreSQL is unreachable (the API answers 503)."""

    def __init__(self, config: AutorepairConfig, client: Client,
                 known: Callable[[str, str], bool] | None = None) -> None:
        self.config = config
        self.client = client
        self.known = known
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
                ledger = Ledger(pool, providers=ProviderResolver(self.config.providers))
                self._intake = RepairIntake(self.config, ledger, self.client,
                                            known=self.known)
        return self._intake

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        if self._intake is not None:
            await self._intake.ledger.pool.close()
            self._intake = None
