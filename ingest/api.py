"""HTTP API of the ingest service (port 8080) and the admin endpoint (port 8081).

API app (:func:`build_api_app`):

* ``GET /api/v1/threshold?cluster_id=C[&cohort=W]`` → ``{"cluster_id", "cohort",
  "threshold", "quorum_met", "median", "mad", "active_nodes", "panic", "computed_at",
  "idle_nodes", "calibrating_nodes", "coverage_low", "stragglers", "cohorts": {...}}``
  (docs/design.md §4.3); before quorum ``threshold`` is 0 and ``quorum_met`` false; an unknown
  cluster gets that cold-start shape too. ``cluster_id`` missing → 422 naming the field.
* ``GET /api/v1/state[?cluster_id=C]`` → read-only snapshot (scores, thresholds,
  stragglers, cluster alerts; no credentials) for ``autorepair status``. Needs
  ``Authorization: Bearer <token of api.tokens_file>`` (any role: viewer, detector and
  operator may all read): the node list, machine ids and scores map the fleet for whoever
  reads them. 401 without a valid token or when no API token is configured.
* ``GET /healthz`` (open, for probes) → 200 ``{"status": "ok"}`` while the process serves.
* ``GET /readyz`` (open, for probes) → 200 once the first threshold computation ran and
  Temporal is reachable, else 503; body names each condition.
* ``GET /metrics`` → Prometheus text exposition of the service registry (docs/design.md §4.5).

Other modules add routes (the repair API of ``workers/``) by passing ``routers`` or calling
``app.include_router`` on the returned app.

Admin app (:func:`build_admin_app`, bound to 127.0.0.1 only): ``GET /internal/state``
with ``Authorization: Bearer <admin token>`` → the same snapshot; 401 on a bad token,
403 when no admin token is configured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ingest.auth import TokenCheck
from ingest.pipeline import Ingestor


def build_api_app(
    ingestor: Ingestor,
    *,
    routers: Sequence[APIRouter] = (),
    title: str = "autorepair",
    state_auth: TokenCheck | None = None,
) -> FastAPI:
    """The FastAPI app of port 8080 (routes in the module docstring) plus ``routers``.

    ``state_auth``: the API tokens (``api.tokens_file``) that may read ``/api/v1/state``;
    ``None`` or no token: the snapshot answers 401 to everyone.
    """
    auth = state_auth or TokenCheck(())
    app = FastAPI(title=title, docs_url="/api/docs", openapi_url="/api/openapi.json")
    app.state.ingestor = ingestor

    @app.get("/api/v1/threshold")
    async def threshold(
        cluster_id: str = Query(..., min_length=1, max_length=253),
        cohort: str | None = Query(None, min_length=1, max_length=253),
    ) -> dict[str, Any]:
        return ingestor.threshold_view(cluster_id, cohort)

    @app.get("/api/v1/state", response_model=None)
    async def state(
        request: Request, cluster_id: str | None = Query(None, max_length=253),
    ) -> dict[str, Any] | JSONResponse:
        if not auth.check_header(request.headers.get("authorization")):
            detail = ("missing or invalid bearer token (a token of api.tokens_file)"
                      if auth.enabled else "api.tokens_file is not configured; "
                      "/api/v1/state needs a viewer token")
            return JSONResponse({"detail": detail}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        return ingestor.snapshot(cluster_id)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready, checks = await ingestor.readiness()
        return JSONResponse({"ready": ready, **checks}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ingestor.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    for r in routers:
        app.include_router(r)
    return app


def build_admin_app(ingestor: Ingestor, auth: TokenCheck) -> FastAPI:
    """The loopback admin app: ``GET /internal/state`` behind the admin bearer token."""
    app = FastAPI(title="autorepair-admin", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/internal/state")
    async def internal_state(request: Request) -> JSONResponse:
        if not auth.enabled:
            return JSONResponse({"detail": "admin token not configured "
                                 "(ingest.admin_token_file or AUTOREPAIR_ADMIN_TOKEN)"},
                                status_code=403)
        if not auth.check_header(request.headers.get("authorization")):
            return JSONResponse({"detail": "missing or invalid bearer token"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        return JSONResponse(ingestor.snapshot())

    return app
