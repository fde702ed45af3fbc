"""Smoke test of the dev stack pieces of ``autorepair up``, in-process.

Starts the Temporal dev server the way ``up`` does (own data dir, free ports, search
attributes registered), embedded PostgreSQL with the ledger migrated, and one worker
that runs a trivial workflow which round-trips an alert through a ledger activity.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio import workflow
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

# This module defines a workflow: the sandbox re-imports it, so C-extension I/O modules
# (asyncpg) must be passed through rather than re-imported (re-importing them crashes).
with workflow.unsafe.imports_passed_through():
    from activities.ledger import Ledger, connect
    from activities.ledger_activities import LedgerActivities
    from workers.devstack import DevStack, StackError, StackPorts, free_port
    from workflows.activity_api import ACT
    from workflows.config import AutorepairConfig
    from workflows.models import Alert, Severity
    from workflows.protocol import SEARCH_ATTRIBUTES


@workflow.defn(name="SmokeWorkflow")
class SmokeWorkflow:
    @workflow.run
    async def run(self, alert: Alert) -> bool:
        return await workflow.execute_activity(
            ACT.ledger_record_alert, alert, result_type=bool,
            start_to_close_timeout=timedelta(seconds=30),
        )


@workflow.defn(name="ParkedWorkflow")
class ParkedWorkflow:
    """Waits for a signal: stands in for a repair that outlives the stack."""

    def __init__(self) -> None:
        self.go = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.go)
        return "resumed"

    @workflow.signal
    def proceed(self) -> None:
        self.go = True


def _ports() -> StackPorts:
    return StackPorts(
        temporal=free_port(), temporal_ui=free_port(), temporal_http=free_port(),
        temporal_metrics=free_port(), otlp_grpc=free_port(), otlp_http=free_port(),
        api=free_port(), admin=free_port(), worker_metrics=free_port(),
    )


async def test_dev_stack_round_trip(tmp_path: Path) -> None:
    stack = DevStack(config=AutorepairConfig(), data_dir=tmp_path / "data", ports=_ports())
    stack.data_dir.mkdir(parents=True)
    try:
        stack.check_ports()
        await asyncio.to_thread(stack.start_temporal)
        await asyncio.to_thread(stack.start_postgres)
        await stack.migrate_ledger()
        client = await Client.connect(
            f"127.0.0.1:{stack.ports.temporal}", data_converter=pydantic_data_converter
        )
        resp = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace="default")
        )
        assert set(SEARCH_ATTRIBUTES) <= set(resp.custom_attributes)

        pool = await connect(stack.pg_dsn)
        try:
            alert = Alert(
                alert_id="smoke-" + uuid.uuid4().hex, cluster="c", node="gpu-01", kind="xid",
                code=79, severity=Severity.critical, summary="Xid 79",
                observed_at=datetime.now(UTC),
            )
            async with Worker(client, task_queue="smoke", workflows=[SmokeWorkflow],
                              activities=LedgerActivities(pool).all()):
                first = await client.execute_workflow(
                    SmokeWorkflow.run, alert, id="smoke-1", task_queue="smoke")
                second = await client.execute_workflow(
                    SmokeWorkflow.run, alert, id="smoke-2", task_queue="smoke")
            assert (first, second) == (True, False)
            stored = await Ledger(pool).get_alert(alert.alert_id)
            assert stored is not None and stored.summary == "Xid 79"
        finally:
            await pool.close()
    finally:
        await asyncio.to_thread(stack.stop)


async def test_second_up_on_same_data_dir_resumes_workflows(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    first = DevStack(config=AutorepairConfig(), data_dir=data, ports=_ports())
    try:
        await asyncio.to_thread(first.start_temporal)
        client = await Client.connect(f"127.0.0.1:{first.ports.temporal}",
                                      data_converter=pydantic_data_converter)
        await client.start_workflow(ParkedWorkflow.run, id="parked-1", task_queue="parked")
    finally:
        await asyncio.to_thread(first.stop)
    second = DevStack(config=AutorepairConfig(), data_dir=data, ports=_ports())
    try:
        await asyncio.to_thread(second.start_temporal)
        client = await Client.connect(f"127.0.0.1:{second.ports.temporal}",
                                      data_converter=pydantic_data_converter)
        handle = client.get_workflow_handle("parked-1")
        async with Worker(client, task_queue="parked", workflows=[ParkedWorkflow]):
            await handle.signal(ParkedWorkflow.proceed)
            assert await handle.result() == "resumed"
    finally:
        await asyncio.to_thread(second.stop)


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        ports = _ports()
        ports.api = busy
        stack = DevStack(config=AutorepairConfig(), data_dir=tmp_path, ports=ports)
        try:
            stack.check_ports()
        except StackError as exc:
            assert f"{busy} (HTTP API)" in str(exc)
        else:
            raise AssertionError("busy port not reported")


def test_dev_stack_writes_operator_token_once(tmp_path: Path) -> None:
    import stat

    stack = DevStack(config=AutorepairConfig(), data_dir=tmp_path, ports=_ports())
    tokens = stack.ensure_api_tokens()
    token = (tmp_path / "operator.token").read_text()
    assert tokens.read_text() == f"{token} operator operator\n" and len(token) >= 32
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    assert stack.ensure_api_tokens() == tokens
    assert (tmp_path / "operator.token").read_text() == token  # stable across restarts


def test_dev_stack_writes_collector_token_once(tmp_path: Path) -> None:
    import stat

    from ingest.auth import load_identities
    from workflows.config import ClusterConfig, IngestConfig

    cfg = AutorepairConfig(clusters=[ClusterConfig(name="c1"), ClusterConfig(name="c2")])
    stack = DevStack(config=cfg, data_dir=tmp_path, ports=_ports())
    tokens = stack.ensure_ingest_tokens()
    token = (tmp_path / "collector.token").read_text()
    assert tokens.read_text() == f"{token} collector c1,c2\n" and len(token) >= 32
    for path in (tokens, tmp_path / "collector.token"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stack.ensure_ingest_tokens() == tokens and stack.collector_token() == token
    assert ("Collector token (OTLP)", str(tmp_path / "collector.token")) in stack.endpoints()
    (_, _, ident), = load_identities(str(tokens))
    assert ident.may_report("c2", "any-node") and not ident.may_report("other", "n")
    # the environment of the ingest child points at it: the receivers require it
    assert stack._env()["AUTOREPAIR__INGEST__TOKENS_FILE"] == str(tokens)
    # an operator's own tokens file wins; no dev collector token then
    own = DevStack(config=AutorepairConfig(ingest=IngestConfig(tokens_file="/etc/t")),
                   data_dir=tmp_path / "own", ports=_ports())
    assert own.ensure_ingest_tokens().as_posix() == "/etc/t" and own.collector_token() is None


async def test_clients_find_the_config_while_the_stack_is_starting(tmp_path: Path) -> None:
    """stack.json (with the config file) is written before the first child starts, so a
    client run while the stack comes up finds the configured machines: `validate gpu-03`
    right after `up --demo` used to fall back to the defaults and fail with 'cannot tell
    its cluster'."""
    import json

    config_path = tmp_path / "autorepair.yaml"
    config_path.write_text("clusters: [{name: demo, nodes: [{name: gpu-03}]}]\n")
    stack = DevStack(config=AutorepairConfig(), data_dir=tmp_path / "data", ports=_ports(),
                     config_path=config_path)
    seen: dict[str, object] = {}

    def temporal_not_started_yet() -> None:
        seen.update(json.loads((tmp_path / "data" / "stack.json").read_text()))
        raise StackError("stopped here by the test")

    stack.start_temporal = temporal_not_started_yet  # type: ignore[method-assign]
    try:
        await stack.start()
    except StackError:
        pass
    finally:
        stack.stop()
    assert seen["config"] == str(config_path.absolute())
    assert seen["api"] == f"http://127.0.0.1:{stack.ports.api}"


def test_a_temporal_that_does_not_answer_is_named_with_its_error() -> None:
    """``start_temporal`` waits for the frontend to answer ``GetSystemInfo``, not only
    for its port (a CI run's second start over one database failed "Frontend is not
    healthy yet" in the client's connect); nothing listening is reported with the CLI's
    error once the wait is over."""
    from workers.devstack import find_binary, wait_serving

    port = free_port()
    answer = wait_serving(find_binary("temporal"), f"127.0.0.1:{port}", 0.5)
    assert answer is not None and "connection refused" in answer, answer
