"""``autorepair domains status|release``: failure-domain holds through the API
(``GET /api/v1/domains``, ``POST /api/v1/domains/{cluster}/{domain}/release``; issue 29
item 2). Releasing needs an operator token, status any token."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import typer
from rich.console import Console
from rich.table import Table

from workers import ops

_out = Console()


def status(api: str, auth: ops.ApiToken, as_json: bool, cluster: str) -> None:
    """The holds of ``cluster`` as a table (``--json``: the API's answer)."""
    doc = ops.call_api("GET", api, "/api/v1/domains", auth, params={"cluster": cluster})
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    print_view(doc)


def release(api: str, auth: ops.ApiToken, as_json: bool, cluster: str, domain: str,
            reason: str) -> None:
    """Release the hold of ``domain``; a domain not held is an error naming it (exit 1)."""
    path = f"/api/v1/domains/{quote(cluster, safe='')}/{quote(domain, safe='')}/release"
    doc = ops.call_api("POST", api, path, auth, body={"reason": reason})
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(f"released {domain} on {cluster}: its waiting repairs go as the rails allow")


def print_view(doc: dict[str, Any]) -> None:
    """One row per hold, then the rule and the nodes counted in the window."""
    t = Table(title=f"failure-domain holds {doc['cluster']}")
    for col in ("domain", "since", "nodes", "kinds"):
        t.add_column(col)
    for h in doc["holds"]:
        t.add_row(h["domain"], str(h["opened_at"])[:19], ", ".join(h["nodes"]),
                  ", ".join(h["kinds"]))
    _out.print(t)
    rule = f"a hold opens at {doc['threshold']} nodes of one domain within " \
           f"{doc['window_s']:g} s (policy.domains)"
    if not doc["guard_running"]:
        rule += "; no guard runs for this cluster yet: nothing is held"
    _out.print(rule, highlight=False)
    recent: dict[str, set[str]] = {}
    for f in doc["recent"]:
        recent.setdefault(f["domain"], set()).add(f["node"])
    for d, nodes in sorted(recent.items()):
        _out.print(f"counted in the window: {d}: {', '.join(sorted(nodes))}", highlight=False)
    for r in doc["releases"][-5:]:
        _out.print(f"released {r['domain']} by {r['by']} at {str(r['at'])[:19]}: "
                   f"{r['reason']}", highlight=False)
