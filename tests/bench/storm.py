"""Storm benchmark: 1,000 nodes of one cluster raise actionable faults within a minute.

Run: ``.venv/bin/python tests/bench/storm.py [--nodes 1000] [--spread 60]`` (``make bench``).

* The dev stack of ``autorepair up`` (Temporal dev server, embedded PostgreSQL, the real
  worker and ingest processes); one Kubernetes cluster of ``--nodes`` GPU nodes served by
  kmock (the realistic Kubernetes API of the tests) with every node in the ingest's
  inventory, 8 nodes per pool, one GPU pod running on every node (so leased repairs wait
  for idle after cordoning instead of acting), policy at its defaults except: Xid 79
  repairs are automatic (the breaker counts automatic repairs) and the idle check polls
  every 5 s. Budget and breaker are the defaults for that many GPU nodes (5 % and 10 %).
* Every node pushes its health score every 10 s throughout (a live agent; a silent
  inventory node would raise ``node_unreachable``).
* Phase 1: every node pushes one Xid 79 fault record over OTLP/HTTP, spread evenly over
  ``--spread`` seconds. Sampled every second: the guard's breaker and leases, nodes cordoned
  (kmock's ``spec.unschedulable``), repairs in a disruptive stage (draining, repairing,
  migrating, joining). Then: duplicate repairs per node, alerts in the ledger within 10 s
  of their push (``alerts.recorded_at``), peak workflow starts per second, worker CPU,
  Temporal history events per node (NodeWorkflow + RepairWorkflow, sampled).
* Phase 2: every node pushes the clear of its fault, the GPU pods finish (nodes go idle),
  and the breaker is reset (the ``reset_breaker`` signal of ``autorepair breaker reset``).
  Every repair must end without acting: ``auto_resolved``.

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
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import asyncpg
import kmock
from kubernetes_asyncio import client as k8s
from temporalio.service import RPCError

from tests.bench.support.stack import (
    Stack,
    cluster_config,
    dev_stack,
    node_name,
    pct,
)
from tests.fixtures.kube import NODES, PDBS, PODS, KubeApi, KubeEmulator
from workflows.protocol import (
    GUARD_QUERY_STATUS,
    GUARD_SIGNAL_RESET_BREAKER,
    GuardStatus,
    ResetBreakerSignal,
    workflow_id_guard,
    workflow_id_node,
)

CLUSTER = "storm"
DISRUPTIVE = ("draining", "repairing", "migrating", "joining")
LEDGER_WINDOW_S = 10.0


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class Sampler:
    """Once a second: guard status, cordoned nodes, repairs in a disruptive stage."""

    def __init__(self, s: Stack, kube: KubeApi) -> None:
        self.s, self.kube = s, kube
        self.max_cordoned = 0
        self.max_acting = 0
        self.max_leases = 0
        self.status: GuardStatus | None = None
        self.rows: list[tuple[float, int, int, int, int, bool]] = []

    def cordoned(self) -> int:
        return sum(1 for (res, _, _), obj in list(self.kube.server.objects.items())
                   if res == NODES and not obj.deleted and obj.raw.get("spec", {}).get(
                       "unschedulable"))

    async def guard(self) -> GuardStatus | None:
        try:
            return await self.s.client.get_workflow_handle(workflow_id_guard(CLUSTER)).query(
                GUARD_QUERY_STATUS, result_type=GuardStatus)
        except Exception:
            return None

    async def run(self, t0: float, stop: asyncio.Event) -> None:
        stages = " OR ".join(f"RepairStage = '{st}'" for st in DISRUPTIVE)
        query = (f"WorkflowType = 'RepairWorkflow' AND ClusterId = '{CLUSTER}' AND "
                 f"ExecutionStatus = 'Running' AND ({stages})")
        tick = 0
        while not stop.is_set():
            tick += 1
            # the guard answers queries between its own tasks: every other second is enough
            status = await self.guard() if tick % 2 else None
            if status is not None:
                self.status = status
                self.max_leases = max(self.max_leases, len(status.leases))
            cordoned = self.cordoned()
            acting = await self.s.count(query)
            self.max_cordoned = max(self.max_cordoned, cordoned)
            self.max_acting = max(self.max_acting, acting)
            st = self.status
            self.rows.append((time.time() - t0, cordoned, acting,
                              len(st.leases) if st else 0, len(st.pending) if st else 0,
                              bool(st and st.breaker_open)))
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass


async def spread(n: int, seconds: float, fn: Any) -> None:
    """Call ``fn(i)`` for i in 0..n-1 evenly over ``seconds`` (concurrently)."""
    t0 = time.monotonic()

    async def one(i: int) -> None:
        await asyncio.sleep(max(0.0, t0 + i * seconds / n - time.monotonic()))
        await fn(i)

    await asyncio.gather(*(one(i) for i in range(n)))


async def wait_until(cond: Any, timeout_s: float, poll_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await cond():
            return True
        await asyncio.sleep(poll_s)
    return False


async def run(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    n = args.nodes
    async with KubeEmulator() as server, kmock.Server(server) as srv:
        server.resources[NODES] = kmock.ResourceInfo(kind="Node", namespaced=False)
        server.resources[PODS] = kmock.ResourceInfo(kind="Pod", namespaced=True)
        server.resources[PDBS] = kmock.ResourceInfo(kind="PodDisruptionBudget", namespaced=True)
        url = str(srv.url).rstrip("/")
        kube = KubeApi(server=server, url=url, api_client=k8s.ApiClient(k8s.Configuration(host=url)))
        for i in range(n):
            kube.add_node(node_name(i))
            kube.add_pod("train", f"job-{i:05d}", node_name(i), gpus=8)
        kubeconfig = data_dir / "kubeconfig"
        await asyncio.to_thread(_write, kubeconfig, json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": url}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}],
        }))
        cluster = cluster_config(CLUSTER, n, pools=max(1, n // 8))
        cluster.update({"scheduler": "kubernetes", "kubeconfig": str(kubeconfig)})
        config = {
            "clusters": [cluster],
            "worker": {"watchers": False},
            "policy": {"consent": {"automatic_xids": [79]},
                       "wait_for_idle": {"poll_s": 5}},
        }
        try:
            async with dev_stack(data_dir, config) as s:
                return await storm(args, s, kube)
        finally:
            await kube.api_client.close()


async def storm(args: argparse.Namespace, s: Stack, kube: KubeApi) -> dict[str, Any]:
    n = args.nodes
    alive = asyncio.Event()
    beats = asyncio.create_task(s.heartbeats(CLUSTER, [node_name(i) for i in range(n)], alive))
    try:
        return await _storm(args, s, kube)
    finally:
        alive.set()
        await beats


async def _storm(args: argparse.Namespace, s: Stack, kube: KubeApi) -> dict[str, Any]:
    n = args.nodes
    pushes: dict[str, float] = {}
    repairs_q = f"WorkflowType = 'RepairWorkflow' AND ClusterId = '{CLUSTER}'"
    sampler = Sampler(s, kube)
    stop = asyncio.Event()
    t0 = time.time()
    cpu0 = s.cpu_s()
    sampling = asyncio.create_task(sampler.run(t0, stop))

    async def raise_fault(i: int) -> None:
        pushes[node_name(i)] = await s.push_fault(CLUSTER, node_name(i))

    await spread(n, args.spread, raise_fault)
    t_pushed = time.time()

    async def settled() -> bool:
        st = sampler.status
        return (await s.count(repairs_q) >= n and st is not None
                and len(st.leases) + len(st.pending) >= n)

    all_decided = await wait_until(settled, args.settle)
    t_settled = time.time()
    cpu1 = s.cpu_s()
    st = sampler.status
    figures: dict[str, Any] = {"nodes": n, "spread_s": args.spread, "cpus": os.cpu_count(),
                               "phase1_settled": all_decided,
                               "phase1_settle_s": t_settled - t_pushed}
    if st is not None:
        figures.update(budget=st.budget, breaker_threshold=st.breaker_threshold,
                       leases_at_end=len(st.leases), queued_at_end=len(st.pending))
        figures["breaker_trip_s"] = (st.tripped_at.timestamp() - t0) if st.tripped_at else None
        figures["breaker_trip_after_threshold_s"] = trip_after_threshold(
            pushes, st.breaker_threshold, st.tripped_at.timestamp() if st.tripped_at else None)
    # duplicates and workflow start rate
    per_node: Counter[str] = Counter()
    starts: Counter[int] = Counter()
    async for wf in s.client.list_workflows(f"ClusterId = '{CLUSTER}' OR WorkflowId STARTS_WITH "
                                            f"'node/{CLUSTER}/'"):
        if wf.workflow_type == "RepairWorkflow":
            per_node[wf.search_attributes.get("NodeId", ["?"])[0]] += 1  # type: ignore[index]
        starts[int(wf.start_time.timestamp())] += 1
    figures["repairs"] = sum(per_node.values())
    figures["duplicates"] = sum(c - 1 for c in per_node.values() if c > 1)
    figures["peak_workflow_starts_per_s"] = max(starts.values()) if starts else 0
    # ledger completeness
    pool = await asyncpg.connect(s.stack.pg_dsn)
    try:
        rows = await pool.fetch("SELECT node, min(recorded_at) AS t FROM alerts WHERE cluster = $1"
                                " AND active GROUP BY node", CLUSTER)
        lag = {r["node"]: r["t"].timestamp() - pushes[r["node"]] for r in rows
               if r["node"] in pushes}
        figures["ledger_complete_pct"] = 100.0 * sum(
            1 for v in lag.values() if v <= LEDGER_WINDOW_S) / n
        figures["ledger_recorded_pct"] = 100.0 * len(lag) / n
        figures["ledger_p50_s"] = pct(lag.values(), 50)
        figures["ledger_p99_s"] = pct(lag.values(), 99)
        wall = t_settled - t0
        for name in ("worker", "ingest", "temporal"):
            figures[f"{name}_cpu_cores_phase1"] = (cpu1[name] - cpu0[name]) / wall
        # history events per node (sample)
        sample = [node_name(i) for i in range(0, n, max(1, n // 20))]
        events = []
        for node in sample:
            try:
                h = await s.client.get_workflow_handle(
                    workflow_id_node(CLUSTER, node)).fetch_history()
            except RPCError:
                continue  # its alert never got through: counted by the ledger figures
            total = len(h.events)
            async for wf in s.client.list_workflows(f"{repairs_q} AND NodeId = '{node}'"):
                total += len((await s.client.get_workflow_handle(wf.id).fetch_history()).events)
            events.append(total)
        figures["history_events_per_node_p50"] = pct(events, 50)
        figures["history_events_per_node_max"] = max(events) if events else 0
        figures.update(phase1_max_cordoned=sampler.max_cordoned,
                       phase1_max_acting=sampler.max_acting, phase1_max_leases=sampler.max_leases)
        print("phase 1: " + json.dumps(figures, sort_keys=True, default=str), flush=True)

        # phase 2: clear, nodes go idle, reset the breaker
        queued = {r.repair_id for r in (st.pending if st else [])}
        t_clear = time.time()

        async def clear(i: int) -> None:
            await s.push_fault(CLUSTER, node_name(i), active=False)

        await spread(n, min(args.spread, 30.0), clear)
        for i in range(n):
            kube.server.objects[PODS, "train", f"job-{i:05d}"].patch(
                {"status": {"phase": "Succeeded"}})
        await s.client.get_workflow_handle(workflow_id_guard(CLUSTER)).signal(
            GUARD_SIGNAL_RESET_BREAKER, ResetBreakerSignal(by="bench", reason="storm over"))
        t_reset = time.time()
        running_q = f"{repairs_q} AND ExecutionStatus = 'Running'"
        ended = await wait_until(lambda: _zero(s, running_q), args.drain)
        figures["phase2_all_ended"] = ended
        figures["phase2_s"] = time.time() - t_reset
        stop.set()
        await sampling
        final = await pool.fetch("SELECT repair_id, stage FROM repairs WHERE cluster = $1",
                                 CLUSTER)
        acted = {r["repair_id"] for r in await pool.fetch(
            "SELECT DISTINCT t.repair_id FROM repair_transitions t JOIN repairs r USING "
            "(repair_id) WHERE r.cluster = $1 AND t.stage = ANY($2::text[])",
            CLUSTER, ["repairing", "migrating"])}
        acted |= {r["repair_id"] for r in await pool.fetch(
            "SELECT DISTINCT repair_id FROM repair_attempts WHERE cluster = $1", CLUSTER)}
    finally:
        await pool.close()
    stages = Counter(r["stage"] for r in final)
    figures["final_stages"] = dict(stages)
    figures["queued_at_reset"] = len(queued)
    figures["auto_resolved_after_reset"] = sum(
        1 for r in final if r["repair_id"] in queued and r["stage"] == "auto_resolved")
    figures["auto_resolved_total"] = stages.get("auto_resolved", 0)
    figures["acted_after_reset"] = len(acted)
    figures["clear_to_all_ended_s"] = time.time() - t_clear
    figures["max_cordoned"] = sampler.max_cordoned
    figures["max_acting"] = sampler.max_acting
    figures["max_leases"] = sampler.max_leases
    print_table(figures, sampler)
    return figures


def trip_after_threshold(pushes: dict[str, float], threshold: int,
                         tripped_at: float | None) -> float | None:
    """Seconds from the arrival of the fault that took the count past the breaker's
    threshold (the breaker trips when starts in its window *exceed* it: the
    ``threshold + 1``-th fault, in arrival order) to the guard's trip; None when it did
    not trip or fewer faults arrived. ``pushes``: node → the push's answer time (epoch s);
    ``tripped_at``: the guard's trip time (epoch s, the control plane's clock — the same
    host's clock in this benchmark)."""
    arrivals = sorted(pushes.values())
    if tripped_at is None or len(arrivals) <= threshold:
        return None
    return tripped_at - arrivals[threshold]


async def _zero(s: Stack, query: str) -> bool:
    return await s.count(query) == 0


def print_table(f: dict[str, Any], sampler: Sampler) -> None:
    print(f"storm: {f['nodes']} nodes, faults spread over {f['spread_s']:g} s, {f['cpus']} CPUs")
    print(f"{'t s':>6} {'cordoned':>9} {'acting':>7} {'leases':>7} {'queued':>7} breaker")
    step = max(1, len(sampler.rows) // 30)
    for t, c, a, le, q, b in sampler.rows[::step]:
        print(f"{t:6.0f} {c:9d} {a:7d} {le:7d} {q:7d} {'OPEN' if b else 'closed'}")
    rows = [
        ("budget / breaker threshold", f"{f.get('budget')} / {f.get('breaker_threshold')}", ""),
        ("breaker trip after first push", _fmt(f.get("breaker_trip_s"), "s"), "trips"),
        ("breaker trip after threshold-th fault",
         _fmt(f.get("breaker_trip_after_threshold_s"), "s"), "≤ 10 s"),
        ("max cordoned", f["max_cordoned"], f"≤ {f.get('breaker_threshold')}"),
        ("max acting (disruptive stage)", f["max_acting"], f"≤ {f.get('budget')}"),
        ("max leases", f["max_leases"], f"≤ {f.get('budget')}"),
        ("duplicate repairs", f["duplicates"], "0"),
        ("alerts in ledger ≤ 10 s", _fmt(f["ledger_complete_pct"], "%"), "100 %"),
        ("ledger lag p50 / p99", f"{f['ledger_p50_s']:.1f} / {f['ledger_p99_s']:.1f} s", ""),
        ("peak workflow starts", f"{f['peak_workflow_starts_per_s']}/s", ""),
        ("worker / temporal CPU (phase 1)",
         f"{f['worker_cpu_cores_phase1']:.2f} / {f['temporal_cpu_cores_phase1']:.2f} cores", ""),
        ("history events per node p50 / max",
         f"{f['history_events_per_node_p50']:.0f} / {f['history_events_per_node_max']}", ""),
        ("queued at reset → auto_resolved",
         f"{f['queued_at_reset']} → {f['auto_resolved_after_reset']}", "all"),
        ("repairs that acted", f["acted_after_reset"], "0"),
        ("final stages", f["final_stages"], ""),
    ]
    for label, value, target in rows:
        print(f"{label:36} {value!s:>28}  {target}")


def _fmt(v: Any, unit: str) -> str:
    return "n/a" if v is None else f"{v:.1f} {unit}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--spread", type=float, default=60.0, help="seconds over which faults rise")
    ap.add_argument("--settle", type=float, default=1800.0,
                    help="longest wait for every alert to have its repair decided, seconds")
    ap.add_argument("--drain", type=float, default=1800.0,
                    help="longest wait for every repair to end after the reset, seconds")
    ap.add_argument("--data-dir", type=Path, default=None)
    args = ap.parse_args()
    if args.data_dir is not None:
        figures = asyncio.run(run(args, args.data_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp:
            figures = asyncio.run(run(args, Path(tmp)))
    print(json.dumps(figures, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
