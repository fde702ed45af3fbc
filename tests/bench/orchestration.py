"""Orchestration benchmark: alert → repair decision latency on the dev stack, vs a bare start.

Run: ``.venv/bin/python tests/bench/orchestration.py [--nodes 40] [--rate 0.5]`` (``make bench``;
``--nodes 100`` and ``--nodes 1000`` for the figures of the performance notes; at 0.5 alerts/s
a 2-core machine keeps up, faster rates measure the worker's and server's queueing).

* The dev stack of ``autorepair up`` (Temporal dev server on SQLite, embedded PostgreSQL,
  the real worker and ingest child processes), one cluster whose inventory holds the nodes.
* Per alert: an Xid 79 fault log record pushed over OTLP/HTTP for a distinct node, at a
  steady rate; latency = push accepted (HTTP 200) → the node's ``RepairWorkflow`` visible by
  search attribute (``WorkflowType = 'RepairWorkflow' AND NodeId = …``, polled every 10 ms).
* Baseline in the same run, interleaved half a period after each alert: a bare
  ``start_workflow`` of an empty workflow carrying the same search attributes (no worker
  needed: it is never run), then the same visibility wait.
* Where the time goes: each node's ``NodeWorkflow`` and ``RepairWorkflow`` histories give
  the server's time of every event; the table lists the median and p99 of each event's
  time after the push, and the step from the previous one.

Prints a table, then as the last line one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from temporalio.common import SearchAttributePair, TypedSearchAttributes

from tests.bench.support.stack import (
    PySpy,
    Stack,
    cluster_config,
    dev_stack,
    history_times,
    node_name,
    pct,
    wait_visible,
)
from workflows.protocol import SA_CLUSTER, SA_NODE, workflow_id_node

CLUSTER = "bench"
BARE_QUEUE = "bench-bare"
VISIBLE_TIMEOUT_S = 60.0


def repair_query(node: str) -> str:
    return f"WorkflowType = 'RepairWorkflow' AND ClusterId = '{CLUSTER}' AND NodeId = '{node}'"


def bare_query(node: str) -> str:
    return f"WorkflowType = 'BenchBare' AND ClusterId = 'bench-bare' AND NodeId = '{node}'"


async def one_alert(s: Stack, node: str) -> dict[str, float]:
    t_push = await s.push_fault(CLUSTER, node)
    try:
        t_vis = await wait_visible(s, repair_query(node), VISIBLE_TIMEOUT_S)
    except TimeoutError:
        return {"push": t_push, "lost": 1.0}
    return {"push": t_push, "visible": t_vis}


async def one_bare(s: Stack, node: str) -> dict[str, float]:
    t0 = time.time()
    await s.client.start_workflow(
        "BenchBare", id=f"bare/{node}", task_queue=BARE_QUEUE,
        search_attributes=TypedSearchAttributes([SearchAttributePair(SA_NODE, node),
                                                 SearchAttributePair(SA_CLUSTER, "bench-bare")]))
    t_started = time.time()
    t_vis = await wait_visible(s, bare_query(node), VISIBLE_TIMEOUT_S)
    return {"start": t0, "started": t_started, "visible": t_vis}


async def breakdown(s: Stack, nodes: list[str], pushes: dict[str, float]) -> dict[str, list[float]]:
    """Per history event label: seconds after the push, one value per node."""
    after: dict[str, list[float]] = defaultdict(list)
    for node in nodes:
        times = await history_times(s.client, workflow_id_node(CLUSTER, node), "node")
        async for wf in s.client.list_workflows(repair_query(node)):
            rt = await history_times(s.client, wf.id, "repair")
            times.update(rt)
            break
        for label, t in times.items():
            after[label].append(t - pushes[node])
    return after


async def run(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    n = args.nodes
    config = {
        "clusters": [cluster_config(CLUSTER, n + 1)],
        "worker": {"watchers": False},
    }
    async with dev_stack(data_dir, config) as s:
        # warm-up: the worker's first workflow tasks, the ledger pool, the sandbox
        warm = node_name(n)
        await s.push_fault(CLUSTER, warm)
        await wait_visible(s, repair_query(warm), 120, poll_s=0.1)
        await one_bare(s, "warm")

        spies = []
        if args.py_spy:
            spies = [(name, PySpy(args.py_spy, s.pid(name), data_dir / f"{name}.pyspy.txt"))
                     for name in ("worker", "ingest")]
        cpu0 = s.cpu_s()
        period = 1.0 / args.rate
        t0 = time.monotonic() + 0.2
        alerts: dict[str, dict[str, float]] = {}
        bares: dict[str, dict[str, float]] = {}

        async def at(delay: float, coro: Any) -> Any:
            await asyncio.sleep(max(0.0, t0 + delay - time.monotonic()))
            return await coro

        async def alert_task(i: int) -> None:
            alerts[node_name(i)] = await at(i * period, one_alert(s, node_name(i)))

        async def bare_task(i: int) -> None:
            bares[f"b{i}"] = await at((i + 0.5) * period, one_bare(s, f"b-{i:05d}"))

        await asyncio.gather(*(alert_task(i) for i in range(n)),
                             *(bare_task(i) for i in range(n)))
        # the repairs' first steps after becoming visible still cost the worker CPU
        await asyncio.sleep(5.0)
        cpu1 = s.cpu_s()
        for _, spy in spies:
            spy.stop()
        lat = [(a["visible"] - a["push"]) * 1000 for a in alerts.values() if "visible" in a]
        bare = [(b["visible"] - b["start"]) * 1000 for b in bares.values()]
        bare_rpc = [(b["started"] - b["start"]) * 1000 for b in bares.values()]
        lost = sum(1 for a in alerts.values() if "lost" in a)
        nodes = [k for k, a in alerts.items() if "visible" in a]
        sample = nodes if len(nodes) <= 200 else nodes[:: max(1, len(nodes) // 200)]
        after = await breakdown(s, sample, {k: a["push"] for k, a in alerts.items()})
        vis = [(alerts[k]["visible"] - alerts[k]["push"]) for k in sample]
    figures: dict[str, Any] = {
        "nodes": n,
        "rate_per_s": args.rate,
        "cpus": os.cpu_count(),
        "alert_to_repair_p50_ms": pct(lat, 50),
        "alert_to_repair_p99_ms": pct(lat, 99),
        "bare_start_p50_ms": pct(bare, 50),
        "bare_start_p99_ms": pct(bare, 99),
        "bare_start_rpc_p50_ms": pct(bare_rpc, 50),
        "ratio_p50": pct(lat, 50) / pct(bare, 50),
        "ratio_p99": pct(lat, 99) / pct(bare, 99),
        "alerts_lost": lost,
    }
    for name in ("worker", "ingest", "temporal"):
        figures[f"{name}_cpu_ms_per_alert"] = (cpu1[name] - cpu0[name]) * 1000 / n
    stages = sorted(((pct(v, 50), label, v) for label, v in after.items()
                     if len(v) >= len(sample) // 2), key=lambda x: x[0])
    stages.append((pct(vis, 50), "visible by search attribute (client poll)", vis))
    figures["stages_p50_ms"] = {label: round(m * 1000, 1) for m, label, _ in stages}
    print(f"orchestration: {n} alerts at {args.rate:g}/s, {os.cpu_count()} CPUs")
    print(f"{'':44} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{'alert → RepairWorkflow visible':44} {figures['alert_to_repair_p50_ms']:8.1f} "
          f"{figures['alert_to_repair_p99_ms']:8.1f}")
    print(f"{'bare start_workflow → visible':44} {figures['bare_start_p50_ms']:8.1f} "
          f"{figures['bare_start_p99_ms']:8.1f}")
    print(f"{'ratio':44} {figures['ratio_p50']:8.2f} {figures['ratio_p99']:8.2f}")
    print(f"alerts lost: {lost}")
    print(f"\nwhere the time goes ({len(sample)} alerts; server event times after the push):")
    print(f"{'event':64} {'p50 ms':>8} {'p99 ms':>8} {'step ms':>8}")
    prev = 0.0
    for m, label, v in stages:
        print(f"{label[:64]:64} {m * 1000:8.1f} {pct(v, 99) * 1000:8.1f} {(m - prev) * 1000:8.1f}")
        prev = m
    print("\nCPU per alert (alert and bare start together): " + ", ".join(
        f"{name} {figures[f'{name}_cpu_ms_per_alert']:.0f} ms"
        for name in ("worker", "ingest", "temporal")))
    for name, spy in spies:
        samples, rows = spy.top(30)
        print(f"\npy-spy {name}: {samples} samples; top functions by total share")
        for f, own, tot in rows:
            print(f"  {tot * 100:5.1f}% (self {own * 100:4.1f}%)  {f[:110]}")
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=40, help="alerts, one per distinct node")
    ap.add_argument("--rate", type=float, default=0.5, help="alerts per second (steady)")
    ap.add_argument("--py-spy", default=None, metavar="BINARY",
                    help="profile the worker and ingest with this py-spy binary")
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="stack data dir (default: a temporary directory, removed after)")
    args = ap.parse_args()
    if args.data_dir is not None:
        figures = asyncio.run(run(args, args.data_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-orch-") as tmp:
            figures = asyncio.run(run(args, Path(tmp)))
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
