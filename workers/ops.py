"""Operator commands of the ``autorepair`` CLI (DESIGN §4.1): what ``status``, ``repairs``,
``validate`` and ``breaker`` do. The commands themselves (options, help) are declared in
:mod:`workers.cli`.

``status`` and ``repairs`` talk to the HTTP API (``--api``, default
``http://127.0.0.1:8080``) with a bearer token found by :func:`resolve_token`;
``validate`` and ``breaker`` talk to Temporal directly (``--temporal-address``, default
``temporal.address`` of the config). Every read command takes ``--json``; people get
rich tables. Exit codes: 0 ok, 1 the server refused (message printed), 2 bad usage or
unreachable server.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

DEFAULT_API = "http://127.0.0.1:8080"
"""Default API address: the API port of DESIGN §4.2 on loopback."""
TOKEN_ENV = "AUTOREPAIR_TOKEN"
"""Environment variable holding the API bearer token (``--token``)."""
DATA_DIR_ENV = "AUTOREPAIR_DATA_DIR"
"""Environment variable naming the dev stack's data directory (``--data-dir``)."""
DEFAULT_DATA_DIR = Path(".autorepair")
"""Default data directory of ``autorepair up`` and of the client commands (DESIGN §4.1)."""
STATUS_WINDOW = "7d"
"""Window of the downtime table of ``autorepair status`` (a week, as ``report``'s default)."""
OPERATOR_TOKEN_FILE = "operator.token"
"""File in the data directory where ``autorepair up`` leaves its operator token (DESIGN §4.2)."""


@dataclass(frozen=True, slots=True)
class ApiToken:
    """The bearer token a client command sends, and where it came from.

    ``token``: ``None`` when none was found. ``source``: ``"--token"`` (the option or
    ``$AUTOREPAIR_TOKEN``) or the token file read. ``token_file``: the data directory's
    operator token file that was (or would have been) read, as an absolute path."""

    token: str | None
    source: str
    token_file: Path

    def help_401(self) -> str:
        """What to tell a user whose request was refused with 401 with this token."""
        if self.token is None:
            return (f"no API token found: looked at --token, ${TOKEN_ENV} and "
                    f"{self.token_file} (--data-dir / ${DATA_DIR_ENV}, default "
                    f"{DEFAULT_DATA_DIR}); pass --token TOKEN or set {TOKEN_ENV} to a token "
                    "of api.tokens_file, or point --data-dir at the directory given to "
                    "`autorepair up --data-dir`")
        if self.source == "--token":
            return f"the token from --token / ${TOKEN_ENV} was refused"
        return (f"the token in {self.source} was refused; is {self.token_file.parent} the "
                f"data directory of the running stack? (--data-dir / ${DATA_DIR_ENV}, or "
                "pass --token)")


def resolve_token(token: str | None, data_dir: Path | str = DEFAULT_DATA_DIR) -> ApiToken:
    """``--token`` / ``$AUTOREPAIR_TOKEN`` (``token``), else the operator token that
    ``autorepair up --data-dir DATA_DIR`` wrote to ``DATA_DIR/operator.token``, else none.

    ``data_dir``: relative paths are taken from the current directory. Never raises: an
    unreadable or empty token file counts as no token."""
    token_file = (Path(data_dir) / OPERATOR_TOKEN_FILE).absolute()
    if token:
        return ApiToken(token, "--token", token_file)
    try:
        found = token_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        found = ""
    return ApiToken(found or None, str(token_file), token_file)


_out = Console()
_err = Console(stderr=True)


def _call(method: str, api: str, path: str, auth: ApiToken | None,
          body: dict[str, Any] | None = None, params: dict[str, Any] | None = None) -> Any:
    """One API request (``auth``: the bearer token, ``None`` for public endpoints); prints
    the server's error and exits 1 (2 when unreachable). A 401 also says where the token
    was looked for and how to pass one."""
    headers = {"Authorization": f"Bearer {auth.token}"} if auth and auth.token else {}
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
        if r.status_code == 401 and auth is not None:
            _err.print(auth.help_401())
        raise typer.Exit(1)
    return r.json()


call_api = _call
"""Public name of the API call helper, for the report command (:mod:`workers.report`)."""


def _ts(v: Any) -> str:
    return str(v)[:19].replace("T", " ") if v else ""


def _cost(d: dict[str, Any] | None) -> tuple[str, str]:
    """(GPU-hours, cost) cells of a repair's downtime; empty while it runs."""
    if not d:
        return "", ""
    cost = "-" if d.get("cost") is None else f"{d['cost']:.2f} {d.get('currency', '')}"
    return f"{d['gpu_hours']:.2f}", cost.strip()


def _repairs_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="repairs")
    for col in ("repair", "cluster", "node", "action", "stage", "requester", "updated",
                "GPU-h lost", "cost"):
        # ids and stages are copied into commands: never cut them
        t.add_column(col, no_wrap=col in ("repair", "stage", "action"))
    for r in rows:
        t.add_row(r["repair_id"], r["cluster"], r["node"], r["action"], r["stage"],
                  f"{r['requester_kind']}:{r['requester_name']}", _ts(r["updated_at"]),
                  *_cost(r.get("downtime")))
    return t


def _downtime_table(d: dict[str, Any]) -> Table:
    """A finished repair's downtime: GPUs, times, GPU-hours (waiting / out of service), cost."""
    t = Table(title="downtime", show_header=False)
    t.add_column("field")
    t.add_column("value")
    gpu_h, cost = _cost(d)
    rows = [
        ("GPUs", str(d["gpus"])), ("cordoned", _ts(d.get("cordoned_at"))),
        ("back in service", _ts(d.get("rejoined_at"))),
        ("out of the pool", f"{d['duration_s'] / 60:.1f} min"),
        ("  waiting for idle", f"{d['idle_wait_s'] / 60:.1f} min"),
        ("  out of service", f"{d['out_of_service_s'] / 60:.1f} min"),
        ("GPU-hours lost", gpu_h),
        ("  waiting for idle", f"{d['idle_wait_gpu_hours']:.2f}"),
        ("  out of service", f"{d['out_of_service_gpu_hours']:.2f}"),
        ("hourly rate (per GPU)", "-" if d.get("hourly_rate") is None
         else f"{d['hourly_rate']:.2f} {d.get('currency', '')}"),
        ("cost", cost),
        ("provider", " / ".join(str(d[k]) for k in ("provider", "region", "gpu_type")
                                if d.get(k)) or "-"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def repairs_list(api: str, auth: ApiToken, as_json: bool, filters: dict[str, Any]) -> None:
    """``repairs list``: repairs newest first; ``filters``: node, cluster, state, action,
    requester, limit (``None`` values are left out)."""
    doc = _call("GET", api, "/api/v1/repairs", auth, params=filters)
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
    if r.get("downtime"):
        _out.print(_downtime_table(r["downtime"]))
    live = r.get("live") or {}
    if live.get("evidence"):
        e = Table(title="evidence")
        for col in ("alert", "kind", "severity", "summary"):
            e.add_column(col)
        for a in live["evidence"]:
            e.add_row(a["alert_id"][:16], a["kind"], a["severity"], a["summary"])
        _out.print(e)


def repairs_show(api: str, auth: ApiToken, as_json: bool, repair_id: str) -> None:
    """``repairs show ID``: fields, transitions, evidence."""
    r = _call("GET", api, f"/api/v1/repairs/{repair_id}", auth)
    if as_json:
        typer.echo(json.dumps(r, indent=2))
    else:
        _show(r)


def repairs_create(api: str, auth: ApiToken, as_json: bool, body: dict[str, Any]) -> None:
    """``repairs create``: POST ``body`` (``None`` values left out); exits 1 when the
    request was recorded as refused."""
    res = _call("POST", api, "/api/v1/repairs", auth,
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


def repairs_decide(verb: str, api: str, auth: ApiToken, as_json: bool, repair_id: str,
                   body: dict[str, Any]) -> None:
    """``repairs approve|reject|cancel ID``: POST the decision ``verb`` with ``body``."""
    r = _call("POST", api, f"/api/v1/repairs/{repair_id}/{verb}", auth, body=body)
    if as_json:
        typer.echo(json.dumps(r, indent=2))
    else:
        _out.print(f"{verb} sent: {repair_id} (stage {r['stage']})")


# ------------------------------------------------------------------------ status
def status_doc(api: str, auth: ApiToken, cluster: str | None) -> dict[str, Any]:
    """``{"state": GET /api/v1/state, "alerts": recent alerts, "repairs": recent repairs,
    "downtime": GET /api/v1/report?since=7d}`` (every one needs a token of any role; exits
    1 with where the token was looked for when it is refused)."""
    state = _call("GET", api, "/api/v1/state", auth, params={"cluster_id": cluster})
    repairs: list[dict[str, Any]] = []
    alerts: list[dict[str, Any]] = []
    downtime: dict[str, Any] | None = None
    if auth.token:
        repairs = _call("GET", api, "/api/v1/repairs", auth,
                        params={"cluster": cluster, "limit": 20})["repairs"]
        alerts = _call("GET", api, "/api/v1/alerts", auth,
                       params={"cluster": cluster, "limit": 20})["alerts"]
        downtime = _call("GET", api, "/api/v1/report", auth,
                         params={"since": STATUS_WINDOW, "cluster": cluster})
    return {"state": state, "alerts": alerts, "repairs": repairs, "downtime": downtime}


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
    tables = [c, n, a, al, _repairs_table(doc["repairs"])]
    rep = doc.get("downtime")
    if rep:
        cur = rep["currency"]
        d = Table(title=f"downtime and cost, last {STATUS_WINDOW} "
                  f"({rep['gpu_hours']:.2f} GPU-h, {rep['cost']:.2f} {cur})")
        for col in ("cluster", "action", "fault kind", "repairs", "failed", "GPU-h lost",
                    f"cost ({cur})"):
            d.add_column(col)
        for r in rep["breakdown"]:
            d.add_row(r["cluster"], r["action"], r["fault_kind"], str(r["repairs"]),
                      str(r["failed"]), f"{r['gpu_hours']:.2f}", f"{r['cost']:.2f}")
        tables.append(d)
    for t in tables:
        grid.add_row(t)
    return grid


def status_command(api: str, auth: ApiToken, as_json: bool, watch: bool,
                   cluster: str | None, interval_s: float = 2.0) -> None:
    """``autorepair status``: print once, or refresh every ``interval_s`` with ``watch``.
    Without a token the API answers 401 and stderr says where the token was looked for."""
    if as_json:
        typer.echo(json.dumps(status_doc(api, auth, cluster), indent=2))
        return
    if not watch:
        _out.print(status_tables(status_doc(api, auth, cluster)))
        return
    with Live(status_tables(status_doc(api, auth, cluster)), console=_out) as live:
        try:
            while True:
                time.sleep(interval_s)
                live.update(status_tables(status_doc(api, auth, cluster)))
        except KeyboardInterrupt:
            pass


def resolve_cluster(cfg: Any, machine: str, api: str, auth: ApiToken | None = None) -> str:
    """Cluster of ``machine``: the only configured cluster, or the configured cluster that
    lists it as a node or machine, else the cluster whose agents report a node of that
    name to the ingest API (read with ``auth``: ``/api/v1/state`` needs a token). Exits 2
    naming the machine when none or several match."""
    clusters = [c for c in cfg.clusters
                if any(machine in (n.name, n.machine) for n in c.nodes) or machine in c.spares]
    if not clusters and len(cfg.clusters) == 1:
        clusters = list(cfg.clusters)
    names = sorted({c.name for c in clusters})
    if not names:
        try:
            state = _call("GET", api, "/api/v1/state", auth)
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
