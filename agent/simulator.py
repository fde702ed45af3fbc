"""Fleet simulator: N simulated agents in one asyncio process (``autorepair-agent simulate``).

Each simulated node is a full :class:`agent.runner.Agent` (same scoring, tiers, push
code) over a :class:`agent.nvml.SimulatedBackend`, pushing real OTLP to ``endpoint``.
Nodes ``{prefix}01``..``{prefix}NN`` (at least two digits); every fourth node (by default
25 %) runs the ``inference`` cohort, the rest ``training``.

Fault kinds (:data:`FAULT_KINDS`), injected by schedule (``NODE:KIND@SECONDS``), by
:meth:`FleetSimulator.inject` or through the control endpoint:

==============  ==========================================================================
``slow``        straggler: work rate × 0.6 (util and SM clock × √0.6, hardware slowdown)
``xidNN``       replay a real ``NVRM: Xid`` line with code NN from the kernel lines (PCI
                rewritten to the node's GPU 0); a labelled synthetic line if none has NN
``sxidNN``      same for ``SXid`` lines
``kernel``      replay the next line of the kernel-lines file (round robin)
``lost``        GPU 0 falls off the bus: one GPU fewer in NVML + the real NVRM record
``ecc``         volatile uncorrectable ECC count on GPU 0 (level fault, NVML path)
``remap``       remapped rows pending on GPU 0 (level fault, NVML path)
``outage``      the next 5 NVML reads fail (transient outage: state unknown, no fault)
``idle``        the job ends: GPUs idle
``silent``      the agent stops pushing (process gone)
==============  ==========================================================================

With ``nccl_ranks`` (``--nccl-comm RANKS``) the fleet also runs one NCCL communicator of
that many ranks, ``gpus_per_node`` ranks per node in node order, at ``nccl_ops_per_s``
collectives a second: each node's agent receives its ranks' timings (as from a
``--nccl-trace`` file) and pushes them as ``autorepair.nccl.collective.duration_ms``
(:class:`agent.nccl.TraceModel`). ``slow_ranks`` (``--slow-rank NODE[:MS]``) plants nodes
whose ranks arrive MS late at every collective; a ``slow`` fault does the same for its node
(:data:`NCCL_LATE_MS`).

``clear`` removes every fault. ``reboot`` = agent restarts with a new boot id, faults
cleared, baseline kept (state file survives). ``reprovision`` = same, baseline reset.

Control endpoint (loopback only, stdlib ``http.server`` in a thread), JSON replies:
``GET /nodes``; ``POST /nodes/{node}/fault/{kind}``; ``POST /nodes/{node}/clear``;
``POST /nodes/{node}/reboot``; ``POST /nodes/{node}/reprovision``. Unknown node or kind →
404/400 with the offending value named.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from agent.config import AgentConfig, PushConfig
from agent.kmsg import LineReader, default_reader
from agent.nccl import NcclRecord, TraceModel
from agent.nvml import SimFaults, SimulatedBackend
from agent.otlp import HttpTransport, PushResult, Transport
from agent.runner import Agent

log = logging.getLogger("autorepair.agent.simulator")

FAULT_KINDS = ("slow", "kernel", "lost", "ecc", "remap", "outage", "idle", "silent")
_CODE_KIND = re.compile(r"^(xid|sxid)(\d+)$")
#: Work-rate multiplier of a ``slow`` node (design choice: a 40 % slowdown, the size of a
#: thermally throttled or PCIe-degraded node in a synchronous training job).
SLOW_FACTOR = 0.6

#: How late (ms) the NCCL ranks of a ``slow`` or ``--slow-rank`` node arrive at each
#: collective: ten times the trace model's default arrival jitter (0.2 ms), about 10 % of a
#: 25 MiB AllGather on 40 GB/s — a node that drags a synchronous job visibly.
NCCL_LATE_MS = 2.0

#: Real kernel lines (from the project corpus /work/shared/corpus/real-inputs.jsonl; the
#: public source of each is given) used when no ``--kernel-lines`` file is supplied.
BUILTIN_KERNEL_LINES: tuple[str, ...] = (
    # wilicc/gpu-burn#1
    "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
    # leptonai/gpud PR #46
    "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
    "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): "
    "Illegal Instruction Parameter",
    # NVIDIA forum thread 364958
    "Mar 27 17:40:36 kernel: NVRM: Xid (PCI:0000:01:00): 45, pid=12542, "
    "name=VLLM::Worker, channel 0x00000002",
    # NVIDIA/gpu-operator#1146
    "Dec  2 11:38:47 node-a kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, "
    "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been "
    "detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
    # stas00/ml-engineering debug.md
    "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for "
    "remapping, reset gpu to activate.",
    # NVIDIA/open-gpu-kernel-modules#446
    "[Fri Mar  3 04:28:38 2023] NVRM: Xid (PCI:0000:61:00): 119, pid=1346198, "
    "name=nvidia-smi, Timeout waiting for RPC from GSP! Expected function 76 "
    "(GSP_RM_CONTROL) (0x20800110 0x84).",
    # NVIDIA/nvtrust#124
    "[   38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, "
    "Link 44 Minion Link DLREQ interrupt",
    # Bumblebee-Project/Bumblebee#554
    "[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
)
_PCI_IN_LINE = re.compile(r"(PCI:|GPU at )([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})")


class SimulatorError(ValueError):
    """Bad simulator input (node, fault kind, schedule); the message names the value."""


def load_kernel_lines(path: str | Path) -> list[str]:
    """Lines to replay: plain text (one line each; blank and ``#`` lines skipped) or JSONL
    with a ``text`` field (the corpus format). Raises :class:`SimulatorError`."""
    try:
        raw = Path(path).read_text()
    except OSError as exc:
        raise SimulatorError(f"--kernel-lines {str(path)!r}: {exc.strerror}") from exc
    out: list[str] = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.lstrip().startswith("{"):
            try:
                text = json.loads(line)["text"]
            except (ValueError, KeyError, TypeError) as exc:
                raise SimulatorError(
                    f"--kernel-lines {str(path)!r} line {n}: JSON without 'text'"
                ) from exc
            out.append(str(text))
        else:
            out.append(line)
    if not out:
        raise SimulatorError(f"--kernel-lines {str(path)!r}: no lines")
    return out


@dataclass(frozen=True)
class ScheduledFault:
    """``NODE:KIND@SECONDS`` — inject KIND on NODE SECONDS after the start."""

    node: str
    kind: str
    at_s: float

    @classmethod
    def parse(cls, spec: str) -> ScheduledFault:
        """Parse ``gpu-02:slow@30``; raises :class:`SimulatorError` naming ``spec``."""
        m = re.fullmatch(r"([^:@\s]+):([A-Za-z0-9_]+)@(\d+(?:\.\d+)?)", spec.strip())
        if not m:
            raise SimulatorError(
                f"--fault {spec!r}: expected NODE:KIND@SECONDS, e.g. gpu-02:slow@30"
            )
        check_kind(m.group(2))
        return cls(m.group(1), m.group(2), float(m.group(3)))


def check_kind(kind: str) -> None:
    """Raise :class:`SimulatorError` unless ``kind`` is a known fault kind."""
    if kind not in FAULT_KINDS and not _CODE_KIND.match(kind):
        raise SimulatorError(
            f"fault kind {kind!r}: expected one of {', '.join(FAULT_KINDS)}, xidNN or sxidNN"
        )


class InjectedKernelLog:
    """In-memory kernel log of a simulated node: lines pushed by the simulator go through
    the real reader (same interface the agent uses for ``KernelLogFollower``)."""

    def __init__(self, reader_factory: Callable[[], LineReader]) -> None:
        self.reader = reader_factory()
        self.error: str | None = None
        self._lines: list[str] = []

    def push(self, text: str) -> None:
        self._lines.extend(text.splitlines())

    def poll(self) -> list[Any]:
        lines, self._lines = self._lines, []
        events: list[Any] = []
        for line in lines:
            events.extend(self.reader.feed(line))
        if lines:
            events.extend(self.reader.flush())
        return events

    def finish(self) -> list[Any]:
        """The end of the input: what was pushed and not yet polled, and what the reader
        still holds."""
        return [*self.poll(), *self.reader.flush()]

    def close(self) -> None:
        self._lines.clear()


class InjectedNccl:
    """In-memory NCCL trace of a simulated node (same interface as the trace follower)."""

    def __init__(self) -> None:
        self.error: str | None = None
        self._records: list[NcclRecord] = []

    def push(self, records: list[NcclRecord]) -> None:
        self._records.extend(records)

    def poll(self) -> list[Any]:
        out, self._records = self._records, []
        return out

    def close(self) -> None:
        self._records.clear()


def parse_slow_rank(spec: str) -> tuple[str, float]:
    """``NODE[:MS]`` → ``(node, ms)`` (default :data:`NCCL_LATE_MS`); raises
    :class:`SimulatorError` naming ``spec``."""
    m = re.fullmatch(r"([^:\s]+)(?::(\d+(?:\.\d+)?))?", spec.strip())
    if not m:
        raise SimulatorError(f"--slow-rank {spec!r}: expected NODE or NODE:MS, e.g. gpu-03:2.5")
    return m.group(1), float(m.group(2)) if m.group(2) else NCCL_LATE_MS


@dataclass
class SimNode:
    """One simulated node and its running agent."""

    name: str
    profile: str
    seed: int
    state_dir: Path
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    faults: set[str] = field(default_factory=set)
    silent: bool = False
    agent: Agent | None = None
    backend: SimulatedBackend | None = None
    kernel: InjectedKernelLog | None = None
    nccl: InjectedNccl | None = None
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event | None = None
    boots: int = 0


AUTH_REFUSED_STATUS = frozenset({401, 403})
"""Answers meaning the receiver refused the credential (OTLP/HTTP: 401 no or unknown
token, 403 a token that may not report for this node or cluster)."""
MAX_AUTH_REFUSALS = 10
"""Consecutive refused pushes (any node) after which the simulator stops: with a wrong or
missing token no push will ever be accepted (10: two rounds of a 4-node demo fleet plus
slack for a token file being replaced)."""


class _RefusalWatch:
    """A :class:`agent.otlp.Transport` that counts consecutive refused pushes of the whole
    fleet (:data:`AUTH_REFUSED_STATUS`) and calls ``on_limit(message)`` once at ``limit``;
    any accepted push resets the count."""

    def __init__(self, inner: Transport, sim: FleetSimulator) -> None:
        self.inner = inner
        self.sim = sim

    def _seen(self, result: PushResult) -> PushResult:
        self.sim._note_push(result)
        return result

    async def export_metrics(self, req: Any) -> PushResult:
        return self._seen(await self.inner.export_metrics(req))

    async def export_logs(self, req: Any) -> PushResult:
        return self._seen(await self.inner.export_logs(req))

    async def aclose(self) -> None:
        await self.inner.aclose()


class FleetSimulator:
    """N simulated agents sharing one event loop and one HTTP connection pool.

    ``transport_factory`` (node name → Transport) overrides the default shared-pool
    OTLP/HTTP transport. ``reader_factory`` is the kernel-log reader (production:
    ``agent.readers.KernelLogReader``). ``token``: bearer token of every push (one sender
    for many nodes: a collector token of the ingest service; ``None`` = none).
    ``max_auth_refusals``: after that many consecutive pushes answered 401/403 (any node)
    :meth:`run` stops and :attr:`refused` says why (``None`` = never stop).
    """

    def __init__(
        self,
        endpoint: str,
        cluster: str,
        nodes: int = 8,
        *,
        node_prefix: str = "gpu-",
        gpus_per_node: int = 8,
        push_interval_s: float = 10.0,
        sample_interval_s: float | None = None,
        inference_every: int = 4,
        state_dir: str | Path = ".autorepair/sim",
        kernel_lines: list[str] | None = None,
        seed: int = 1,
        transport_factory: Callable[[str], Transport] | None = None,
        reader_factory: Callable[[], LineReader] = default_reader,
        push: PushConfig | None = None,
        agent_overrides: dict[str, Any] | None = None,
        nccl_ranks: int | None = None,
        nccl_ops_per_s: float = 10.0,
        slow_ranks: dict[str, float] | None = None,
        token: str | None = None,
        max_auth_refusals: int | None = MAX_AUTH_REFUSALS,
    ) -> None:
        if nodes < 1:
            raise SimulatorError(f"--nodes: must be >= 1, got {nodes!r}")
        if nccl_ranks is not None and nccl_ranks < 2:
            raise SimulatorError(f"--nccl-comm: must be >= 2 ranks, got {nccl_ranks!r}")
        if not (nccl_ops_per_s > 0 and nccl_ops_per_s <= 10_000):
            raise SimulatorError(f"--nccl-ops-per-s: must be in (0, 10000], got {nccl_ops_per_s!r}")
        if slow_ranks and nccl_ranks is None:
            raise SimulatorError("--slow-rank: needs --nccl-comm RANKS")
        if not (math.isfinite(push_interval_s) and push_interval_s > 0):
            raise SimulatorError(
                f"--push-interval: must be a finite number of seconds > 0, got {push_interval_s!r}")
        if gpus_per_node < 1:
            raise SimulatorError(f"--gpus-per-node: must be >= 1, got {gpus_per_node!r}")
        self.endpoint = endpoint
        self.token = token
        self.max_auth_refusals = max_auth_refusals
        #: Why :meth:`run` stopped early: the receiver refused the credential (else None).
        self.refused: str | None = None
        self._refusals = 0
        self._run_stop: asyncio.Event | None = None
        self.cluster = cluster
        self.gpus_per_node = gpus_per_node
        self.push_interval_s = push_interval_s
        self.sample_interval_s = sample_interval_s or push_interval_s / 2
        self.kernel_lines = list(kernel_lines or BUILTIN_KERNEL_LINES)
        self.reader_factory = reader_factory
        self.transport_factory = transport_factory
        self.push = push or PushConfig()
        self.agent_overrides = agent_overrides or {}
        self.state_root = Path(state_dir)
        self._rng = random.Random(seed)
        self._kernel_pos = 0
        width = max(2, len(str(nodes)))
        self.nodes: dict[str, SimNode] = {}
        for i in range(1, nodes + 1):
            name = f"{node_prefix}{i:0{width}d}"
            profile = "inference" if inference_every and i % inference_every == 0 else "training"
            self.nodes[name] = SimNode(name, profile, seed * 1000 + i, self.state_root / name)
        self.nccl_model: TraceModel | None = None
        self.nccl_ops_per_s = nccl_ops_per_s
        if nccl_ranks is not None:
            try:
                self.nccl_model = TraceModel(
                    nccl_ranks, list(self.nodes), ranks_per_node=gpus_per_node,
                    comm=f"{seed:08x}c0ffee01", late=slow_ranks, seed=seed)
            except ValueError as exc:
                raise SimulatorError(f"--nccl-comm {nccl_ranks} / --slow-rank: {exc}") from None
        self._nccl_task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: ThreadingHTTPServer | None = None
        self.started_at = 0.0

    # ----- node lifecycle -------------------------------------------------------------
    def _node(self, name: str) -> SimNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise SimulatorError(
                f"node {name!r}: not in this simulator ({', '.join(list(self.nodes)[:4])}...)"
            ) from None

    def _make_agent(self, node: SimNode) -> Agent:
        cfg = AgentConfig(
            endpoint=self.endpoint, cluster=self.cluster, node=node.name, backend="simulated",
            push_interval_s=self.push_interval_s, sample_interval_s=self.sample_interval_s,
            expected_gpus=self.gpus_per_node, workload_type=node.profile,  # type: ignore[arg-type]
            node_pool=node.profile, state_dir=str(node.state_dir), kernel_log="none",
            push=self.push, **self.agent_overrides,
        )
        backend = SimulatedBackend(self.gpus_per_node, node.profile, seed=node.seed + node.boots)
        node.backend = backend
        node.kernel = InjectedKernelLog(self.reader_factory)
        node.nccl = InjectedNccl() if self.nccl_model is not None else None
        rng = random.Random(node.seed)
        transport: Transport
        if self.transport_factory is not None:
            transport = self.transport_factory(node.name)
        else:
            assert self._client is not None
            transport = HttpTransport(self.endpoint, token=self.token, client=self._client)
        transport = _RefusalWatch(transport, self)
        return Agent(
            cfg, backend, transport=transport,
            cpu=lambda: min(1.0, rng.gauss(0.97, 0.01)),
            memory=lambda: max(0.0, rng.gauss(0.45, 0.02)),
            kernel=node.kernel,
            boot_id=node.boot_id, host_id=f"sim-{self.cluster}-{node.name}",
            seed=node.seed, nccl=node.nccl,
        )

    def _start(self, node: SimNode, delay_s: float = 0.0) -> None:
        node.agent = self._make_agent(node)
        node.stop = asyncio.Event()
        agent, stop = node.agent, node.stop

        async def runner() -> None:
            if delay_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay_s)
            if not stop.is_set():
                await agent.run(stop)

        node.task = asyncio.create_task(runner(), name=f"agent-{node.name}")

    async def _stop(self, node: SimNode) -> None:
        if node.stop is not None and node.task is not None:
            node.stop.set()
            with contextlib.suppress(Exception):
                await node.task
        node.task = None

    # ----- faults ---------------------------------------------------------------------
    def _line_for(self, kind: str, node: SimNode) -> str:
        assert node.backend is not None
        m = _CODE_KIND.match(kind)
        if kind == "lost":
            pool = [ln for ln in self.kernel_lines if "fallen off the bus" in ln]
        elif m:
            word = "SXid" if m.group(1) == "sxid" else "Xid"
            pool = [ln for ln in self.kernel_lines
                    if re.search(rf"\b{word} \(PCI:[^)]*\): {m.group(2)},", ln)]
            if not pool:
                pci = node.backend.pci_of(0)
                return (f"NVRM: {word} (PCI:{pci}): {m.group(2)}, pid=4242, name=python, "
                        "(synthetic line from autorepair-agent simulate)")
        else:
            line = self.kernel_lines[self._kernel_pos % len(self.kernel_lines)]
            self._kernel_pos += 1
            pool = [line]
        line = pool[self._rng.randrange(len(pool))] if pool else (
            f"[    1.000000] NVRM: GPU at {node.backend.pci_of(0)}.0 has fallen off the bus.")
        pci = node.backend.pci_of(0)
        return _PCI_IN_LINE.sub(lambda mm: mm.group(1) + pci, line)

    async def inject(self, name: str, kind: str) -> None:
        """Inject ``kind`` on node ``name`` now. Raises :class:`SimulatorError`."""
        check_kind(kind)
        node = self._node(name)
        log.info("event=sim_fault node=%s kind=%s", name, kind)
        if kind == "silent":
            node.faults.add(kind)
            if not node.silent:
                node.silent = True
                await self._stop(node)
            return
        if node.backend is None or node.kernel is None:
            raise SimulatorError(f"node {name!r}: not running")
        f = node.backend.faults
        if kind == "slow":
            f.slow_factor = SLOW_FACTOR
            self._set_late(name, NCCL_LATE_MS)
        elif kind == "ecc":
            f.ecc_uncorrectable = 2
        elif kind == "remap":
            f.remap_pending = True
        elif kind == "outage":
            f.fail_reads = 5
        elif kind == "idle":
            f.idle = True
        elif kind == "lost":
            f.lost_gpus = 1
            node.kernel.push(self._line_for(kind, node))
        else:  # kernel, xidNN, sxidNN
            node.kernel.push(self._line_for(kind, node))
        if kind in ("slow", "ecc", "remap", "idle", "lost"):
            node.faults.add(kind)

    async def clear(self, name: str) -> None:
        """Remove every fault of ``name`` (a silent node starts pushing again)."""
        node = self._node(name)
        node.faults.clear()
        self._set_late(name, 0.0)
        if node.backend is not None:
            node.backend.faults = replace(SimFaults())
        if node.silent:
            node.silent = False
            self._start(node)

    async def reboot(self, name: str, downtime_s: float = 0.0) -> str:
        """Restart the node's agent: new boot id, faults cleared, baseline kept.
        Returns the new boot id."""
        node = self._node(name)
        await self._stop(node)
        node.faults.clear()
        node.silent = False
        node.boots += 1
        node.boot_id = str(uuid.uuid4())
        self._start(node, delay_s=downtime_s)
        log.info("event=sim_reboot node=%s boot_id=%s", name, node.boot_id)
        return node.boot_id

    async def reprovision(self, name: str, downtime_s: float = 0.0) -> str:
        """Reboot with a clean image: the persisted baseline is deleted (recalibrates)."""
        node = self._node(name)
        await self._stop(node)
        shutil.rmtree(node.state_dir, ignore_errors=True)
        return await self.reboot(name, downtime_s)

    def _set_late(self, name: str, ms: float) -> None:
        m = self.nccl_model
        if m is not None and name in m.node_ranks:
            m.set_late(name, ms)

    async def _nccl_loop(self) -> None:
        """Generate the communicator's ops at ``nccl_ops_per_s`` and hand every running
        node its ranks' timings (a silent node's ranks go missing, as with a dead rank)."""
        m = self.nccl_model
        assert m is not None
        start, made = time.monotonic(), 0
        while True:
            due = int((time.monotonic() - start) * self.nccl_ops_per_s) - made
            if due > 0:
                due = min(due, 1000)
                seqs, types, nbytes, durations = m.next_ops(due)
                made += due
                now_ns = time.time_ns()
                for name, node in self.nodes.items():
                    if node.nccl is not None and not node.silent and name in m.node_ranks:
                        node.nccl.push(m.records(name, seqs, types, nbytes, durations, now_ns))
            await asyncio.sleep(0.1)

    def status(self) -> list[dict[str, Any]]:
        """One dict per node: node, boot_id, profile, faults, silent, state, score, mode,
        threshold, straggler, pushed metrics, dropped metrics."""
        out = []
        for node in self.nodes.values():
            a = node.agent
            last = a.last if a else None
            out.append({
                "node": node.name, "boot_id": node.boot_id, "profile": node.profile,
                "faults": sorted(node.faults), "silent": node.silent,
                "state": last.state if last else None,
                "score": None if last is None or last.score is None else round(last.score, 4),
                "mode": a.mode if a else None, "threshold": a.threshold if a else None,
                "straggler": a.classifier.straggler if a else False,
                "metrics_sent": a.pusher.stats.metrics_sent if a else 0,
                "metrics_dropped": a.pusher.stats.metrics_dropped if a else 0,
            })
        return out

    def _note_push(self, result: PushResult) -> None:
        """Count a push answer (see :class:`_RefusalWatch`); stop the run at the limit."""
        if result.status in AUTH_REFUSED_STATUS:
            self._refusals += 1
        elif result.ok:
            self._refusals = 0
        if (self.max_auth_refusals is not None and self.refused is None
                and self._refusals >= self.max_auth_refusals):
            how = ("no token was sent: pass --token / --token-file / --data-dir, or set "
                   "AUTOREPAIR_AGENT_TOKEN" if not self.token else
                   "the token was refused: is it a collector token of this ingest "
                   "(ingest.tokens_file; the dev stack's DATA_DIR/collector.token)?")
            self.refused = (f"{self._refusals} pushes in a row refused with HTTP "
                            f"{result.status} by {self.endpoint}; {how}")
            if self._run_stop is not None:
                self._run_stop.set()

    # ----- run ------------------------------------------------------------------------
    async def start(self) -> None:
        """Start every node's agent, spread over one push interval."""
        self._loop = asyncio.get_running_loop()
        if self.transport_factory is None and self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.push.timeout_s,
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            )
        self.started_at = time.monotonic()
        for i, node in enumerate(self.nodes.values()):
            self._start(node, delay_s=self.push_interval_s * i / len(self.nodes))
        if self.nccl_model is not None and self._nccl_task is None:
            self._nccl_task = asyncio.create_task(self._nccl_loop(), name="sim-nccl")

    async def stop(self) -> None:
        """Stop every agent (each saves its baseline) and the control endpoint."""
        if self._nccl_task is not None:
            self._nccl_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._nccl_task
            self._nccl_task = None
        await asyncio.gather(*(self._stop(n) for n in self.nodes.values()))
        self.stop_control()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def run(self, stop: asyncio.Event, schedule: list[ScheduledFault] = ()) -> None:  # type: ignore[assignment]
        """Start, apply ``schedule`` at its offsets, run until ``stop`` (or until the
        receiver refused :attr:`max_auth_refusals` pushes in a row: :attr:`refused`), then
        stop."""
        self._run_stop = stop
        for f in schedule:
            self._node(f.node)
        await self.start()
        try:
            for f in sorted(schedule, key=lambda s: s.at_s):
                delay = self.started_at + f.at_s - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=delay)
                if stop.is_set():
                    break
                await self.inject(f.node, f.kind)
            await stop.wait()
        finally:
            await self.stop()

    # ----- control endpoint -----------------------------------------------------------
    def serve_control(self, port: int = 0) -> tuple[str, int]:
        """Start the loopback control endpoint; returns (host, port). Call from the loop."""
        loop = asyncio.get_running_loop()
        sim = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                log.debug("event=control_request " + format, *args)

            def _reply(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _run(self, coro: Any) -> Any:
                return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/nodes":
                    self._reply(200, self._run(_async(sim.status)))
                else:
                    self._reply(404, {"error": f"path {self.path!r}: not found"})

            def do_POST(self) -> None:
                parts = [p for p in self.path.split("/") if p]
                try:
                    if len(parts) == 4 and parts[0] == "nodes" and parts[2] == "fault":
                        self._run(sim.inject(parts[1], parts[3]))
                    elif len(parts) == 3 and parts[0] == "nodes" and parts[2] == "clear":
                        self._run(sim.clear(parts[1]))
                    elif len(parts) == 3 and parts[0] == "nodes" and parts[2] == "reboot":
                        self._run(sim.reboot(parts[1]))
                    elif len(parts) == 3 and parts[0] == "nodes" and parts[2] == "reprovision":
                        self._run(sim.reprovision(parts[1]))
                    else:
                        self._reply(404, {"error": f"path {self.path!r}: not found"})
                        return
                except SimulatorError as exc:
                    code = 404 if str(exc).startswith("node ") else 400
                    self._reply(code, {"error": str(exc)})
                    return
                node = sim.nodes[parts[1]]
                self._reply(200, {"node": node.name, "boot_id": node.boot_id,
                                  "faults": sorted(node.faults), "silent": node.silent})

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="sim-control", daemon=True).start()
        self._server = server
        host, bound = server.server_address[:2]
        return str(host), int(bound)

    def stop_control(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


async def _async(fn: Callable[[], Any]) -> Any:
    return fn()
