"""Dead letters as an operator sees them: ``autorepair dead-letters list|replay``.

An alert that ingest or a watcher could not hand to its node's workflow (refused, over the
size limit, still failing after ``ingest.handoff_max_attempts``) is kept in the ledger's
``dead_letters`` table (``ingest.handoff``, docs/design.md §4.5). Once the cause is fixed (the
node's workflow was reset, a worker bug deployed away), :func:`replay` re-delivers chosen
dead letters through the same path as ingest (``TemporalAlertSink.deliver``: update-with-
start of the node's ``NodeWorkflow``), oldest receipt first (the control plane's
``received_at``, never the sender's clock, I17), so a fault's raise still reaches its
workflow before its clear. The row is kept and marked ``replayed_at`` /
``replay_outcome`` (the workflow's answer); a re-delivery of an alert the workflow already
has comes back ``deduplicated``.

Replay never acts on stale evidence by accident. A clear is always re-delivered (it can
only end a fault). A level raise (a state: GPU lost, link down, node NotReady) is skipped
when the ledger holds a clear of its fault received after it, and the node's workflow
ignores a raise older than its fault's last clear anyway (``workflows.node``). An event
raise (an Xid line, a straggler) received longer ago than ``max_age`` (default
:data:`DEFAULT_MAX_AGE`) is skipped with its age in the reason: re-delivered now it would
be taken as a fault seen now (an operator who wants it anyway passes a longer
``--max-age``). A row kept as its identity only (the alert was over 256 KiB of JSON)
cannot be re-delivered and is skipped saying so; an alert still over
``ingest.max_alert_bytes`` after capping is skipped too. One delivery waits at most
``timeout_s`` (a task queue no worker polls never answers). Every row gets a result; one
failure never stops the others.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import typer
from pydantic import ValidationError

from activities.ledger import DEAD_LETTER_MAX_BYTES, Ledger
from ingest.handoff import TemporalAlertSink
from ingest.limits import cap_alert
from workers.fleet_models import clip, parse_since
from workers.lazy_ledger import LazyLedger, maintenance_marks
from workers.temporal_client import temporal_client
from workflows.config import AutorepairConfig
from workflows.models import Alert

#: Default ``--max-age``: dead letters observed longer ago are not re-delivered. One hour
#: is the order of the persistence windows and cooldowns of the catalogue (a fault older
#: than that has either recurred, with a fresh alert, or ended).
DEFAULT_MAX_AGE = "1h"
#: Default ``--timeout``: seconds one re-delivery may take (an update-with-start answers in
#: well under a second when a worker polls the task queue; none answers when none does).
DEFAULT_TIMEOUT_S = 60.0
#: Most dead letters one ``replay --all`` delivers (the oldest first); it says when more
#: are pending.
MAX_BATCH = 10_000



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


def _observed(row: dict[str, Any]) -> datetime:
    """When the control plane received the dead letter's alert (``received_at``; the
    sender's ``observed_at`` only for an alert without one, I17)."""
    a = row.get("alert") or {}
    raw = a.get("received_at") or a.get("observed_at")
    try:
        t = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return row["recorded_at"]  # type: ignore[no-any-return]
    return t if t.tzinfo else t.replace(tzinfo=UTC)


async def _replayable(row: dict[str, Any], config: AutorepairConfig, ledger: Ledger,
                      not_before: datetime) -> tuple[Alert | None, str]:
    """``(alert to deliver, "")`` or ``(None, why it is skipped)``.

    A clear is always re-delivered (it can only end a fault). A level raise is skipped
    when the ledger holds a clear of its fault received after it (the fault ended; the
    node's workflow would also answer it ``ignored`` as stale). An event raise (Xid,
    SXid, a straggler) is skipped when received before ``not_before`` (``--max-age``).
    Receipt times, never the sender's stamps (I17)."""
    if int(row.get("alert_bytes") or 0) > DEAD_LETTER_MAX_BYTES:
        return None, (f"kept as its identity only ({row['alert_bytes']} bytes): "
                      "cannot be re-delivered")
    try:
        alert = Alert.model_validate(row["alert"])
    except ValidationError as e:
        return None, f"alert: unreadable ({e.error_count()} errors: {e.errors()[0]['msg']})"
    if row.get("replayed_at") is not None:
        return None, f"already replayed at {row['replayed_at']} ({row['replay_outcome']})"
    observed = _observed(row)
    if alert.active and alert.level:
        cleared = await ledger.clear_after(alert)
        if cleared is not None:
            return None, (f"superseded: its fault was cleared at "
                          f"{cleared.isoformat(timespec='seconds')}, after this raise")
    elif alert.active and observed < not_before:
        return None, (f"received {observed.isoformat(timespec='seconds')}, before "
                      f"{not_before.isoformat(timespec='seconds')} (--max-age): the event "
                      "may be long over; pass a longer --max-age to replay it anyway")
    ic = config.ingest
    capped, _ = cap_alert(alert, max_value_chars=ic.max_evidence_value_chars,
                          max_bytes=ic.max_alert_bytes)
    size = len(capped.model_dump_json().encode())
    if size > ic.max_alert_bytes:
        return None, (f"still {size} bytes after capping, over ingest.max_alert_bytes "
                      f"({ic.max_alert_bytes})")
    return capped, ""


def _ready(ledger: Ledger) -> Callable[[], Awaitable[Ledger]]:
    async def get() -> Ledger:
        return ledger

    return get


def _result(row: dict[str, Any] | None, alert_id: str, result: str,
            reason: str = "") -> dict[str, Any]:
    r = row or {}
    return {"alert_id": r.get("alert_id", alert_id), "cluster": r.get("cluster"),
            "node": r.get("node"), "kind": r.get("kind"), "result": result, "outcome": None,
            "repair_id": None, "reason": reason}


def _by_request(rows: list[dict[str, Any]], alert_ids: Sequence[str]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(rows to replay, results for ids that name none or several)``: each requested id
    names the row with that id, else the one row whose id starts with it."""
    chosen: dict[str, dict[str, Any]] = {}
    unresolved: list[dict[str, Any]] = []
    for want in dict.fromkeys(alert_ids):
        exact = [r for r in rows if r["alert_id"] == want]
        match = exact or [r for r in rows if len(want) >= 8 and r["alert_id"].startswith(want)]
        if len(match) == 1:
            chosen[match[0]["alert_id"]] = match[0]
        elif not match:
            unresolved.append(_result(None, want, "not_found", "no dead letter with this id"
                                      + ("" if len(want) >= 8 else " (a prefix needs 8 "
                                         "characters or more)")))
        else:
            unresolved.append(_result(None, want, "not_found", (
                f"ambiguous: {len(match)} dead letters start with it; give more characters")))
    return list(chosen.values()), unresolved


async def replay(config: AutorepairConfig, address: str, namespace: str, *,
                 alert_ids: Sequence[str] = (), cluster: str | None = None,
                 max_age: str = DEFAULT_MAX_AGE, timeout_s: float = DEFAULT_TIMEOUT_S,
                 now: datetime | None = None, ledger: Ledger | None = None,
                 batch: int = MAX_BATCH) -> list[dict[str, Any]]:
    """Re-deliver dead letters: those named by ``alert_ids`` (full ids, or prefixes of 8
    characters or more), else every one not yet replayed (of ``cluster`` when given), at
    most ``batch`` per call. Returns one result per row, oldest receipt first:
    ``{"alert_id", "cluster", "node", "kind", "result", "outcome", "repair_id",
    "reason"}`` with ``result`` ``replayed`` | ``skipped`` | ``failed`` | ``not_found``,
    and, when more than ``batch`` rows were pending, a last ``more_pending`` entry.

    ``max_age``: a duration (``90m``, ``24h``, ``7d``) or an ISO time; event raises
    received earlier are skipped (``ValueError`` naming the value when it is neither).
    ``timeout_s``: how long one delivery may take (a task queue no worker polls never
    answers). ``ledger``: an open ledger (tests); else one is opened from ``ledger.dsn``.
    Raises ``RuntimeError`` when there is no ledger,
    :class:`~workers.temporal_client.TemporalUnreachable` when Temporal cannot be
    reached."""
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
        extra: list[dict[str, Any]] = []
        if alert_ids:
            rows, extra = _by_request(await ledger.get_dead_letters(alert_ids), alert_ids)
        else:
            rows = await ledger.pending_dead_letters(cluster=cluster, limit=batch + 1)
            if len(rows) > batch:
                rows = rows[:batch]
                extra = [_result(None, "", "more_pending", (
                    f"more than {batch} dead letters pending: replayed the oldest {batch}; "
                    "run again for the rest"))]
        rows.sort(key=lambda r: (_observed(r), r["recorded_at"]))
        results: list[dict[str, Any]] = []
        async with temporal_client(address, namespace, config=config.temporal) as client:
            sink = TemporalAlertSink(client, config.temporal.task_queue,
                                     maintenance=maintenance_marks(
                                         _ready(ledger), config.policy.maintenance.grace_s))
            for row in rows:
                results.append(await _replay_one(ledger, sink, row, config, not_before,
                                                 timeout_s))
        return results + extra
    finally:
        if lazy is not None:
            await lazy.close()


async def _replay_one(ledger: Ledger, sink: TemporalAlertSink, row: dict[str, Any],
                      config: AutorepairConfig, not_before: datetime,
                      timeout_s: float) -> dict[str, Any]:
    res = _result(row, row["alert_id"], "skipped")
    alert, why = await _replayable(row, config, ledger, not_before)
    if alert is None:
        res["reason"] = why
        return res
    t0 = time.monotonic()
    try:
        delivery = await asyncio.wait_for(sink.deliver(alert), timeout_s)
    except Exception as e:  # one row's failure never stops the others; the row is kept
        cause = getattr(e, "cause", None) or e
        # the SDK answers the cancellation of a waiting update with its own error
        if isinstance(e, TimeoutError) or (isinstance(cause, asyncio.CancelledError)
                                           and time.monotonic() - t0 >= timeout_s):
            res.update(result="failed", reason=(
                f"no answer within {timeout_s:g} s: is a worker polling task queue "
                f"{config.temporal.task_queue!r} (temporal.task_queue)?"))
        else:
            res.update(result="failed",
                       reason=f"{type(cause).__name__}: {clip(str(cause), 300)}")
        return res
    res.update(result="replayed", outcome=delivery.outcome.value,
               repair_id=delivery.repair_id, reason=delivery.reason or "")
    try:
        await ledger.mark_dead_letter_replayed(row["alert_id"], delivery.outcome.value)
    except Exception as e:  # delivered; a later replay re-delivers it (de-duplicated)
        res["reason"] = (f"{res['reason']}; not marked replayed in the ledger: "
                         f"{type(e).__name__}: {clip(str(e), 200)}")
    return res


def print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    """``dead-letters list`` output: JSON, or one line per dead letter, newest first —
    alert id shortened to 12 characters (``replay`` takes it as a prefix), node (with its
    cluster when several are listed), kind, why and attempts, when recorded (UTC, to the
    minute), the replay outcome if replayed, and the last error. Lines, not a table: the
    fields that identify a row are never cut on a narrow terminal."""
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    typer.echo(f"dead letters: {len(rows)}")
    several = len({r["cluster"] for r in rows}) > 1
    for r in rows:
        node = f"{r['cluster']}/{r['node']}" if several else r["node"]
        replayed = f"  replayed: {r['replay_outcome']}" if r.get("replayed_at") else ""
        typer.echo(f"{r['alert_id'][:12]}  {node}  {r['kind']}  {r['reason']} x"
                   f"{r['attempts']}  {_minute(r['recorded_at'])}{replayed}  "
                   f"{clip(r['error'], 200)}".rstrip())


def _minute(t: object) -> str:
    return str(t).replace("T", " ")[:16]


def print_results(results: list[dict[str, Any]], as_json: bool) -> int:
    """``dead-letters replay`` output (JSON, or one line per row: id, node, kind, result,
    the workflow's outcome, reason); returns the exit code: 0 when every row was replayed
    (or none was pending), 1 when one failed or an id named no single row, 3 when some
    were skipped or more are pending."""
    if as_json:
        typer.echo(json.dumps(results, indent=2, default=str))
    else:
        typer.echo(f"replay: {len(results)}" if results
                   else "replay: nothing to replay, no dead letter pending")
        for r in results:
            outcome = f" ({r['outcome']})" if r["outcome"] else ""
            where = " ".join(x for x in (r["node"], r["kind"]) if x)
            typer.echo(f"{str(r['alert_id'])[:12]}  {where}  {r['result']}{outcome}"
                       f"{'  ' + clip(r['reason'], 300) if r['reason'] else ''}")
    kinds = {r["result"] for r in results}
    if kinds & {"failed", "not_found"}:
        return 1
    return 3 if kinds & {"skipped", "more_pending"} else 0
