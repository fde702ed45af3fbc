"""The repair API router: ``/api/v1/repairs`` (and ``/api/v1/alerts``) on the API port,
over :class:`workers.repairs.intake.RepairIntake` and the tokens of
:mod:`workers.repairs.auth`.

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
GET    /api/v1/alerts?cluster&node&limit viewer+   200 ``{"alerts": [Alert, ...]}`` newest first
GET    /api/v1/report?since&until&...  viewer+   200 fleet report: repairs, MTTR, cost, reliability
GET    /api/v1/machines/held?cluster     viewer+   200 machines held for RMA
POST   /api/v1/machines/{c}/{m}/return   operator  200 hold lifted / 409 not held
GET    /api/v1/domains?cluster           viewer+   200 failure-domain holds of a cluster
POST   /api/v1/domains/{c}/{d}/release   operator  200 hold released / 409 not held
====== ================================= ========= ==========================================

(The machine routes: :mod:`workers.repairs.machines`; the domain routes:
:mod:`workers.repairs.domains`.)

Errors: 401 without or with an unknown token (or when no tokens file is configured),
403 for a role that may not do it (both checked before the ledger is touched), 503 when
the ledger is unavailable (:data:`LEDGER_UNAVAILABLE`: no internal address), 404 unknown
repair, 409 decision on a finished repair, an approve that changes nothing (a repair past its
approval, or approved and waiting for its lease or a maintenance window) or a request id
reused for another node or mode, 422
malformed body naming the field (FastAPI's ``{"detail": [{"loc": ["body", FIELD],
"msg": ...}]}`` shape; ``["body"]`` alone for a body that is not JSON text).
"""

# No ``from __future__ import annotations``: FastAPI resolves the dependency annotations
# of the route closures at definition time.
import logging
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator
from starlette.exceptions import HTTPException as StarletteHTTPException
from temporalio.client import Client

from activities.ledger_reports import fleet_report
from activities.maintenance_store import MaintenanceStore, WindowError, window_view
from activities.reliability import fleet_gpus
from workers.repairs.auth import ApiTokens, Principal
from workers.repairs.domains import add_domain_routes, known_cluster
from workers.repairs.intake import IntakeError, LazyIntake, RepairIntake
from workers.repairs.machines import add_machine_routes
from workers.repairs.models import (
    STORABLE,
    AlertList,
    CreateResult,
    DecisionBody,
    MaintenanceCreate,
    RepairCreate,
    RepairList,
    RepairMode,
    RepairView,
    in_utc,
    parse_duration,
    parse_since,
)
from workflows.config import AutorepairConfig
from workflows.maintenance import Scope
from workflows.models import Requester, RequesterKind

RepairId = Annotated[str, Path(min_length=1, max_length=256, pattern=STORABLE)]
"""The ``{repair_id}`` path parameter: text the ledger can look up (no U+0000)."""

log = logging.getLogger("autorepair.api.repairs")

LEDGER_UNAVAILABLE = "the repair ledger is unavailable; try again later"
"""The 503 detail when the ledger cannot be reached (no DSN, host or port in it)."""

_UNPARSED_BODY = "There was an error parsing the body"
"""FastAPI's bare 400 detail for a body it could not read (``fastapi.routing``): a JSON
content type whose bytes are not JSON text (not UTF-8, UTF-16 or UTF-32, RFC 8259 §8.1)."""


def _encodable(value: Any) -> Any:
    """``value`` with every string made UTF-8 encodable (lone surrogates → ``\\udXXX``)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(v) for v in value]
    return value


class _BodyNamingRoute(APIRoute):
    """An :class:`APIRoute` whose unreadable JSON bodies answer 422 naming the body
    (``{"detail": [{"loc": ["body"], "msg": ..., "type": "json_invalid"}]}``, like
    undecodable JSON) instead of FastAPI's bare 400, which names no field; and whose 422
    details can always be encoded (see :func:`_encodable`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def named(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as e:
                # the default handler echoes each bad input; a lone surrogate in it (JSON
                # "\ud800") cannot be encoded as UTF-8 and would turn the 422 into a 500
                raise RequestValidationError(_encodable(e.errors()), body=e.body) from None
            except StarletteHTTPException as e:  # what fastapi.routing raises
                if e.status_code != 400 or e.detail != _UNPARSED_BODY:
                    raise
                cause = e.__cause__
                why = f"{type(cause).__name__}: {cause}" if cause else "unreadable"
                raise RequestValidationError([{
                    "type": "json_invalid", "loc": ("body",), "input": None,
                    "msg": f"body is not JSON text in UTF-8 ({why})",
                }]) from e

        return named


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
    router = APIRouter(prefix="/api/v1", tags=["repairs"], route_class=_BodyNamingRoute)

    def need(perm: str, what: str = "repairs") -> Callable[..., Principal]:
        def dep(
            creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
        ) -> Principal:
            who = tokens.authenticate(creds.credentials if creds else None)
            if who is None:
                msg = ("missing or invalid bearer token" if tokens.enabled
                       else "api.tokens_file is not configured; the repair API needs tokens")
                raise HTTPException(401, msg, headers={"WWW-Authenticate": "Bearer"})
            if not who.may(perm):
                raise HTTPException(403, f"role {who.role!r} may not {perm} {what}")
            return who

        return dep

    def authenticated(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        return need("read")(creds)

    async def get_intake(_: Annotated[Principal, Depends(authenticated)]) -> RepairIntake:
        # Only an authenticated caller reaches the ledger (each route also declares its
        # role check first), and the 503 names no internal address: the ledger's DSN,
        # host and port go to the log only.
        try:
            return await intake()
        except RuntimeError as e:
            log.warning("event=repair_api_ledger_unavailable error=%s", e)
            raise HTTPException(503, LEDGER_UNAVAILABLE) from e

    def fail(e: IntakeError) -> HTTPException:
        return HTTPException(e.status, e.detail())

    Intake = Annotated[RepairIntake, Depends(get_intake)]

    @router.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> dict[str, Any]:
        return cast(dict[str, Any], request.app.openapi())

    @router.post("/repairs", response_model=CreateResult, status_code=201,
                 responses={200: {"model": CreateResult, "description": "existing repair"}})
    async def create(
        body: RepairCreate, response: Response,
        who: Annotated[Principal, Depends(need("create"))], ix: Intake,
    ) -> CreateResult:
        """Create a repair (idempotent on detector + request_id)."""
        if body.mode == RepairMode.remove and not who.may("remove"):
            raise HTTPException(403, f"role {who.role!r} may not request remove "
                                "(human-only, docs/design.md §5)")
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
        _: Annotated[Principal, Depends(need("read"))], ix: Intake,
        node: str | None = Query(None, max_length=253, pattern=STORABLE),
        cluster: str | None = Query(None, max_length=253, pattern=STORABLE),
        state: str | None = Query(None, max_length=64, pattern=STORABLE),
        action: str | None = Query(None, max_length=64, pattern=STORABLE),
        requester: str | None = Query(None, max_length=256, pattern=STORABLE),
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
        _: Annotated[Principal, Depends(need("read"))], ix: Intake,
        cluster: str | None = Query(None, max_length=253, pattern=STORABLE),
        node: str | None = Query(None, max_length=253, pattern=STORABLE),
        limit: int = Query(50, ge=1, le=1000),
    ) -> AlertList:
        """Alerts recorded in the ledger (observed and actionable), newest first."""
        return AlertList(alerts=await ix.ledger.list_alerts(cluster=cluster, node=node,
                                                            limit=limit))

    @router.get("/report")
    async def report(
        _: Annotated[Principal, Depends(need("read"))], ix: Intake,
        since: str = Query("7d", max_length=64, pattern=STORABLE),
        until: Annotated[datetime | None, Query(), AfterValidator(in_utc)] = None,
        cluster: str | None = Query(None, max_length=253, pattern=STORABLE),
    ) -> dict[str, Any]:
        """Repairs that ended in the window: by outcome, MTTR, GPU-hours lost, cost, top
        fault kinds and machines (shape: ``activities.ledger_reports.fleet_report``)."""
        if cluster is not None:
            known_cluster(ix.config, cluster)  # a typo would report "no repairs"
        end = until or datetime.now(UTC)
        try:
            start = parse_since(since, end)
        except ValueError as e:
            raise HTTPException(422, [{"loc": ["query", "since"], "msg": str(e),
                                       "type": "value_error"}]) from e
        return await fleet_report(ix.ledger, start, end, cluster=cluster,
                                  currency=ix.config.providers.currency,
                                  gpus=fleet_gpus(ix.config, cluster),
                                  repeat=ix.config.policy.rails.repeat_offender)

    @router.get("/repairs/{repair_id}", response_model=RepairView)
    async def show(repair_id: RepairId,
                   _: Annotated[Principal, Depends(need("read"))], ix: Intake) -> RepairView:
        """One repair with transitions and live workflow status."""
        try:
            return await ix.get(repair_id)
        except IntakeError as e:
            raise fail(e) from e

    @router.post("/repairs/{repair_id}/approve", response_model=RepairView)
    async def approve(repair_id: RepairId,
                      who: Annotated[Principal, Depends(need("decide"))], ix: Intake,
                      body: DecisionBody | None = None) -> RepairView:
        """Approve (optionally overriding the action)."""
        try:
            return await ix.approve(repair_id, who.user, body.action if body else None)
        except IntakeError as e:
            raise fail(e) from e

    @router.post("/repairs/{repair_id}/reject", response_model=RepairView)
    async def reject(repair_id: RepairId,
                     who: Annotated[Principal, Depends(need("decide"))], ix: Intake,
                     body: DecisionBody | None = None) -> RepairView:
        """Reject with a reason."""
        try:
            return await ix.reject(repair_id, who.user, body.reason if body else "")
        except IntakeError as e:
            raise fail(e) from e

    @router.post("/repairs/{repair_id}/cancel", response_model=RepairView)
    async def cancel(repair_id: RepairId,
                     who: Annotated[Principal, Depends(need("decide"))], ix: Intake,
                     body: DecisionBody | None = None) -> RepairView:
        """Cancel with a reason."""
        try:
            return await ix.cancel(repair_id, who.user, body.reason if body else "")
        except IntakeError as e:
            raise fail(e) from e

    @router.post("/maintenance", status_code=201)
    async def maintenance_start(
        body: MaintenanceCreate,
        who: Annotated[Principal, Depends(need("decide"))], ix: Intake,
    ) -> dict[str, Any]:
        """Open a maintenance window (issue 29): alerts of covered nodes are recorded as
        ``in_maintenance`` and nothing is recommended until it ends."""
        try:
            known = ix.window_scope_problem(body.cluster, body.pool, body.nodes)
        except KeyError as e:
            raise HTTPException(422, [{"loc": ["body", "cluster"], "msg": str(e.args[0]),
                                       "type": "value_error"}]) from e
        if known is not None:
            raise HTTPException(422, [{"loc": ["body", known[0]], "msg": known[1],
                                       "type": "value_error"}])
        store = MaintenanceStore(ix.ledger.pool, ix.config.policy.maintenance.max_s)
        scope: Scope = "all" if body.all else ("pool" if body.pool else "nodes")
        try:
            w = await store.start(cluster=body.cluster, scope=scope,
                                  duration_s=parse_duration(body.duration),
                                  reason=body.reason, created_by=who.user, pool=body.pool,
                                  nodes=body.nodes)
        except WindowError as e:
            raise HTTPException(e.status, [{"loc": ["body", e.field], "msg": e.message,
                                            "type": "value_error"}]) from e
        log.info("event=maintenance_started window=%s cluster=%s scope=%s by=%s until=%s",
                 w.window_id, w.cluster, w.scope, who.user, w.ends_at.isoformat())
        return window_view(w, datetime.now(UTC))

    @router.get("/maintenance")
    async def maintenance_list(
        _: Annotated[Principal, Depends(need("read"))], ix: Intake,
        cluster: str | None = Query(None, max_length=253, pattern=STORABLE),
        active: bool = Query(False),
        limit: int = Query(200, ge=1, le=1000),
    ) -> dict[str, Any]:
        """Windows newest first (``active``: only those in force now); a cluster the
        config does not list is a 422 naming it (a typo would list no window)."""
        if cluster is not None:
            known_cluster(ix.config, cluster)
        now = datetime.now(UTC)
        store = MaintenanceStore(ix.ledger.pool)
        ws = await store.list(cluster, active_at=now if active else None, limit=limit)
        return {"windows": [window_view(w, now) for w in ws]}

    @router.delete("/maintenance/{window_id}")
    async def maintenance_end(
        window_id: Annotated[str, Path(max_length=300, pattern=STORABLE)],
        who: Annotated[Principal, Depends(need("decide"))], ix: Intake,
    ) -> dict[str, Any]:
        """End a window now (idempotent: an ended window is answered as it is)."""
        store = MaintenanceStore(ix.ledger.pool)
        try:
            w, ended = await store.end(window_id, who.user)
        except WindowError as e:
            raise HTTPException(e.status, f"window_id {window_id!r}: {e.message}") from e
        if ended:
            log.info("event=maintenance_ended window=%s cluster=%s by=%s", w.window_id,
                     w.cluster, who.user)
        return {**window_view(w, datetime.now(UTC)), "ended_now": ended}

    add_machine_routes(router, need, Intake)
    add_domain_routes(router, need, Intake)
    return router


def api_routers(
    config: AutorepairConfig,
) -> Callable[..., tuple[list[APIRouter], list[Callable[[], Awaitable[None]]]]]:
    """The factory ``autorepair ingest`` hands to ``ingest.service.run_ingest``: the repair
    router on the given Temporal client (and ``known``, the ingest inventory's
    ``(cluster, node) → bool``: requests for nodes outside it are refused), and the
    intake's ``close`` for shutdown.

    Raises ``ValueError`` naming the tokens file when it is malformed (at call time)."""

    def build(client: Client, known: Callable[[str, str], bool] | None = None
              ) -> tuple[list[APIRouter], list[Callable[[], Awaitable[None]]]]:
        router, intake = repairs_router_for(config, client, known)
        return [router], [intake.close]

    return build


def repairs_router_for(config: AutorepairConfig, client: Client,
                       known: Callable[[str, str], bool] | None = None,
                       ) -> tuple[APIRouter, LazyIntake]:
    """Router wired to ``config`` (tokens from ``api.tokens_file``, falling back to
    ``secrets.api_tokens_file``) and a :class:`LazyIntake` (``known``: the inventory
    check of :class:`RepairIntake`); close the intake on shutdown.

    Raises ``ValueError`` naming the tokens file when it is malformed."""
    tokens = ApiTokens.load(config.api.tokens_file or config.secrets.api_tokens_file)
    lazy = LazyIntake(config, client, known)
    return build_repairs_router(lazy.get, tokens), lazy
