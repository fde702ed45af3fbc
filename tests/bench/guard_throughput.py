"""Guard throughput benchmark: how fast one ``ClusterGuardWorkflow`` decides a storm of leases.

Run: ``.venv/bin/python tests/bench/guard_throughput.py [--requests 1000] [--manual]``
(``make bench``).

* The dev stack's Temporal dev server (SQLite) and embedded PostgreSQL (the ledger the
  guard rebuilds from; :func:`tests.bench.support.stack.core_stack`), as child processes;
  the real ``ClusterGuardWorkflow`` (sandboxed, as the worker runs it) with the real
  ``load_policy``, ledger and notify activities on a worker in this process, so its CPU is
  this process's (the worker and ingest children of ``autorepair up`` are not started:
  they would only compete for the two cores). The dev server, not the time-skipping test
  server: decisions per second are wall-clock figures, and the time-skipping server's
  clock jumps would hide the cost of every timer and round trip.
* One cluster of ``gpu_nodes`` = ``--requests`` (budget and breaker at their defaults: 5 %
  and 10 % of that), no inventory (the ingest would raise ``node_unreachable`` for every
  silent inventory node); each request names its pool, ``--pools`` of them round robin.
* One requester per node: a ``BenchLeaseSink`` workflow (:mod:`tests.bench.support.lease_sink`,
  on a worker of its own in this process) whose id the request names, so the guard's
  ``lease`` reply goes to a running workflow as it does to a waiting repair.
* The client signals ``acquire`` (:class:`~workflows.protocol.LeaseRequest`, automatic
  unless ``--manual``) for every requester as fast as it can (``--concurrency`` signals in
  flight): a storm, every node at once. A decision is the guard's first ``lease`` reply to
  a request (granted, or queued with its reason); its latency runs from the moment the
  client sent the request to the server's time of the ``WorkflowExecutionSignaled`` event
  in the requester's history. decisions/s = requests / (last reply − first request).

Prints a table, then as the last line one JSON object with every figure and the target
beside each (issue 30: ≥ 100 decisions/s per cluster on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.guard_replies import GuardReplyActivities
from activities.ledger import Ledger
from activities.ledger_activities import LedgerActivities
from activities.notify import NotifyActivities
from activities.policy_activities import PolicyActivities
from tests.bench.support.lease_sink import SINK_QUEUE, SINK_WORKFLOW, LeaseSink
from tests.bench.support.stack import Core, core_stack, node_name, pct
from workflows.activity_api import ACT
from workflows.guard import ClusterGuardWorkflow
from workflows.protocol import (
    GUARD_QUERY_STATUS,
    GUARD_SIGNAL_ACQUIRE,
    GUARD_SIGNAL_RELEASE,
    GUARD_WORKFLOW,
    GuardInput,
    GuardStatus,
    LeaseRelease,
    LeaseReply,
    LeaseRequest,
    workflow_id_guard,
)

CLUSTER = "bench-guard"
GUARD_QUEUE = "bench-guard"
#: Targets (issue 30 item 1): decisions per second per cluster on 2 cores.
TARGET_DECISIONS_PER_S = 100.0
#: How long the run may take before the benchmark gives up waiting for replies, seconds.
REPLY_TIMEOUT_S = 600.0
#: Node pools of the requests (``--pools``).
POOLS = {"n": 125}
#: Client re-sends after the server said the guard's workflow was busy.
BUSY = {"retries": 0}


def sink_id(i: int) -> str:
    return f"bench-sink/{node_name(i)}"


def request(i: int, *, automatic: bool) -> LeaseRequest:
    node = node_name(i)
    return LeaseRequest(repair_id=f"bench-{node}", workflow_id=sink_id(i), cluster=CLUSTER,
                        node=node, node_pool=f"pool-{i % POOLS['n']:03d}", automatic=automatic)


async def guard_status(client: Client) -> GuardStatus:
    return await client.get_workflow_handle(workflow_id_guard(CLUSTER)).query(
        GUARD_QUERY_STATUS, result_type=GuardStatus)


async def settled_status(client: Client, tries: int = 20) -> GuardStatus:
    """The guard's status once it answers (a guard still busy with a storm's tail may let
    a query time out)."""
    for attempt in range(tries):
        try:
            return await guard_status(client)
        except RPCError:
            if attempt == tries - 1:
                raise
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


async def wait_serving(client: Client, timeout_s: float = 120.0) -> GuardStatus:
    """Until the guard has read its policy and rebuilt from the ledger."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            st = await guard_status(client)
            if st.policy_loaded and st.rebuilt_at is not None:
                return st
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"guard not serving within {timeout_s:g} s")
        await asyncio.sleep(0.2)


async def signalled_at(client: Client, workflow_id: str) -> float | None:
    """Server time (s since the epoch) of the first signal in ``workflow_id``'s history."""
    hist = await client.get_workflow_handle(workflow_id).fetch_history()
    for ev in hist.events:
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            return float(ev.event_time.seconds) + ev.event_time.nanos / 1e9
    return None


async def bounded(n: int, coros: list[Any]) -> list[Any]:
    sem = asyncio.Semaphore(n)

    async def one(c: Any) -> Any:
        async with sem:
            return await c
    return await asyncio.gather(*(one(c) for c in coros))


async def signal_retrying(guard: WorkflowHandle[Any, Any], req: LeaseRequest) -> None:
    """``acquire`` ``req``; the server's "Workflow is busy" (RESOURCE_EXHAUSTED: too many
    concurrent writes to one workflow) is retried after a short pause, as a repair's
    re-send would come again."""
    for attempt in range(100):
        try:
            await guard.signal(GUARD_SIGNAL_ACQUIRE, req)
            return
        except RPCError as err:
            if err.status != RPCStatusCode.RESOURCE_EXHAUSTED or attempt == 99:
                raise
            BUSY["retries"] += 1
            # back off: a flood of retries holds the workflow's lock and starves the
            # dispatch of its own workflow task (the guard then decides nothing)
            await asyncio.sleep(min(2.0, 0.05 * 2 ** min(attempt, 6)))


def _t(ev: Any) -> float:
    return float(ev.event_time.seconds) + ev.event_time.nanos / 1e9


TIMELINE: list[tuple[float, str, str]] = []


async def guard_history(client: Client) -> dict[str, Any]:
    """What the guard's runs (continue-as-new followed) cost in history: events, workflow
    tasks, signals received, and the lease replies it sent (``guard_send_leases``
    activities: how many, replies per activity, seconds from scheduled to completed; an
    external ``lease`` signal for a guard that still sends them)."""
    tasks = events = runs = signals = external = 0
    sizes: list[int] = []
    scheduled: dict[int, float] = {}
    durations: list[float] = []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id_guard(CLUSTER)}'"):
        runs += 1
        hist = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        events += len(hist.events)
        for e in hist.events:
            t = e.event_type
            TIMELINE.append((_t(e), EventType.Name(t).removeprefix("EVENT_TYPE_"), ""))
            if t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                tasks += 1
            elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                signals += 1
            elif t == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
                external += 1
            elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                a = e.activity_task_scheduled_event_attributes
                if a.activity_type.name == ACT.guard_send_leases:
                    scheduled[e.event_id] = _t(e)
                    body = json.loads(a.input.payloads[0].data)
                    sizes.append(len(body.get("commands", [])))
            elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                sid = e.activity_task_completed_event_attributes.scheduled_event_id
                if sid in scheduled:
                    durations.append(_t(e) - scheduled[sid])
    return {"guard_runs": runs, "guard_events": events, "guard_workflow_tasks": tasks,
            "guard_signals_received": signals, "guard_external_signals": external,
            "reply_activities": len(sizes),
            "replies_per_activity": sum(sizes) / len(sizes) if sizes else 0.0,
            "reply_activity_p50_s": pct(durations, 50) if durations else 0.0,
            "reply_activity_max_s": max(durations) if durations else 0.0}


async def run(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    n = args.requests
    # no inventory: the ingest would raise ``node_unreachable`` for every silent node;
    # each request names its pool (the guard takes it for an unconfigured node)
    config = {"clusters": [{"name": CLUSTER, "gpu_nodes": n + 1}],
              "worker": {"watchers": False}}
    async with core_stack(data_dir, config) as core:
        return await measure(core, args)


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of ``pid`` (None: this process)."""
    p = psutil.Process(pid)
    return float(sum(p.cpu_times()[:2]))


async def measure(core: Core, args: argparse.Namespace) -> dict[str, Any]:
    n = args.requests
    POOLS["n"] = args.pools
    automatic = not args.manual
    client = core.client
    ledger = LedgerActivities(core.pool)
    policy = PolicyActivities(core.config, core.pool)
    notify = NotifyActivities(core.config.notifications, ledger=Ledger(core.pool))
    temporal_pid = next(c.proc.pid for c in core.stack.children
                        if c.name == "temporal" and c.proc is not None)
    async with Worker(client, task_queue=SINK_QUEUE, workflows=[LeaseSink],
                      workflow_runner=UnsandboxedWorkflowRunner(),
                      max_concurrent_workflow_tasks=50), \
            Worker(client, task_queue=GUARD_QUEUE, workflows=[ClusterGuardWorkflow],
                   activities=[*ledger.all(), policy.load_policy, notify.notify,
                               *GuardReplyActivities(client).all()]):
        await client.start_workflow(GUARD_WORKFLOW, GuardInput(cluster=CLUSTER),
                                    id=workflow_id_guard(CLUSTER), task_queue=GUARD_QUEUE)
        before = await wait_serving(client)
        # warm-up: one request answered and released (the worker's caches, the sandbox)
        warm = await client.start_workflow(SINK_WORKFLOW, id=sink_id(n), task_queue=SINK_QUEUE,
                                           result_type=LeaseReply)
        guard = client.get_workflow_handle(workflow_id_guard(CLUSTER))
        await guard.signal(GUARD_SIGNAL_ACQUIRE, request(n, automatic=False))
        await asyncio.wait_for(warm.result(), 60)
        await guard.signal(GUARD_SIGNAL_RELEASE, LeaseRelease(repair_id=f"bench-{node_name(n)}"))
        sinks: list[WorkflowHandle[Any, LeaseReply]] = await bounded(32, [
            client.start_workflow(SINK_WORKFLOW, id=sink_id(i), task_queue=SINK_QUEUE,
                                  result_type=LeaseReply) for i in range(n)])
        await asyncio.sleep(2.0)  # every sink's first workflow task done: they wait
        cpu0 = (cpu_s(), cpu_s(temporal_pid))
        sent: dict[int, float] = {}

        async def send(i: int) -> None:
            sent[i] = time.time()
            await signal_retrying(guard, request(i, automatic=automatic))
        t_first = time.time()
        await bounded(args.concurrency, [send(i) for i in range(n)])
        t_sent = time.time()
        replies: list[LeaseReply] = await asyncio.wait_for(
            asyncio.gather(*(h.result() for h in sinks)), REPLY_TIMEOUT_S)
        t_done = time.time()
        cpu1 = (cpu_s(), cpu_s(temporal_pid))
        TIMELINE.extend([(t_first, "CLIENT_FIRST_SEND", ""), (t_sent, "CLIENT_LAST_SEND", "")])
        at: list[float | None] = await bounded(16, [signalled_at(client, sink_id(i))
                                                    for i in range(n)])
        after = await settled_status(client)
        hist = await guard_history(client)
    got = [t for t in at if t is not None]
    lat = [(t - sent[i]) * 1000 for i, t in enumerate(at) if t is not None]
    span = max(got) - t_first if got else float("nan")
    granted = sum(1 for r in replies if r.granted)
    figures: dict[str, Any] = {
        "requests": n,
        "automatic": automatic,
        "cpus": os.cpu_count(),
        "budget": before.budget,
        "breaker_threshold": before.breaker_threshold,
        "decisions_per_s": n / span,
        "decisions_per_s_target": TARGET_DECISIONS_PER_S,
        "decision_p50_ms": pct(lat, 50),
        "decision_p99_ms": pct(lat, 99),
        "decision_max_ms": max(lat) if lat else float("nan"),
        "send_s": t_sent - t_first,
        # how far the last reply came after the last request was sent: near 0, the guard
        # kept up with the arrivals and decisions/s is their rate
        "last_reply_after_last_request_s": (max(got) - t_sent) if got else float("nan"),
        "busy_retries": BUSY["retries"],
        "all_replies_s": t_done - t_first,
        "granted": granted,
        "queued": n - granted,
        "breaker_open": after.breaker_open,
        "leases": len(after.leases),
        "pending": len(after.pending),
        "guard_errors": len(after.errors),
        **hist,
    }
    figures["worker_cpu_s"] = cpu1[0] - cpu0[0]  # guard, sinks and client together
    figures["temporal_cpu_s"] = cpu1[1] - cpu0[1]
    figures["decisions_per_guard_task"] = n / max(1, hist["guard_workflow_tasks"])
    print(f"guard throughput: {n} {'automatic' if automatic else 'manual'} lease requests, "
          f"one cluster, {os.cpu_count()} CPUs (budget {before.budget}, breaker threshold "
          f"{before.breaker_threshold})")
    rows = [
        ("decisions/s", f"{figures['decisions_per_s']:.1f}", f"≥ {TARGET_DECISIONS_PER_S:g}"),
        ("decision latency p50 (ms)", f"{figures['decision_p50_ms']:.0f}", "—"),
        ("decision latency p99 (ms)", f"{figures['decision_p99_ms']:.0f}", "—"),
        ("client send time (s)", f"{figures['send_s']:.2f}", "—"),
        ("last reply after last request (s)",
         f"{figures['last_reply_after_last_request_s']:.2f}", "—"),
        ("client re-sends (workflow busy)", str(BUSY["retries"]), "—"),
        ("granted / queued", f"{granted} / {n - granted}", "—"),
        ("breaker open after", str(after.breaker_open), "—"),
        ("guard workflow tasks / runs", f"{hist['guard_workflow_tasks']} / {hist['guard_runs']}",
         "—"),
        ("decisions per guard task", f"{figures['decisions_per_guard_task']:.1f}", "—"),
        ("guard history events per decision", f"{hist['guard_events'] / n:.2f}", "—"),
        ("reply activities / replies each", f"{hist['reply_activities']} / "
                                            f"{hist['replies_per_activity']:.0f}", "—"),
        ("reply activity p50 / max (s)", f"{hist['reply_activity_p50_s']:.2f} / "
                                         f"{hist['reply_activity_max_s']:.2f}", "—"),
        ("external lease signals", str(hist["guard_external_signals"]), "—"),
        ("bench process / Temporal CPU (s)", f"{figures['worker_cpu_s']:.1f} / "
                                      f"{figures['temporal_cpu_s']:.1f}", "—"),
    ]
    print(f"{'figure':32} {'now':>14} {'target':>10}")
    for label, now, target in rows:
        print(f"{label:32} {now:>14} {target:>10}")
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000, help="lease requests, one per node")
    ap.add_argument("--pools", type=int, default=125, help="node pools (8 nodes each at 1000)")
    ap.add_argument("--concurrency", type=int, default=4, help="client signals in flight")
    ap.add_argument("--manual", action="store_true",
                    help="requests from a person (not counted by the breaker)")
    ap.add_argument("--timeline", type=Path, default=None,
                    help="write the guard's history (time, event type) as JSON lines here")
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="stack data dir (default: a temporary directory, removed after)")
    args = ap.parse_args()
    if args.data_dir is not None:
        figures = asyncio.run(run(args, args.data_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-guard-") as tmp:
            figures = asyncio.run(run(args, Path(tmp)))
    if args.timeline is not None:
        t0 = min((t for t, _, _ in TIMELINE), default=0.0)
        args.timeline.write_text("".join(json.dumps([round(t - t0, 3), k]) + "\n"
                                         for t, k, _ in sorted(TIMELINE)))
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
