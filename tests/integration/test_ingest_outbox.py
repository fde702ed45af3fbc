"""Durable hand-off: an alert ingest answered for is in PostgreSQL, and reaches its node's
workflow even when the ingest that took it dies first.

Real Temporal dev server, real ingest service over OTLP/HTTP and gRPC, embedded
PostgreSQL with the ledger's migrations (one fresh schema per test). The node's entity is
the same-named test workflow of ``test_ingest_handoff`` (records and de-duplicates).

* a push stored twice (the agent re-sends) is one row and one delivery, and the row is
  marked handed off once the workflow has it;
* alerts accepted while Temporal is unreachable stay unmarked when that ingest goes away;
  a new ingest re-delivers them at start, in the order they were accepted;
* an unmarked alert left by another ingest and older than the resubmit age is picked up
  by a running ingest's sweep, and an alert this ingest still holds is never queued twice;
* PostgreSQL unreachable (the connection to it cut): the push is answered 503 +
  ``Retry-After`` (gRPC UNAVAILABLE) and nothing of it is stored or delivered; once
  PostgreSQL is back the re-sent push is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import grpc
import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import LogsServiceStub
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.ledger import Ledger, connect, migrate
from ingest.handoff import OutboxUnavailable, TemporalAlertSink
from ingest.otlp import make_fault_request
from ingest.service import IngestService
from tests.integration.test_ingest_handoff import FakeNodeWorkflow, cfg, delivered
from workflows.models import Alert

PB = {"Content-Type": "application/x-protobuf"}
LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


class PgProxy:
    """A TCP proxy in front of PostgreSQL that the test can cut (every connection closed,
    nothing listening) and restore on the same port: PostgreSQL as ingest sees it.
    ``dsn``: the server's (TCP ``host:port`` or a Unix socket ``?host=DIR``); :attr:`dsn`
    after :meth:`start`: the same database through the proxy."""

    def __init__(self, dsn: str) -> None:
        u = urlsplit(dsn)
        sock_dir = parse_qs(u.query).get("host", [""])[0]
        self.unix: str | None = None
        if sock_dir:
            (self.unix,) = [str(p) for p in Path(sock_dir).glob(".s.PGSQL.*")
                            if not p.name.endswith(".lock")]
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 5432
        self._user, self._path = u.username or "postgres", u.path
        self.listen_port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def dsn(self) -> str:
        return f"postgresql://{self._user}:@127.0.0.1:{self.listen_port}{self._path}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.listen_port)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            if self.unix is not None:
                ur, uw = await asyncio.open_unix_connection(self.unix)
            else:
                ur, uw = await asyncio.open_connection(self.host, self.port)
        except OSError:
            w.close()
            return
        self._writers |= {w, uw}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(r, uw), pipe(ur, w))

    async def cut(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for w in list(self._writers):
            w.close()
        self._writers.clear()
        await self._server.wait_closed()
        self._server = None


@pytest.fixture
async def client(temporal_dev_env: Any) -> Client:
    c: Client = temporal_dev_env.client
    return c


@pytest.fixture
async def schema(pg_dsn: str) -> AsyncIterator[str]:
    name = "o_" + uuid.uuid4().hex[:12]
    pool = await connect(pg_dsn, schema=name)
    await migrate(pool)
    await pool.close()
    yield name
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
async def ledger(pg_dsn: str, schema: str) -> AsyncIterator[Ledger]:
    pool = await connect(pg_dsn, schema=schema)
    yield Ledger(pool)
    await pool.close()


def fault(cluster: str, node: str, i: int) -> bytes:
    body: bytes = make_fault_request(
        cluster, node, kind="xid", code=79, gpu="0000:3b:00.0", body=f"{LINE} #{i}",
        time_ns=(1_700_000_000 + i) * 10**9).SerializeToString()
    return body


async def rows(ledger: Ledger, cluster: str) -> list[asyncpg.Record]:
    got: list[asyncpg.Record] = await ledger.db.fetch(
        "SELECT alert_id, node, handed_off_at, evidence_text FROM alerts WHERE cluster = $1"
        " ORDER BY recorded_at, accepted_ord", cluster)
    return got


async def eventually(cond: Any, what: str, timeout_s: float = 15.0) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if await cond():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def alert(cluster: str, node: str, i: int) -> Alert:
    return Alert(alert_id=f"{cluster}-{node}-{i}", cluster=cluster, node=node, kind="xid",
                 code=79, summary=f"Xid 79 #{i}", observed_at=datetime(2026, 1, 1, tzinfo=UTC))


async def test_duplicate_push_is_stored_once_and_delivered_once(
    client: Client, ledger: Ledger
) -> None:
    cluster = f"d-{uuid.uuid4().hex[:6]}"
    queue = f"outbox-{uuid.uuid4().hex[:8]}"
    a, b = alert(cluster, "n1", 1), alert(cluster, "n1", 2)
    assert await ledger.accept_alerts([a, a, b]) == {a.alert_id, b.alert_id}
    assert await ledger.accept_alerts([a]) == set()
    assert [r["alert_id"] for r in await rows(ledger, cluster)] == [a.alert_id, b.alert_id]
    assert await ledger.pending_handoff(0.0) == [a, b]
    assert await ledger.mark_handed_off([a.alert_id, b.alert_id, "unknown"]) == 2
    assert await ledger.pending_handoff(0.0) == []

    sink = TemporalAlertSink(client, queue, outbox=ledger, mark_every_s=0.1)
    svc = IngestService(cfg(), sink)
    async with Worker(client, task_queue=queue, workflows=[FakeNodeWorkflow]):
        await svc.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
                for _ in range(3):  # the agent re-sends the same record
                    r = await c.post("/v1/logs", headers=PB, content=fault(cluster, "n2", 7))
                    assert r.status_code == 200, r.content
            (got,) = await delivered(client, cluster, "n2", 1)
            mine = [r for r in await rows(ledger, cluster) if r["node"] == "n2"]
            assert len(mine) == 1 and mine[0]["alert_id"] == got.alert_id

            async def marked() -> bool:
                return all(r["handed_off_at"] is not None for r in await rows(ledger, cluster))

            await eventually(marked, "the delivered alert marked handed off")
            assert sink.counts["delivered"] == 1
        finally:
            await svc.stop()


async def test_alerts_accepted_while_temporal_is_down_are_redelivered_by_a_new_ingest(
    client: Client, ledger: Ledger
) -> None:
    cluster = f"k-{uuid.uuid4().hex[:6]}"
    queue = f"outbox-{uuid.uuid4().hex[:8]}"
    # ingest 1: its Temporal is unreachable, so nothing it accepts can be handed off
    down = await Client.connect("127.0.0.1:1", data_converter=pydantic_data_converter,
                                lazy=True)
    sink1 = TemporalAlertSink(down, queue, outbox=ledger, rpc_timeout_s=0.5,
                              max_backoff_s=0.5, max_attempts=1000)
    svc1 = IngestService(cfg(), sink1)
    await svc1.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc1.http_port}") as c:
            for i in range(3):
                r = await c.post("/v1/logs", headers=PB, content=fault(cluster, "n1", i))
                assert r.status_code == 200, r.content
        await asyncio.sleep(1.0)
        assert sink1.counts["delivered"] == 0 and sink1.counts["retried"] >= 1
    finally:
        # what a SIGKILL leaves: the in-memory queue is gone, the rows are unmarked
        await svc1.stop()
    stored = await rows(ledger, cluster)
    assert len(stored) == 3 and all(r["handed_off_at"] is None for r in stored)

    # ingest 2 starts with Temporal up: it re-delivers before taking any push
    sink2 = TemporalAlertSink(client, queue, outbox=ledger, mark_every_s=0.1)
    async with Worker(client, task_queue=queue, workflows=[FakeNodeWorkflow]):
        await sink2.start()
        try:
            got = await delivered(client, cluster, "n1", 3)
            assert [a.evidence_text.rsplit("#", 1)[1] for a in got] == ["0", "1", "2"]
            assert [a.alert_id for a in got] == [r["alert_id"] for r in stored]
            assert sink2.counts["resubmitted"] == 3

            async def marked() -> bool:
                return all(r["handed_off_at"] is not None for r in await rows(ledger, cluster))

            await eventually(marked, "the re-delivered alerts marked handed off")
        finally:
            await sink2.stop()
            await client.get_workflow_handle(f"node/{cluster}/n1").terminate()


async def test_sweep_takes_what_another_ingest_left_and_never_queues_twice(
    client: Client, ledger: Ledger
) -> None:
    cluster = f"s-{uuid.uuid4().hex[:6]}"
    queue = f"outbox-{uuid.uuid4().hex[:8]}"  # no worker at first: alerts stay held
    sink = TemporalAlertSink(client, queue, outbox=ledger, rpc_timeout_s=0.5,
                             max_backoff_s=0.5, resubmit_after_s=60, mark_every_s=0.1)
    await sink.start()
    try:
        await sink.submit(alert(cluster, "mine", 1))
        # left by another ingest two minutes ago, and one it stored just now
        old, fresh = alert(cluster, "theirs", 1), alert(cluster, "theirs2", 1)
        await ledger.accept_alerts([old, fresh])
        await ledger.db.execute("UPDATE alerts SET recorded_at = now() - interval '2 minutes'"
                                " WHERE alert_id = ANY($1::text[])",
                                [old.alert_id, f"{cluster}-mine-1"])
        assert await sink.sweep() == 1  # the old one; not "mine" (held), not the fresh one
        assert await sink.sweep() == 0  # now held too
        assert sink.depth() == 2
        async with Worker(client, task_queue=queue, workflows=[FakeNodeWorkflow]):
            (a,) = await delivered(client, cluster, "theirs", 1)
            assert a.alert_id == old.alert_id
            (m,) = await delivered(client, cluster, "mine", 1)
            assert m.alert_id == f"{cluster}-mine-1"

            async def marked() -> bool:
                left = {r["alert_id"] for r in await rows(ledger, cluster)
                        if r["handed_off_at"] is None}
                return left == {fresh.alert_id}

            await eventually(marked, "both delivered alerts marked, the fresh one left")
    finally:
        await sink.stop(drain_timeout_s=0.1)
        for node in ("theirs", "mine"):
            with contextlib.suppress(Exception):
                await client.get_workflow_handle(f"node/{cluster}/{node}").terminate()


async def test_postgres_unreachable_answers_503_and_stores_nothing(
    client: Client, ledger: Ledger, pg_dsn: str, schema: str
) -> None:
    cluster = f"p-{uuid.uuid4().hex[:6]}"
    queue = f"outbox-{uuid.uuid4().hex[:8]}"
    proxy = PgProxy(pg_dsn)
    await proxy.start()
    pool = await connect(proxy.dsn, schema=schema)
    sink = TemporalAlertSink(client, queue, outbox=Ledger(pool), outbox_timeout_s=1.0)
    svc = IngestService(cfg(), sink)
    async with Worker(client, task_queue=queue, workflows=[FakeNodeWorkflow]):
        await svc.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
                r = await c.post("/v1/logs", headers=PB, content=fault(cluster, "n1", 0))
                assert r.status_code == 200, r.content
                await proxy.cut()
                r = await c.post("/v1/logs", headers=PB, content=fault(cluster, "n1", 1))
                assert r.status_code == 503, r.content
                assert r.headers["retry-after"] == "1"
                async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.grpc_port}") as ch:
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await LogsServiceStub(ch).Export(make_fault_request(
                            cluster, "n1", kind="xid", code=79, body=f"{LINE} #2",
                            time_ns=(1_700_000_002) * 10**9))
                    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                assert sink.counts["outbox_unavailable"] >= 2
                # nothing of the refused pushes was stored or handed to the workflow
                assert [r["evidence_text"][-2:] for r in await rows(ledger, cluster)] == ["#0"]
                await asyncio.sleep(0.5)
                assert len(await delivered(client, cluster, "n1", 1)) == 1
                await proxy.start()  # PostgreSQL back: the agent's re-send is taken
                for _ in range(20):
                    r = await c.post("/v1/logs", headers=PB, content=fault(cluster, "n1", 1))
                    if r.status_code == 200:
                        break
                    assert r.status_code == 503
                    await asyncio.sleep(0.2)
                assert r.status_code == 200
            got = await delivered(client, cluster, "n1", 2)
            assert [a.evidence_text[-2:] for a in got] == ["#0", "#1"]
            assert len(await rows(ledger, cluster)) == 2
        finally:
            await svc.stop()
            await pool.close()
            await proxy.cut()


async def test_submit_many_refuses_all_when_the_outbox_fails(client: Client) -> None:
    """All or none: a failing outbox queues nothing and releases the reserved room."""

    class Broken:
        async def accept_alerts(self, alerts: Any) -> set[str]:
            raise ConnectionResetError("connection reset by peer")

        async def mark_handed_off(self, ids: Any) -> int:
            return 0

        async def pending_handoff(self, older_than_s: float = 0.0, limit: int = 1000
                                  ) -> list[Alert]:
            return []

    sink = TemporalAlertSink(client, "nowhere", queue_size=4, shards=1, outbox=Broken())
    with pytest.raises(OutboxUnavailable):
        await sink.submit_many([alert("c", "n", i) for i in range(3)])
    assert sink.depth() == 0 and sink.counts["outbox_unavailable"] == 1
    with pytest.raises(ValueError, match="outbox_timeout_s"):
        TemporalAlertSink(client, "nowhere", outbox_timeout_s=0)


async def test_one_bad_record_never_makes_the_push_unstorable(
    client: Client, ledger: Ledger
) -> None:
    """A push with a good Xid, a record whose code does not fit the ledger (2**40) and one
    with a NaN evidence attribute: 200 with ``partial_success`` counting the one record
    named by field and value, both good alerts stored (the NaN kept as text) and
    delivered — never a 503 that the sender would retry for ever (docs/wire-contract.md:
    503 only for a full hand-off queue or PostgreSQL unreachable)."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceRequest,
        ExportLogsServiceResponse,
    )

    cluster = f"b-{uuid.uuid4().hex[:6]}"
    queue = f"outbox-{uuid.uuid4().hex[:8]}"
    req = ExportLogsServiceRequest()
    req.MergeFrom(make_fault_request(cluster, "n1", kind="xid", code=48, body=f"{LINE} a",
                                     time_ns=1_700_000_000 * 10**9))
    req.MergeFrom(make_fault_request(cluster, "n1", kind="xid", code=2**40, body=f"{LINE} b",
                                     time_ns=1_700_000_001 * 10**9))
    req.MergeFrom(make_fault_request(cluster, "n1", kind="xid", code=79, body=f"{LINE} c",
                                     time_ns=1_700_000_002 * 10**9,
                                     evidence={"temp": float("nan"), "x": float("-inf")}))
    sink = TemporalAlertSink(client, queue, outbox=ledger, mark_every_s=0.1)
    svc = IngestService(cfg(), sink)
    async with Worker(client, task_queue=queue, workflows=[FakeNodeWorkflow]):
        await svc.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
                r = await c.post("/v1/logs", headers=PB, content=req.SerializeToString())
            assert r.status_code == 200, r.content
            resp = ExportLogsServiceResponse.FromString(r.content)
            assert resp.partial_success.rejected_log_records == 1
            assert f"autorepair.fault.code: {2**40} is outside 0..{2**31 - 1}" in \
                resp.partial_success.error_message
            got = await delivered(client, cluster, "n1", 2)
            assert sorted(a.code or 0 for a in got) == [48, 79]
            stored = await ledger.db.fetch(
                "SELECT code, evidence FROM alerts WHERE cluster = $1 ORDER BY code", cluster)
            assert [row["code"] for row in stored] == [48, 79]
            nan = next(a for a in got if a.code == 79)
            assert (nan.evidence["temp"], nan.evidence["x"]) == ("nan", "-inf")
        finally:
            await svc.stop()
