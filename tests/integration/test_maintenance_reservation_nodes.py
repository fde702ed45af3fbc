"""A scheduler's maintenance window holds each node once, on the whole path: the Slurm
watcher's ``Flags=MAINT`` reservation whose node list repeats a node
(``Nodes=gpu-[01-02],gpu-01``) is stored by the scheduler sync, listed by the API and by
``autorepair maintenance list`` and answered by the covering query with each node once,
in the scheduler's order (first occurrence wins), as an operator's ``--nodes a,a`` window
(294203b). A row stored with a repeat before this fix reads back with each node once."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from activities.ledger_activities import LedgerActivities
from activities.maintenance_store import MaintenanceStore
from activities.scheduler.slurm import parse_scontrol_show_reservation
from tests.integration.test_maintenance_windows import VIEW, _cfg, api  # noqa: F401
from workers import maintenance_cli
from workers.cli import app as cli_app
from workers.watchers.slurm import SlurmWatcher
from workflows.activity_api import MaintenanceQuery

NOW = datetime.now(UTC).replace(microsecond=0)


def _scontrol() -> str:
    fmt = "%Y-%m-%dT%H:%M:%S"
    start = (NOW - timedelta(minutes=5)).astimezone().strftime(fmt)
    end = (NOW + timedelta(hours=1)).astimezone().strftime(fmt)
    return (f"ReservationName=rack-a StartTime={start} EndTime={end} Duration=01:05:00 "
            "Nodes=gpu-[02-03],gpu-02,gpu-01 NodeCnt=3 CoreCnt=3 Features=(null) "
            "PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=3 Users=root "
            "State=ACTIVE\n")


class _NoSink:
    async def submit(self, alert: object) -> None:
        raise AssertionError("no alert expected")


async def test_a_reservation_window_is_stored_listed_and_covered_with_each_node_once(
    ledger_pool: Any, api: httpx.AsyncClient,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = _cfg()
    store = MaintenanceStore(ledger_pool)
    watcher = SlurmWatcher(cfg, cfg.clusters[0], _NoSink(),  # type: ignore[arg-type]
                           maintenance=store.sync)

    async def scontrol(*args: str) -> str:
        assert args == ("show", "reservation")
        return _scontrol()

    monkeypatch.setattr(watcher, "_scontrol", scontrol)
    await watcher.sync_maintenance(NOW)
    want = ["gpu-02", "gpu-03", "gpu-01"]
    (stored,) = await store.list("c1")
    assert stored.window_id == "slurm:c1:rack-a" and stored.nodes == want
    # the API and the CLI list it once
    r = await api.get("/api/v1/maintenance", headers=VIEW, params={"cluster": "c1"})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert [w["nodes"] for w in doc["windows"]] == [want]
    monkeypatch.setattr(maintenance_cli.ops, "call_api", lambda *a, **k: doc)
    out = CliRunner().invoke(cli_app, ["maintenance", "list", "--cluster", "c1", "--json",
                                       "--api", "http://127.0.0.1:9", "--token", "t"])
    assert out.exit_code == 0, out.output
    assert [w["nodes"] for w in json.loads(out.output)] == [want]
    monkeypatch.setattr(maintenance_cli._out, "width", 200)
    out = CliRunner().invoke(cli_app, ["maintenance", "list", "--cluster", "c1",
                                       "--api", "http://127.0.0.1:9", "--token", "t"])
    assert out.exit_code == 0, out.output
    assert "gpu-02, gpu-03, gpu-01" in out.output and "gpu-01, gpu-02" not in out.output, \
        out.output
    # the repair's covering query answers the window
    cover = await LedgerActivities(ledger_pool).maintenance_covering(MaintenanceQuery(
        cluster="c1", node="gpu-01", at=NOW))
    assert cover.window_id == "slurm:c1:rack-a"


async def test_a_window_stored_with_a_repeated_node_reads_back_once(
    ledger_pool: Any, api: httpx.AsyncClient,  # noqa: F811
) -> None:
    # as the scheduler sync stored a repeated reservation node before this fix
    await ledger_pool.execute(
        """INSERT INTO maintenance_windows (window_id, cluster, scope, pool, nodes, reason,
               created_by, source, starts_at, ends_at)
           VALUES ('slurm:c1:old', 'c1', 'nodes', NULL, $1, 'Slurm maintenance reservation old',
                   'slurm', 'slurm', $2, $3)""",
        ["gpu-01", "gpu-02", "gpu-01"], NOW - timedelta(minutes=1), NOW + timedelta(hours=1))
    (w,) = await MaintenanceStore(ledger_pool).list("c1", active_at=NOW)
    assert w.nodes == ["gpu-01", "gpu-02"]
    r = await api.get("/api/v1/maintenance", headers=VIEW)
    assert [x["nodes"] for x in r.json()["windows"]] == [["gpu-01", "gpu-02"]]


def test_parsed_reservation_is_read_once() -> None:
    (res,) = parse_scontrol_show_reservation(_scontrol())
    assert res.nodes == ("gpu-02", "gpu-03", "gpu-01")
