"""NCCL collective health: per-op peer lag and slow-rank attribution (docs/design.md §4.5).

Input: per-rank collective durations, the ``autorepair.nccl.collective.duration_ms`` points
decoded by :mod:`ingest.nccl_wire`. For each (cluster, communicator, op sequence) the
:class:`NcclEngine` collects every rank's duration; when all ``nranks`` ranks have reported
(or the op ages out with enough of them) it computes each rank's **lag**:

    lag[r] = median(duration of the other ranks) − duration[r]        (milliseconds)

Why this sign: a collective is synchronous — no rank finishes before the last one has
contributed — so the ranks of one op finish together (within jitter) and a rank's duration
is *common end − its own arrival*. The rank that arrives last waits least: its duration is
the shortest, and ``median(peers) − duration`` estimates how long after its peers it
arrived, i.e. how long they waited for it. No clocks of different nodes are compared. An
early rank gets a negative lag (it waited for the others).

Attribution, per communicator, over a sliding window of ``window_ops`` completed ops: in
each op the rank with the largest lag (at least ``min_lag_ms``) "arrived last". A node is
**attributed** when, with at least ``min_ops`` ops in the window,

- the share of the window's ops in which one of its ranks arrived last is ≥ ``min_share``,
- and the median over the window of its ranks' largest lag per op is
  ≥ max(``min_lag_ms``, ``noise_multiplier`` × noise), where noise = 1.4826 × the median
  over ranks of each rank's MAD of lag over the window (1.4826: consistency constant of the
  MAD for normal data). A balanced communicator's lags are pure jitter: every rank is last
  about 1/nranks of the time and its median lag is near 0, so neither test passes.

It stays attributed while its share is ≥ ``clear_share`` and its median lag ≥ half the
bound (hysteresis). An attribution that holds for ``alert_ops`` more ops becomes an
observed ``nccl_slow_rank`` alert naming the node that hosts the rank (an
:class:`NcclEdge`); its end, or the communicator's expiry, clears it. Attribution is per
node because the alert and ``autorepair_nccl_slow_rank_info`` name nodes, and a slow node's
eight GPUs share the lateness (each of its ranks alone is last only 1/8 of the time).
Communicators of fewer than :data:`MIN_ATTRIBUTION_RANKS` ranks are measured, never
attributed.

Bounded memory: at most ``max_ranks`` ranks over all communicators (the least recently
updated communicator of the owner holding the most ranks is evicted to admit a new one;
each sender identity may open a bounded number, ``ingest.limits``), each costing
4 bytes × (pending op slots ≤ ``max_pending_ops`` + ``window_ops``); a communicator
silent for ``comm_ttl_s`` is forgotten; an op still missing ranks after ``op_timeout_s``,
or the oldest op when the pending slots are full, is closed with the ranks it has (dropped below
``min_present_fraction`` of ``nranks``).

Pure and synchronous (numpy only); callers pass ``now`` (epoch seconds). Nothing raises
on bad points: they are rejected with a reason (returned and counted in
:attr:`NcclEngine.rejected`).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from workflows.config import NcclConfig

MIN_ATTRIBUTION_RANKS = 3
"""Smallest communicator that is attributed: with two ranks, one arriving late and the
other being slow inside the collective produce the same pair of durations."""

MAD_TO_SIGMA = 1.4826
"""Consistency constant of the MAD for normally distributed data."""

NOISE_FLOOR_MS = 0.001
"""Lower bound of the noise scale (1 µs, the resolution of the profiler's timestamps), so
perfectly regular synthetic traces still have a finite bound."""

LAG_BUCKETS_MS: tuple[float, ...] = (
    0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0,
)
"""Upper bounds of ``autorepair_nccl_rank_lag_ms`` (ms): from small-message collective
latency (tens of µs in nccl-tests) to a rank seconds late; ``le=0`` holds the early ranks."""

NOISE_SAMPLE_RANKS = 256
"""Ranks sampled for the noise scale: the median of 256 per-rank MADs is within a few
per cent of the median over all ranks, at a fraction of the cost for large communicators."""

NCCL_OWNER_REFUSED = "nccl.comm: this identity holds"
"""Start of the rejection reason of a point refused by the per-identity communicator cap."""

INITIAL_PENDING_SLOTS = 8
"""Pending op slots a new communicator starts with; doubled on demand up to
``max_pending_ops``."""


@dataclass(frozen=True, slots=True)
class NcclEdge:
    """Raise (``active``) or clear of the ``nccl_slow_rank`` alert for ``node``.

    ``ranks``: the node's ranks that arrived last within the window; ``share``: fraction
    of the window's ops in which one of them did; ``median_lag_ms``: median over the window
    of their largest lag per op; ``noise_ms``: the communicator's noise scale;
    ``op_types``: op type → count in the window; ``at``: epoch seconds.
    """

    cluster: str
    comm: str
    node: str
    active: bool
    nranks: int
    ranks: tuple[int, ...]
    share: float
    median_lag_ms: float
    noise_ms: float
    window_ops: int
    op_types: dict[str, int]
    at: float

    def evidence(self) -> dict[str, Any]:
        """The alert's machine-readable evidence payload."""
        return {
            "comm": self.comm, "nranks": self.nranks, "ranks": list(self.ranks),
            "share": round(self.share, 4), "median_lag_ms": round(self.median_lag_ms, 4),
            "noise_ms": round(self.noise_ms, 4), "window_ops": self.window_ops,
            "op_types": dict(self.op_types), "classified_by": "ingest",
        }

    def text(self) -> str:
        """Plain evidence text of the alert."""
        if not self.active:
            return (f"NCCL communicator {self.comm} ({self.nranks} ranks): ranks on "
                    f"{self.node} no longer arrive last (share {self.share:.2f}, median lag "
                    f"{self.median_lag_ms:.3f} ms)")
        ranks = ", ".join(str(r) for r in self.ranks[:16])
        types = ", ".join(f"{k} {v}" for k, v in sorted(self.op_types.items()))
        return (f"NCCL communicator {self.comm} ({self.nranks} ranks): rank(s) {ranks} on "
                f"{self.node} arrived last in {self.share:.0%} of the last {self.window_ops} "
                f"collectives, median {self.median_lag_ms:.3f} ms behind their peers' median "
                f"(noise {self.noise_ms:.3f} ms; ops: {types})")


@dataclass(slots=True)
class Attribution:
    """A node currently attributed in one communicator."""

    node: str
    share: float
    median_lag_ms: float
    ranks: tuple[int, ...]
    ops: int = 0
    alerted: bool = False


@dataclass(slots=True)
class _Comm:
    cluster: str
    comm: str
    n: int
    window: int
    last_seen: float
    # pending ops
    pend: np.ndarray
    p_seq: np.ndarray
    p_count: np.ndarray
    p_first: np.ndarray
    p_type: list[str]
    slot_of: dict[int, int] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)
    done: set[int] = field(default_factory=set)
    done_order: deque[int] = field(default_factory=deque)
    # rank → node
    rank_node: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    node_names: list[str] = field(default_factory=list)
    node_ids: dict[str, int] = field(default_factory=dict)
    # window (ring buffer over completed ops)
    lags: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    last_node: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    last_rank: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    w_type: list[str] = field(default_factory=list)
    pos: int = 0
    filled: int = 0
    ops_total: int = 0
    noise_ms: float = math.nan
    noise_at: int = -1
    hist: np.ndarray = field(default_factory=lambda: np.zeros(len(LAG_BUCKETS_MS) + 1, np.int64))
    hist_sum: float = 0.0
    attributed: dict[int, Attribution] = field(default_factory=dict)
    #: identity whose point opened the communicator (``ingest.quota``; None: no identity)
    owner: str | None = None


def peer_median(values: np.ndarray) -> np.ndarray:
    """For each element, the median of the *other* elements (leave-one-out median).

    ``values``: 1-D float array, length n ≥ 2. Returns a float64 array of length n. O(n):
    one ``np.partition`` at the two or three middle order statistics; element ``r`` at
    sorted position ``p`` sees ``s[k+1]`` instead of ``s[k]`` when ``p ≤ k``, which the
    comparison ``values[r] <= s[k]`` decides (ties give equal values either way).
    Raises ``ValueError`` for n < 2.
    """
    v = np.asarray(values, dtype=np.float64)
    n = v.shape[0]
    if n < 2:
        raise ValueError(f"values: need at least 2 elements, got {n}")
    if n % 2 == 0:
        k = n // 2 - 1
        s = np.partition(v, (k, k + 1))
        return np.where(v <= s[k], s[k + 1], s[k])
    k1 = (n - 3) // 2
    s = np.partition(v, (k1, k1 + 1, k1 + 2))
    lo = np.where(v <= s[k1], s[k1 + 1], s[k1])
    hi = np.where(v <= s[k1 + 1], s[k1 + 2], s[k1 + 1])
    return (lo + hi) / 2.0


class NcclEngine:
    """Per-communicator op assembly, lag and slow-rank attribution (module docstring).

    Counters (read by ``/metrics`` and the benchmark): ``ops`` (``complete`` / ``aged`` /
    ``dropped``), ``rejected`` (reason → points), ``points``, ``late_points`` (for an op
    already closed), ``ignored_points`` (one-rank communicators), ``comms_evicted``,
    ``comms_expired``. :meth:`drain` hands out the alert edges produced since the last call.
    """

    def __init__(self, config: NcclConfig | None = None) -> None:
        self.cfg = config or NcclConfig()
        self.comms: OrderedDict[tuple[str, str], _Comm] = OrderedDict()
        self.total_ranks = 0
        self.ops: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.points = 0
        self.late_points = 0
        self.ignored_points = 0
        self.comms_evicted = 0
        self.comms_expired = 0
        self._edges: list[NcclEdge] = []
        #: communicators held per owner (identity label) and ranks per owner ("" = none)
        self.owned: dict[str, int] = {}
        self.owner_ranks: dict[str, int] = {}
        self.owner_refused = 0
        self._bounds = np.asarray(LAG_BUCKETS_MS, dtype=np.float64)

    # ------------------------------------------------------------------ input
    def observe(
        self, cluster: str, node: str, comm: str, op_seq: int, op_type: str, rank: int,
        nranks: int, duration_ms: float, now: float,
    ) -> str | None:
        """One data point. Returns None when accepted (or ignored), else the rejection
        reason (also counted in :attr:`rejected`)."""
        bad = self.observe_batch(
            cluster, node, comm, nranks, np.asarray([op_seq], np.int64),
            np.asarray([rank], np.int64), np.asarray([duration_ms], np.float64), [op_type], now)
        return bad[0][0] if bad else None

    def observe_batch(
        self, cluster: str, node: str, comm: str, nranks: int, op_seq: ArrayLike,
        rank: ArrayLike, duration_ms: ArrayLike, op_type: Sequence[str] | str, now: float,
        *, owner: str | None = None, owner_cap: int | None = None,
    ) -> list[tuple[str, int]]:
        """Points of one node for one communicator: aligned arrays (or lists) ``op_seq`` (int),
        ``rank`` (int), ``duration_ms`` (float) and ``op_type`` (one per point, or one
        for all). Returns ``[(reason, count), ...]`` for the rejected points (counted in
        :attr:`rejected`); never raises on bad values.

        ``owner``: the sender's identity label; a point that would open a new communicator
        while ``owner`` already holds ``owner_cap`` of them is rejected (reason starting
        ``nccl.comm: identity``; counted in :attr:`owner_refused`), so one identity cannot
        fill the engine and evict other senders' communicators (``ingest.limits``)."""
        seq = np.asarray(op_seq, dtype=np.int64).ravel()
        rk = np.asarray(rank, dtype=np.int64).ravel()
        dur = np.asarray(duration_ms, dtype=np.float64).ravel()
        total = seq.shape[0]
        out: list[tuple[str, int]] = []
        if rk.shape[0] != total or dur.shape[0] != total or (
                not isinstance(op_type, str) and len(op_type) != total):
            out.append(("nccl: columns of unequal length", total))
            return self._count(out)
        if total == 0:
            return out
        if not 1 <= nranks <= self.cfg.max_nranks:
            out.append((f"nccl.nranks: {nranks} outside [1, {self.cfg.max_nranks}]", total))
            return self._count(out)
        if nranks == 1:
            self.ignored_points += total
            return out
        ok = (rk >= 0) & (rk < nranks) & (seq >= 0) & (dur >= 0) & (dur < math.inf)
        if not ok.all():
            out += self._reasons(seq, rk, dur, nranks)
        key = (cluster, comm)
        c = self.comms.get(key)
        if c is not None and c.n != nranks:
            out.append((f"nccl.nranks: {nranks} differs from communicator {comm}'s "
                        f"{c.n}", int(np.count_nonzero(ok))))
            return self._count(out)
        if not ok.any():
            return self._count(out)
        if not ok.all():
            seq, rk, dur = seq[ok], rk[ok], dur[ok]
            if not isinstance(op_type, str):
                op_type = [t for t, good in zip(op_type, ok.tolist(), strict=True) if good]
        if c is None:
            if (owner is not None and owner_cap is not None
                    and self.owned.get(owner, 0) >= owner_cap):
                self.owner_refused += 1
                out.append((f"{NCCL_OWNER_REFUSED} {owner_cap} communicators "
                            "(ingest.limits.nccl_communicators_per_identity)",
                            int(seq.shape[0])))
                return self._count(out)
            c = self._new_comm(cluster, comm, nranks, now, owner)
        else:
            self.comms.move_to_end(key)
        c.last_seen = now
        self.points += seq.shape[0]
        nid = c.node_ids.get(node)
        if nid is None:
            nid = c.node_ids[node] = len(c.node_names)
            c.node_names.append(node)
        c.rank_node[rk] = nid
        m = seq.shape[0]
        if m > 1 and not bool(np.all(seq[1:] >= seq[:-1])):
            order = np.argsort(seq, kind="stable")
            seq, rk, dur = seq[order], rk[order], dur[order]
            if not isinstance(op_type, str):
                op_type = [op_type[int(i)] for i in order]
        cuts = [0, *(np.flatnonzero(seq[1:] != seq[:-1]) + 1).tolist(), m] if m > 1 else [0, 1]
        for a, b in itertools.pairwise(cuts):
            t = op_type if isinstance(op_type, str) else op_type[a]
            self._put(c, int(seq[a]), t, rk[a:b], dur[a:b], now)
        return self._count(out)

    @staticmethod
    def _reasons(seq: np.ndarray, rk: np.ndarray, dur: np.ndarray,
                 nranks: int) -> list[tuple[str, int]]:
        """One reason per kind of bad point, quoting the first bad value, with its count."""
        out: list[tuple[str, int]] = []
        taken = np.zeros(seq.shape[0], dtype=bool)
        for mask, what in (((rk < 0) | (rk >= nranks), "rank"), (seq < 0, "seq"),
                           (~((dur >= 0) & (dur < math.inf)), "dur")):
            mask &= ~taken
            k = int(np.count_nonzero(mask))
            if not k:
                continue
            i = int(np.flatnonzero(mask)[0])
            if what == "rank":
                msg = f"nccl.rank: {int(rk[i])} outside [0, nranks {nranks})"
            elif what == "seq":
                msg = f"nccl.op_seq: {int(seq[i])} is negative"
            else:
                msg = f"duration_ms: {float(dur[i])!r} is not a finite number >= 0"
            out.append((msg, k))
            taken |= mask
        return out

    def _count(self, out: list[tuple[str, int]]) -> list[tuple[str, int]]:
        for reason, k in out:
            self.rejected[reason] += k
        return out

    def _victim(self) -> tuple[str, str]:
        """Key of the communicator to evict: the least recently updated one of the owner
        holding the most ranks (a flooding identity evicts its own first)."""
        biggest = max(self.owner_ranks, key=lambda o: self.owner_ranks[o])
        return next(k for k, c in self.comms.items() if (c.owner or "") == biggest)

    def _new_comm(self, cluster: str, comm: str, n: int, now: float,
                  owner: str | None = None) -> _Comm:
        while self.comms and self.total_ranks + n > self.cfg.max_ranks:
            old = self.comms.pop(self._victim())
            self._forget(old, now)
            self.comms_evicted += 1
        cap = min(INITIAL_PENDING_SLOTS, self.cfg.max_pending_ops)
        w = self.cfg.window_ops
        c = _Comm(
            cluster=cluster, comm=comm, n=n, window=w, last_seen=now,
            pend=np.full((cap, n), np.nan, np.float32), p_seq=np.full(cap, -1, np.int64),
            p_count=np.zeros(cap, np.int64), p_first=np.zeros(cap, np.float64),
            p_type=[""] * cap, free=list(range(cap - 1, -1, -1)),
            rank_node=np.full(n, -1, np.int32),
            lags=np.full((w, n), np.nan, np.float32), last_node=np.full(w, -1, np.int32),
            last_rank=np.full(w, -1, np.int32), w_type=[""] * w, owner=owner,
        )
        self.comms[(cluster, comm)] = c
        self.total_ranks += n
        key = owner or ""
        self.owner_ranks[key] = self.owner_ranks.get(key, 0) + n
        if owner is not None:
            self.owned[owner] = self.owned.get(owner, 0) + 1
        return c

    def _forget(self, c: _Comm, now: float) -> None:
        """Drop a communicator: clear edges for its alerted nodes."""
        self.total_ranks -= c.n
        key = c.owner or ""
        left = self.owner_ranks.get(key, 0) - c.n
        if left > 0:
            self.owner_ranks[key] = left
        else:
            self.owner_ranks.pop(key, None)
        if c.owner is not None:
            k = self.owned.get(c.owner, 0) - 1
            if k > 0:
                self.owned[c.owner] = k
            else:
                self.owned.pop(c.owner, None)
        for a in c.attributed.values():
            if a.alerted:
                self._edges.append(self._edge(c, a, False, now))
        c.attributed.clear()

    def _put(self, c: _Comm, seq: int, op_type: str, ranks: np.ndarray, dur: np.ndarray,
             now: float) -> None:
        slot = c.slot_of.get(seq)
        if slot is None:
            if seq in c.done:
                self.late_points += ranks.shape[0]
                return
            slot = self._alloc(c, now)
            c.slot_of[seq] = slot
            c.p_seq[slot] = seq
            c.p_count[slot] = 0
            c.p_first[slot] = now
            c.p_type[slot] = op_type
        row = c.pend[slot]
        # a rank sent twice for one op counts once; within one batch a repeat is counted
        # twice, which can only close the op one rank early (the lag uses what is present)
        c.p_count[slot] += int(np.count_nonzero(np.isnan(row[ranks])))
        row[ranks] = dur
        if c.p_count[slot] >= c.n:
            self._close(c, slot, now, complete=True)

    def _alloc(self, c: _Comm, now: float) -> int:
        if not c.free:
            cap = c.pend.shape[0]
            if cap < self.cfg.max_pending_ops:
                new = min(cap * 2, self.cfg.max_pending_ops)
                grow = new - cap
                c.pend = np.vstack([c.pend, np.full((grow, c.n), np.nan, np.float32)])
                c.p_seq = np.concatenate([c.p_seq, np.full(grow, -1, np.int64)])
                c.p_count = np.concatenate([c.p_count, np.zeros(grow, np.int64)])
                c.p_first = np.concatenate([c.p_first, np.zeros(grow, np.float64)])
                c.p_type.extend([""] * grow)
                c.free.extend(range(new - 1, cap - 1, -1))
            else:
                used = np.flatnonzero(c.p_seq >= 0)
                oldest = int(used[np.argmin(c.p_seq[used])])
                self._close(c, oldest, now, complete=False)
        return c.free.pop()

    # ---------------------------------------------------------------- closing
    def _close(self, c: _Comm, slot: int, now: float, *, complete: bool) -> None:
        seq = int(c.p_seq[slot])
        row = c.pend[slot]
        op_type = c.p_type[slot]
        del c.slot_of[seq]
        c.p_seq[slot] = -1
        c.free.append(slot)
        c.done.add(seq)
        c.done_order.append(seq)
        if len(c.done_order) > 4 * self.cfg.max_pending_ops:
            c.done.discard(c.done_order.popleft())
        if complete and not np.isnan(row).any():
            vals = row.astype(np.float64)
            present = None
        else:
            mask = ~np.isnan(row)
            k = int(np.count_nonzero(mask))
            if k < 2 or k < self.cfg.min_present_fraction * c.n:
                self.ops["dropped"] += 1
                row.fill(np.nan)
                return
            present = np.flatnonzero(mask)
            vals = row[present].astype(np.float64)
        row.fill(np.nan)
        self.ops["complete" if present is None else "aged"] += 1
        lag = peer_median(vals) - vals
        # histogram of every rank's lag (cumulative counts are built on scrape)
        c.hist += np.bincount(np.searchsorted(self._bounds, lag, side="left"),
                              minlength=len(LAG_BUCKETS_MS) + 1)
        c.hist_sum += float(lag.sum())
        # window
        p = c.pos
        j = int(np.argmax(lag))
        last = j if present is None else int(present[j])
        if present is None:
            c.lags[p] = lag
        else:
            c.lags[p].fill(np.nan)
            c.lags[p, present] = lag
        if lag[j] >= self.cfg.min_lag_ms:
            c.last_rank[p] = last
            c.last_node[p] = c.rank_node[last]
        else:
            c.last_rank[p] = -1
            c.last_node[p] = -1
        c.w_type[p] = op_type
        c.pos = (p + 1) % c.window
        c.filled = min(c.filled + 1, c.window)
        c.ops_total += 1
        self._attribute(c, now)

    # ------------------------------------------------------------ attribution
    def _noise(self, c: _Comm) -> float:
        """1.4826 × median over ranks of each rank's MAD of lag over the window, from at
        most :data:`NOISE_SAMPLE_RANKS` evenly spaced ranks; cached for window/4 ops."""
        if c.noise_at >= 0 and c.ops_total - c.noise_at < max(1, c.window // 4):
            return c.noise_ms
        cols = np.unique(np.linspace(0, c.n - 1, min(c.n, NOISE_SAMPLE_RANKS)).astype(np.int64))
        lag = np.ascontiguousarray(c.lags[: c.filled][:, cols].T)  # ranks × ops
        if np.isnan(lag).any():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                med = np.nanmedian(lag, axis=1)
                scale = float(np.nanmedian(np.nanmedian(np.abs(lag - med[:, None]), axis=1)))
        else:
            med = np.median(lag, axis=1)
            scale = float(np.median(np.median(np.abs(lag - med[:, None]), axis=1)))
        scale *= MAD_TO_SIGMA
        c.noise_ms = max(scale if math.isfinite(scale) else 0.0, NOISE_FLOOR_MS)
        c.noise_at = c.ops_total
        return c.noise_ms

    def _node_lag(self, c: _Comm, nid: int) -> float:
        """Median over the window of the node's largest rank lag per op (ms)."""
        ranks = np.flatnonzero(c.rank_node == nid)
        sub = c.lags[: c.filled][:, ranks]
        per_op = np.where(np.isnan(sub), -np.inf, sub).max(axis=1)
        per_op = per_op[np.isfinite(per_op)]
        return float(np.median(per_op)) if per_op.size else -math.inf

    def _attribute(self, c: _Comm, now: float) -> None:
        ops = c.filled
        if c.n < MIN_ATTRIBUTION_RANKS or ops < self.cfg.min_ops:
            return
        ln = c.last_node[:ops]
        counts = np.bincount(ln[ln >= 0], minlength=len(c.node_names))
        need_share = self.cfg.min_share * ops
        cands = [int(i) for i in np.flatnonzero(counts >= need_share)]
        cands += [i for i in c.attributed if i not in cands]
        if not cands:
            return
        bound = max(self.cfg.min_lag_ms, self.cfg.noise_multiplier * self._noise(c))
        for nid in cands:
            share = float(counts[nid]) / ops if nid < counts.shape[0] else 0.0
            med = self._node_lag(c, nid)
            a = c.attributed.get(nid)
            if a is None:
                if share >= self.cfg.min_share and med >= bound:
                    c.attributed[nid] = Attribution(
                        c.node_names[nid], share, med, self._last_ranks(c, nid))
                continue
            a.share, a.median_lag_ms = share, med
            if share < self.cfg.clear_share or med < bound / 2:
                del c.attributed[nid]
                if a.alerted:
                    self._edges.append(self._edge(c, a, False, now))
                continue
            a.ops += 1
            a.ranks = self._last_ranks(c, nid) or a.ranks
            if not a.alerted and a.ops >= self.cfg.alert_ops:
                a.alerted = True
                self._edges.append(self._edge(c, a, True, now))

    def _last_ranks(self, c: _Comm, nid: int) -> tuple[int, ...]:
        lr = c.last_rank[: c.filled][c.last_node[: c.filled] == nid]
        return tuple(int(r) for r in np.unique(lr[lr >= 0]))

    def _edge(self, c: _Comm, a: Attribution, active: bool, now: float) -> NcclEdge:
        types = Counter(t for t in c.w_type[: c.filled] if t)
        return NcclEdge(
            cluster=c.cluster, comm=c.comm, node=a.node, active=active, nranks=c.n,
            ranks=a.ranks, share=a.share, median_lag_ms=a.median_lag_ms,
            noise_ms=c.noise_ms if math.isfinite(c.noise_ms) else 0.0,
            window_ops=c.filled, op_types=dict(types), at=now,
        )

    def defer(self, edge: NcclEdge) -> None:
        """The alert hand-off refused ``edge``: undo it so the next op raises it again (a
        refused clear is re-sent at the next check only while the communicator lives)."""
        c = self.comms.get((edge.cluster, edge.comm))
        if c is None or not edge.active:
            return
        for a in c.attributed.values():
            if a.node == edge.node:
                a.alerted = False

    # ---------------------------------------------------------------- periodic
    def sweep(self, now: float) -> None:
        """Close ops older than ``op_timeout_s`` and forget communicators silent for
        ``comm_ttl_s``. Call periodically (ingest's recompute loop)."""
        dead = [k for k, c in self.comms.items() if now - c.last_seen > self.cfg.comm_ttl_s]
        for k in dead:
            self._forget(self.comms.pop(k), now)
            self.comms_expired += 1
        cutoff = now - self.cfg.op_timeout_s
        for c in list(self.comms.values()):
            used = np.flatnonzero((c.p_seq >= 0) & (c.p_first < cutoff))
            for slot in used[np.argsort(c.p_seq[used])]:
                self._close(c, int(slot), now, complete=False)

    def drain(self) -> list[NcclEdge]:
        """Alert edges produced since the last call, oldest first."""
        out, self._edges = self._edges, []
        return out

    # ------------------------------------------------------------------- views
    def attributions(self) -> Iterator[tuple[str, str, str, Attribution]]:
        """``(cluster, comm, node, attribution)`` of every currently attributed node."""
        for c in self.comms.values():
            for a in c.attributed.values():
                yield c.cluster, c.comm, a.node, a

    def histograms(self) -> Iterator[tuple[str, str, list[tuple[str, float]], float]]:
        """Per communicator: ``(cluster, comm, [(le, cumulative count)...], sum_ms)`` of the
        rank lags, in Prometheus histogram shape (last bucket ``+Inf``)."""
        les = [f"{b:g}" for b in LAG_BUCKETS_MS] + ["+Inf"]
        for c in self.comms.values():
            if c.ops_total:
                cum = np.cumsum(c.hist)
                yield c.cluster, c.comm, list(zip(les, cum.astype(float).tolist(),
                                                  strict=True)), c.hist_sum

    def pending_ops(self) -> int:
        """Ops waiting for ranks, over all communicators."""
        return sum(len(c.slot_of) for c in self.comms.values())

    def memory_bytes(self) -> int:
        """Bytes held by the numpy arrays of every communicator."""
        total = 0
        for c in self.comms.values():
            for arr in (c.pend, c.p_seq, c.p_count, c.p_first, c.rank_node, c.lags,
                        c.last_node, c.last_rank, c.hist):
                total += arr.nbytes
        return total
