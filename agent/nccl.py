"""NCCL collective timings on the agent: the JSON-lines trace, its OTLP form, a trace model.

A training job feeds the agent through a JSON-lines file (``autorepair-agent run
--nccl-trace FILE``) that an NCCL profiler plugin (NCCL ≥ 2.23 profiler API: the
``ncclProfileColl`` event carries ``commHash``, ``seqNumber`` and ``func``; ``init`` of
plugin API v4 and later carries ``nranks`` and ``rank``) or a thin wrapper around the
collective calls appends to, one line per rank and collective::

    {"comm": "7f3a9c2e51d04b18", "op": "AllReduce", "seq": 1042, "rank": 3,
     "nranks": 16, "bytes": 26214400, "duration_ms": 12.84, "ts": 1718000000.123}

``comm`` (string, or an integer written as hex), ``op``, ``seq`` (≥ 0), ``rank``
(0 ≤ rank < nranks), ``nranks`` (≥ 1) and ``duration_ms`` (≥ 0, the rank's time from its
start of the collective to its end) are required; ``bytes`` and ``ts`` (epoch seconds at
the end of the op) are optional. The agent follows the file (rotation handled, lines read
from where it starts) and sends each line as one data point of the gauge
``autorepair.nccl.collective.duration_ms`` (docs/design.md §4.5) with the attributes
``nccl.comm_id_hash``, ``nccl.op_type``, ``nccl.op_seq``, ``nccl.rank``, ``nccl.nranks``,
``nccl.bytes``. Malformed lines are counted and skipped, never raised.

:class:`TraceModel` produces realistic per-rank timings for ``autorepair-agent simulate``,
the tests and the benchmark, with planted late nodes.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, NumberDataPoint

from agent.otlp import key_values

METRIC = "autorepair.nccl.collective.duration_ms"
ATTR_COMM = "nccl.comm_id_hash"
ATTR_OP_TYPE = "nccl.op_type"
ATTR_OP_SEQ = "nccl.op_seq"
ATTR_RANK = "nccl.rank"
ATTR_NRANKS = "nccl.nranks"
ATTR_BYTES = "nccl.bytes"

MAX_LINE_CHARS = 4096
"""Longest trace line read; a longer one is malformed (a record is ~150 characters)."""
MAX_FIELD_CHARS = 128
"""Longest ``comm`` / ``op`` value (a 64-bit hash in hex is 16 characters)."""


@dataclass(frozen=True, slots=True)
class NcclRecord:
    """One rank's timing of one collective (a trace line)."""

    comm: str
    op_type: str
    seq: int
    rank: int
    nranks: int
    duration_ms: float
    nbytes: int | None = None
    time_ns: int = 0


def _int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def parse_line(line: str) -> NcclRecord | str:
    """One trace line → :class:`NcclRecord`, or the reason it is malformed (naming the
    field and value). Never raises."""
    if len(line) > MAX_LINE_CHARS:
        return f"line longer than {MAX_LINE_CHARS} characters"
    try:
        obj = json.loads(line)
    except ValueError:
        return f"not JSON: {line[:60]!r}"
    if not isinstance(obj, dict):
        return f"not a JSON object: {line[:60]!r}"
    comm = obj.get("comm")
    if isinstance(comm, int) and not isinstance(comm, bool):
        comm = format(comm, "x")
    if not isinstance(comm, str) or not comm or len(comm) > MAX_FIELD_CHARS:
        return f"comm: {str(comm)[:60]!r} is not a non-empty string"
    op = obj.get("op")
    if not isinstance(op, str) or not op or len(op) > MAX_FIELD_CHARS:
        return f"op: {str(op)[:60]!r} is not a non-empty string"
    seq, rank, nranks = _int(obj.get("seq")), _int(obj.get("rank")), _int(obj.get("nranks"))
    if seq is None or seq < 0:
        return f"seq: {obj.get('seq')!r} is not an integer >= 0"
    if nranks is None or nranks < 1:
        return f"nranks: {obj.get('nranks')!r} is not an integer >= 1"
    if rank is None or not 0 <= rank < nranks:
        return f"rank: {obj.get('rank')!r} is not an integer in [0, {nranks})"
    d = obj.get("duration_ms")
    if isinstance(d, bool) or not isinstance(d, int | float) or not math.isfinite(d) or d < 0:
        return f"duration_ms: {d!r} is not a finite number >= 0"
    nbytes = obj.get("bytes")
    nb = _int(nbytes) if nbytes is not None else None
    if nbytes is not None and (nb is None or nb < 0):
        return f"bytes: {nbytes!r} is not an integer >= 0"
    ts = obj.get("ts")
    t_ns = 0
    if ts is not None:
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) \
                or ts < 0:
            return f"ts: {ts!r} is not epoch seconds"
        t_ns = int(ts * 1e9)
    return NcclRecord(comm, op, seq, rank, nranks, float(d), nb, t_ns)


class NcclLineReader:
    """Line reader for :class:`agent.kmsg.KernelLogFollower` (the same file follower as
    the kernel log): ``feed(line)`` → ``[NcclRecord]`` or ``[]``; malformed lines are
    counted in ``malformed`` with the last reason in ``last_error``."""

    def __init__(self) -> None:
        self.malformed = 0
        self.last_error: str | None = None

    def feed(self, line: str) -> list[NcclRecord]:
        line = line.strip()
        if not line:
            return []
        rec = parse_line(line)
        if isinstance(rec, str):
            self.malformed += 1
            self.last_error = rec
            return []
        return [rec]

    def flush(self) -> list[NcclRecord]:
        return []


class NcclBuffer:
    """Records waiting for the next push; beyond ``max_points`` the oldest are dropped and
    counted in ``dropped`` (the same policy as the agent's metric queue)."""

    def __init__(self, max_points: int = 100_000) -> None:
        if max_points < 1:
            raise ValueError(f"max_points: must be >= 1, got {max_points!r}")
        self.max_points = max_points
        self.dropped = 0
        self._q: deque[NcclRecord] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def extend(self, records: Iterable[NcclRecord]) -> None:
        self._q.extend(records)
        over = len(self._q) - self.max_points
        for _ in range(max(0, over)):
            self._q.popleft()
        self.dropped += max(0, over)

    def take(self) -> list[NcclRecord]:
        out = list(self._q)
        self._q.clear()
        return out


def nccl_metric(records: Sequence[NcclRecord], now_ns: int | None = None) -> Metric:
    """One gauge ``autorepair.nccl.collective.duration_ms`` (unit ``ms``) with a data point
    per record (docs/design.md §4.5 attributes)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    points = []
    for r in records:
        attrs: dict[str, str | int] = {
            ATTR_COMM: r.comm, ATTR_OP_TYPE: r.op_type, ATTR_OP_SEQ: r.seq,
            ATTR_RANK: r.rank, ATTR_NRANKS: r.nranks,
        }
        if r.nbytes is not None:
            attrs[ATTR_BYTES] = r.nbytes
        points.append(NumberDataPoint(time_unix_nano=r.time_ns or now_ns,
                                      as_double=r.duration_ms, attributes=key_values(attrs)))
    return Metric(name=METRIC, unit="ms", gauge=Gauge(data_points=points))


# ------------------------------------------------------------------------ trace model
#: A training step of a sharded data-parallel job (FSDP / ZeRO-3): per layer group one
#: AllGather of parameters and one ReduceScatter of gradients, then a small AllReduce
#: (gradient norm / loss). 25 MiB buckets: PyTorch DDP's default ``bucket_cap_mb=25``.
STEP_OPS: tuple[tuple[str, int], ...] = (
    ("AllGather", 25 << 20), ("ReduceScatter", 25 << 20),
    ("AllGather", 25 << 20), ("ReduceScatter", 25 << 20),
    ("AllGather", 25 << 20), ("ReduceScatter", 25 << 20),
    ("AllReduce", 4096),
)
#: Bytes each rank moves per byte of payload, ring algorithm (nccl-tests PERFORMANCE.md
#: "bus bandwidth": AllReduce 2(n−1)/n, AllGather and ReduceScatter (n−1)/n, Broadcast 1).
_BUS_FACTOR = {"AllReduce": lambda n: 2 * (n - 1) / n, "AllGather": lambda n: (n - 1) / n,
               "ReduceScatter": lambda n: (n - 1) / n, "Broadcast": lambda n: 1.0}


class TraceModel:
    """Per-rank collective timings of one communicator, with planted late nodes.

    Ranks ``r`` live on ``nodes[r // ranks_per_node]`` (``nodes`` must host them all). Per
    op: every rank arrives after a compute jitter ``|N(0, jitter_ms)|`` (plus ``late`` ms
    for a rank on a node of ``late``); the collective runs ``latency + factor × bytes /
    bus_gbps`` once the last rank arrived; each rank ends within ``|N(0, end_jitter_ms)|``
    of that; its duration is its end minus its own arrival — so the late rank has the
    *shortest* duration and its peers wait for it (as in a real synchronous collective).

    Defaults: ``bus_gbps`` 40 GB/s (an NDR 400 Gb/s InfiniBand rail carries at most 50 GB/s;
    nccl-tests reach ~80–90 % of it), ``jitter_ms`` 0.2 ms of arrival skew between ranks.
    Raises ``ValueError`` naming the argument on bad input.
    """

    def __init__(
        self, nranks: int, nodes: Sequence[str], *, ranks_per_node: int = 8,
        comm: str = "c0ffee0000000001", late: Mapping[str, float] | None = None,
        jitter_ms: float = 0.2, end_jitter_ms: float = 0.01, bus_gbps: float = 40.0,
        latency_ms: float = 0.03, step: Sequence[tuple[str, int]] = STEP_OPS, seed: int = 0,
    ) -> None:
        if nranks < 1:
            raise ValueError(f"nranks: must be >= 1, got {nranks!r}")
        if ranks_per_node < 1:
            raise ValueError(f"ranks_per_node: must be >= 1, got {ranks_per_node!r}")
        if len(nodes) * ranks_per_node < nranks:
            raise ValueError(f"nodes: {len(nodes)} nodes × {ranks_per_node} ranks cannot host "
                             f"{nranks} ranks")
        unknown = set(late or {}) - set(nodes)
        if unknown:
            raise ValueError(f"late: node(s) {sorted(unknown)} not among the nodes")
        for name, v in (("jitter_ms", jitter_ms), ("end_jitter_ms", end_jitter_ms),
                        ("latency_ms", latency_ms)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
        if not bus_gbps > 0:
            raise ValueError(f"bus_gbps: must be > 0, got {bus_gbps!r}")
        if not step:
            raise ValueError("step: needs at least one (op, bytes)")
        self.nranks = nranks
        self.comm = comm
        self.rank_node = [nodes[r // ranks_per_node] for r in range(nranks)]
        self.node_ranks: dict[str, list[int]] = {}
        for r, n in enumerate(self.rank_node):
            self.node_ranks.setdefault(n, []).append(r)
        self.extra = np.zeros(nranks)
        for node, ms in (late or {}).items():
            self.extra[self.node_ranks.get(node, [])] = ms
        self.jitter_ms = jitter_ms
        self.end_jitter_ms = end_jitter_ms
        self.bus = bus_gbps * 1e9
        self.latency_ms = latency_ms
        self.step = list(step)
        self.seq = 0
        self.rng = np.random.default_rng(seed)

    def set_late(self, node: str, ms: float) -> None:
        """Make ``node``'s ranks arrive ``ms`` late from now on (0 = on time again)."""
        if node not in self.node_ranks:
            raise ValueError(f"node: {node!r} hosts no rank of communicator {self.comm}")
        self.extra[self.node_ranks[node]] = ms

    def next_ops(self, k: int) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
        """The next ``k`` ops: ``(seq (k,), op types, bytes (k,), durations_ms (k, nranks))``."""
        n = self.nranks
        seqs = np.arange(self.seq, self.seq + k, dtype=np.int64)
        kinds = [self.step[int(s) % len(self.step)] for s in seqs]
        self.seq += k
        nbytes = np.array([b for _, b in kinds], dtype=np.int64)
        factor = np.array([_BUS_FACTOR.get(t, _BUS_FACTOR["AllReduce"])(max(n, 2))
                           for t, _ in kinds])
        run = self.latency_ms * math.log2(max(n, 2)) + factor * nbytes / self.bus * 1e3
        arrive = np.abs(self.rng.normal(0.0, self.jitter_ms, (k, n))) + self.extra
        end = arrive.max(axis=1, keepdims=True) + run[:, None] \
            + np.abs(self.rng.normal(0.0, self.end_jitter_ms, (k, n)))
        return seqs, [t for t, _ in kinds], nbytes, end - arrive

    def records(self, node: str, seqs: np.ndarray, types: Sequence[str], nbytes: np.ndarray,
                durations: np.ndarray, time_ns: int = 0) -> list[NcclRecord]:
        """The trace lines ``node`` would write for ops from :meth:`next_ops`."""
        ranks = self.node_ranks.get(node, [])
        out = []
        for i in range(len(seqs)):
            for r in ranks:
                out.append(NcclRecord(self.comm, types[i], int(seqs[i]), r, self.nranks,
                                      float(durations[i, r]), int(nbytes[i]), time_ns))
        return out
