"""``autorepair machines held|return``: machines held for RMA and their return to service
(issue 26 I18), over the HTTP API (``/api/v1/machines``, :mod:`workers.repairs.machines`):
the CLI needs only the API address and a token, like ``repairs`` and ``report``.

``held`` needs a token of any role (viewer and up), ``return`` an operator token; the
operator named by the token is recorded with the return. Exit codes: 0 done, 1 the server
refused (its message printed: a machine that is not held answers 409 naming it), 2
unreachable server.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import typer
from rich.console import Console

from workers.ops import ApiToken, call_api
from workers.tables import Col, fitted_table

_out = Console()

HELD_COLS = (
    Col("cluster", priority=2), Col("machine", keep=True), Col("since", priority=4),
    Col("repair", priority=3), Col("reason", priority=1, wrap=True),
)
"""Columns of the held-machines table; the machine is copied into ``machines return``."""


def _ts(v: Any) -> str:
    return str(v)[:19].replace("T", " ") if v else ""


def held_command(api: str, auth: ApiToken, as_json: bool, cluster: str | None) -> None:
    """``machines held [--cluster C] [--json]``: machines held for RMA, by cluster."""
    doc = call_api("GET", api, "/api/v1/machines/held", auth, params={"cluster": cluster})
    rows = doc["machines"]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        where = f" in cluster {cluster}" if cluster else ""
        _out.print(f"no machine is held for RMA{where}", highlight=False)
        return
    cells = [[r["cluster"], r["machine"], _ts(r["since"]), r.get("repair_id") or "-",
              r["reason"]] for r in rows]
    _out.print(fitted_table("machines held for RMA", HELD_COLS, cells, _out.width))


def return_command(api: str, auth: ApiToken, as_json: bool, cluster: str, machine: str,
                   reason: str) -> None:
    """``machines return CLUSTER MACHINE --reason TEXT``: lift the machine's RMA hold."""
    path = f"/api/v1/machines/{quote(cluster, safe='')}/{quote(machine, safe='')}/return"
    doc = call_api("POST", api, path, auth, body={"reason": reason},
                   hint_404="`autorepair machines held` lists the held machines")
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    hold = doc["hold"]
    _out.print(f"returned: {doc['cluster']}/{doc['machine']} (held since "
               f"{_ts(hold['since'])}, repair {hold.get('repair_id') or '-'}) by "
               f"{doc['returned_by']}: {doc['reason']}", highlight=False)
