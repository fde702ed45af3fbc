"""``autorepair maintenance start|list|end``: planned maintenance windows through the API
(``POST/GET /api/v1/maintenance``, ``DELETE /api/v1/maintenance/{id}``; issue 29 item 1).
Writing needs an operator token, listing any token."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from workers import ops

_out = Console()


def start(api: str, auth: ops.ApiToken, as_json: bool, body: dict[str, Any]) -> None:
    """Open a window; prints its id (``--json``: the window)."""
    w = ops.call_api("POST", api, "/api/v1/maintenance", auth, body=body)
    if as_json:
        typer.echo(json.dumps(w, indent=2))
        return
    typer.echo(w["window_id"])
    _out.print(f"maintenance window {w['window_id']} on {w['cluster']} ({_scope(w)}) until "
               f"{w['ends_at']}: {w['reason']}", style="dim", highlight=False)


def list_windows(api: str, auth: ops.ApiToken, as_json: bool, cluster: str | None,
                 active: bool) -> None:
    """Windows newest first, as a table (``--json``: the list)."""
    doc = ops.call_api("GET", api, "/api/v1/maintenance", auth,
                       params={"cluster": cluster, "active": str(active).lower()})
    ws = doc["windows"]
    if as_json:
        typer.echo(json.dumps(ws, indent=2))
        return
    t = Table(title="maintenance windows")
    for col in ("id", "cluster", "covers", "state", "from", "until", "by", "reason"):
        t.add_column(col)
    for w in ws:
        until = w["ended_at"] or w["ends_at"]
        t.add_row(w["window_id"], w["cluster"], _scope(w), w["state"], str(w["starts_at"])[:19],
                  str(until)[:19], w["created_by"], w["reason"])
    _out.print(t)


def end(api: str, auth: ops.ApiToken, as_json: bool, window_id: str) -> None:
    """End a window now (an ended window is reported as it is)."""
    path = f"/api/v1/maintenance/{ops.path_part('window_id', window_id)}"
    w = ops.call_api("DELETE", api, path, auth,
                     hint_404="`autorepair maintenance list` shows the windows")
    if as_json:
        typer.echo(json.dumps(w, indent=2))
    elif w.get("ended_now"):
        typer.echo(f"ended {window_id}")
    else:
        typer.echo(f"{window_id} had already ended ({w['ended_at'] or w['ends_at']})")


def _scope(w: dict[str, Any]) -> str:
    if w["scope"] == "all":
        return "all nodes"
    if w["scope"] == "pool":
        return f"pool {w['pool']}"
    nodes = w["nodes"]
    return ", ".join(nodes[:5]) + (f" (+{len(nodes) - 5})" if len(nodes) > 5 else "")
