"""NCCL collective health benchmark: ingest cost per op, attribution latency, accuracy.

Run: ``.venv/bin/python tests/bench/nccl.py [--quick]`` (``make bench``).

Traces come from :class:`agent.nccl.TraceModel` (per-rank arrival jitter 0.2 ms, a planted
node 1 ms late), pushed node by node as agents do: each node's eight ranks, ten ops per
push.

* **1,000-rank communicator at 10 ops/s** (125 nodes × 8 ranks):
  - engine cost per op (``NcclEngine.observe_batch``, all 1,000 points), and the share of
    one core it takes at 10 ops/s;
  - full ingest cost per op: OTLP protobuf parse + ``Ingestor.handle_metrics`` (decoding,
    engine, alerts) for the 125 agent requests of each 10 ops;
  - baseline on the same arrays: a plain ``np.median`` per op, and the leave-one-out
    ``peer_median`` the engine uses;
  - attribution latency: wall time of the call that delivers an op's last ranks, i.e.
    from the last point to the op's lag and attribution being current (p50/p99 per op);
  - ops until a planted late node is attributed, and until its alert;
  - false attribution on balanced traces: share of 10,000 ops after which any node is
    attributed (target < 1 %).
* **100 communicators × 64 ranks** at 10 ops/s each (1,000 ops/s): engine cost per op,
  share of a core, false attribution over 10,000 balanced ops, the worst ops-to-attribute
  over 10 planted communicators, engine memory.

Prints a table, then as the last line one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from agent.nccl import TraceModel, nccl_metric
from agent.otlp import metrics_request
from ingest.nccl import NcclEngine, peer_median
from workflows.config import AutorepairConfig

BATCH = 10
NOW = 1_800_000_000.0
LATE_MS = 1.0


def nodes_for(nranks: int, prefix: str = "gpu-") -> list[str]:
    return [f"{prefix}{i:04d}" for i in range(-(-nranks // 8))]


def node_batches(model: TraceModel, k: int) -> tuple[list[tuple[str, np.ndarray, np.ndarray,
                                                               np.ndarray, list[str]]],
                                                    np.ndarray]:
    """One push per node for the next ``k`` ops: (node, seq, rank, duration, op types)."""
    seqs, types, _nb, dur = model.next_ops(k)
    out = []
    for node, ranks in model.node_ranks.items():
        r = np.asarray(ranks)
        out.append((node, np.repeat(seqs, len(r)), np.tile(r, k), dur[:, r].ravel(),
                    [t for t in types for _ in r]))
    return out, dur


def run_comm(engine: NcclEngine, model: TraceModel, ops: int, cluster: str = "c",
             lat: list[float] | None = None) -> list[int]:
    """Feed ``ops`` ops; returns the attributed-node count after each batch of ops.
    ``lat`` collects, per op, the time of the call that delivered its last ranks."""
    counts: list[int] = []
    done = 0
    while done < ops:
        k = min(BATCH, ops - done)
        batches, _ = node_batches(model, k)
        for i, (node, s, r, d, t) in enumerate(batches):
            t0 = time.perf_counter()
            engine.observe_batch(cluster, node, model.comm, model.nranks, s, r, d, t, NOW)
            if lat is not None and i == len(batches) - 1:
                lat.extend([(time.perf_counter() - t0) / k] * k)
        done += k
        attributed = sum(1 for a in engine.attributions() if a[1] == model.comm)
        counts += [attributed] * k
    return counts


def first_attributed(engine: NcclEngine, model: TraceModel, limit: int) -> tuple[int, int]:
    """Ops (pushed one at a time) until the planted node is attributed, and until alerted."""
    found = alerted = -1
    for op in range(1, limit + 1):
        batches, _ = node_batches(model, 1)
        for node, s, r, d, t in batches:
            engine.observe_batch("c", node, model.comm, model.nranks, s, r, d, t, NOW)
        if found < 0 and any(a[1] == model.comm for a in engine.attributions()):
            found = op
        if alerted < 0 and any(e.active and e.comm == model.comm for e in engine.drain()):
            alerted = op
        if found > 0 and alerted > 0:
            break
    return found, alerted


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def bench_1000(false_ops: int, cost_ops: int) -> dict[str, Any]:
    f: dict[str, Any] = {}
    nodes = nodes_for(1000)
    # engine cost and attribution latency on a balanced trace
    engine = NcclEngine()
    model = TraceModel(1000, nodes, seed=1)
    run_comm(engine, model, 50)  # warm: window filled
    lat: list[float] = []
    t0 = time.perf_counter()
    run_comm(engine, model, cost_ops, lat=lat)
    per_op = (time.perf_counter() - t0) / cost_ops
    f["k1000_engine_us_per_op"] = per_op * 1e6
    f["k1000_engine_us_per_point"] = per_op * 1e6 / 1000
    f["k1000_cpu_share_at_10_ops_s"] = per_op * 10
    f["k1000_attribution_latency_p50_us"] = pct(lat, 50) * 1e6
    f["k1000_attribution_latency_p99_us"] = pct(lat, 99) * 1e6
    # baseline on the same arrays
    _, dur = node_batches(TraceModel(1000, nodes, seed=2), cost_ops)
    t0 = time.perf_counter()
    for i in range(cost_ops):
        np.median(dur[i])
    f["k1000_baseline_np_median_us_per_op"] = (time.perf_counter() - t0) / cost_ops * 1e6
    t0 = time.perf_counter()
    for i in range(cost_ops):
        peer_median(dur[i])
    f["k1000_peer_median_us_per_op"] = (time.perf_counter() - t0) / cost_ops * 1e6
    # full ingest path: protobuf parse + Ingestor.handle_metrics
    f.update(full_path(nodes, max(20, cost_ops // 5)))
    # planted late node
    late = nodes[77]
    found, alerted = first_attributed(
        NcclEngine(), TraceModel(1000, nodes, late={late: LATE_MS}, seed=3), 200)
    f["k1000_planted_found_after_ops"] = found
    f["k1000_planted_alert_after_ops"] = alerted
    # false attribution on balanced traces
    counts = run_comm(NcclEngine(), TraceModel(1000, nodes, seed=4), false_ops)
    f["k1000_balanced_ops"] = false_ops
    f["k1000_false_attribution_pct"] = 100.0 * sum(1 for c in counts if c) / len(counts)
    return f


def full_path(nodes: list[str], ops: int) -> dict[str, float]:
    import asyncio

    from ingest.pipeline import Ingestor

    model = TraceModel(1000, nodes, seed=5)
    bodies: list[bytes] = []
    for _ in range(ops // BATCH):
        seqs, types, nbytes, dur = model.next_ops(BATCH)
        for node in nodes:
            recs = model.records(node, seqs, types, nbytes, dur)
            req = metrics_request({"host.name": node, "autorepair.cluster.id": "c"},
                                  [nccl_metric(recs, now_ns=int(NOW * 1e9))])
            bodies.append(req.SerializeToString())
    ing = Ingestor(AutorepairConfig(), clock=lambda: NOW)

    async def go() -> float:
        t0 = time.perf_counter()
        for b in bodies:
            await ing.handle_metrics(ExportMetricsServiceRequest.FromString(b), "http", raw=b)
        return time.perf_counter() - t0

    dt = asyncio.run(go())
    n_ops = (ops // BATCH) * BATCH
    assert ing.nccl.ops["complete"] == n_ops, ing.nccl.ops
    return {"k1000_full_ingest_us_per_op": dt / n_ops * 1e6,
            "k1000_full_ingest_cpu_share_at_10_ops_s": dt / n_ops * 10,
            "k1000_otlp_bytes_per_op": sum(len(b) for b in bodies) / n_ops}


def bench_100x64(ops_per_comm: int, planted: int) -> dict[str, Any]:
    f: dict[str, Any] = {}
    engine = NcclEngine()
    models = [TraceModel(64, nodes_for(64, f"c{i:03d}-"), comm=f"comm-{i:03d}", seed=100 + i)
              for i in range(100)]
    counts: list[int] = []
    t0 = time.perf_counter()
    for m in models:
        counts += run_comm(engine, m, ops_per_comm)
    dt = time.perf_counter() - t0
    total = ops_per_comm * len(models)
    f["c100x64_engine_us_per_op"] = dt / total * 1e6
    f["c100x64_cpu_share_at_1000_ops_s"] = dt / total * 1000
    f["c100x64_balanced_ops"] = total
    f["c100x64_false_attribution_pct"] = 100.0 * sum(1 for c in counts if c) / len(counts)
    f["c100x64_memory_mb"] = engine.memory_bytes() / 2**20
    worst_found = worst_alert = 0
    missed = 0
    for i in range(planted):
        nodes = nodes_for(64, f"p{i:03d}-")
        found, alerted = first_attributed(
            engine, TraceModel(64, nodes, comm=f"planted-{i:03d}", late={nodes[i % 8]: LATE_MS},
                               seed=500 + i), 200)
        if found < 0:
            missed += 1
        worst_found, worst_alert = max(worst_found, found), max(worst_alert, alerted)
    f["c100x64_planted"] = planted
    f["c100x64_planted_missed"] = missed
    f["c100x64_planted_found_after_ops_max"] = worst_found
    f["c100x64_planted_alert_after_ops_max"] = worst_alert
    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer ops (smoke run)")
    args = ap.parse_args()
    false_ops = 1000 if args.quick else 10_000
    f: dict[str, Any] = {}
    f.update(bench_1000(false_ops=false_ops, cost_ops=100 if args.quick else 500))
    f.update(bench_100x64(ops_per_comm=false_ops // 100, planted=10))
    rows = [
        ("1,000 ranks: engine cost per op", f"{f['k1000_engine_us_per_op']:.0f} µs "
         f"({f['k1000_engine_us_per_point']:.2f} µs/point)"),
        ("  core share at 10 ops/s (engine)", f"{100 * f['k1000_cpu_share_at_10_ops_s']:.2f} %"),
        ("  full ingest (OTLP parse + decode + engine) per op",
         f"{f['k1000_full_ingest_us_per_op']:.0f} µs, "
         f"{100 * f['k1000_full_ingest_cpu_share_at_10_ops_s']:.1f} % of a core at 10 ops/s"),
        ("  baseline: np.median per op / peer_median per op",
         f"{f['k1000_baseline_np_median_us_per_op']:.1f} µs / "
         f"{f['k1000_peer_median_us_per_op']:.1f} µs"),
        ("  attribution latency p50 / p99 (last point → current)",
         f"{f['k1000_attribution_latency_p50_us']:.0f} µs / "
         f"{f['k1000_attribution_latency_p99_us']:.0f} µs"),
        ("  planted late node: attributed / alerted after",
         f"{f['k1000_planted_found_after_ops']} / {f['k1000_planted_alert_after_ops']} ops"),
        (f"  false attribution over {f['k1000_balanced_ops']:,} balanced ops",
         f"{f['k1000_false_attribution_pct']:.2f} %"),
        ("100 × 64 ranks: engine cost per op", f"{f['c100x64_engine_us_per_op']:.0f} µs"),
        ("  core share at 1,000 ops/s", f"{100 * f['c100x64_cpu_share_at_1000_ops_s']:.1f} %"),
        (f"  false attribution over {f['c100x64_balanced_ops']:,} balanced ops",
         f"{f['c100x64_false_attribution_pct']:.2f} %"),
        (f"  {f['c100x64_planted']} planted: worst attributed / alerted after",
         f"{f['c100x64_planted_found_after_ops_max']} / "
         f"{f['c100x64_planted_alert_after_ops_max']} ops "
         f"(missed {f['c100x64_planted_missed']})"),
        ("  engine memory (100 communicators)", f"{f['c100x64_memory_mb']:.1f} MiB"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in f.items()},
                     sort_keys=True))


if __name__ == "__main__":
    main()
