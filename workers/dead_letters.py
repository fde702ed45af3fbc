"""Dead letters as an operator sees them: ``autorepair dead-letters list|replay``.

An alert that ingest or a watcher could not hand to its node's workflow (refused, over the
size limit, still failing after ``ingest.handoff_max_attempts``) is kept in the ledger's
``dead_letters`` table (``ingest.handoff``, DESIGN §4.5). Once the cause is fixed (the
node's workflow was reset, a worker bug deployed away), :func:`replay` re-delivers chosen
dead letters through the same path as ingest (``TemporalAlertSink.deliver``: update-with-
start of the node's ``NodeWorkflow``), oldest first, so a node's raise still reaches its
workflow before its clear. The row is kept and marked ``replayed_at`` / ``replay_outcome``
(the workflow's answer); a re-delivery of an alert the workflow already has comes back
``deduplicated``.

Replay never acts on stale evidence by accident: a dead letter observed longer ago than
``max_age`` (default :data:`DEFAULT_MAX_AGE`) is skipped with its age in the reason, since
the fault it reports may be long gone and a raise re-delivered now would be taken as a
fault seen now (an operator who wants it anyway passes a longer ``--max-age``). A row kept
as its identity only (the alert was over 256 KiB of JSON) cannot be re-delivered and is
skipped saying so; an alert still over ``ingest.max_alert_bytes`` after capping is skipped
too. Every row gets a result; one failure never stops the others.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from activities.ledger import DEAD_LETTER_MAX_BYTES, Ledger
from ingest.handoff import TemporalAlertSink
from ingest.limits import cap_alert
from workers.fleet_models import clip, parse_since
from workers.lazy_ledger import LazyLedger
from workers.temporal_client import temporal_client
from workflows.config import AutorepairConfig
from workflows.models import Alert

#: Default ``--max-age``: dead letters observed longer ago are not re-delivered. One hour
#: is the order of the persistence windows and cooldowns of the catalogue (a fault older
#: than that has either recurred, with a fresh alert, or ended).
DEFAULT_MAX_AGE = "1h"

_out = Console()


def _row_doc(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}


async def list_rows(config: AutorepairConfig, *, cluster: str | None, include_replayed: bool,
                    limit: int) -> list[dict[str, Any]]:
    """Dead letters newest first (``Ledger.list_dead_letters`` rows, times as ISO text).
    Raises ``RuntimeError`` naming ``ledger.dsn`` when there is no ledger."""
    lazy = LazyLedger(config, max_size=1)
    try:
        rows = await (await lazy.get()).list_dead_letters(
            cluster=cluster, limit=limit, include_replayed=include_replayed)
    finally:
        await lazy.close()
    return [_row_doc(r) for r in rows]


def _replayable(row: dict[str, Any], config: AutorepairConfig,
                not_before: datetime) -> tuple[Alert | None, str]:
    """``(alert to deliver, "")`` or ``(None, why it is skipped)``."""
    if int(row.get("alert_bytes") or 0) > DEAD_LETTER_MAX_BYTES:
        return None, (f"kept as its identity only ({row['alert_bytes']} bytes): "
                      "cannot be re-delivered")
    try:
        alert = Alert.model_validate(row["alert"])
    except ValidationError as e:
        return None, f"alert: unreadable ({e.error_count()} errors: {e.errors()[0]['msg']})"
    if row.get("replayed_at") is not None:
        return None, f"already replayed at {row['replayed_at']} ({row['replay_outcome']})"
    if alert.observed_at < not_before:
        return None, (f"observed {alert.observed_at.isoformat(timespec='seconds')}, before "
                      f"{not_before.isoformat(timespec='seconds')} (--max-age): the fault "
                      "may have ended; pass a longer --max-age to replay it anyway")
    ic = config.ingest
    capped, _ = cap_alert(alert, max_value_chars=ic.max_evidence_value_chars,
                          max_bytes=ic.max_alert_bytes)
    size = len(capped.model_dump_json().encode())
    if size > ic.max_alert_bytes:
        return None, (f"still {size} bytes after capping, over ingest.max_alert_bytes "
                      f"({ic.max_alert_bytes})")
    return capped, ""


async def replay(config: AutorepairConfig, address: str, namespace: str, *,
                 alert_ids: Sequence[str] = (), cluster: str | None = None,
                 max_age: str = DEFAULT_MAX_AGE, now: datetime | None = None,
                 ledger: Ledger | None = None) -> list[dict[str, Any]]:
    """Re-deliver dead letters: those named by ``alert_ids``, else every one not yet
    replayed (of ``cluster`` when given). Returns one result per row, oldest first:
    ``{"alert_id", "cluster", "node", "kind", "result", "outcome", "repair_id",
    "reason"}`` with ``result`` ``replayed`` | ``skipped`` | ``failed`` | ``not_found``.

    ``max_age``: a duration (``90m``, ``24h``, ``7d``) or an ISO time; older alerts are
    skipped (``ValueError`` naming the value when it is neither). ``ledger``: an open
    ledger (tests); else one is opened from ``ledger.dsn``. Raises ``RuntimeError`` when
    there is no ledger, :class:`~workers.temporal_client.TemporalUnreachable` when
    Temporal cannot be reached."""
    now = now or datetime.now(UTC)
    try:
        not_before = parse_since(max_age, now)
    except ValueError as e:
        raise ValueError(f"--max-age: {e}") from None
    lazy = None
    if ledger is None:
        lazy = LazyLedger(config, max_size=1)
        ledger = await lazy.get()
    try:
        if alert_ids:
            rows = await ledger.get_dead_letters(alert_ids)
            found = {r["alert_id"] for r in rows}
            missing = [{"alert_id": a, "cluster": None, "node": None, "kind": None,
                        "result": "not_found", "outcome": None, "repair_id": None,
                        "reason": "no dead letter with this id"}
                       for a in dict.fromkeys(alert_ids) if a not in found]
        else:
            rows = list(reversed(await ledger.list_dead_letters(
                cluster=cluster, limit=10_000, include_replayed=False)))
            missing = []
        results: list[dict[str, Any]] = []
        async with temporal_client(address, namespace) as client:
            sink = TemporalAlertSink(client, config.temporal.task_queue)
            for row in rows:
                results.append(await _replay_one(ledger, sink, row, config, not_before))
        return results + missing
    finally:
        if lazy is not None:
            await lazy.close()


async def _replay_one(ledger: Ledger, sink: TemporalAlertSink, row: dict[str, Any],
                      config: AutorepairConfig, not_before: datetime) -> dict[str, Any]:
    res: dict[str, Any] = {k: row.get(k) for k in ("alert_id", "cluster", "node", "kind")}
    res.update(result="skipped", outcome=None, repair_id=None, reason="")
    alert, why = _replayable(row, config, not_before)
    if alert is None:
        res["reason"] = why
        return res
    try:
        delivery = await sink.deliver(alert)
    except Exception as e:  # one row's failure never stops the others; the row is kept
        cause = getattr(e, "cause", None) or e
        res.update(result="failed", reason=f"{type(cause).__name__}: {clip(str(cause), 300)}")
        return res
    await ledger.mark_dead_letter_replayed(row["alert_id"], delivery.outcome.value)
    res.update(result="replayed", outcome=delivery.outcome.value,
               repair_id=delivery.repair_id, reason=delivery.reason or "")
    return res


def print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    """``dead-letters list`` output: JSON, or a table (alert id shortened to 12)."""
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    t = Table(title=f"dead letters ({len(rows)})")
    for c in ("alert", "cluster", "node", "kind", "reason", "attempts", "recorded", "replayed",
              "error"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["alert_id"][:12], r["cluster"], r["node"], r["kind"], r["reason"],
                  str(r["attempts"]), str(r["recorded_at"])[:19],
                  f"{str(r['replayed_at'])[:19]} {r['replay_outcome']}" if r.get("replayed_at")
                  else "", clip(r["error"], 60))
    _out.print(t)


def print_results(results: list[dict[str, Any]], as_json: bool) -> int:
    """``dead-letters replay`` output; returns the exit code: 0 when every row was
    replayed (or there was none), 1 when any failed or was not found, 3 when some were
    only skipped."""
    if as_json:
        typer.echo(json.dumps(results, indent=2, default=str))
    else:
        t = Table(title=f"replay ({len(results)})")
        for c in ("alert", "node", "kind", "result", "outcome", "repair", "reason"):
            t.add_column(c)
        for r in results:
            t.add_row(str(r["alert_id"])[:12], r["node"] or "", r["kind"] or "", r["result"],
                      r["outcome"] or "", r["repair_id"] or "", clip(r["reason"], 120))
        _out.print(t)
    kinds = {r["result"] for r in results}
    if kinds & {"failed", "not_found"}:
        return 1
    return 3 if "skipped" in kinds else 0
