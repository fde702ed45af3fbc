"""Benchmark: one agent's CPU share and RSS, and simulated agents per simulator process.

Run: ``.venv/bin/python tests/bench/agent.py [--agent-seconds 180] [--sim-seconds 30]
[--sim-nodes 100,300,1000]``.

1. ``autorepair-agent run --backend simulated --push-interval 5`` as a subprocess for
   ``--agent-seconds``; CPU share = (user+sys CPU time) / wall time of that process,
   RSS sampled every second (psutil). Targets: < 1 % of a core, < 60 MB RSS.
   The simulated backend stands in for NVML here (no GPU on CI machines).
2. ``autorepair-agent simulate --nodes N --push-interval 5`` as a subprocess for
   ``--sim-seconds``; a receiver counts the OTLP metric pushes. N is *sustained* when the
   pushes received reach 95 % of the expected N·(seconds - warm-up)/5 and the simulator's
   CPU stays under one core.

Both talk to a recording OTLP/HTTP receiver (uvicorn + starlette) in this process, which
answers with threshold headers like the ingest does. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import psutil
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

BIN = Path(sys.executable).parent / "autorepair-agent"
HEADERS = {"X-Autorepair-Threshold": "0.9", "X-Autorepair-Quorum-Met": "true"}


class Receiver:
    def __init__(self) -> None:
        self.metrics = 0
        self.logs = 0

    def app(self) -> Starlette:
        async def metrics(request: Request) -> Response:
            await request.body()
            self.metrics += 1
            return Response(b"", headers=HEADERS, media_type="application/x-protobuf")

        async def logs(request: Request) -> Response:
            await request.body()
            self.logs += 1
            return Response(b"", headers=HEADERS, media_type="application/x-protobuf")

        return Starlette(routes=[Route("/v1/metrics", metrics, methods=["POST"]),
                                 Route("/v1/logs", logs, methods=["POST"])])


async def watch(proc: asyncio.subprocess.Process, seconds: float) -> dict[str, float]:
    p = psutil.Process(proc.pid)
    rss: list[float] = []
    t0 = time.monotonic()
    cpu0 = p.cpu_times()
    start_cpu = cpu0.user + cpu0.system
    last = start_cpu
    while time.monotonic() - t0 < seconds and proc.returncode is None:
        try:
            rss.append(p.memory_info().rss / 2**20)
            ct = p.cpu_times()
            last = ct.user + ct.system
        except psutil.NoSuchProcess:
            break
        await asyncio.sleep(1.0)
    wall = time.monotonic() - t0
    return {"wall_s": wall, "cpu_s": last - start_cpu,
            "rss_max_mb": max(rss) if rss else 0.0,
            "rss_mean_mb": sum(rss) / len(rss) if rss else 0.0}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent-seconds", type=float, default=180.0)
    ap.add_argument("--sim-seconds", type=float, default=30.0)
    ap.add_argument("--sim-nodes", default="100,300,1000")
    args = ap.parse_args()

    rec = Receiver()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(rec.app(), log_level="warning", lifespan="off",
                                           access_log=False))
    serve = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes no started event
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    tmp = tempfile.mkdtemp(prefix="agent-bench-")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    figures: dict[str, float | int | list[dict[str, float]]] = {}

    # 1. one agent
    warm_s = 10.0
    proc = await asyncio.create_subprocess_exec(
        str(BIN), "run", "--endpoint", url, "--cluster", "bench", "--node", "gpu-01",
        "--backend", "simulated", "--push-interval", "5", "--kernel-log", "none",
        "--state-dir", f"{tmp}/agent", "--duration", str(args.agent_seconds + warm_s + 5),
        "--log-level", "warning", env=env,
    )
    await asyncio.sleep(warm_s)  # imports and first pushes are start-up, not steady state
    pushes0 = rec.metrics
    w = await watch(proc, args.agent_seconds)
    pushes = rec.metrics - pushes0
    proc.terminate()
    await proc.wait()
    figures |= {
        "agent_seconds": round(w["wall_s"], 1),
        "agent_cpu_pct_of_core": round(100 * w["cpu_s"] / w["wall_s"], 3),
        "agent_rss_max_mb": round(w["rss_max_mb"], 1),
        "agent_rss_mean_mb": round(w["rss_mean_mb"], 1),
        "agent_pushes": pushes,
    }

    # 2. simulator capacity
    steps: list[dict[str, float]] = []
    sustained = 0
    for n in [int(x) for x in args.sim_nodes.split(",")]:
        before = rec.metrics
        proc = await asyncio.create_subprocess_exec(
            str(BIN), "simulate", "--endpoint", url, "--cluster", "bench", "--nodes", str(n),
            "--push-interval", "5", "--gpus-per-node", "8", "--state-dir", f"{tmp}/sim{n}",
            "--duration", str(args.sim_seconds), "--log-level", "warning", env=env,
        )
        warm = 10.0  # agents start spread over one push interval, plus imports
        await asyncio.sleep(warm)
        got0 = rec.metrics
        w = await watch(proc, args.sim_seconds - warm - 1)
        got = rec.metrics - got0
        await proc.wait()
        expected = n * w["wall_s"] / 5.0
        ratio = got / expected if expected else 0.0
        cpu = w["cpu_s"] / w["wall_s"]
        ok = ratio >= 0.95 and cpu < 1.0
        if ok:
            sustained = max(sustained, n)
        steps.append({"nodes": n, "push_ratio": round(ratio, 3),
                      "cpu_cores": round(cpu, 3), "rss_max_mb": round(w["rss_max_mb"], 1),
                      "pushes": rec.metrics - before, "sustained": float(ok)})
    figures["sim_steps"] = steps
    figures["sim_max_sustained_nodes"] = sustained
    server.should_exit = True
    await serve

    print(f"{'figure':<28}{'value':>12}")
    for k, v in figures.items():
        if k != "sim_steps":
            print(f"{k:<28}{v!s:>12}")
    print(f"\n{'sim nodes':>9} {'push ratio':>10} {'cpu cores':>10} {'rss MB':>8} {'ok':>4}")
    for s in steps:
        print(f"{int(s['nodes']):>9} {s['push_ratio']:>10} {s['cpu_cores']:>10} "
              f"{s['rss_max_mb']:>8} {'yes' if s['sustained'] else 'no':>4}")
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
