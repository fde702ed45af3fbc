"""``autorepair mcp``: a read-only Model Context Protocol server over the fleet's records.

Built on the official ``mcp`` Python SDK's low-level :class:`mcp.server.Server`, so each
tool's input schema is the JSON schema of a pydantic model of :mod:`workers.fleet_models`
(unknown fields refused, every field bounded) and a bad call answers a tool error naming
the field and the value. The tools (answers from :class:`workers.fleet_query.FleetQuery`):

==========================  =============================================================
``list_alerts``             recorded alerts, newest first (cluster, node, kind, severity,
                            active, since; ``limit`` ≤ 200)
``list_repairs``            repairs, newest first (cluster, node, state, action,
                            requester; ``limit`` ≤ 200)
``repair_history``          one repair: stages with who and why, approver, deciding
                            rules (consent, ladder, gate), attempts, evidence, live stage
``node_status``             a node: NodeWorkflow's live faults, persistence, repair in
                            flight, cooldown; running repairs (visibility); newest records
``explain_recommendation``  catalogue row, node decision, persistence, ladder, migrate gate
                            and consent for the node's faults, under the configured policy
``fleet_summary``           counts over a window: alerts, repairs by stage, open repairs,
                            tickets, downtime (GPU-hours, cost, MTTR of the repairs that
                            ended), reliability figures, running workflows (visibility)
==========================  =============================================================

Every tool only reads: the ledger through a read-only PostgreSQL session, Temporal through
visibility and queries. Each answer is the structured content (the output model's JSON)
and the same JSON as text.

Transports: stdio (default: the assistant starts ``autorepair mcp`` itself; whoever can
run it can read the configuration, so no token) and streamable HTTP at ``/mcp``, which
demands ``Authorization: Bearer TOKEN`` for a token of the API tokens file with a role
that may read (``viewer`` or higher, :mod:`workers.repairs.auth`) — 401 without or with an
unknown token — and binds loopback unless told otherwise. ``autorepair mcp`` ends with
exit 0 on Ctrl-C, at the end of its standard input (stdio) and on SIGTERM (HTTP).

Where things are (first found wins): the ledger DSN — ``--ledger-dsn``, ``ledger.dsn`` of
the configuration (``AUTOREPAIR__LEDGER__DSN``), the running dev stack's PostgreSQL in
``DATA/pg`` (:func:`dev_stack_dsn`); the tokens file — ``--tokens-file``,
``api.tokens_file``, ``secrets.api_tokens_file``, ``DATA/api-tokens`` of the dev stack;
Temporal — ``--temporal-address``, ``temporal.address``. ``DATA`` is ``--data-dir`` /
``$AUTOREPAIR_DATA_DIR`` (default ``.autorepair``), as for the other client commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp.server import Server, ServerRequestContext
from pydantic import BaseModel, ValidationError

from workers.fleet_models import (
    AlertList,
    ExplainInput,
    ExplanationOut,
    FleetSummaryInput,
    FleetSummaryOut,
    ListAlertsInput,
    ListRepairsInput,
    NodeInput,
    NodeStatusOut,
    RepairHistory,
    RepairHistoryInput,
    RepairList,
    input_errors,
)
from workers.fleet_query import FleetQuery, QueryError
from workers.ops import DEV_PG_DIR, dev_stack_dsn, stack_info
from workers.repairs.auth import ApiTokens
from workers.temporal_client import release_runtimes, temporal_client

log = logging.getLogger("autorepair.mcp")

SERVER_NAME = "autorepair"
DEFAULT_HOST = "127.0.0.1"
"""Default bind address of the HTTP transport: loopback (docs/design.md §4.2 keeps admin surfaces
on loopback; exposing it is a decision: ``--host``)."""
DEFAULT_PORT = 8082
"""Default port of the HTTP transport (next to the API's 8080 and admin 8081, design.md §4.2)."""
MCP_PATH = "/mcp"
"""Path of the streamable HTTP endpoint (the SDK's default)."""
DEV_TOKENS_FILE = "api-tokens"
"""The dev stack's API tokens file in the data directory (``workers.devstack``)."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, description, input and output models and the query behind it."""

    name: str
    title: str
    description: str
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    call: Callable[[FleetQuery, Any], Awaitable[BaseModel]]

    def tool(self) -> types.Tool:
        """The MCP tool declaration (input/output JSON schemas; read-only hints)."""
        return types.Tool(
            name=self.name, title=self.title, description=self.description,
            input_schema=self.input_model.model_json_schema(),
            output_schema=self.output_model.model_json_schema(),
            annotations=types.ToolAnnotations(
                title=self.title, read_only_hint=True, destructive_hint=False,
                idempotent_hint=True, open_world_hint=False),
        )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("list_alerts", "Alerts",
             "Recorded alerts (faults observed on nodes, actionable or not), newest first. "
             "Filters: cluster, node, kind (xid, gpu_lost, straggler, ...), severity, active, "
             "since (30m, 24h, 7d or an ISO time); limit at most 200.",
             ListAlertsInput, AlertList, lambda fq, i: fq.list_alerts(i)),
    ToolSpec("list_repairs", "Repairs",
             "Repairs newest first with stage, action, requester, approver and deciding rule. "
             "Filters: cluster, node, state (a stage, open, in_progress, awaiting_approval), "
             "action, requester; limit at most 200.",
             ListRepairsInput, RepairList, lambda fq, i: fq.list_repairs(i)),
    ToolSpec("repair_history", "Repair history",
             "One repair: every stage with when, who and why; who approved; which rules decided "
             "(consent, ladder, migrate gate); executed actions and outcomes; the evidence "
             "alerts; the live stage while it runs.",
             RepairHistoryInput, RepairHistory, lambda fq, i: fq.repair_history(i)),
    ToolSpec("node_status", "Node status",
             "One node: its active faults with first observation and persistence due time, the "
             "repair in flight, cooldown, running repair workflows, newest alerts and repairs.",
             NodeInput, NodeStatusOut, lambda fq, i: fq.node_status(i)),
    ToolSpec("explain_recommendation", "Explain a recommendation",
             "Why a node gets (or does not get) a repair action: for each fault the catalogue "
             "row (severity, action, source), the node decision rule, persistence, escalation "
             "ladder, migrate evidence gate and consent, under the configured policy.",
             ExplainInput, ExplanationOut, lambda fq, i: fq.explain_recommendation(i)),
    ToolSpec("fleet_summary", "Fleet summary",
             "Counts over a window (since, default 24h): alerts by severity, top fault kinds "
             "and nodes, repairs by stage, open and awaiting-approval repairs, open hardware "
             "tickets, GPU-hours lost, cost and MTTR of the repairs that ended, the reliability "
             "figures (MTTR by decision, auto-remediation rate, disruptive actions per 1,000 "
             "GPU-days, time between incidents, second-rung share), running workflows.",
             FleetSummaryInput, FleetSummaryOut, lambda fq, i: fq.fleet_summary(i)),
)
"""Every tool of the server, in ``tools/list`` order."""


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=True)


async def call_tool(fq: FleetQuery, name: str, arguments: dict[str, Any] | None
                    ) -> types.CallToolResult:
    """Run tool ``name`` on ``arguments``; never raises. A bad input, an unknown tool or a
    question the data cannot answer is a tool error (``is_error``) whose text names the
    field and value; an unexpected failure is logged and answered as an error."""
    spec = next((t for t in TOOLS if t.name == name), None)
    if spec is None:
        return _error(f"name: unknown tool {name!r} (tools: {', '.join(t.name for t in TOOLS)})")
    try:
        inp = spec.input_model.model_validate(arguments or {})
    except ValidationError as e:
        return _error(f"{name}: {input_errors(e, spec.input_model)}")
    try:
        out = await spec.call(fq, inp)
    except QueryError as e:
        return _error(f"{name}: {e}")
    except Exception as e:  # readers never raise: the caller gets an error result
        log.exception("event=mcp_tool_failed tool=%s", name)
        return _error(f"{name}: internal error: {type(e).__name__}")
    doc = out.model_dump(mode="json")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(doc, indent=1))],
        structured_content=doc)


def build_server(fq: FleetQuery) -> Server[Any]:
    """The MCP server answering :data:`TOOLS` from ``fq``."""

    async def list_tools(ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[t.tool() for t in TOOLS])

    async def on_call(ctx: ServerRequestContext[Any, Any],
                      params: types.CallToolRequestParams) -> types.CallToolResult:
        return await call_tool(fq, params.name, params.arguments)

    schemas = {t.name: t.input_model.model_json_schema() for t in TOOLS}
    return Server(
        SERVER_NAME,
        instructions=("Read-only view of a GPU fleet's auto-repair records: alerts, repairs, "
                      "node state and why the platform recommends an action. Nothing here "
                      "changes the fleet."),
        get_tool_input_schema=schemas.get,
        on_list_tools=list_tools,
        on_call_tool=on_call,
    )


# ------------------------------------------------------------------------- HTTP auth
class BearerGate:
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer TOKEN`` for a
    token of ``tokens`` whose role may read; others get 401 (no or unknown token) or 403
    (a role without ``read``) with a JSON ``{"error": ...}``. Lifespan events pass."""

    def __init__(self, app: Any, tokens: ApiTokens) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, cand = raw.decode("latin-1").partition(" ")
        who = self.tokens.authenticate(cand.strip() if scheme.lower() == "bearer" else None)
        if who is None:
            log.warning("event=mcp_refused status=401 path=%s", scope.get("path"))
            await _deny(send, 401, "missing or invalid bearer token (a token of the API "
                        "tokens file, role viewer or higher)")
            return
        if not who.may("read"):
            await _deny(send, 403, f"role {who.role!r} may not read")
            return
        log.debug("event=mcp_request user=%s role=%s", who.user, who.role)
        await self.app(scope, receive, send)


async def _deny(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def http_app(server: Server[Any], tokens: ApiTokens, host: str = DEFAULT_HOST) -> Any:
    """The streamable HTTP ASGI app at :data:`MCP_PATH` behind :class:`BearerGate`.

    Raises ``ValueError`` when ``tokens`` holds no token (the HTTP transport is never
    served unauthenticated)."""
    if not tokens.enabled:
        raise ValueError("the HTTP transport needs API tokens: set api.tokens_file (or pass "
                         "--tokens-file) to a file of 'TOKEN ROLE USER' lines")
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host)
    return BearerGate(app, tokens)


# ------------------------------------------------------------------ discovery and run
def tokens_file_for(config: Any, tokens_file: Path | None, data_dir: Path) -> Path | None:
    """``tokens_file``, else ``api.tokens_file``, else ``secrets.api_tokens_file``, else the
    dev stack's ``DATA/api-tokens`` when it exists, else None."""
    if tokens_file is not None:
        return tokens_file
    named = config.api.tokens_file or config.secrets.api_tokens_file
    if named:
        return Path(named)
    dev = data_dir / DEV_TOKENS_FILE
    return dev if dev.exists() else None


async def serve(config: Any, *, transport: str, dsn: str, temporal_address: str | None,
                tokens: ApiTokens | None, host: str = DEFAULT_HOST,
                port: int = DEFAULT_PORT) -> None:
    """Run the server until its input ends (stdio) or it is stopped (HTTP: SIGINT/SIGTERM).

    ``transport``: ``stdio`` or ``http``; ``dsn``: the ledger; ``temporal_address``: None
    for ledger only. Raises ``RuntimeError`` naming ``ledger.dsn`` when PostgreSQL cannot
    be reached, ``ValueError`` when the HTTP transport has no tokens."""
    import asyncpg

    from activities.ledger_queries import connect_read_only

    if transport == "http" and (tokens is None or not tokens.enabled):
        raise ValueError("the HTTP transport needs API tokens: set api.tokens_file (or pass "
                         "--tokens-file) to a file of 'TOKEN ROLE USER' lines")
    try:
        pool = await connect_read_only(dsn)
    except (OSError, asyncpg.PostgresError) as e:
        raise RuntimeError(f"ledger.dsn: cannot reach PostgreSQL: {e}") from e
    try:
        async with contextlib.AsyncExitStack() as stack:
            client = None
            if temporal_address:
                # a runtime of its own, joined before the interpreter exits (run_mcp)
                client = await stack.enter_async_context(
                    temporal_client(temporal_address, config.temporal.namespace, lazy=True,
                                    config=config.temporal))
            await _serve_on(build_server(FleetQuery(config, pool, client)), transport,
                            tokens, host, port)
    finally:
        await pool.close()


async def _serve_on(server: Any, transport: str, tokens: ApiTokens | None, host: str,
                    port: int) -> None:
    """Serve ``server`` on stdio or HTTP until the input ends or it is stopped."""
    if transport == "stdio":
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    else:
        import uvicorn

        assert tokens is not None
        app = http_app(server, tokens, host)
        log.info("event=mcp_listening url=http://%s:%d%s", host, port, MCP_PATH)
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                            lifespan="on")).serve()


def run_mcp(config: Any, *, transport: str, data_dir: Path, ledger_dsn: str | None,
            temporal_address: str | None, tokens_file: Path | None, host: str, port: int,
            no_temporal: bool = False) -> int:
    """``autorepair mcp``: resolve the ledger, Temporal and tokens, serve, return the exit
    code: 0 after a clean stop (Ctrl-C, SIGTERM, end of input), 2 when the ledger or the
    tokens cannot be found or read (message on stderr)."""
    import sys

    if transport not in ("stdio", "http"):
        print(f"error: --transport: {transport!r} is not stdio or http", file=sys.stderr)
        return 2
    dsn = ledger_dsn or config.ledger.dsn or dev_stack_dsn(data_dir)
    if not dsn:
        print(f"error: no ledger: pass --ledger-dsn, set ledger.dsn (AUTOREPAIR__LEDGER__DSN), "
              f"or point --data-dir at a running `autorepair up` (looked in "
              f"{(data_dir / DEV_PG_DIR).absolute()})", file=sys.stderr)
        return 2
    tokens: ApiTokens | None = None
    if transport == "http":
        path = tokens_file_for(config, tokens_file, data_dir)
        try:
            tokens = ApiTokens.load(path)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if not tokens.enabled:
            print("error: the HTTP transport needs API tokens: pass --tokens-file, set "
                  f"api.tokens_file, or point --data-dir at a running `autorepair up` (looked "
                  f"for {(data_dir / DEV_TOKENS_FILE).absolute()})", file=sys.stderr)
            return 2
    address = None if no_temporal else (
        temporal_address or stack_info(data_dir).get("temporal_address")
        or config.temporal.address)
    try:
        asyncio.run(serve(config, transport=transport, dsn=dsn, temporal_address=address,
                          tokens=tokens, host=host, port=port))
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        release_runtimes()
    return 0
