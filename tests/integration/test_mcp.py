"""``autorepair mcp``: the read-only MCP tools answered through the SDK's own client.

The world is real: the ledger on embedded PostgreSQL, Temporal's dev server (visibility
with the search attributes of docs/design.md §4.4) and our workflows on a worker whose cluster
is :class:`tests.workflows.conftest.FakeCluster`. Alerts go in as the ingest sends them
(update-with-start on ``NodeWorkflow``), repairs are recommended, one approved by a
person and run to the end; then the tools are asked through ``mcp.Client`` connected
in-process (memory streams, JSON-RPC, initialize handshake). The HTTP transport is
served by uvicorn on a free loopback port and refuses requests without a viewer token;
the ``autorepair mcp`` process ends with exit 0 at the end of its input and on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from mcp import Client, StdioServerParameters
from temporalio import activity
from temporalio.client import WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from activities.ledger_queries import connect_read_only
from tests.workflows.conftest import OWN_WORKFLOWS, FakeCluster, make_alert
from tests.workflows.fake_validation import FakeValidationWorkflow
from workers.devpeers import free_port, wait_port
from workers.fleet_query import FleetQuery
from workers.mcp_server import TOOLS, BearerGate, build_server, dev_stack_dsn, http_app
from workers.repairs.auth import ApiTokens
from workflows.activity_api import (
    ACT,
    AttemptRecord,
    NodePolicy,
    NodeRef,
    PolicySnapshot,
    RepairRecord,
)
from workflows.config import AutorepairConfig, PolicyConfig
from workflows.models import (
    Action,
    AlertDelivery,
    ApproveSignal,
    NodeInput,
    Requester,
    RequesterKind,
    Stage,
)
from workflows.protocol import (
    NODE_UPDATE_DELIVER_ALERT,
    REPAIR_SIGNAL_APPROVE,
    workflow_id_guard,
    workflow_id_node,
)

ROOT = Path(__file__).resolve().parents[2]
NODES = ["gpu-01", "gpu-02", "gpu-03"]


@pytest.fixture
async def ro_pool(ledger_pool: asyncpg.Pool, pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """A read-only pool on the test's ledger schema (what ``autorepair mcp`` opens)."""
    schema = await ledger_pool.fetchval("SELECT current_schema()")
    pool = await connect_read_only(pg_dsn, schema=str(schema))
    try:
        yield pool
    finally:
        await pool.close()


def config_for(cluster: str) -> AutorepairConfig:
    return AutorepairConfig.model_validate({"clusters": [{
        "name": cluster, "gpu_nodes": 20,
        "nodes": [{"name": n, "machine": f"m-{n}"} for n in NODES]}]})


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    res = await client.call_tool(tool, args)
    assert not res.is_error, res.content
    doc = res.structured_content
    assert isinstance(doc, dict)
    assert json.loads(res.content[0].text) == doc  # type: ignore[union-attr]
    return doc


async def call_error(client: Client, tool: str, **args: Any) -> str:
    res = await client.call_tool(tool, args)
    assert res.is_error, res.structured_content
    return str(res.content[0].text)  # type: ignore[union-attr]


async def eventually(check: Any, within_s: float = 15.0) -> Any:
    """Poll ``check()`` (async, returns a value or None) until it returns a value."""
    for _ in range(int(within_s / 0.25)):
        got = await check()
        if got is not None:
            return got
        await asyncio.sleep(0.25)
    raise AssertionError("condition not met in time")


async def test_tools_answer_on_a_live_fleet(
    temporal_dev_env: WorkflowEnvironment, ledger_pool: asyncpg.Pool, ro_pool: asyncpg.Pool
) -> None:
    env = temporal_dev_env
    sfx = uuid.uuid4().hex[:8]
    cluster, tq, bmc_q = f"m-{sfx}", f"autorepair-{sfx}", f"bmc-{sfx}"
    fake = FakeCluster(cluster=cluster, nodes=NODES)
    policy = PolicyConfig()  # approve before repair (docs/design.md §5 default)
    ledger = Ledger(ledger_pool)
    now = datetime.now(UTC)
    # gpu-01's machine was power-cycled twice for Xid 79 this week: the ladder moves up
    for i, days in enumerate((1, 2)):
        await ledger.record_attempt(AttemptRecord(
            repair_id=f"old-{i}", cluster=cluster, node="gpu-01", machine_id="m-gpu-01",
            action=Action.power_cycle, alert_kind="xid", code=79, outcome="succeeded",
            at=now - timedelta(days=days)))

    @activity.defn(name=ACT.load_policy)
    async def load_policy(c: str) -> PolicySnapshot:
        return PolicySnapshot(cluster=c, policy=policy, gpu_nodes=20, scheduler="slurm",
                              machines={n: f"m-{n}" for n in NODES}, bmc_task_queue=bmc_q)

    @activity.defn(name=ACT.load_node_policy)
    async def load_node_policy(ref: NodeRef) -> NodePolicy:
        return NodePolicy.of(await load_policy(ref.cluster), ref.node)

    async def deliver(node: str, n: int, **kw: Any) -> AlertDelivery:
        alert = make_alert(cluster, node, n, observed_at=datetime.now(UTC), **kw)
        op = WithStartWorkflowOperation(
            "NodeWorkflow", NodeInput(cluster=cluster, node=node),
            id=workflow_id_node(cluster, node), task_queue=tq,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
        return await env.client.execute_update_with_start_workflow(
            NODE_UPDATE_DELIVER_ALERT, alert, start_workflow_operation=op,
            result_type=AlertDelivery)

    fq = FleetQuery(config_for(cluster), ro_pool, env.client)
    async with (
        Worker(env.client, task_queue=tq, workflows=[*OWN_WORKFLOWS, FakeValidationWorkflow],
               activities=[*LedgerActivities(ledger_pool).all(), load_policy,
                           load_node_policy, *fake.scheduler_activities(),
                           *GuardReplyActivities(env.client).all()]),
        Worker(env.client, task_queue=bmc_q, activities=fake.machine_activities()),
        Client(build_server(fq), mode="legacy") as client,
    ):
        r1 = await deliver("gpu-01", 1)  # Xid 79: power_cycle, escalated by the ladder
        r2 = await deliver("gpu-02", 2, code=45, action="none", actionable=False,
                           severity="warning", summary="Xid 45: preemptive cleanup")
        r3 = await deliver("gpu-03", 3)
        assert r1.repair_id and r3.repair_id and r2.repair_id is None
        r3_row = await eventually(lambda: _stage(ledger, r3.repair_id, "awaiting_approval"))
        await env.client.get_workflow_handle(r3_row["workflow_id"]).signal(
            REPAIR_SIGNAL_APPROVE, ApproveSignal(by="alice"))
        await eventually(lambda: _stage(ledger, r3.repair_id, "succeeded"), 60)
        await eventually(lambda: _stage(ledger, r1.repair_id, "awaiting_approval"))

        tools = (await client.list_tools()).tools
        assert [t.name for t in tools] == [t.name for t in TOOLS]
        for t in tools:
            assert t.input_schema["additionalProperties"] is False, t.name
            assert t.annotations is not None and t.annotations.read_only_hint is True
            assert t.output_schema and t.output_schema["type"] == "object"

        # list_alerts: filters and bounds
        doc = await call(client, "list_alerts", cluster=cluster)
        assert {a["node"] for a in doc["alerts"]} == set(NODES) and doc["truncated"] is False
        crit = await call(client, "list_alerts", cluster=cluster, severity="critical")
        assert {(a["node"], a["code"]) for a in crit["alerts"]} == {("gpu-01", 79), ("gpu-03", 79)}
        one = await call(client, "list_alerts", cluster=cluster, limit=1, since="1h")
        assert one["count"] == 1 and one["truncated"] is True
        assert (await call(client, "list_alerts", cluster=cluster, kind="sxid"))["alerts"] == []

        # list_repairs: states
        waiting = await call(client, "list_repairs", cluster=cluster, state="awaiting_approval")
        assert [r["repair_id"] for r in waiting["repairs"]] == [r1.repair_id]
        done = await call(client, "list_repairs", cluster=cluster, state="succeeded")
        assert [r["repair_id"] for r in done["repairs"]] == [r3.repair_id]
        assert done["repairs"][0]["approved_by"] == "alice"
        opened = await call(client, "list_repairs", cluster=cluster, state="open")
        assert [r["node"] for r in opened["repairs"]] == ["gpu-01"]

        # repair_history: stages, who approved, which rule decided
        h3 = await call(client, "repair_history", repair_id=r3.repair_id)
        stages = [t["stage"] for t in h3["transitions"]]
        assert stages[0] == "recommended" and stages[-1] == "succeeded"
        assert "awaiting_approval" in stages and "repairing" in stages
        assert h3["approved_by"] == "alice"
        assert h3["decision"][0] == "approved by alice"
        assert any(d.startswith("ladder:") for d in h3["decision"])
        assert [a["action"] for a in h3["attempts"]] == ["power_cycle"]
        assert h3["evidence"][0]["code"] == 79
        h1 = await call(client, "repair_history", repair_id=r1.repair_id)
        assert h1["repair"]["action"] == "reprovision"
        assert any("power_cycle x2" in d and "reprovision" in d for d in h1["decision"])
        assert h1["live_stage"] == "awaiting_approval" and h1["approved_by"] is None

        # node_status: live NodeWorkflow view + visibility (cluster found from the ledger)
        async def node1() -> dict[str, Any] | None:
            d = await call(client, "node_status", node="gpu-01")
            return d if d["running_repairs"] else None

        ns = await eventually(node1)
        assert ns["cluster"] == cluster and ns["machine_id"] == "m-gpu-01" and ns["live"]
        assert ns["degraded"] is True and ns["repair_in_flight"] == r1.repair_id
        assert ns["active_faults"][0]["alert"]["code"] == 79
        assert ns["active_faults"][0]["persistence_s"] == 0.0
        wf = ns["running_repairs"][0]
        assert wf["workflow_type"] == "RepairWorkflow"
        assert wf["search_attributes"]["RepairState"] == "awaiting_approval"
        assert ns["recent_repairs"][0]["repair_id"] == r1.repair_id

        # explain_recommendation: catalogue row, ladder, gate, consent
        ex = await call(client, "explain_recommendation", node="gpu-01", cluster=cluster)
        assert ex["source"] == "live" and ex["recommended_action"] == "reprovision"
        f = ex["faults"][0]
        assert f["catalogue"]["action"] == "power_cycle" and f["catalogue"]["severity"] == "critical"
        assert "79" in f["catalogue"]["source"]
        assert f["node_decision"]["rule"] == "xid:79:default" and f["node_decision"]["actionable"]
        assert f["ladder"]["escalated"] is True and "power_cycle x2" in f["ladder"]["rule"]
        assert f["gate"]["rule"] == "gate:not applicable"
        assert f["consent"] == {"automatic": False, "rule": "approve_before_repair"}
        assert f["persistence"]["due"] is True and f["final_action"] == "reprovision"
        assert "reprovision recommended" in ex["summary"] and "in flight" in ex["summary"]
        x45 = await call(client, "explain_recommendation", node="gpu-02",
                         alert_id=f"{cluster}/gpu-02/2")
        f45 = x45["faults"][0]
        assert f45["node_decision"]["rule"] == "xid:45:app" and f45["final_action"] == "none"
        assert f45["ladder"] is None and x45["recommended_action"] == "none"
        assert x45["summary"].startswith("gpu-02: no node action")

        # fleet_summary: ledger counts and visibility counts
        async def summary() -> dict[str, Any] | None:
            d = await call(client, "fleet_summary", cluster=cluster, since="1h")
            w = d["workflows"]
            # visibility is eventually consistent: gpu-03's repair closes a moment later
            return d if w and w["running_node_workflows"] == 3 and w[
                "awaiting_approval_workflows"] == 1 and w[
                "running_repair_workflows"] == 1 else None

        fs = await eventually(summary)
        assert fs["alerts"]["total"] == 3 and fs["alerts"]["by_severity"] == {
            "critical": 2, "warning": 1}
        assert fs["repairs_by_stage"] == {"awaiting_approval": 1, "succeeded": 1}
        assert fs["open_repairs"] == 1 and fs["awaiting_approval"] == 1
        assert fs["workflows"]["running_repair_workflows"] == 1
        assert fs["clusters"] == [cluster]
        # downtime as `autorepair report` counts it: the succeeded repair ended in the window
        dt = fs["downtime"]
        assert dt["repairs_ended"] == 1 and dt["mttr_s"] is not None and dt["mttr_s"] >= 0
        assert dt["gpu_hours"] >= 0 and dt["currency"] and dt["unpriced_repairs"] <= 1

        # nothing was written through the tools: the pool refuses writes
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await ro_pool.execute("DELETE FROM alerts")

        # the session's dev server is shared: end what this test left running
        r1_row = await ledger.get_repair(r1.repair_id)
        assert r1_row is not None
        for wid in [workflow_id_guard(cluster), r1_row["workflow_id"],
                    *(workflow_id_node(cluster, n) for n in NODES)]:
            with contextlib.suppress(Exception):
                await env.client.get_workflow_handle(wid).terminate("test finished")


async def _stage(ledger: Ledger, repair_id: str | None, stage: str) -> dict[str, Any] | None:
    row = await ledger.get_repair(str(repair_id))
    return row if row is not None and row["stage"] == stage else None


async def test_bad_inputs_name_the_field_and_value(ro_pool: asyncpg.Pool) -> None:
    async with Client(build_server(FleetQuery(config_for("c1"), ro_pool)), mode="legacy") as c:
        cases = {
            ("list_alerts", (("limit", 5000),)): ["limit", "5000"],
            ("list_alerts", (("bogus", 1),)): ["bogus: unknown field", "cluster"],
            ("list_alerts", (("severity", "fatal"),)): ["severity", "'fatal'"],
            ("list_alerts", (("since", "yesterday"),)): ["since", "'yesterday'"],
            ("list_repairs", (("state", "nonsense"),)): ["state", "'nonsense'", "open"],
            ("list_repairs", (("action", "explode"),)): ["action", "'explode'"],
            ("repair_history", ()): ["repair_id: required"],
            ("repair_history", (("repair_id", "nope"),)): ["repair_id: no repair 'nope'"],
            ("node_status", (("node", "a b"),)): ["node", "'a b'"],
            ("node_status", (("node", "gpu-77"),)): ["node: no alert or repair of node 'gpu-77'"],
            ("explain_recommendation", (("node", "gpu-01"), ("cluster", "c1"),
                                        ("alert_id", "zz"))): ["alert_id: no alert 'zz'"],
            ("fleet_summary", (("top", 0),)): ["top", "0"],
            ("fleet_summary", (("since", "400d"),)): ["since", "366 days"],
        }
        for (tool, args), wants in cases.items():
            text = await call_error(c, tool, **dict(args))
            assert text.startswith(f"{tool}: ")
            for want in wants:
                assert want in text, (tool, args, text)
        assert "unknown tool 'drop_tables'" in await call_error(c, "drop_tables")


async def test_ledger_only_answers_without_temporal(
    ledger_pool: asyncpg.Pool, ro_pool: asyncpg.Pool
) -> None:
    ledger = Ledger(ledger_pool)
    now = datetime.now(UTC)
    for i, node in enumerate(("gpu-01", "gpu-02")):
        await ledger.record_alert(make_alert("c1", node, i, kind="gpu_lost", code=None,
                                             observed_at=now - timedelta(minutes=i)))
    await ledger.upsert_repair(RepairRecord(
        repair_id="r-1", cluster="c1", node="gpu-01", machine_id="m-gpu-01",
        action=Action.power_cycle, stage=Stage.failed,
        requester=Requester(kind=RequesterKind.system), alert_ids=["c1/gpu-01/0"],
        decided_by_rule="automatic_action:power_cycle; ladder:first rung; gate:not applicable",
        approved_by="auto-approved", updated_at=now))
    fq = FleetQuery(config_for("c1"), ro_pool, None)
    async with Client(build_server(fq)) as c:  # the SDK's default (modern) in-process path
        ns = await call(c, "node_status", node="gpu-01")
        assert ns["live"] is False and ns["cluster"] == "c1"
        assert ns["notes"] == ["Temporal: not connected (ledger only)"] * 2
        assert [a["kind"] for a in ns["recent_alerts"]] == ["gpu_lost"]
        ex = await call(c, "explain_recommendation", node="gpu-02", cluster="c1")
        assert ex["source"] == "ledger" and ex["recommended_action"] == "power_cycle"
        assert ex["faults"][0]["consent"]["rule"] == "approve_before_repair"
        h = await call(c, "repair_history", repair_id="r-1")
        assert h["decision"] == ["automatic_action:power_cycle", "ladder:first rung",
                                 "gate:not applicable"]
        assert h["approved_by"] == "auto-approved" and h["live_stage"] is None
        fs = await call(c, "fleet_summary")
        assert fs["workflows"] is None and fs["repairs_by_stage"] == {"failed": 1}
        assert fs["alerts"]["top_nodes"][0]["critical"] == 1


async def test_alerts_are_listed_and_windowed_by_when_they_were_received(
    ledger_pool: asyncpg.Pool, ro_pool: asyncpg.Pool
) -> None:
    """I17: a sender's clock never orders or windows alerts. An agent 10 min fast
    reported 30 min ago; one 3 h slow reported a minute ago: the newest received is
    listed first (``list_alerts``, the API's ``Ledger.list_alerts``), ``since=10m``
    keeps only it, and the fleet summary counts it alone in the last 10 minutes."""
    ledger = Ledger(ledger_pool)
    now = datetime.now(UTC)
    fast = make_alert("c1", "gpu-01", "fast", observed_at=now + timedelta(minutes=10),
                      received_at=now - timedelta(minutes=30))
    slow = make_alert("c1", "gpu-02", "slow", observed_at=now - timedelta(hours=3),
                      received_at=now - timedelta(minutes=1))
    for a in (fast, slow):
        await ledger.record_alert(a)
    assert [a.alert_id for a in await ledger.list_alerts(cluster="c1")] == \
        [slow.alert_id, fast.alert_id]
    fq = FleetQuery(config_for("c1"), ro_pool, None)
    async with Client(build_server(fq)) as c:
        doc = await call(c, "list_alerts", cluster="c1")
        assert [a["alert_id"] for a in doc["alerts"]] == [slow.alert_id, fast.alert_id]
        recent = await call(c, "list_alerts", cluster="c1", since="10m")
        assert [a["alert_id"] for a in recent["alerts"]] == [slow.alert_id]
        fs = await call(c, "fleet_summary", since="10m")
        assert fs["alerts"]["total"] == 1


async def test_http_transport_needs_a_viewer_token(ro_pool: asyncpg.Pool, tmp_path: Path) -> None:
    import uvicorn

    tokens_file = tmp_path / "api-tokens"
    tokens_file.write_text("view-tok viewer bob\n# comment\nop-tok operator alice\n")
    tokens = ApiTokens.load(tokens_file)
    app = http_app(build_server(FleetQuery(config_for("c1"), ro_pool)), tokens)
    assert isinstance(app, BearerGate)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    url = f"http://127.0.0.1:{port}/mcp"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    try:
        assert await asyncio.to_thread(wait_port, "127.0.0.1", port, 20)
        async with httpx.AsyncClient() as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "view-tok"}):
                r = await http.post(url, json=body, headers=headers)
                assert r.status_code == 401, headers
                assert r.headers["www-authenticate"] == "Bearer"
                assert "bearer token" in r.json()["error"]
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        for tok in ("view-tok", "op-tok"):
            http2 = httpx2.AsyncClient(headers={"Authorization": f"Bearer {tok}"})
            async with http2, Client(streamable_http_client(url, http_client=http2)) as c:
                assert len((await c.list_tools()).tools) == len(TOOLS)
                fs = await call(c, "fleet_summary")
                assert fs["alerts"]["total"] == 0
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)
    with pytest.raises(ValueError, match="needs API tokens"):
        http_app(build_server(FleetQuery(config_for("c1"), ro_pool)), ApiTokens.load(None))


def test_dev_stack_dsn_reads_postmaster_pid(tmp_path: Path) -> None:
    assert dev_stack_dsn(tmp_path) is None
    (tmp_path / "pg").mkdir()
    pid = tmp_path / "pg" / "postmaster.pid"
    pid.write_text("4242\n/data/pg\n1712346200\n5433\n/tmp/sock\n\n  1 2\nready   \n")
    assert dev_stack_dsn(tmp_path) == "postgresql://postgres@/postgres?host=/tmp/sock&port=5433"
    pid.write_text("4242\n/data/pg\n1712346200\n5433\n\n127.0.0.1\n  1 2\nready\n")
    assert dev_stack_dsn(tmp_path) == "postgresql://postgres@127.0.0.1:5433/postgres"
    pid.write_text("garbage")
    assert dev_stack_dsn(tmp_path) is None


def _cli_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOREPAIR")}
    return {**env, "PYTHONPATH": str(ROOT), "AUTOREPAIR_DATA_DIR": str(data_dir)}


async def test_cli_serves_stdio_and_exits_0_at_end_of_input(
    ledger_pool: asyncpg.Pool, pg_dsn: str, tmp_path: Path
) -> None:
    schema = await ledger_pool.fetchval("SELECT current_schema()")
    await Ledger(ledger_pool).record_alert(make_alert("c1", "gpu-01", 1))
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "workers.cli", "mcp", "--no-temporal",
              "--ledger-dsn", f"{pg_dsn}&search_path={schema}"],
        env=_cli_env(tmp_path), cwd=str(ROOT))
    async with Client(params) as c:
        doc = await call(c, "list_alerts", node="gpu-01")
        assert [a["alert_id"] for a in doc["alerts"]] == ["c1/gpu-01/1"]
    # the end of standard input ends the server with exit 0
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers.cli", "mcp", "--no-temporal", "--ledger-dsn",
        f"{pg_dsn}&search_path={schema}", cwd=str(ROOT), env=_cli_env(tmp_path),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(b""), 60)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err


async def test_cli_http_exits_0_on_ctrl_c_and_finds_the_dev_stack(
    ledger_pool: asyncpg.Pool, pg_dsn: str, tmp_path: Path
) -> None:
    # no token anywhere: refused before serving, naming where it looked
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers.cli", "mcp", "--transport", "http", "--no-temporal",
        "--ledger-dsn", pg_dsn, cwd=str(ROOT), env=_cli_env(tmp_path),
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and str(tmp_path / "api-tokens") in err.decode()
    # no ledger anywhere
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers.cli", "mcp", cwd=str(ROOT), env=_cli_env(tmp_path),
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and "--ledger-dsn" in err.decode()
    # the dev stack's tokens file in the data dir (AUTOREPAIR_DATA_DIR) is used
    (tmp_path / "api-tokens").write_text("tok-1 viewer carol\n")
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers.cli", "mcp", "--transport", "http", "--no-temporal",
        "--port", str(port), "--ledger-dsn", pg_dsn, cwd=str(ROOT), env=_cli_env(tmp_path),
        stderr=asyncio.subprocess.PIPE)
    try:
        assert await asyncio.to_thread(wait_port, "127.0.0.1", port, 60)
        async with httpx.AsyncClient() as http:
            r = await http.post(f"http://127.0.0.1:{port}/mcp", json={})
            assert r.status_code == 401
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err


async def test_explain_judges_persistence_from_the_receipt_time(
    ledger_pool: asyncpg.Pool, ro_pool: asyncpg.Pool
) -> None:
    """Break-test of 8a5413f (I17): gpu-03's clock runs 10 minutes fast; its gpu_lost was
    received 2 minutes ago. Without a live node status, `explain_recommendation` said the
    60 s persistence ends 11 minutes from now (first seen = the sender's stamp), while
    the node workflow, which counts from the receipt, found it due a minute ago. Rail:
    persistence is judged on when the control plane received the fault."""
    ledger = Ledger(ledger_pool)
    now = datetime.now(UTC).replace(microsecond=0)
    await ledger.record_alert(make_alert("c1", "gpu-03", "fast", kind="gpu_lost", code=None,
                                         level=True,
                                         observed_at=now + timedelta(minutes=10),
                                         received_at=now - timedelta(minutes=2)))
    fq = FleetQuery(config_for("c1"), ro_pool, None)
    async with Client(build_server(fq)) as c:
        ex = await call(c, "explain_recommendation", node="gpu-03", cluster="c1")
    p = ex["faults"][0]["persistence"]
    assert p["first_seen"] == (now - timedelta(minutes=2)).isoformat(), p
    assert p["due"] is True, p


async def test_list_repairs_tells_an_approved_waiting_repair_from_one_asking(
    ledger_pool: asyncpg.Pool, ro_pool: asyncpg.Pool
) -> None:
    """A repair approved before its cordon keeps the stage ``awaiting_approval`` while it
    waits for its lease or a window (the documented order) but nobody is asked: the MCP
    ``list_repairs`` lists it under ``in_progress`` with state ``in_progress``, and
    ``awaiting_approval`` lists only the repair a person is asked about (as the API)."""
    ledger = Ledger(ledger_pool)
    now = datetime.now(UTC)
    for rid, node, pending, by in (("r-ask", "gpu-01", True, None),
                                   ("r-ok", "gpu-02", False, "oncall")):
        await ledger.upsert_repair(RepairRecord(
            repair_id=rid, cluster="c1", node=node, action=Action.reboot,
            stage=Stage.awaiting_approval, requester=Requester(kind=RequesterKind.system),
            approved_by=by, approval_pending=pending, updated_at=now))
    fq = FleetQuery(config_for("c1"), ro_pool, None)
    async with Client(build_server(fq)) as c:
        asking = await call(c, "list_repairs", cluster="c1", state="awaiting_approval")
        assert [(r["repair_id"], r["state"]) for r in asking["repairs"]] == [
            ("r-ask", "awaiting_approval")]
        going = await call(c, "list_repairs", cluster="c1", state="in_progress")
        assert [(r["repair_id"], r["state"]) for r in going["repairs"]] == [
            ("r-ok", "in_progress")]
