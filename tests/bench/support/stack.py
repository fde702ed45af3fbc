"""Shared pieces of the orchestration benchmarks: the dev stack, OTLP fault pushes, histories.

Not a benchmark itself (``make bench`` runs only ``tests/bench/*.py``). Everything is the
dev stack of ``autorepair up`` (:class:`workers.devstack.DevStack`): the Temporal dev server
(SQLite), embedded PostgreSQL, and the worker and ingest as child processes, on free ports
and in a data directory of the benchmark's own; a benchmark stopped by a signal stops
all of it (:func:`workers.devstack.stop_stacks_on_exit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import yaml
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from agent.otlp import RETRYABLE_STATUS
from ingest.otlp import make_fault_request, make_metrics_request
from workers.config import load_config
from workers.devpeers import free_ports
from workers.devstack import DevStack, StackPorts, stop_stacks_on_exit
from workflows.config import AutorepairConfig

XID79_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def bench_ports() -> StackPorts:
    """Nine distinct free ports for a stack that never collides with ``autorepair up``."""
    p = free_ports(9)
    return StackPorts(temporal=p[0], temporal_ui=p[1], temporal_http=p[2], temporal_metrics=p[3],
                      otlp_grpc=p[4], otlp_http=p[5], api=p[6], admin=p[7], worker_metrics=p[8])


def cluster_config(name: str, nodes: int, *, pools: int = 1, prefix: str = "gpu") -> dict[str, Any]:
    """A cluster section with ``nodes`` inventory nodes ``{prefix}-00000…`` in ``pools``
    pools (round robin), ``gpu_nodes`` = ``nodes`` (the budget's and breaker's denominator)."""
    return {
        "name": name,
        "gpu_nodes": nodes,
        "nodes": [{"name": node_name(i, prefix), "pool": f"pool-{i % pools:03d}"}
                  for i in range(nodes)],
    }


def node_name(i: int, prefix: str = "gpu") -> str:
    return f"{prefix}-{i:05d}"


@dataclass
class Stack:
    stack: DevStack
    client: Client
    token: str
    http: httpx.AsyncClient

    @property
    def otlp_url(self) -> str:
        return f"http://127.0.0.1:{self.stack.ports.otlp_http}"

    async def push_fault(self, cluster: str, node: str, *, kind: str = "xid", code: int | None = 79,
                         active: bool = True, time_ns: int | None = None,
                         body: str = XID79_LINE) -> float:
        """One fault log record over OTLP/HTTP; returns the wall time (``time.time()``,
        seconds) at which the 200 arrived. Raises ``RuntimeError`` on any other status."""
        raw = make_fault_request(cluster, node, kind=kind, code=code, gpu="0000:3b:00.0",
                                 body=body, active=active,
                                 time_ns=time_ns or time.time_ns()).SerializeToString()
        headers = {"Content-Type": "application/x-protobuf",
                   "Authorization": f"Bearer {self.token}"}
        for _ in range(30):  # re-send what an agent re-sends (503 / 429 say when)
            r = await self.http.post("/v1/logs", content=raw, headers=headers)
            if r.status_code not in RETRYABLE_STATUS:
                break
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))
        if r.status_code != 200:
            raise RuntimeError(f"push {cluster}/{node}: HTTP {r.status_code} {r.text[:200]}")
        return time.time()

    async def heartbeats(self, cluster: str, nodes: list[str], stop: asyncio.Event,
                         interval_s: float = 10.0, batch: int = 250) -> None:
        """Every node pushes its health score every ``interval_s`` (docs/design.md §5 push interval)
        until ``stop``, ``batch`` nodes per OTLP request (as a collector sends them): the
        ingest sees live agents, not silent ones (a silent inventory node raises
        ``node_unreachable``)."""
        while not stop.is_set():
            t0 = time.monotonic()
            now = time.time_ns()
            for k in range(0, len(nodes), batch):
                req = make_metrics_request(cluster, nodes[k], 0.97, time_ns=now)
                for node in nodes[k + 1:k + batch]:
                    req.resource_metrics.extend(
                        make_metrics_request(cluster, node, 0.97, time_ns=now).resource_metrics)
                r = await self.http.post("/v1/metrics", content=req.SerializeToString(),
                                         headers={"Content-Type": "application/x-protobuf",
                                                  "Authorization": f"Bearer {self.token}"})
                if r.status_code != 200:
                    raise RuntimeError(f"heartbeat push: HTTP {r.status_code} {r.text[:200]}")
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, interval_s - (time.monotonic() - t0)))
            except TimeoutError:
                pass

    def pid(self, name: str) -> int:
        """Process id of the stack's child ``name`` (``temporal``, ``worker``, ``ingest``)."""
        for child in self.stack.children:
            if child.name == name and child.proc is not None:
                return child.proc.pid
        raise KeyError(f"no child process {name!r} in the stack")

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far by each child, children of it included."""
        out: dict[str, float] = {}
        for child in self.stack.children:
            if child.proc is None:
                continue
            try:
                p = psutil.Process(child.proc.pid)
                procs = [p, *p.children(recursive=True)]
                out[child.name] = sum(sum(q.cpu_times()[:2]) for q in procs)
            except psutil.Error:
                out[child.name] = float("nan")
        return out

    async def count(self, query: str) -> int:
        return (await self.client.count_workflows(query)).count


@contextlib.asynccontextmanager
async def dev_stack(data_dir: Path, config: dict[str, Any]) -> AsyncIterator[Stack]:
    """Start the dev stack with ``config`` (YAML written to ``data_dir/autorepair.yaml``);
    stop everything on exit, and on SIGTERM, SIGINT or SIGHUP (a benchmark stopped by
    ``timeout`` or Ctrl-C: :func:`workers.devstack.stop_stacks_on_exit`). Raises
    ``workers.devstack.StackError`` when it cannot start."""
    stop_stacks_on_exit()
    path = await asyncio.to_thread(_write_config, data_dir, config)
    stack = DevStack(config=load_config(path, environ={}), data_dir=data_dir,
                     ports=bench_ports(), config_path=path)
    try:
        await stack.start()
        client = await Client.connect(f"127.0.0.1:{stack.ports.temporal}",
                                      data_converter=pydantic_data_converter)
        token = await asyncio.to_thread(_read_token, data_dir)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{stack.ports.otlp_http}",
            # a push waits for a free connection as long as it takes (a storm's pushes queue
            # here, not in a timeout), then 30 s for the answer
            timeout=httpx.Timeout(30.0, pool=None),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        ) as http:
            yield Stack(stack, client, token, http)
    finally:
        await asyncio.to_thread(stack.stop)


@dataclass
class Core:
    """The Temporal dev server and the migrated ledger of :func:`core_stack`."""

    stack: DevStack
    client: Client
    pool: Any  # asyncpg.Pool on the ledger
    config: AutorepairConfig


@contextlib.asynccontextmanager
async def core_stack(data_dir: Path, config: dict[str, Any]) -> AsyncIterator[Core]:
    """Only the dev stack's Temporal dev server and embedded PostgreSQL (ledger migrated),
    for a benchmark that runs its own worker in-process; stopped on exit and on SIGTERM,
    SIGINT or SIGHUP (:func:`workers.devstack.stop_stacks_on_exit`)."""
    from activities.ledger import connect

    stop_stacks_on_exit()
    path = await asyncio.to_thread(_write_config, data_dir, config)
    cfg = load_config(path, environ={})
    stack = DevStack(config=cfg, data_dir=data_dir, ports=bench_ports(), config_path=path)
    pool = None
    try:
        stack.data_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(stack.start_temporal)
        await asyncio.to_thread(stack.start_postgres)
        await stack.migrate_ledger()
        pool = await connect(stack.pg_dsn)
        client = await Client.connect(f"127.0.0.1:{stack.ports.temporal}",
                                      data_converter=pydantic_data_converter)
        yield Core(stack, client, pool, cfg)
    finally:
        if pool is not None:
            await pool.close()
        await asyncio.to_thread(stack.stop)


def _write_config(data_dir: Path, config: dict[str, Any]) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "autorepair.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _read_token(data_dir: Path) -> str:
    return (data_dir / "collector.token").read_text().strip()


async def wait_visible(s: Stack, query: str, timeout_s: float, poll_s: float = 0.01) -> float:
    """Poll ``count_workflows(query)`` every ``poll_s`` until ≥ 1; returns the wall time it
    was first seen (``time.time()``). Raises ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await s.count(query) >= 1:
            return time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"not visible within {timeout_s:g} s: {query}")
        await asyncio.sleep(poll_s)


async def history_times(client: Client, workflow_id: str, prefix: str) -> dict[str, float]:
    """First wall time (s) of each event of ``workflow_id``'s history, labelled
    ``prefix:EventType`` (activity events with the activity type, e.g.
    ``node:ACTIVITY_TASK_SCHEDULED(ledger_record_alert)``)."""
    out: dict[str, float] = {}
    sched: dict[int, str] = {}
    hist = await client.get_workflow_handle(workflow_id).fetch_history()
    for ev in hist.events:
        name = EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_")
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            act = ev.activity_task_scheduled_event_attributes.activity_type.name
            sched[ev.event_id] = act
            name = f"{name}({act})"
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            name = f"{name}({sched.get(ev.activity_task_started_event_attributes.scheduled_event_id)})"
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            name = f"{name}({sched.get(ev.activity_task_completed_event_attributes.scheduled_event_id)})"
        label = f"{prefix}:{name}"
        if label not in out:
            out[label] = _ts(ev.event_time)
    return out


def _ts(t: Any) -> float:
    return float(t.seconds) + t.nanos / 1e9


def pct(values: Iterable[float], q: float) -> float:
    arr = np.asarray(list(values), dtype=float)
    return float(np.percentile(arr, q)) if arr.size else float("nan")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts).isoformat(timespec="milliseconds")


class PySpy:
    """``py-spy record --format raw`` on one process (collapsed stacks), stopped by SIGINT;
    :meth:`top` sums samples per function (self time and total)."""

    def __init__(self, binary: str, pid: int, out: Path, rate: int = 100) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [binary, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate),
             "--nonblocking", "-o", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def top(self, n: int = 25) -> tuple[int, list[tuple[str, float, float]]]:
        """(samples, [(function, self share, total share)]) sorted by total share."""
        own: dict[str, int] = defaultdict(int)
        total: dict[str, int] = defaultdict(int)
        samples = 0
        if not self.out.exists():
            return 0, []
        for line in self.out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            c = int(count)
            samples += c
            frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
                      if " (" in f else f for f in stack.split(";")]
            own[frames[-1]] += c
            for f in set(frames):
                total[f] += c
        rows = sorted(((f, own[f] / samples, t / samples) for f, t in total.items()),
                      key=lambda r: -r[2])
        return samples, rows[:n]
