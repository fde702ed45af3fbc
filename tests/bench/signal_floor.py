"""Signal floor: what the two signals of every lease decision cost the Temporal dev server.

Run: ``.venv/bin/python tests/bench/signal_floor.py [--signals 1000] [--data-dir DIR]``
(``make bench``).

Every lease decision of the cluster guard is at least one signal into the guard (the
request, ``acquire``) and one out of it (the reply, ``lease``), which wakes the requester
(docs/design.md §4.4). This measures both on the dev stack's Temporal dev server
(:func:`tests.bench.support.stack.core_stack`), with trivial workflows on an unsandboxed
worker in this process, so the figures are the floor under
``tests/bench/guard_throughput.py``'s decisions per second on the same machine:

* ``into_one``: ``--signals`` signals from the client into one running workflow that only
  counts them, at 1, 4 and 32 in flight: signals/s and Temporal CPU per signal;
* ``wake_to_completion``: one signal each into ``--signals`` waiting workflows that
  complete on it (as ``BenchLeaseSink`` does on its lease reply), 32 in flight: signals/s,
  Temporal CPU and this process's (worker) CPU per signal.

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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.bench.support.stack import core_stack

QUEUE = "bench-signal-floor"


@workflow.defn(name="BenchSignalCounter")
class Counter:
    """Counts ``hit`` signals; returns once it has ``total``."""

    def __init__(self) -> None:
        self.n = 0

    @workflow.signal
    def hit(self, _: int) -> None:
        self.n += 1

    @workflow.run
    async def run(self, total: int) -> int:
        await workflow.wait_condition(lambda: self.n >= total)
        return self.n


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of ``pid`` (None: this process)."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


async def bounded(n: int, coros: list[Any]) -> list[Any]:
    sem = asyncio.Semaphore(n)

    async def one(c: Any) -> Any:
        async with sem:
            return await c
    return await asyncio.gather(*(one(c) for c in coros))


async def into_one(client: Client, temporal: int, n: int, conc: int) -> dict[str, float]:
    h = await client.start_workflow(Counter.run, n, id=f"floor-one-{conc}", task_queue=QUEUE)
    await asyncio.sleep(1.0)  # its first task done: it waits
    c0, t0 = cpu_s(temporal), time.monotonic()
    await bounded(conc, [h.signal(Counter.hit, i) for i in range(n)])
    t1 = time.monotonic()
    await h.result()
    return {"per_s": n / (t1 - t0), "temporal_ms": (cpu_s(temporal) - c0) / n * 1000}


async def wake_to_completion(client: Client, temporal: int, n: int) -> dict[str, float]:
    hs = await bounded(32, [client.start_workflow(Counter.run, 1, id=f"floor-wake-{i}",
                                                  task_queue=QUEUE) for i in range(n)])
    await asyncio.sleep(3.0)  # every first task done: they wait
    c0, w0, t0 = cpu_s(temporal), cpu_s(), time.monotonic()
    await bounded(32, [h.signal(Counter.hit, 1) for h in hs])
    t1 = time.monotonic()
    await asyncio.sleep(3.0)  # the woken tasks and completions run (no client polls)
    out = {"per_s": n / (t1 - t0), "temporal_ms": (cpu_s(temporal) - c0) / n * 1000,
           "worker_ms": (cpu_s() - w0) / n * 1000}
    await bounded(32, [h.result() for h in hs])  # every one did complete (after measuring)
    return out


async def run(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    n = args.signals
    async with core_stack(data_dir, {"clusters": [{"name": "floor"}],
                                     "worker": {"watchers": False}}) as core:
        temporal = next(c.proc.pid for c in core.stack.children
                        if c.name == "temporal" and c.proc is not None)
        async with Worker(core.client, task_queue=QUEUE, workflows=[Counter],
                          workflow_runner=UnsandboxedWorkflowRunner(),
                          max_concurrent_workflow_tasks=50):
            figures: dict[str, Any] = {"signals": n, "cpus": os.cpu_count()}
            for conc in (1, 4, 32):
                r = await into_one(core.client, temporal, n, conc)
                figures[f"into_one_c{conc}_per_s"] = r["per_s"]
                figures[f"into_one_c{conc}_temporal_ms"] = r["temporal_ms"]
            r = await wake_to_completion(core.client, temporal, n)
            figures |= {f"wake_to_completion_{k}": v for k, v in r.items()}
    print(f"signal floor: {n} signals, Temporal dev server, {os.cpu_count()} CPUs")
    print(f"{'figure':44} {'signals/s':>10} {'Temporal ms':>12} {'worker ms':>10}")
    for conc in (1, 4, 32):
        print(f"{f'into one running workflow, {conc} in flight':44} "
              f"{figures[f'into_one_c{conc}_per_s']:>10.0f} "
              f"{figures[f'into_one_c{conc}_temporal_ms']:>12.1f} {'—':>10}")
    print(f"{'wakes a waiting workflow to completion, 32':44} "
          f"{figures['wake_to_completion_per_s']:>10.0f} "
          f"{figures['wake_to_completion_temporal_ms']:>12.1f} "
          f"{figures['wake_to_completion_worker_ms']:>10.1f}")
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--signals", type=int, default=1000, help="signals per figure")
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="stack data dir (default: a temporary directory, removed after)")
    args = ap.parse_args()
    if args.data_dir is not None:
        figures = asyncio.run(run(args, args.data_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
            figures = asyncio.run(run(args, Path(tmp)))
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
