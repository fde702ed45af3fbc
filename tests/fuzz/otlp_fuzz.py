"""Fuzz both OTLP receivers with 100,000+ hostile requests (``make fuzz``).

Run: ``.venv/bin/python tests/fuzz/otlp_fuzz.py [--cases 100000] [--seed 1] [--threads 8]``.

The real :class:`ingest.service.IngestService` runs in a child process; client threads
send :func:`tests.fuzz.cases.make_case` requests over OTLP/HTTP and OTLP/gRPC and check
the properties of :mod:`tests.fuzz.harness` on each answer, plus a valid push and
``/healthz`` every :data:`ALIVE_EVERY` cases per thread. The server's peak RSS (``VmHWM``)
must stay under ``--rss-limit-mib``. Thread ``i`` draws from ``Random(seed * 1000 + i)``,
so a failing case can be regenerated from the seed, thread and case index printed with it.

The last line reads ``fuzz: cases=N cases/s=R failures=F peak_rss_mib=M …``; the exit
status is 1 when anything failed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[0] = str(ROOT)  # the repository, not tests/fuzz (whose module names are generic)

ALIVE_EVERY = 1000
"""Cases per thread between liveness checks."""


def _serve(conn: Connection) -> None:
    import asyncio
    import logging

    from ingest.service import IngestService
    from tests.fuzz.harness import fuzz_config

    logging.basicConfig(level=logging.ERROR)

    async def main() -> None:
        svc = IngestService(fuzz_config())
        await svc.start()
        conn.send((svc.http_port, svc.grpc_port, svc.api_port))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, conn.recv)  # until the parent says stop
        await svc.stop()

    asyncio.run(main())


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rss-limit-mib", type=float, default=1024.0,
                    help="server peak RSS budget (decode caps × decode threads + state)")
    args = ap.parse_args()

    from tests.fuzz.cases import gzip_bomb, make_case
    from tests.fuzz.harness import Sender

    for mib in (1, 8, 64):
        gzip_bomb(mib)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child,), daemon=True)
    proc.start()
    http_port, grpc_port, api_port = parent.recv()
    assert proc.pid is not None

    per_thread = -(-args.cases // args.threads)
    failures: list[str] = []
    families: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    lock = threading.Lock()
    done = [0]
    not_sent = [0]

    def work(i: int) -> None:
        rng = random.Random(args.seed * 1000 + i)
        s = Sender(http_port, grpc_port, api_port)
        try:
            for n in range(per_thread):
                case = make_case(rng)
                t = time.perf_counter()
                problem = s.send(case)
                spent = time.perf_counter() - t
                if problem is None and (n + 1) % ALIVE_EVERY == 0:
                    problem = s.alive()
                with lock:
                    families[case.family] += 1
                    seconds[case.family] += spent
                    done[0] += 1
                    if problem is not None:
                        failures.append(f"seed={args.seed} thread={i} case={n}: {problem}")
        finally:
            with lock:
                not_sent[0] += s.not_sent
            s.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(work, range(args.threads)))
    elapsed = time.perf_counter() - t0
    final = Sender(http_port, grpc_port, api_port)
    alive = final.alive()
    final.close()
    if alive is not None:
        failures.append(f"after the run: {alive}")
    peak = _peak_rss_mib(proc.pid)
    if not peak < args.rss_limit_mib:
        failures.append(f"server peak RSS {peak:.0f} MiB over {args.rss_limit_mib:.0f} MiB")
    parent.send("stop")
    proc.join(30)

    for f in failures[:20]:
        print("FAIL", f)
    print("families (cases, mean ms):", ", ".join(
        f"{k}={v} {1000 * seconds[k] / v:.1f}" for k, v in sorted(families.items())))
    print(f"fuzz: cases={done[0]} cases/s={done[0] / elapsed:.0f} failures={len(failures)} "
          f"peak_rss_mib={peak:.0f} (server) not_sent={not_sent[0]} seed={args.seed} "
          f"seconds={elapsed:.0f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
