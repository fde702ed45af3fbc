"""Dead letters are not a grave: `autorepair dead-letters list|replay`.

Real Temporal dev server, the real NodeWorkflow with its ledger and policy activities,
embedded PostgreSQL:

* replay re-delivers a node's dead letters oldest first (its raise reaches the workflow
  before its clear), marks each row with the workflow's answer, and a second replay of
  the same alert is refused as already replayed;
* an alert observed longer ago than ``--max-age`` is skipped with its age (a stale raise
  must not be taken as a fault seen now) until the operator passes a longer one;
* a row kept as its identity only (over 256 KiB) is skipped saying why; an unknown id is
  ``not_found``; the exit code says what happened;
* the command line, run as an operator runs it (its own process, ``--ledger-dsn``,
  ``--temporal-address``), lists and replays, and refuses bad arguments naming them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger, connect, migrate
from activities.ledger_activities import LedgerActivities
from activities.notify import NotifyActivities
from activities.policy_activities import PolicyActivities
from workers.dead_letters import print_results, replay
from workflows.alerts import alert_from_fault
from workflows.config import AutorepairConfig, CatalogueConfig, TemporalConfig
from workflows.models import Alert, AlertOutcome
from workflows.protocol import NODE_QUERY_STATUS, NodeStatus
from workflows.registry import WORKFLOWS

REPO = Path(__file__).resolve().parents[2]


def _alert(cluster: str, node: str, minutes_ago: float, *,
           evidence: dict[str, Any] | None = None) -> Alert:
    """An Xid 13 (observed, an event)."""
    return alert_from_fault(
        cluster=cluster, node=node, kind="xid", code=13, gpu="0000:3b:00",
        evidence_text="NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception",
        evidence=evidence or {}, observed_at=datetime.now(UTC) - timedelta(minutes=minutes_ago),
        catalogue=CatalogueConfig(),
    )


def _drained(cluster: str, node: str, minutes_ago: float, active: bool) -> Alert:
    """A Slurm DRAIN seen by the watcher (a level fault, observed only), or its clear."""
    text = f"NodeName={node} State=IDLE+DRAIN Reason=psu"
    return alert_from_fault(
        cluster=cluster, node=node, kind="slurm_node", code=None, gpu=None,
        evidence_text=text if active else f"{text} (cleared)",
        evidence={"state": ["IDLE", "DRAIN"], "reason": "psu"},
        observed_at=datetime.now(UTC) - timedelta(minutes=minutes_ago),
        catalogue=CatalogueConfig(), active=active, level=True, source="slurm_watcher",
    )


async def _workflow_alerts(ledger: Ledger, cluster: str, node: str) -> list[Alert]:
    return list(reversed(await ledger.list_alerts(cluster=cluster, node=node)))


async def test_replay_redelivers_in_order_marks_rows_and_skips_stale(
    temporal_dev_env: Any, ledger_pool: Any
) -> None:
    client = temporal_dev_env.client
    address = client.service_client.config.target_host
    tq = "dlr-" + uuid.uuid4().hex[:8]
    cluster = "c-" + uuid.uuid4().hex[:6]
    config = AutorepairConfig(temporal=TemporalConfig(task_queue=tq))
    ledger = Ledger(ledger_pool)
    raise_ = _drained(cluster, "gpu-01", 20, active=True)
    clear = _drained(cluster, "gpu-01", 10, active=False)
    stale = _alert(cluster, "gpu-02", 3 * 24 * 60)  # an Xid line three days old
    huge = _alert(cluster, "gpu-03", 5, evidence={"dump": "A" * 300_000})
    old_clear = _drained(cluster, "gpu-04", 120, active=False)  # clears do not age
    # gpu-05: the raise was dead-lettered again after its clear: still delivered first
    raise5 = _drained(cluster, "gpu-05", 30, active=True)
    clear5 = _drained(cluster, "gpu-05", 25, active=False)
    # gpu-06: its fault's clear reached the node (it is in the ledger): the raise is over
    raise6 = _drained(cluster, "gpu-06", 40, active=True)
    await ledger.record_alert(_drained(cluster, "gpu-06", 35, active=False))
    for a, why in ((raise_, "retries_exhausted"), (clear, "retries_exhausted"),
                   (stale, "rejected"), (huge, "too_large"), (old_clear, "rejected"),
                   (raise5, "retries_exhausted"), (clear5, "retries_exhausted"),
                   (raise6, "rejected")):
        await ledger.record_dead_letter(a, why, "boom", 3)
    await ledger.record_dead_letter(raise5, "retries_exhausted", "again", 3)
    activities: list[Callable[..., Any]] = [
        *LedgerActivities(ledger_pool).all(), *PolicyActivities(config).all(),
        NotifyActivities(config.notifications).notify, *GuardReplyActivities(client).all()]
    nodes = [f"gpu-0{i}" for i in range(1, 7)]
    async with Worker(client, task_queue=tq, workflows=WORKFLOWS, activities=activities):
        try:
            results = await replay(config, address, "default", cluster=cluster,
                                   ledger=ledger)
            by_id = {r["alert_id"]: r for r in results}
            order = [r["alert_id"] for r in results]  # oldest observation first
            assert order == [stale.alert_id, old_clear.alert_id, raise6.alert_id,
                             raise5.alert_id, clear5.alert_id, raise_.alert_id,
                             clear.alert_id, huge.alert_id]
            for a in (raise_, clear, old_clear, raise5, clear5):
                assert by_id[a.alert_id]["result"] == "replayed", by_id[a.alert_id]
            assert by_id[clear.alert_id]["outcome"] == AlertOutcome.cleared.value
            assert by_id[stale.alert_id]["result"] == "skipped"
            assert "--max-age" in by_id[stale.alert_id]["reason"]
            assert by_id[raise6.alert_id]["result"] == "skipped"
            assert by_id[raise6.alert_id]["reason"].startswith("superseded")
            assert by_id[huge.alert_id]["result"] == "skipped"
            assert "identity only" in by_id[huge.alert_id]["reason"]
            assert print_results(results, as_json=True) == 3  # some skipped
            # the node's workflow took them in order: the raise, then its clear
            got = await _workflow_alerts(ledger, cluster, "gpu-01")
            assert [a.alert_id for a in got] == [raise_.alert_id, clear.alert_id]
            for n in ("gpu-01", "gpu-05"):  # nothing left active on either node
                st = await client.get_workflow_handle(f"node/{cluster}/{n}").query(
                    NODE_QUERY_STATUS, result_type=NodeStatus)
                assert not st.active_alerts and st.repair_id is None, st
            rows = {r["alert_id"]: r for r in await ledger.list_dead_letters(cluster=cluster)}
            assert rows[raise_.alert_id]["replayed_at"] is not None
            assert rows[clear.alert_id]["replay_outcome"] == "cleared"
            assert rows[stale.alert_id]["replayed_at"] is None
            pending = await ledger.list_dead_letters(cluster=cluster, include_replayed=False)
            assert {r["alert_id"] for r in pending} == {
                stale.alert_id, huge.alert_id, raise6.alert_id}
            # the operator decides the stale one counts: a longer --max-age; ids may be
            # given as the 12-character prefix the table shows
            again = await replay(config, address, "default", ledger=ledger, max_age="7d",
                                 alert_ids=[stale.alert_id[:12], raise_.alert_id, "nope"])
            assert [(r["alert_id"], r["result"]) for r in again] == [
                (stale.alert_id, "replayed"), (raise_.alert_id, "skipped"),
                ("nope", "not_found")]
            assert "already replayed" in again[1]["reason"]
            assert "8 characters" in again[2]["reason"]
            assert print_results(again, as_json=True) == 1  # one not found
            assert [a.alert_id for a in await _workflow_alerts(ledger, cluster, "gpu-02")
                    ] == [stale.alert_id]
            # dead-lettered again later: the row is pending again
            await ledger.record_dead_letter(raise_, "retries_exhausted", "again", 3)
            assert raise_.alert_id in {r["alert_id"] for r in await ledger.list_dead_letters(
                cluster=cluster, include_replayed=False)}
            with pytest.raises(ValueError, match="--max-age"):
                await replay(config, address, "default", ledger=ledger, max_age="soon")
            # a batch is bounded and says more are pending
            more = await replay(config, address, "default", ledger=ledger, cluster=cluster,
                                batch=1)
            assert [r["result"] for r in more][-1] == "more_pending"
            assert len(more) == 2 and print_results(more, as_json=True) == 3
        finally:
            for n in nodes:
                try:
                    await client.get_workflow_handle(f"node/{cluster}/{n}").terminate("done")
                except Exception:
                    pass


async def test_replay_to_a_queue_no_worker_polls_fails_in_bounded_time(
    temporal_dev_env: Any, ledger_pool: Any
) -> None:
    client = temporal_dev_env.client
    cluster = "c-" + uuid.uuid4().hex[:6]
    config = AutorepairConfig(temporal=TemporalConfig(task_queue="nobody-" + cluster))
    ledger = Ledger(ledger_pool)
    a = _alert(cluster, "gpu-01", 1)
    await ledger.record_dead_letter(a, "retries_exhausted", "boom", 3)
    try:
        (res,) = await asyncio.wait_for(replay(
            config, client.service_client.config.target_host, "default", ledger=ledger,
            alert_ids=[a.alert_id], timeout_s=2.0), 60)
        assert res["result"] == "failed" and "no answer within 2 s" in res["reason"]
        assert config.temporal.task_queue in res["reason"]
        (row,) = await ledger.get_dead_letters([a.alert_id])
        assert row["replayed_at"] is None  # kept for the next try
    finally:
        try:
            await client.get_workflow_handle(f"node/{cluster}/gpu-01").terminate("done")
        except Exception:
            pass


@pytest.fixture
async def ledger_database(pg_dsn: str) -> AsyncIterator[str]:
    """A database of its own (the CLI connects without a schema), migrated; its DSN."""
    name = "dl_" + uuid.uuid4().hex[:10]
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    dsn = urlsplit(pg_dsn)._replace(path="/" + name).geturl()
    pool = await connect(dsn)
    try:
        await migrate(pool)
    finally:
        await pool.close()
    try:
        yield dsn
    finally:
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


async def _cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    env.pop("AUTOREPAIR_CONFIG", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers.cli", *args, cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_cli_lists_and_replays_and_names_bad_arguments(
    temporal_dev_env: Any, ledger_database: str, tmp_path: Path
) -> None:
    client = temporal_dev_env.client
    address = client.service_client.config.target_host
    cluster = "c-" + uuid.uuid4().hex[:6]
    tq = "dlr-" + uuid.uuid4().hex[:8]
    cfg_file = tmp_path / "autorepair.yaml"
    cfg_file.write_text(f"temporal:\n  task_queue: {tq}\n")
    pool = await connect(ledger_database)
    ledger = Ledger(pool)
    a = _alert(cluster, "gpu-07", 2)
    await ledger.record_dead_letter(a, "retries_exhausted", "DeadlineExceeded", 5)
    common = ("--config", str(cfg_file), "--data-dir", str(tmp_path / "none"),
              "--ledger-dsn", ledger_database)
    config = AutorepairConfig(temporal=TemporalConfig(task_queue=tq))
    activities: list[Callable[..., Any]] = [*LedgerActivities(pool).all(), *PolicyActivities(config).all(),
                  NotifyActivities(config.notifications).notify,
                  *GuardReplyActivities(client).all()]
    try:
        rc, out, err = await _cli("dead-letters", "list", "--json", *common, cwd=tmp_path)
        assert rc == 0, err
        (row,) = json.loads(out)
        assert (row["alert_id"], row["node"], row["reason"], row["attempts"]) == (
            a.alert_id, "gpu-07", "retries_exhausted", 5)
        rc, _, err = await _cli("dead-letters", "replay", *common, cwd=tmp_path)
        assert rc == 2 and "name alert ids or pass --all" in err
        rc, _, err = await _cli("dead-letters", "replay", "--all", "--max-age", "soon",
                                *common, cwd=tmp_path)
        assert rc == 2 and "--max-age" in err and "'soon'" in err
        rc, _, err = await _cli("dead-letters", "replay", a.alert_id, "--cluster", "other",
                                *common, cwd=tmp_path)
        assert rc == 2 and "--cluster goes with --all" in err
        async with Worker(client, task_queue=tq, workflows=WORKFLOWS, activities=activities):
            rc, out, err = await _cli("dead-letters", "replay", "--all", "--json",
                                      "--temporal-address", address, *common, cwd=tmp_path)
        assert rc == 0, (out, err)
        (res,) = json.loads(out)
        assert (res["alert_id"], res["result"]) == (a.alert_id, "replayed")
        rc, out, err = await _cli("dead-letters", "list", "--json", *common, cwd=tmp_path)
        assert rc == 0 and json.loads(out) == []  # replayed rows only with --all
        rc, out, err = await _cli("dead-letters", "list", "--all", *common, cwd=tmp_path)
        assert rc == 0 and "gpu-07" in out and res["outcome"] in out
    finally:
        await pool.close()
        try:
            await client.get_workflow_handle(f"node/{cluster}/gpu-07").terminate("done")
        except Exception:
            pass
