"""Operator commands of the ``autorepair`` CLI (DESIGN §4.1): ``status``, ``repairs``,
``validate``, ``breaker``.

``status`` and ``repairs`` talk to the HTTP API (``--api``, default
``http://127.0.0.1:8080``; bearer token from ``--token`` or ``AUTOREPAIR_TOKEN``);
``validate`` and ``breaker`` talk to Temporal directly (``--temporal-address``, default
``temporal.address`` of the config). Every read command takes ``--json``; people get
rich tables. Exit codes: 0 ok, 1 the server refused (message printed), 2 bad usage or
unreachable server.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

repairs_app = typer.Typer(help="Repair API: list, show, create, approve, reject, cancel.",
                          no_args_is_help=True)
breaker_app = typer.Typer(help="Circuit breaker of a cluster (ClusterGuardWorkflow).",
                          no_args_is_help=True)

DEFAULT_API = "http://127.0.0.1:8080"
"""Default API address: the API port of DESIGN §4.2 on loopback."""
Api = Annotated[str, typer.Option("--api", envvar="AUTOREPAIR_API", help="API base URL")]
Token = Annotated[str | None, typer.Option(
    "--token", envvar="AUTOREPAIR_TOKEN",
    help="bearer token (api.tokens_file); default: .autorepair/operator.token written by "
         "`autorepair up`")]

#: Where ``autorepair up`` leaves the dev stack's operator token (``--data-dir``).
DEV_TOKEN_FILE = Path(".autorepair") / "operator.token"


def resolve_token(token: str | None) -> str | None:
    """``--token`` / ``$AUTOREPAIR_TOKEN``, else the dev stack's operator token file in the
    current directory, else None."""
    if token:
        return token
    if DEV_TOKEN_FILE.is_file():
        return DEV_TOKEN_FILE.read_text(encoding="utf-8").strip() or None
    return None
AsJson = Annotated[bool, typer.Option("--json", help="print JSON")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="autorepair.yaml")]
TemporalOpt = Annotated[str | None, typer.Option(
    "--temporal-address", help="Temporal frontend (default: temporal.address)")]

_out = Console()
_err = Console(stderr=True)


def _call(method: str, api: str, path: str, token: str | None,
          body: dict[str, Any] | None = None, params: dict[str, Any] | None = None) -> Any:
    """One API request; prints the server's error and exits 1 (2 when unreachable)."""
    token = resolve_token(token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.request(method, api.rstrip("/") + path, json=body, headers=headers,
                          params={k: v for k, v in (params or {}).items() if v is not None},
                          timeout=30.0)
    except httpx.HTTPError as e:
        _err.print(f"error: --api {api}: {e} (is the stack up? `autorepair up` starts one)")
        raise typer.Exit(2) from None
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        if isinstance(detail, list):
            detail = "; ".join(f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg')}"
                               for d in detail)
        _err.print(f"error: HTTP {r.status_code}: {detail}")
        raise typer.Exit(1)
    return r.json()


def _ts(v: Any) -> str:
    return str(v)[:19].replace("T", " ") if v else ""


def _repairs_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="repairs")
    for col in ("repair", "cluster", "node", "action", "stage", "requester", "updated"):
        # ids and stages are copied into commands: never cut them
        t.add_column(col, no_wrap=col in ("repair", "stage", "action"))
    for r in rows:
        t.add_row(r["repair_id"], r["cluster"], r["node"], r["action"], r["stage"],
                  f"{r['requester_kind']}:{r['requester_name']}", _ts(r["updated_at"]))
    return t


@repairs_app.command("list")
def repairs_list(
    api: Api = DEFAULT_API, token: Token = None, as_json: AsJson = False,
    node: Annotated[str | None, typer.Option(help="node name")] = None,
    cluster: Annotated[str | None, typer.Option(help="cluster name")] = None,
    state: Annotated[str | None, typer.Option(help="stage, open, in_progress or terminal")]
    = None,
    action: Annotated[str | None, typer.Option(help="reboot, reprovision, ...")] = None,
    requester: Annotated[str | None, typer.Option(help="requester name or kind")] = None,
) -> None:
    """Repairs, newest first."""
    doc = _call("GET", api, "/api/v1/repairs", token, params={
        "node": node, "cluster": cluster, "state": state, "action": action,
        "requester": requester})
    if as_json:
        typer.echo(json.dumps(doc["repairs"], indent=2))
    else:
        _out.print(_repairs_table(doc["repairs"]))


def _show(r: dict[str, Any]) -> None:
    t = Table(title=f"repair {r['repair_id']}", show_header=False)
    t.add_column("field")
    t.add_column("value")
    for k in ("cluster", "node", "machine_id", "action", "stage", "state", "requester_kind",
              "requester_name", "detector", "request_id", "reason", "approved_by",
              "decided_by_rule", "workflow_id"):
        t.add_row(k, "" if r.get(k) is None else str(r[k]))
    _out.print(t)
    h = Table(title="transitions")
    for col in ("at", "stage", "by", "reason"):
        h.add_column(col)
    for tr in r.get("transitions", []):
        h.add_row(_ts(tr["at"]), tr["stage"], tr["by"], tr["reason"])
    _out.print(h)
    live = r.get("live") or {}
    if live.get("evidence"):
        e = Table(title="evidence")
        for col in ("alert", "kind", "severity", "summary"):
            e.add_column(col)
        for a in live["evidence"]:
            e.add_row(a["alert_id"][:16], a["kind"], a["severity"], a["summary"])
        _out.print(e)


@repairs_app.command("show")
def repairs_show(repair_id: str, api: Api = DEFAULT_API, token: Token = None,
                 as_json: AsJson = False) -> None:
    """One repair: fields, transitions, evidence."""
    r = _call("GET", api, f"/api/v1/repairs/{repair_id}", token)
    if as_json:
        typer.echo(json.dumps(r, indent=2))
    else:
        _show(r)


@repairs_app.command("create")
def repairs_create(
    node: Annotated[str, typer.Option("--node", help="node name")],
    mode: Annotated[str, typer.Option("--mode", help="reboot|reprovision|migrate|remove")],
    reason: Annotated[str, typer.Option("--reason", help="why (evidence text)")],
    request_id: Annotated[str | None, typer.Option(
        "--request-id", help="idempotency key (default: a new uuid)")] = None,
    detector: Annotated[str | None, typer.Option("--detector", help="detector name")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster")] = None,
    evidence_alert: Annotated[str | None, typer.Option("--evidence-alert",
                                                       help="ledger alert id cited")] = None,
    evidence_run: Annotated[str | None, typer.Option("--evidence-run",
                                                     help="health-check run id cited")] = None,
    api: Api = DEFAULT_API, token: Token = None, as_json: AsJson = False,
) -> None:
    """Create a repair (a retried create with the same request id returns the same one)."""
    body = {"node": node, "mode": mode, "reason": reason,
            "request_id": request_id or str(uuid.uuid4()), "detector": detector,
            "cluster": cluster, "evidence_alert": evidence_alert, "evidence_run": evidence_run}
    res = _call("POST", api, "/api/v1/repairs", token,
                body={k: v for k, v in body.items() if v is not None})
    if as_json:
        typer.echo(json.dumps(res, indent=2))
        return
    r = res["repair"]
    verb = "created" if res["created"] else "exists"
    _out.print(f"{verb}: {r['repair_id']} ({r['cluster']}/{r['node']} {r['action']}, "
               f"stage {r['stage']})")
    if res["refused"]:
        _out.print(f"refused: {res['refused_reason']}")
        raise typer.Exit(1)


def _decide(verb: str, repair_id: str, api: str, token: str | None, as_json: bool,
            body: dict[str, Any]) -> None:
    r = _call("POST", api, f"/api/v1/repairs/{repair_id}/{verb}", token, body=body)
    if as_json:
        typer.echo(json.dumps(r, indent=2))
    else:
        _out.print(f"{verb} sent: {repair_id} (stage {r['stage']})")


@repairs_app.command("approve")
def repairs_approve(
    repair_id: str, api: Api = DEFAULT_API, token: Token = None, as_json: AsJson = False,
    action: Annotated[str | None, typer.Option(help="override the action")] = None,
) -> None:
    """Approve a repair waiting for approval."""
    _decide("approve", repair_id, api, token, as_json,
            {"action": action} if action else {})


@repairs_app.command("reject")
def repairs_reject(
    repair_id: str, api: Api = DEFAULT_API, token: Token = None, as_json: AsJson = False,
    reason: Annotated[str, typer.Option(help="why")] = "",
) -> None:
    """Reject a repair (before it acts)."""
    _decide("reject", repair_id, api, token, as_json, {"reason": reason})


@repairs_app.command("cancel")
def repairs_cancel(
    repair_id: str, api: Api = DEFAULT_API, token: Token = None, as_json: AsJson = False,
    reason: Annotated[str, typer.Option(help="why")] = "",
) -> None:
    """Cancel a repair at its next safe point."""
    _decide("cancel", repair_id, api, token, as_json, {"reason": reason})


# ------------------------------------------------------------------------ status
def status_doc(api: str, token: str | None, cluster: str | None) -> dict[str, Any]:
    """``{"state": GET /api/v1/state, "alerts": recent alerts, "repairs": recent repairs}``
    (alerts and repairs need a token; empty without one)."""
    state = _call("GET", api, "/api/v1/state", None, params={"cluster_id": cluster})
    repairs: list[dict[str, Any]] = []
    alerts: list[dict[str, Any]] = []
    token = resolve_token(token)
    if token:
        repairs = _call("GET", api, "/api/v1/repairs", token,
                        params={"cluster": cluster, "limit": 20})["repairs"]
        alerts = _call("GET", api, "/api/v1/alerts", token,
                       params={"cluster": cluster, "limit": 20})["alerts"]
    return {"state": state, "alerts": alerts, "repairs": repairs}


def status_tables(doc: dict[str, Any]) -> Table:
    """One grid holding the cohort, node, alert and repair tables."""
    grid = Table.grid()
    st = doc["state"]
    c = Table(title="thresholds")
    for col in ("cluster", "cohort", "threshold", "quorum", "median", "mad", "active",
                "panic"):
        c.add_column(col)
    for r in st.get("cohorts", []):
        c.add_row(r["cluster_id"], str(r["cohort"]), f"{r['threshold']:.4f}",
                  str(r["quorum_met"]), f"{r['median'] or 0:.4f}", f"{r['mad'] or 0:.4f}",
                  str(r["active_nodes"]), str(r["panic"]))
    n = Table(title="nodes")
    for col in ("cluster", "node", "score", "state", "straggler", "last seen"):
        n.add_column(col)
    for r in st.get("nodes", []):
        seen = datetime.fromtimestamp(r["last_seen"], UTC).isoformat()[:19] if r.get(
            "last_seen") else ""
        n.add_row(r["cluster"], r["node"], f"{r['score']:.4f}", str(r["state"]),
                  "yes" if r["straggler"] else "", seen)
    a = Table(title="open cluster alerts")
    for col in ("cluster", "kind", "summary"):
        a.add_column(col)
    for r in st.get("cluster_alerts", []):
        if r.get("active", True):
            a.add_row(r["cluster_id"], r["kind"], r["summary"])
    al = Table(title="alerts (newest first)")
    for col in ("observed", "node", "kind", "code", "severity", "action", "summary"):
        al.add_column(col)
    for r in doc.get("alerts", []):
        al.add_row(_ts(r.get("observed_at")), r["node"], r["kind"],
                   "" if r.get("code") is None else str(r["code"]), r["severity"],
                   r["action"] if r.get("actionable") else f"({r['action']})", r["summary"])
    for t in (c, n, a, al, _repairs_table(doc["repairs"])):
        grid.add_row(t)
    return grid


def status_command(api: str, token: str | None, as_json: bool, watch: bool,
                   cluster: str | None, interval_s: float = 2.0) -> None:
    """``autorepair status``: print once, or refresh every ``interval_s`` with ``watch``."""
    if as_json:
        typer.echo(json.dumps(status_doc(api, token, cluster), indent=2))
        return
    if not watch:
        _out.print(status_tables(status_doc(api, token, cluster)))
        return
    with Live(status_tables(status_doc(api, token, cluster)), console=_out) as live:
        try:
            while True:
                time.sleep(interval_s)
                live.update(status_tables(status_doc(api, token, cluster)))
        except KeyboardInterrupt:
            pass


def resolve_cluster(cfg: Any, machine: str, api: str) -> str:
    """Cluster of ``machine``: the only configured cluster, or the configured cluster that
    lists it as a node or machine, else the cluster whose agents report a node of that
    name to the ingest API. Exits 2 naming the machine when none or several match."""
    clusters = [c for c in cfg.clusters
                if any(machine in (n.name, n.machine) for n in c.nodes) or machine in c.spares]
    if not clusters and len(cfg.clusters) == 1:
        clusters = list(cfg.clusters)
    names = sorted({c.name for c in clusters})
    if not names:
        try:
            state = _call("GET", api, "/api/v1/state", None)
            names = sorted({n["cluster"] for n in state.get("nodes", []) if n["node"] == machine})
        except typer.Exit:
            names = []
    if len(names) != 1:
        found = f"it is in {names}" if names else "no cluster lists it"
        _err.print(f"error: machine {machine!r}: cannot tell its cluster ({found}); "
                   "pass --cluster")
        raise typer.Exit(2)
    return names[0]


# ------------------------------------------------------------------ Temporal side
async def _client(address: str, namespace: str) -> Any:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    return await Client.connect(address, namespace=namespace,
                                data_converter=pydantic_data_converter)


async def start_validation(address: str, namespace: str, task_queue: str, cluster: str,
                           machine: str, by: str, reason: str) -> str:
    """Start ``ValidationWorkflow`` ``validate/{machine}/{n}``; returns the workflow id."""
    from workflows.models import ValidationRequest
    from workflows.protocol import workflow_id_validation
    from workflows.validation import ValidationWorkflow

    client = await _client(address, namespace)
    wf_id = workflow_id_validation(machine, "op-" + datetime.now(UTC).strftime("%Y%m%d%H%M%S"))
    await client.start_workflow(
        ValidationWorkflow.run,
        ValidationRequest(cluster=cluster, machine=machine, reason=reason, requested_by=by),
        id=wf_id, task_queue=task_queue)
    return wf_id


async def breaker_call(address: str, namespace: str, cluster: str,
                       reset_by: str | None = None, reason: str = "") -> dict[str, Any]:
    """Query (and with ``reset_by`` first reset) ``guard/{cluster}``; the GuardStatus."""
    from workflows.guard import ClusterGuardWorkflow
    from workflows.protocol import ResetBreakerSignal, workflow_id_guard

    client = await _client(address, namespace)
    h = client.get_workflow_handle_for(ClusterGuardWorkflow.run, workflow_id_guard(cluster))
    if reset_by is not None:
        await h.signal(ClusterGuardWorkflow.reset_breaker,
                       ResetBreakerSignal(by=reset_by, reason=reason))
    st = await h.query(ClusterGuardWorkflow.status)
    return st.model_dump(mode="json")


def breaker_print(doc: dict[str, Any], as_json: bool) -> None:
    """Print a GuardStatus as JSON or a table."""
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    t = Table(title=f"breaker {doc['cluster']}", show_header=False)
    t.add_column("field")
    t.add_column("value")
    for k in ("breaker_open", "tripped_at", "tripped_reason", "reset_at", "reset_by",
              "gpu_nodes", "budget", "breaker_threshold", "breaker_window_s",
              "refused_total"):
        t.add_row(k, "" if doc.get(k) is None else str(doc[k]))
    t.add_row("leases", ", ".join(f"{x['node']}:{x['repair_id']}" for x in doc["leases"]))
    t.add_row("queued", ", ".join(f"{x['node']}:{x['repair_id']}" for x in doc["pending"]))
    _out.print(t)


def run_async(coro: Any) -> Any:
    """Run ``coro``; a connection failure prints the error and exits 2."""
    try:
        return asyncio.run(coro)
    except RuntimeError as e:
        _err.print(f"error: {e}")
        raise typer.Exit(2) from None
    except Exception as e:
        _err.print(f"error: {type(e).__name__}: {e}")
        raise typer.Exit(1) from None
