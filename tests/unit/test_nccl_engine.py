"""NCCL collective engine: leave-one-out median, attribution on balanced and planted traces,
alert edges, bounded memory and expiry, malformed points rejected with reasons."""

from __future__ import annotations

import numpy as np
import pytest

from agent.nccl import TraceModel
from ingest.nccl import LAG_BUCKETS_MS, NcclEngine, peer_median
from workflows.config import NcclConfig

NOW = 1_800_000_000.0


def nodes(n_nodes: int) -> list[str]:
    return [f"gpu-{i:03d}" for i in range(n_nodes)]


def feed(engine: NcclEngine, model: TraceModel, ops: int, *, now: float = NOW,
         batch: int = 10, skip: set[str] = frozenset(),  # type: ignore[assignment]
         cluster: str = "c1") -> list[int]:
    """Push ``ops`` ops node by node (as agents do: each node its ranks, ``batch`` ops per
    push). Returns, per op, how many nodes were attributed after it."""
    attributed: list[int] = []
    done = 0
    while done < ops:
        k = min(batch, ops - done)
        seqs, types, _nb, dur = model.next_ops(k)
        for node, ranks in model.node_ranks.items():
            if node in skip:
                continue
            r = np.asarray(ranks)
            assert not engine.observe_batch(
                cluster, node, model.comm, model.nranks, np.repeat(seqs, len(r)),
                np.tile(r, k), dur[:, r].ravel(), [t for t in types for _ in r], now)
        done += k
        attributed += [len(list(engine.attributions()))] * k
    return attributed


# ---------------------------------------------------------------- leave-one-out median
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 64, 65])
def test_peer_median_matches_brute_force_with_ties(n: int) -> None:
    rng = np.random.default_rng(n)
    for trial in range(50):
        v = rng.integers(0, 3, n).astype(float) if trial % 2 else rng.normal(size=n)
        expected = np.array([np.median(np.delete(v, i)) for i in range(n)])
        np.testing.assert_allclose(peer_median(v), expected)


def test_peer_median_needs_two_values() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        peer_median(np.array([1.0]))


# ------------------------------------------------------------------------ attribution
@pytest.mark.parametrize(("nranks", "per_node"), [(64, 8), (3, 1), (1000, 8)])
def test_balanced_traces_are_never_attributed(nranks: int, per_node: int) -> None:
    model = TraceModel(nranks, nodes(-(-nranks // per_node)), ranks_per_node=per_node, seed=3)
    engine = NcclEngine()
    ops = 300 if nranks == 1000 else 2000
    assert sum(feed(engine, model, ops)) == 0
    assert engine.ops["complete"] == ops and not engine.drain()
    # every rank's lag of every op went into the histogram
    (_cl, _comm, buckets, _sum), = engine.histograms()
    assert buckets[-1] == ("+Inf", float(nranks * ops))


@pytest.mark.parametrize(("nranks", "per_node", "late"), [(64, 8, "gpu-005"), (3, 1, "gpu-001"),
                                                          (1000, 8, "gpu-077")])
def test_planted_late_node_found_within_50_ops_and_alerted(
    nranks: int, per_node: int, late: str
) -> None:
    model = TraceModel(nranks, nodes(-(-nranks // per_node)), ranks_per_node=per_node,
                       late={late: 1.0}, seed=5)
    cfg = NcclConfig()
    engine = NcclEngine(cfg)
    attributed = feed(engine, model, 60, batch=1)
    first = attributed.index(1) + 1
    assert first <= 50 and cfg.min_ops <= first
    (cl, comm, node, a), = engine.attributions()
    assert (cl, comm, node) == ("c1", model.comm, late)
    assert a.share >= cfg.min_share and a.median_lag_ms == pytest.approx(1.0, abs=0.35)
    assert set(a.ranks) <= set(model.node_ranks[late])
    (edge,) = engine.drain()  # alert_ops after the attribution
    assert edge.active and edge.node == late and edge.comm == model.comm
    ev = edge.evidence()
    assert ev["nranks"] == nranks and ev["window_ops"] <= cfg.window_ops
    assert set(ev["op_types"]) <= {"AllGather", "ReduceScatter", "AllReduce"}
    assert late in edge.text() and "arrived last" in edge.text()
    # the node recovers: attribution and alert clear
    model.set_late(late, 0.0)
    feed(engine, model, cfg.window_ops, batch=1)
    assert not list(engine.attributions())
    (clear,) = engine.drain()
    assert not clear.active and clear.node == late


def test_two_rank_communicator_is_measured_never_attributed() -> None:
    model = TraceModel(2, ["a", "b"], ranks_per_node=1, late={"a": 5.0}, seed=1)
    engine = NcclEngine()
    assert sum(feed(engine, model, 200)) == 0
    assert engine.ops["complete"] == 200


def test_jitter_below_min_lag_is_not_attributed() -> None:
    # 0.1 ms late with 0.01 ms jitter: consistently last, yet under min_lag_ms (0.25)
    model = TraceModel(16, nodes(2), late={"gpu-001": 0.1}, jitter_ms=0.01, seed=2)
    engine = NcclEngine()
    assert sum(feed(engine, model, 200)) == 0
    lowered = NcclEngine(NcclConfig(min_lag_ms=0.05))
    model2 = TraceModel(16, nodes(2), late={"gpu-001": 0.1}, jitter_ms=0.01, seed=2)
    assert sum(feed(lowered, model2, 200)) > 0


# ---------------------------------------------------------------------- bounded memory
def test_max_ranks_evicts_least_recent_communicators() -> None:
    engine = NcclEngine(NcclConfig(max_ranks=256, max_nranks=64))
    for i in range(20):
        m = TraceModel(64, nodes(8), comm=f"comm-{i}", seed=i)
        feed(engine, m, 5, now=NOW + i)
    assert engine.total_ranks <= 256 and len(engine.comms) == 4
    assert engine.comms_evicted == 16
    assert [c for _, c in engine.comms] == [f"comm-{i}" for i in range(16, 20)]


def test_pending_ops_bounded_and_aged_out() -> None:
    cfg = NcclConfig(max_pending_ops=16, op_timeout_s=30)
    engine = NcclEngine(cfg)
    model = TraceModel(16, nodes(2), seed=4)
    # gpu-001 never reports: no op completes; at most 16 wait, the oldest are closed early
    feed(engine, model, 100, skip={"gpu-001"})
    assert engine.pending_ops() == 16
    # half the ranks present (min_present_fraction 0.5): closed as "aged"
    assert engine.ops["aged"] == 84 and engine.ops["complete"] == 0
    mem = engine.memory_bytes()
    feed(engine, model, 1000, skip={"gpu-001"})
    assert engine.memory_bytes() == mem  # no growth past the pending and window slots
    engine.sweep(NOW + 31)
    assert engine.pending_ops() == 0 and engine.ops["aged"] == 1100


def test_too_few_ranks_dropped_and_late_points_counted() -> None:
    engine = NcclEngine(NcclConfig(op_timeout_s=5))
    assert engine.observe("c", "n0", "k", 7, "AllReduce", 0, 8, 1.0, NOW) is None
    engine.sweep(NOW + 6)
    assert engine.ops["dropped"] == 1 and engine.pending_ops() == 0
    # a straggling point for the closed op is counted, not re-opened
    assert engine.observe("c", "n1", "k", 7, "AllReduce", 1, 8, 1.0, NOW + 7) is None
    assert engine.late_points == 1 and engine.pending_ops() == 0


def test_silent_communicator_expires_and_clears_its_alert() -> None:
    cfg = NcclConfig(comm_ttl_s=600)
    engine = NcclEngine(cfg)
    model = TraceModel(32, nodes(4), late={"gpu-002": 2.0}, seed=6)
    feed(engine, model, 40)
    assert [e.active for e in engine.drain()] == [True]
    engine.sweep(NOW + 599)
    assert len(engine.comms) == 1
    engine.sweep(NOW + 601)
    assert not engine.comms and engine.total_ranks == 0 and engine.comms_expired == 1
    (clear,) = engine.drain()
    assert not clear.active and clear.node == "gpu-002"
    assert engine.memory_bytes() == 0


def test_deferred_raise_is_raised_again() -> None:
    engine = NcclEngine()
    model = TraceModel(32, nodes(4), late={"gpu-001": 2.0}, seed=7)
    feed(engine, model, 40, batch=1)
    (edge,) = engine.drain()
    engine.defer(edge)  # the hand-off queue was full
    feed(engine, model, 1, batch=1)
    (again,) = engine.drain()
    assert again.active and again.node == "gpu-001"


# -------------------------------------------------------------------- malformed points
def test_malformed_points_rejected_with_reasons_never_raise() -> None:
    engine = NcclEngine()
    cases = [
        (dict(rank=8, nranks=8, dur=1.0, seq=1), "nccl.rank: 8 outside [0, nranks 8)"),
        (dict(rank=-1, nranks=8, dur=1.0, seq=1), "nccl.rank: -1 outside"),
        (dict(rank=0, nranks=8, dur=-0.5, seq=1), "duration_ms: -0.5 is not a finite"),
        (dict(rank=0, nranks=8, dur=float("nan"), seq=1), "duration_ms: nan"),
        (dict(rank=0, nranks=8, dur=float("inf"), seq=1), "duration_ms: inf"),
        (dict(rank=0, nranks=8, dur=1.0, seq=-3), "nccl.op_seq: -3 is negative"),
        (dict(rank=0, nranks=0, dur=1.0, seq=1), "nccl.nranks: 0 outside"),
        (dict(rank=0, nranks=10**9, dur=1.0, seq=1), "nccl.nranks: 1000000000 outside"),
    ]
    for p, reason in cases:
        got = engine.observe("c", "n", "k", p["seq"], "AllReduce", p["rank"], p["nranks"],
                             p["dur"], NOW)
        assert got is not None and got.startswith(reason), (p, got)
    assert sum(engine.rejected.values()) == len(cases) and not engine.comms
    # nranks must stay what the communicator has
    assert engine.observe("c", "n", "k", 1, "AllReduce", 0, 8, 1.0, NOW) is None
    got = engine.observe("c", "n", "k", 1, "AllReduce", 1, 16, 1.0, NOW)
    assert got == "nccl.nranks: 16 differs from communicator k's 8"
    # a mixed batch keeps the good points and reports each kind of bad one once
    bad = engine.observe_batch("c", "n", "k", 8, [2, 2, 2, 2], [0, 1, 9, 2],
                               [1.0, -1.0, 1.0, 2.0], "AllGather", NOW)
    assert sorted(k for _, k in bad) == [1, 1] and engine.points == 3
    assert engine.observe_batch("c", "n", "k", 8, [1, 2], [0], [1.0], "x", NOW) == [
        ("nccl: columns of unequal length", 2)]
    # one-rank communicators have no peers: ignored, not rejected
    assert engine.observe("c", "n", "solo", 1, "AllReduce", 0, 1, 1.0, NOW) is None
    assert engine.ignored_points == 1


def test_histogram_buckets_are_cumulative_and_counted() -> None:
    engine = NcclEngine()
    # 4 ranks, durations 10, 10, 10, 4: rank 3 arrived 6 ms late; the others lag 0
    for r, d in enumerate((10.0, 10.0, 10.0, 4.0)):
        engine.observe("c", f"n{r}", "k", 0, "AllReduce", r, 4, d, NOW)
    (_cl, _comm, buckets, total), = engine.histograms()
    les = dict(buckets)
    assert les["0"] == 3.0 and les["5"] == 3.0 and les["10"] == 4.0 and les["+Inf"] == 4.0
    assert total == pytest.approx(6.0)
    assert len(buckets) == len(LAG_BUCKETS_MS) + 1
